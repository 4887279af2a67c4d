"""Instructions executed per simulated request, counted by valgrind: for A/B comparisons of
small changes on a machine whose wall-clock figures vary more than the change.

The count is deterministic (the same commit gives the same figure to within a few parts in
ten thousand) but blind to memory latency, so a change that saves cache misses rather than
instructions does not show here; `run.py` remains the measure of speed.

    .venv/bin/python benchmarks/instructions.py                       # cases a c d e
    .venv/bin/python benchmarks/instructions.py --cases d --before-tree /tmp/before

Each case runs twice under callgrind, with its benchmark scenario cut to a few hundred or
thousand requests and with 10 requests (imports and set-up), and reports the difference per
extra request. Needs valgrind; runs as many processes at once as there are CPUs; a run takes
a minute or two. The CSV (--csv, default benchmarks/instructions.csv) is replaced, and names
each tree's commit (`-dirty` when edited) and the date. A counted process that fails stops
the run with its last error line (exit 1, nothing written); a --before-tree without a
`simulator` package, or a CSV path that cannot be written, is refused first (exit 2).
"""

from __future__ import annotations

import argparse
import copy
import csv
import os
import re
import shutil
import subprocess
import sys
import threading
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# The suite's scenarios and checks, one definition.
from run import CASES, HERE, check_tree, tree_env, unwritable  # noqa: E402
from whole_process import last_error_line, tree_commit  # noqa: E402

SETUP_REQUESTS = 10
# Requests per counted run: enough that set-up is well under half of the count.
DEFAULT_REQUESTS = {
    "a": 3000,
    "b": 3000,
    "c": 1500,
    "d": 600,
    "e": 1500,
    "f": 1500,
    "g": 3000,
    "h": 3000,
    "i": 600,
}
_COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")


def collected_instructions(valgrind_stderr: str) -> int:
    """The total callgrind prints at exit ("==pid== Collected : N")."""
    found = _COLLECTED.findall(valgrind_stderr)
    if not found:
        raise RuntimeError(f"no instruction count in valgrind's output:\n{valgrind_stderr[-2000:]}")
    return int(found[-1])


def per_request(count: int, setup_count: int, requests: int) -> float:
    """Instructions per request beyond the set-up run's SETUP_REQUESTS."""
    return (count - setup_count) / (requests - SETUP_REQUESTS)


class CountFailed(RuntimeError):
    """A counted process failed; the message is one line, with its last error line."""


_RUNNING: set[subprocess.Popen] = set()  # counted processes, stopped when one fails
_RUNNING_LOCK = threading.Lock()
# Set once a count failed: a process started after that (its thread was slower to start
# than the failure) is stopped at once too.
_STOPPING = threading.Event()


def count(case: str, requests: int, tree: Path | None, tool: str = "valgrind") -> int:
    """Instructions of one process simulating `case` cut to `requests` requests."""
    process = subprocess.Popen(
        [
            tool,
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            __file__,
            "--child",
            case,
            str(requests),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # One hash seed for every count: string hashing's seed moves dict and set layouts,
        # and with them about 0.8 % of a count between otherwise identical runs.
        env={**tree_env(tree), "PYTHONHASHSEED": "0"},
    )
    with _RUNNING_LOCK:
        _RUNNING.add(process)
        if _STOPPING.is_set():
            process.kill()
    try:
        _stdout, stderr = process.communicate()
    finally:
        with _RUNNING_LOCK:
            _RUNNING.discard(process)
    where = f" on {tree}" if tree is not None else ""
    if process.returncode != 0:
        raise CountFailed(
            f"({case}) {requests} requests{where} failed (exit {process.returncode}): "
            f"{last_error_line(stderr)}"
        )
    return collected_instructions(stderr)


def _stop_running() -> None:
    with _RUNNING_LOCK:
        _STOPPING.set()
        for process in _RUNNING:
            process.kill()


def count_all(jobs: list[tuple], workers: int, tool: str = "valgrind") -> list[int]:
    """`count` for each (label, tree, case, requests) job, `workers` at a time; the first
    failure stops the others (their processes are killed) and is raised."""
    _STOPPING.clear()
    pool = ThreadPoolExecutor(max_workers=workers)
    futures = [pool.submit(count, case, n, tree, tool) for _label, tree, case, n in jobs]
    try:
        wait(futures, return_when=FIRST_EXCEPTION)
        failed = next((f for f in futures if f.done() and f.exception()), None)
        if failed is not None:
            for f in futures:
                f.cancel()
            _stop_running()
            raise failed.exception()
        return [f.result() for f in futures]
    except BaseException:
        for f in futures:
            f.cancel()
        _stop_running()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def run_child(case: str, requests: int) -> None:
    import simulator

    scenario = copy.deepcopy(CASES[case][1])
    scenario["workload"]["num_requests"] = requests
    simulator.simulate(scenario)


CSV_FIELDS = ["case", "requests", "before", "after", "before_commit", "after_commit", "when_utc"]


def description(doc: str) -> str:
    """The first paragraph of a docstring, as one line (not its first line, cut mid-sentence)."""
    return " ".join(doc.split("\n\n")[0].split())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="instructions.py", description=description(__doc__))
    parser.add_argument("--cases", nargs="*", default=["a", "c", "d", "e"], choices=list(CASES))
    parser.add_argument("--before-tree", type=Path, default=None, help="another checkout")
    parser.add_argument(
        "--csv",
        type=Path,
        default=HERE / "instructions.csv",
        help="CSV to write (default benchmarks/instructions.csv)",
    )
    parser.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    return parser


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """One-line errors (exit 2) before anything is counted."""
    if not args.cases:
        parser.exit(2, "instructions.py: error: --cases needs at least one case name\n")
    if args.before_tree is not None and (why := check_tree(args.before_tree)):
        parser.exit(2, f"instructions.py: error: --before-tree: {why}\n")
    if why := unwritable(args.csv):
        parser.exit(2, f"instructions.py: error: --csv: {why}\n")
    if shutil.which("valgrind") is None:
        parser.exit(2, "instructions.py: error: needs valgrind on PATH\n")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.child:
        run_child(args.child[0], int(args.child[1]))
        return 0
    check_args(parser, args)
    try:
        return count_and_write(args)
    except CountFailed as failure:
        print(f"instructions.py: error: {failure} (nothing written)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("instructions.py: interrupted (nothing written)", file=sys.stderr)
        return 130


def count_and_write(args: argparse.Namespace) -> int:
    trees: list[tuple[str, Path | None]] = [("after", None)]
    if args.before_tree is not None:
        trees.insert(0, ("before", args.before_tree))
    jobs = [
        (label, tree, case, n)
        for label, tree in trees
        for case in args.cases
        for n in (SETUP_REQUESTS, DEFAULT_REQUESTS[case])
    ]
    counted = count_all(jobs, os.cpu_count() or 1)
    counts = dict(zip([(label, case, n) for label, _t, case, n in jobs], counted, strict=True))
    commits = {
        label: tree_commit((tree if tree is not None else HERE.parent) / "simulator")
        for label, tree in trees
    }
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M")
    rows = []
    for case in args.cases:
        n = DEFAULT_REQUESTS[case]
        row = {"case": case, "requests": n, "when_utc": when}
        for label, _tree in trees:
            row[label] = per_request(
                counts[(label, case, n)], counts[(label, case, SETUP_REQUESTS)], n
            )
            row[f"{label}_commit"] = commits[label]
        rows.append(row)
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    with args.csv.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    print("| case | requests | before instr/request | after instr/request | change |")
    print("|---|---:|---:|---:|---:|")
    for row in rows:
        before = row.get("before")
        change = f"{100 * (row['after'] / before - 1):+.1f} %" if before else "–"
        before_text = f"{before:,.0f}" if before else "–"
        print(
            f"| {row['case']} | {row['requests']:,} | {before_text} | {row['after']:,.0f} "
            f"| {change} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
