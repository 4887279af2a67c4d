"""Where a benchmark case's memory goes: peak resident set, when it is reached, and (with
--tracemalloc) the allocation sites that hold the most at the traced peak.

    .venv/bin/python benchmarks/memory.py --cases f g             # 1,000,000 requests each
    .venv/bin/python benchmarks/memory.py --cases c --requests 1000000
    .venv/bin/python benchmarks/memory.py --cases f --requests 200000 --tracemalloc
    .venv/bin/python benchmarks/memory.py --cases d --requests 1000000 --report

Each case runs in a fresh process through `simulator.simulate`, as in run.py. A thread samples
the process's resident set every 20 ms and notes the function the main thread was in at the
largest sample (the phase of the peak: the run, the summary, the result's frames; with
--report also the report `servesim run` prints). With
--tracemalloc, Python's allocations are traced (several times slower) and a snapshot is taken
whenever the traced total has grown by 5 % over the last snapshot's; the largest is reported
by source line. The peak resident set includes the imports and memory the allocator holds but
no object uses: on 2026-12-07 case (a) cut to 10 requests peaked at 57 MiB (the interpreter,
NumPy and servesim's modules; pandas is no longer imported) and at 10,000 requests at 88 MiB.

A --before-tree without a `simulator` package is refused before anything runs (exit 2); a
case's process that fails stops the run with its last error line (exit 1).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# The suite's scenarios and checks, one definition.
from run import CASES, check_imported, check_tree, tree_env  # noqa: E402
from whole_process import last_error_line  # noqa: E402

_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
MIB = 1024 * 1024


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE_BYTES


class PeakSampler(threading.Thread):
    """Samples the resident set; keeps the largest and the main thread's stack then."""

    def __init__(self, period_s: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.period_s = period_s
        self.peak_bytes = 0
        self.peak_at_s = 0.0
        self.peak_stack: list[str] = []
        self.samples: list[tuple[float, int]] = []
        self._halt = threading.Event()
        self._main = threading.main_thread().ident
        self._start = time.perf_counter()

    def run(self) -> None:
        last_kept = 0.0
        while not self._halt.wait(self.period_s):
            rss = _rss_bytes()
            now = time.perf_counter() - self._start
            if now - last_kept >= 1.0:
                self.samples.append((round(now, 1), rss // MIB))
                last_kept = now
            if rss > self.peak_bytes:
                self.peak_bytes, self.peak_at_s = rss, now
                frame = sys._current_frames().get(self._main)
                if frame is not None:
                    self.peak_stack = [
                        f"{Path(f.filename).name}:{f.lineno} {f.name}"
                        for f in traceback.extract_stack(frame)[-8:]
                    ]

    def stop(self) -> None:
        self._halt.set()
        self.join()


class TracedPeak(threading.Thread):
    """Snapshots of tracemalloc whenever the traced total grew by 5 % since the last."""

    def __init__(self, period_s: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.period_s = period_s
        self.best = None
        self.best_bytes = 0
        self._halt = threading.Event()

    def run(self) -> None:
        import tracemalloc

        while not self._halt.wait(self.period_s):
            current, _peak = tracemalloc.get_traced_memory()
            if current > self.best_bytes * 1.05:
                self.best = tracemalloc.take_snapshot()
                self.best_bytes = current

    def stop(self) -> None:
        self._halt.set()
        self.join()


def run_case_here(name: str, requests: int | None, traced: bool, report: bool = False) -> dict:
    import simulator

    scenario = copy.deepcopy(CASES[name][1])
    if requests is not None:
        scenario["workload"]["num_requests"] = requests
    tracer = None
    if traced:
        import tracemalloc

        tracemalloc.start(1)
        tracer = TracedPeak()
        tracer.start()
    sampler = PeakSampler()
    sampler.start()
    start = time.perf_counter()
    result = simulator.simulate(scenario)
    run_s = time.perf_counter() - start
    summary = result.summary
    if report:
        result.report_text()  # what `servesim run` prints: PD metrics, anomalies, per SLO, ...
    wall_s = time.perf_counter() - start
    sampler.stop()
    out = {
        "simulator": os.path.dirname(simulator.__file__),
        "case": name,
        "requests": scenario["workload"]["num_requests"],
        "completed": summary["completed_requests"],
        "wall_s": round(wall_s, 2),
        "simulate_s": round(run_s, 2),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "sampled_peak_mib": sampler.peak_bytes // MIB,
        "peak_at_s": round(sampler.peak_at_s, 2),
        "peak_stack": sampler.peak_stack,
        "rss_mib_each_second": sampler.samples,
    }
    if tracer is not None:
        tracer.stop()
        if tracer.best is not None:
            stats = tracer.best.statistics("lineno")
            out["traced_peak_mib"] = round(tracer.best_bytes / MIB, 1)
            out["top_allocators"] = [
                f"{s.size / MIB:8.1f} MiB {s.count:>10,} blocks  {s.traceback[0]}"
                for s in stats[:25]
            ]
    return out


def description(doc: str) -> str:
    """The first paragraph of a docstring, as one line (not its first line, cut mid-sentence)."""
    return " ".join(doc.split("\n\n")[0].split())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memory.py", description=description(__doc__))
    parser.add_argument("--cases", nargs="*", default=["f"], choices=list(CASES))
    parser.add_argument("--requests", type=int, default=None, help="override the case's count")
    parser.add_argument("--tracemalloc", action="store_true", help="top allocation sites")
    parser.add_argument(
        "--report",
        action="store_true",
        help="also build the printed report, as `servesim run` does (default: stop after the "
        "summary)",
    )
    parser.add_argument("--before-tree", type=Path, default=None, help="also run this checkout")
    parser.add_argument("--child", nargs=4, default=None, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.child:
        name, requests, traced, report = args.child
        count = None if requests == "-" else int(requests)
        print(json.dumps(run_case_here(name, count, traced == "1", report == "1")))
        return 0
    if not args.cases:
        parser.exit(2, "memory.py: error: --cases needs at least one case name\n")
    if args.requests is not None and args.requests < 1:
        parser.exit(2, f"memory.py: error: --requests must be at least 1 (got {args.requests})\n")
    if args.before_tree is not None and (why := check_tree(args.before_tree)):
        parser.exit(2, f"memory.py: error: --before-tree: {why}\n")
    try:
        run_cases(args)
    except KeyboardInterrupt:
        print("memory.py: interrupted", file=sys.stderr)
        return 130
    except RuntimeError as failure:
        print(f"memory.py: error: {failure}", file=sys.stderr)
        return 1
    return 0


def run_cases(args: argparse.Namespace) -> None:
    trees = [("before", args.before_tree)] if args.before_tree else []
    trees.append(("this", None))
    for name in args.cases:
        for label, tree in trees:
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    name,
                    "-" if args.requests is None else str(args.requests),
                    "1" if args.tracemalloc else "0",
                    "1" if args.report else "0",
                ],
                capture_output=True,
                text=True,
                env=tree_env(tree),
            )
            if out.returncode != 0:
                raise RuntimeError(
                    f"({name}) {label} failed (exit {out.returncode}): "
                    f"{last_error_line(out.stderr)}"
                )
            row = json.loads(out.stdout.strip().splitlines()[-1])
            if why := check_imported(row["simulator"], tree):
                raise RuntimeError(f"({name}) {label} {why}")
            print(
                f"({name}) {label}: {row['requests']:,} requests, {row['completed']:,} completed, "
                f"wall {row['wall_s']} s, peak {row['peak_rss_mib']:,.0f} MiB "
                f"at {row['peak_at_s']} s, in:",
                flush=True,
            )
            for line in row["peak_stack"]:
                print(f"    {line}")
            print(f"  RSS (s, MiB) every second: {row['rss_mib_each_second']}")
            for line in row.get("top_allocators", []):
                print(f"  {line}")


if __name__ == "__main__":
    sys.exit(main())
