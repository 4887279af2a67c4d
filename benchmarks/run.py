"""The speed suite (issue #9): fixed cases, simulated requests per wall second, peak memory.

Each case runs in a fresh Python process through the public entry point `simulator.simulate`
(workload generated as a stream, results summarised), so a case's wall time is what a study
pays per run and its peak memory is the process's peak resident set size (imports included).

    .venv/bin/python benchmarks/run.py                      # every case, median of --repeat
    .venv/bin/python benchmarks/run.py --cases a c --repeat 5
    .venv/bin/python benchmarks/run.py --baseline benchmarks/baseline.csv \
        --markdown docs/performance.md                      # rewrite the docs table
    git worktree add /tmp/before c40218d
    .venv/bin/python benchmarks/run.py --before-tree /tmp/before \
        --baseline benchmarks/baseline.csv --markdown docs/performance.md
                                        # before and after, alternating run by run
    .venv/bin/python benchmarks/run.py --whole-process --blis-mar PATH/TO/mar/blis \
        --blis-current PATH/TO/current/blis --pairs 5
                                        # servesim and BLIS as whole processes, A B A B
                                        # (benchmarks/whole_process.py)

Results go to a CSV (--csv, default benchmarks/results.csv). With --baseline (a CSV written
by an earlier run, e.g. on the commit before a speed change) the markdown table shows both.
Running some cases replaces their rows in the CSVs (and the table) and keeps the others; each
row names the commit it measured (`-dirty` when the tree had uncommitted changes) and when.

Options of the other mode are refused (--repeat, --csv, --baseline, --before-tree with
--whole-process; --pairs, --scale, --out, --startup-runs, --no-parity, --servesim and the BLIS
paths without it), and so are output files that cannot be written, before anything runs.
Exit status: 0 when everything ran (and, with --whole-process, every check held); 1 when a run
failed (a one-line reason; nothing is written in-process, --whole-process writes what finished
and marks it incomplete) or a --whole-process check did not hold (the replay parity did not
agree or was not checked, or a case's completed counts differ): the report is written; 2 for
a wrong option; 130 on Ctrl-C (nothing written).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

MODEL = "meta-llama/llama-3.1-8b-instruct"
# One H100 serving Llama-3.1-8B with 512 -> 128-token requests saturates at about 60.8
# completed requests per second (measured by simulating it at 100 and 200 req/s); 70 % load
# is 0.7 x that.
SATURATION_REQ_PER_S = 60.8
LOAD = 0.7


def _fixed_512_128(rate: float, num_requests: int) -> dict:
    return {
        "arrival": "poisson",
        "rate": rate,
        "num_requests": num_requests,
        "prompt_tokens": {"distribution": "constant", "value": 512},
        "output_tokens": {"distribution": "constant", "value": 128},
    }


def _standard(num_requests: int) -> dict:
    return {
        "seed": 42,
        "model": MODEL,
        "hardware": "H100",
        "tp": 1,
        "latency": {"model": "roofline"},  # BLIS's backend: like-for-like with its binary
        "engine": {"total_kv_blocks": 1_000_000},
        "workload": _fixed_512_128(42, num_requests),
    }


# The weighted policy's default scorers, given explicitly where a case names them.
PREFIX_SCORERS = "prefix-affinity:3,queue-depth:2,kv-utilization:2"


def _weighted_cluster(instances: int, num_requests: int, scorers: str | None = None) -> dict:
    """The H100's own KV capacity (defaults.yaml: 29,205 blocks), not (a)'s 1,000,000: a
    cache's index costs memory per block, and eight million-block caches would dominate."""
    routing = {"policy": "weighted"} | ({"scorers": scorers} if scorers else {})
    return {
        "seed": 42,
        "model": MODEL,
        "hardware": "H100",
        "tp": 1,
        "latency": {"model": "roofline"},  # BLIS's backend: like-for-like with its binary
        "cluster": {"num_instances": instances, "routing": routing},
        "workload": _fixed_512_128(LOAD * SATURATION_REQ_PER_S * instances, num_requests),
    }


def _pd(num_requests: int) -> dict:
    return {
        "seed": 42,
        "model": MODEL,
        "hardware": "H100",
        "tp": 1,
        "latency": {"model": "roofline"},  # BLIS's backend: like-for-like with its binary
        "cluster": {
            "num_instances": 4,
            "pd": {"prefill_instances": 2, "decode_instances": 2, "decider": "always"},
        },
        "workload": {
            "rate": 20,
            "num_requests": num_requests,
            "prompt_tokens": {"mean": 2000, "stdev": 500, "min": 100, "max": 4000},
            "output_tokens": {"mean": 200, "stdev": 50, "min": 10, "max": 500},
        },
    }


def _pd_as_blis(num_requests: int) -> dict:
    """Case (d) as the whole-process comparison runs it against BLIS's binaries: no link
    contention (BLIS's model) and the model's own KV bytes per token (131,072 for
    Llama-3.1-8B: 32 layers x 8 KV heads x 128 dims x 2 (K and V) x 2 bytes)."""
    scenario = _pd(num_requests)
    scenario["cluster"]["pd"].update(kv_bytes_per_token=131_072, transfer_contention=False)
    scenario["engine"] = {"total_kv_blocks": 29_205}  # the H100's own, as passed to BLIS
    return scenario


def _chatbot_prefix(num_requests: int) -> dict:
    """BLIS's chatbot lengths behind a 512-token system prompt shared by all, 4 instances."""
    return {
        "seed": 42,
        "model": MODEL,
        "hardware": "H100",
        "tp": 1,
        "latency": {"model": "roofline"},  # BLIS's backend: like-for-like with its binary
        "engine": {"enable_prefix_caching": True},
        "cluster": {
            "num_instances": 4,
            "routing": {
                "policy": "weighted",
                "scorers": "prefix-affinity:3,queue-depth:2,kv-utilization:2",
            },
        },
        "workload": {
            "version": "2",
            "aggregate_rate": 120,
            "num_requests": num_requests,
            "clients": [
                {
                    "id": "chat",
                    "rate_fraction": 1,
                    "prefix_group": "system",
                    "prefix_length": 512,
                    "arrival": {"process": "poisson"},
                    "input_distribution": {
                        "type": "gaussian",
                        "params": {"mean": 256, "std_dev": 100, "min": 2, "max": 800},
                    },
                    "output_distribution": {
                        "type": "gaussian",
                        "params": {"mean": 256, "std_dev": 100, "min": 1, "max": 1024},
                    },
                }
            ],
        },
    }


def _default_model(num_requests: int) -> dict:
    """Case (a) as a user runs it without choosing: servesim's default step-time model
    (`physics`, the shipped H100 fit for the newest vLLM version) instead of BLIS's roofline."""
    scenario = _standard(num_requests)
    del scenario["latency"]
    return scenario


# name -> (description, scenario, default repeats)
CASES: dict[str, tuple[str, dict, int]] = {
    "a": ("standard: 1 instance, Poisson 42 req/s, 512->128, 10k requests", _standard(10_000), 3),
    "b": ("standard with 100k requests", _standard(100_000), 1),
    "c": ("8 instances, weighted routing, 70% load, 50k requests", _weighted_cluster(8, 50_000), 3),
    "d": ("PD 2 prefill + 2 decode, 20k requests", _pd(20_000), 3),
    "e": (
        "chatbot, shared 512-token prefix, 4 instances, 50k requests",
        _chatbot_prefix(50_000),
        3,
    ),
    "f": ("1M requests streamed, 8 instances at 70% load", _weighted_cluster(8, 1_000_000), 1),
    "g": (
        "64 instances, weighted routing with prefix scorers, 70% load, 1M requests",
        _weighted_cluster(64, 1_000_000, PREFIX_SCORERS),
        1,
    ),
    "h": ("standard with the default latency model (physics)", _default_model(10_000), 3),
    "i": ("PD as the whole-process case (d): no link contention, 20k", _pd_as_blis(20_000), 3),
}
# Case (g)'s cost per request is judged against case (c)'s (issue 30: within 1.5x).
COST_RELATIVE_TO = {"g": "c"}

CSV_FIELDS = [
    "case",
    "description",
    "requests",
    "completed",
    "wall_s",
    "requests_per_wall_s",
    "requests_per_cpu_s",
    "peak_rss_mib",
    "runs_requests_per_wall_s",
    "commit",
    "when_utc",
]


def run_case_here(name: str) -> dict:
    """Run one case in this process; the parent reads the JSON line this prints."""
    import resource

    import simulator

    scenario = CASES[name][1]
    start = time.perf_counter()
    cpu_start = time.process_time()
    result = simulator.simulate(scenario)
    summary = result.summary
    wall_s = time.perf_counter() - start
    cpu_s = time.process_time() - cpu_start
    requests = scenario["workload"]["num_requests"]
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {
        "case": name,
        "requests": requests,
        "completed": summary["completed_requests"],
        "wall_s": round(wall_s, 3),
        "requests_per_wall_s": round(requests / wall_s, 1),
        "cpu_s": round(cpu_s, 3),
        "requests_per_cpu_s": round(requests / cpu_s, 1),
        "peak_rss_mib": round(peak_kib / 1024, 1),
        "simulator": os.path.dirname(simulator.__file__),
    }


def tree_env(tree: Path | None) -> dict[str, str]:
    """The environment of a child process that imports servesim from `tree` (another
    checkout), or from the checkout this script is in when None: first on PYTHONPATH either
    way, as the virtual environment's editable install may point at another worktree."""
    env = dict(os.environ)
    source = tree if tree is not None else HERE.parent
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(source), env.get("PYTHONPATH")]))
    return env


def compile_tree(tree: Path | None = None) -> None:
    """Compile `tree`'s (or this checkout's) `simulator` package to bytecode before timing, as
    `pip install` does for a user. A case's timed region imports the modules `simulate` loads
    lazily; from a fresh export or worktree, or with PYTHONDONTWRITEBYTECODE set (so nothing
    is ever written), Python would compile them from source inside it, every run, and a
    before tree without bytecode would look slower than it is (case (a) by about 8 %)."""
    from whole_process import compile_package

    package = (tree if tree is not None else HERE.parent) / "simulator"
    compile_package(sys.executable, package, tree_env(tree))


class ChildFailed(RuntimeError):
    """A case's process failed, or imported servesim from the wrong tree; one-line message."""


def check_tree(tree: Path) -> str | None:
    """Why `tree` (a --before-tree) is not a servesim checkout, or None when it is one."""
    if not tree.is_dir():
        return f"no such folder: {tree}"
    if not (tree / "simulator" / "__init__.py").is_file():
        return f"no simulator/ package in {tree}"
    return None


def check_imported(package_dir: str, tree: Path | None) -> str | None:
    """Why a child that imported `simulator` from `package_dir` did not measure `tree` (this
    checkout when None), or None when it did."""
    expected = ((tree if tree is not None else HERE.parent) / "simulator").resolve()
    if Path(package_dir).resolve() != expected:
        return f"imported simulator from {package_dir}, not {expected}"
    return None


def run_child(name: str, tree: Path | None = None) -> dict:
    """One run of case `name` in a fresh process, on this checkout or on `tree`; ChildFailed
    (with the child's last error line) when it fails."""
    label = f"({name}) on {tree}" if tree is not None else f"({name})"
    out = subprocess.run(
        [sys.executable, __file__, "--child", name],
        capture_output=True,
        text=True,
        env=tree_env(tree),
    )
    if out.returncode != 0:
        reason = _whole_process().last_error_line(out.stderr)
        raise ChildFailed(f"{label} failed (exit {out.returncode}): {reason}")
    row = json.loads(out.stdout.strip().splitlines()[-1])
    if why := check_imported(row["simulator"], tree):
        raise ChildFailed(f"{label} {why}")
    return row


def run_case(name: str, repeat: int) -> dict:
    return summarize_runs(name, [run_child(name) for _ in range(repeat)])


def run_case_against(name: str, repeat: int, before_tree: Path) -> tuple[dict, dict]:
    """Runs alternating between `before_tree` and this checkout, so that both see the same
    machine load: (before row, after row)."""
    before, after = [], []
    for _ in range(repeat):
        before.append(run_child(name, before_tree))
        after.append(run_child(name))
    return summarize_runs(name, before), summarize_runs(name, after)


def summarize_runs(name: str, runs: list[dict]) -> dict:
    speeds = [r["requests_per_wall_s"] for r in runs]
    median = statistics.median(speeds)
    row = dict(runs[0])
    row["description"] = CASES[name][0]
    row["requests_per_wall_s"] = median
    row["requests_per_cpu_s"] = statistics.median(r["requests_per_cpu_s"] for r in runs)
    row["wall_s"] = round(row["requests"] / median, 3)
    row["peak_rss_mib"] = max(r["peak_rss_mib"] for r in runs)
    row["runs_requests_per_wall_s"] = " ".join(str(s) for s in speeds)
    row["commit"] = _commit(row.pop("simulator"))
    row["when_utc"] = _now_utc()
    return row


def _commit(package_dir: str) -> str:
    """The measured tree's commit, `-dirty` when edited: as --whole-process names it."""
    return _whole_process().tree_commit(package_dir)


def _now_utc() -> str:
    from datetime import UTC, datetime

    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M")


def write_csv(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def read_csv(path: Path) -> dict[str, dict]:
    with path.open() as f:
        return {row["case"]: row for row in csv.DictReader(f)}


def merge_rows(rows: list[dict], path: Path) -> list[dict]:
    """`rows` in place of the same cases' rows in the CSV at `path` (if any), the other
    cases' rows kept, in case order: re-measuring some cases keeps the rest of the table."""
    merged = read_csv(path) if path.exists() else {}
    merged.update((row["case"], row) for row in rows)
    return [merged[name] for name in CASES if name in merged]


def _measured(row: dict) -> str:
    """A row's commit and, when the CSV has it, its date: "`3c062f7` 2026-12-05"."""
    commit = row.get("commit") or "?"
    when = (row.get("when_utc") or "").split(" ")[0]
    return f"`{commit}` {when}".rstrip()


def markdown_table(
    rows: list[dict], baseline: dict[str, dict] | None, note: str | None = None
) -> str:
    """The docs table: one line per case, before/after when a baseline is given, and the
    commit (and date) each side measured; `note` goes under it."""
    baseline = baseline or {}
    head = (
        "| case | requests | before req/s | after req/s | speed-up | before req/CPU s "
        "| after req/CPU s | before peak MiB | after peak MiB | measured: before; after |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    )
    lines = [head]
    for row in rows:
        before = baseline.get(row["case"], {})

        def figure(source: dict, key: str) -> str:
            value = source.get(key)
            return f"{float(value):,.0f}" if value not in (None, "") else "–"

        old_speed = before.get("requests_per_wall_s")
        ratio = f"{float(row['requests_per_wall_s']) / float(old_speed):.1f}x" if old_speed else "–"
        measured = f"{_measured(before) if before else '–'}; {_measured(row)}"
        lines.append(
            f"| {row['case']} | {int(row['requests']):,} "
            f"| {figure(before, 'requests_per_wall_s')} | {figure(row, 'requests_per_wall_s')} "
            f"| {ratio} | {figure(before, 'requests_per_cpu_s')} "
            f"| {figure(row, 'requests_per_cpu_s')} | {figure(before, 'peak_rss_mib')} "
            f"| {figure(row, 'peak_rss_mib')} | {measured} |"
        )
    if note:
        lines += ["", note]
    return "\n".join(lines)


def baseline_note(baseline: Path, before_tree: Path | None) -> str | None:
    """Said under the table when the before figures were not measured in this run, run by run
    with the after figures (--before-tree does that)."""
    if before_tree is not None:
        return None
    return (
        f"Before figures: `{baseline.name}` as it stood, not measured alternately with the "
        "after figures (the machine's speed moves between spells; `--before-tree` alternates)."
    )


TABLE_BEGIN = "<!-- benchmarks/run.py table: begin -->"
TABLE_END = "<!-- benchmarks/run.py table: end -->"


def update_markdown(path: Path, table: str, begin: str = TABLE_BEGIN, end: str = TABLE_END) -> None:
    """Replace the generated table between the markers (or append it) in `path`."""
    text = path.read_text() if path.exists() else ""
    block = f"{begin}\n{table}\n{end}"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        tail = rest.split(end, 1)[1]
        text = head + block + tail
    else:
        text = text + ("\n" if text else "") + block + "\n"
    path.write_text(text)


def relative_costs(rows: list[dict]) -> list[str]:
    """Cost per request (CPU µs / request) of each case in COST_RELATIVE_TO against its
    reference case, both from `rows`: this run's rows only (never a reference row kept in
    the CSV from another run, another spell of the machine). A case run without its
    reference gets a line saying how to have the ratio."""
    by_case = {row["case"]: row for row in rows}
    lines = []
    for case, reference in COST_RELATIVE_TO.items():
        if case not in by_case:
            continue
        cost_us = 1e6 / float(by_case[case]["requests_per_cpu_s"])
        if reference not in by_case:
            lines.append(
                f"({case}) {cost_us:.0f} CPU µs/request; no ratio to ({reference}): it was not "
                f"run this time (run --cases {reference} {case} for it)"
            )
            continue
        reference_us = 1e6 / float(by_case[reference]["requests_per_cpu_s"])
        lines.append(
            f"({case}) {cost_us:.0f} CPU µs/request, ({reference}) {reference_us:.0f}, both "
            f"this run: {cost_us / reference_us:.2f}x"
        )
    return lines


def _print_row(row: dict, label: str) -> None:
    print(
        f"({row['case']}) {row['requests']:>9,} requests  {row['requests_per_wall_s']:>9,.0f} req/s"
        f"  peak {row['peak_rss_mib']:>7,.0f} MiB  [{row['runs_requests_per_wall_s']}] {label}",
        flush=True,
    )


WHOLE_PROCESS_HELP = """whole processes:
  run.py --whole-process --blis-mar PATH [--blis-current PATH] [--pairs 5] [--cases a c d]
  Each PATH is a BLIS binary, run in its own folder (it reads defaults.yaml and
  hardware_config.json there). The default --out, benchmarks/whole_process.json, is the
  committed report the docs' table comes from: a run with --scale other than 1 needs --out."""

DEFAULT_OUT = HERE / "whole_process.json"
DEFAULT_CSV = HERE / "results.csv"
WHOLE_DEFAULTS = {"pairs": 5, "startup_runs": 10, "scale": 1.0}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="run.py",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=WHOLE_PROCESS_HELP,
    )
    parser.add_argument(
        "--cases",
        nargs="*",
        default=None,
        choices=list(CASES),
        help="cases to run (default: all; with --whole-process: a c d)",
    )
    parser.add_argument(
        "--repeat", type=int, default=None, help="runs per case (median; default per case)"
    )
    parser.add_argument(
        "--csv", type=Path, default=None, help="results CSV (default benchmarks/results.csv)"
    )
    parser.add_argument("--baseline", type=Path, default=None, help="CSV of an earlier run")
    parser.add_argument("--markdown", type=Path, default=None, help="rewrite the table here")
    parser.add_argument(
        "--before-tree",
        type=Path,
        default=None,
        help="another checkout (e.g. a git worktree of an older commit): run each case on it "
        "and on this one alternately, write its figures to --baseline and compare",
    )
    whole = parser.add_argument_group("whole processes, side by side with BLIS (--whole-process)")
    whole.add_argument(
        "--whole-process",
        action="store_true",
        help="time servesim and BLIS's binaries as whole processes, alternating",
    )
    whole.add_argument(
        "--blis-mar", type=Path, default=None, metavar="PATH", help="BLIS-Mar binary (required)"
    )
    whole.add_argument(
        "--blis-current", type=Path, default=None, metavar="PATH", help="current BLIS binary"
    )
    whole.add_argument("--pairs", type=int, default=None, help="rounds per case (default 5)")
    whole.add_argument(
        "--out",
        type=Path,
        default=None,
        help="report file: JSON here, CSV beside it (default benchmarks/whole_process.json, "
        "only with --scale 1)",
    )
    whole.add_argument(
        "--servesim",
        type=Path,
        default=None,
        metavar="PATH",
        help="another servesim executable, timed with the simulator package it imports itself "
        "(default: the console script next to this Python, importing this checkout)",
    )
    whole.add_argument(
        "--startup-runs",
        type=int,
        default=None,
        help="runs of `--help` and of a 1-request run per program (median; default 10; 0 = skip)",
    )
    whole.add_argument(
        "--no-parity", action="store_true", help="skip the replay parity check against BLIS-Mar"
    )
    whole.add_argument(
        "--scale",
        type=float,
        default=None,
        help="multiply the cases' request counts (trials; needs --out unless 1)",
    )
    return parser


WHOLE_TABLE_BEGIN = "<!-- benchmarks/run.py --whole-process table: begin -->"
WHOLE_TABLE_END = "<!-- benchmarks/run.py --whole-process table: end -->"


def _fail(parser: argparse.ArgumentParser, message: str) -> None:
    """Exit with a one-line error (no usage block)."""
    parser.exit(2, f"{parser.prog}: error: {message}\n")


def unwritable(path: Path) -> str | None:
    """Why a file cannot be written at `path` (its folders are created as needed), or None."""
    if path.is_dir():
        return f"{path} is a folder"
    if path.exists():
        return None if os.access(path, os.W_OK) else f"{path} is not writable"
    folder = path.parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        return f"{folder} is not a folder"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"cannot create files in {folder}"
    return None


def _check_outputs(parser: argparse.ArgumentParser, outputs: list[tuple[str, Path]]) -> None:
    for flag, path in outputs:
        if why := unwritable(path):
            _fail(parser, f"{flag}: {why}")


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Option combinations, values, output files and the BLIS binaries' paths, before anything
    runs; exits with a one-line error naming the option (status 2)."""
    if args.cases is not None and not args.cases:
        _fail(parser, "--cases needs at least one case name")
    if args.repeat is not None and args.repeat < 1:
        _fail(parser, f"--repeat must be at least 1 (got {args.repeat})")
    whole_only = [
        flag
        for flag, value in (
            ("--blis-mar", args.blis_mar),
            ("--blis-current", args.blis_current),
            ("--servesim", args.servesim),
            ("--pairs", args.pairs),
            ("--startup-runs", args.startup_runs),
            ("--no-parity", args.no_parity or None),
            ("--scale", args.scale),
            ("--out", args.out),
        )
        if value is not None
    ]
    if not args.whole_process:
        if whole_only:
            _fail(parser, f"{whole_only[0]} needs --whole-process")
        if args.cases is None:
            args.cases = list(CASES)
        if args.csv is None:
            args.csv = DEFAULT_CSV
        outputs = [("--csv", args.csv)]
        if args.before_tree is not None:
            if why := check_tree(args.before_tree):
                _fail(parser, f"--before-tree: {why}")
            if args.baseline is None:
                _fail(parser, "--before-tree needs --baseline (the CSV its figures go to)")
            outputs.append(("--baseline", args.baseline))
        elif args.baseline is not None and not args.baseline.is_file():
            _fail(parser, f"--baseline: no such file: {args.baseline}")
        if args.markdown is not None:
            outputs.append(("--markdown", args.markdown))
        _check_outputs(parser, outputs)
        return
    for flag, value in (
        ("--repeat", args.repeat),
        ("--csv", args.csv),
        ("--baseline", args.baseline),
        ("--before-tree", args.before_tree),
    ):
        if value is not None:
            _fail(parser, f"{flag} is for the in-process suite; --whole-process does not take it")
    if args.blis_mar is None:
        _fail(parser, "--whole-process needs --blis-mar PATH (the BLIS-Mar binary)")
    wp = _whole_process()
    for flag, path in (
        ("--blis-mar", args.blis_mar),
        ("--blis-current", args.blis_current),
        ("--servesim", args.servesim),
    ):
        if path is not None and (why := wp.check_binary(path)):
            _fail(parser, f"{flag}: {why}")
    for name, value in WHOLE_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.pairs < 1:
        _fail(parser, "--pairs must be at least 1")
    if args.startup_runs < 0:
        _fail(parser, "--startup-runs must be 0 or more")
    if not args.scale > 0:
        _fail(parser, "--scale must be positive")
    if args.out is None:
        if args.scale != 1:
            _fail(
                parser,
                f"--scale {args.scale:g} needs --out: the default {DEFAULT_OUT.name} is the "
                "full-size report the docs' table comes from",
            )
        args.out = DEFAULT_OUT
    if args.cases is None:
        args.cases = list(wp.DEFAULT_CASES)
    other = [c for c in args.cases if c not in wp.CASES]
    if other:
        _fail(
            parser,
            f"--whole-process runs cases {', '.join(wp.CASES)}; not {', '.join(other)}",
        )
    outputs = [("--out", args.out.with_suffix(".json")), ("--out", args.out.with_suffix(".csv"))]
    if args.markdown is not None:
        outputs.append(("--markdown", args.markdown))
    _check_outputs(parser, outputs)


def _whole_process():
    """benchmarks/whole_process.py (this script's helper), imported from this folder."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import whole_process

    return whole_process


def main_whole_process(args: argparse.Namespace) -> int:
    """The --whole-process run; its exit status (see the module's docstring)."""
    wp = _whole_process()
    programs = [wp.servesim_program(args.servesim), wp.blis_program(wp.MAR, args.blis_mar)]
    if args.blis_current is not None:
        programs.append(wp.blis_program(wp.CURRENT, args.blis_current))

    def log(line: str) -> None:
        print(line, flush=True)

    try:
        report = wp.run(
            programs,
            args.cases,
            args.pairs,
            args.startup_runs,
            parity=not args.no_parity,
            scale=args.scale,
            log=log,
        )
    except wp.ProgramFailed as failure:  # before anything was timed
        print(f"run.py: error: {failure} (nothing written)", file=sys.stderr)
        return 1
    json_path, csv_path = wp.write_outputs(report, args.out)
    wp.print_report(report, log)
    if args.markdown and not report.get("incomplete"):
        table = wp.markdown_table(report) + "\n\n" + wp.caption(report)
        update_markdown(args.markdown, table, WHOLE_TABLE_BEGIN, WHOLE_TABLE_END)
    print(f"\nJSON: {json_path}, CSV: {csv_path}")
    problems = wp.failed_checks(report)
    if report.get("incomplete"):
        finished = ", ".join(f"({c['case']})" for c in report["cases"]) or "no case"
        print(
            f"run.py: error: {report['incomplete']}; {finished} finished, written to "
            f"{json_path} marked incomplete"
            + (f"; {args.markdown} left as it was" if args.markdown else ""),
            file=sys.stderr,
        )
        return 1
    if problems:
        print(f"run.py: check failed: {'; '.join(problems)}", file=sys.stderr)
        return 1
    return 0


def main_in_process(args: argparse.Namespace) -> int:
    rows, before_rows = [], []
    compile_tree()
    if args.before_tree is not None:
        compile_tree(args.before_tree)
    for name in args.cases:
        repeat = args.repeat or CASES[name][2]
        if args.before_tree is not None:
            before, row = run_case_against(name, repeat, args.before_tree)
            before_rows.append(before)
            _print_row(before, f"before {before['commit']}")
        else:
            row = run_case(name, repeat)
        rows.append(row)
        _print_row(row, "")
    for line in relative_costs(rows):
        print(line)
    merged = merge_rows(rows, args.csv)
    write_csv(merged, args.csv)
    if args.before_tree is not None:
        write_csv(merge_rows(before_rows, args.baseline), args.baseline)
    baseline = read_csv(args.baseline) if args.baseline else None
    note = baseline_note(args.baseline, args.before_tree) if args.baseline else None
    table = markdown_table(merged, baseline, note)
    if args.markdown:
        update_markdown(args.markdown, table)
    print(f"\n{platform.python_implementation()} {platform.python_version()}, CSV: {args.csv}")
    print(table)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(run_case_here(args.child)))
        return 0
    check_args(parser, args)
    try:
        if args.whole_process:
            return main_whole_process(args)
        return main_in_process(args)
    except ChildFailed as failure:
        print(f"run.py: error: {failure} (nothing written)", file=sys.stderr)
        return 1
    except _whole_process().ProgramFailed as failure:  # compiling a tree's bytecode
        print(f"run.py: error: {failure} (nothing written)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("run.py: interrupted (nothing written)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
