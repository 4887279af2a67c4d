"""Instructions executed per simulated request, counted by valgrind: for A/B comparisons of
small changes on a machine whose wall-clock figures vary more than the change.

The count is deterministic (the same commit gives the same figure to within a few parts in
ten thousand) but blind to memory latency, so a change that saves cache misses rather than
instructions does not show here; `run.py` remains the measure of speed.

    .venv/bin/python benchmarks/instructions.py                       # cases a c d e
    .venv/bin/python benchmarks/instructions.py --cases d --before-tree /tmp/before

Each case runs twice under callgrind, with its benchmark scenario cut to a few hundred or
thousand requests and with 10 requests (imports and set-up, about 3.6 G instructions), and
reports the difference per extra request. Needs valgrind; runs as many processes at once as
there are CPUs; a run takes a minute or two.
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import CASES, HERE, tree_env  # noqa: E402 - the suite's scenarios, one definition

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


def count(case: str, requests: int, tree: Path | None) -> int:
    """Instructions of one process simulating `case` cut to `requests` requests."""
    out = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            __file__,
            "--child",
            case,
            str(requests),
        ],
        check=True,
        capture_output=True,
        text=True,
        # One hash seed for every count: string hashing's seed moves dict and set layouts,
        # and with them about 0.8 % of a count between otherwise identical runs.
        env={**tree_env(tree), "PYTHONHASHSEED": "0"},
    )
    return collected_instructions(out.stderr)


def run_child(case: str, requests: int) -> None:
    import simulator

    scenario = copy.deepcopy(CASES[case][1])
    scenario["workload"]["num_requests"] = requests
    simulator.simulate(scenario)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="*", default=["a", "c", "d", "e"], choices=list(CASES))
    parser.add_argument("--before-tree", type=Path, default=None, help="another checkout")
    parser.add_argument("--csv", type=Path, default=HERE / "instructions.csv")
    parser.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run_child(args.child[0], int(args.child[1]))
        return
    if shutil.which("valgrind") is None:
        parser.exit(2, "benchmarks/instructions.py: needs valgrind on PATH\n")
    trees: list[tuple[str, Path | None]] = [("after", None)]
    if args.before_tree is not None:
        trees.insert(0, ("before", args.before_tree))
    jobs = [
        (label, tree, case, n)
        for label, tree in trees
        for case in args.cases
        for n in (SETUP_REQUESTS, DEFAULT_REQUESTS[case])
    ]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        counts = dict(
            zip(
                [(label, case, n) for label, _t, case, n in jobs],
                pool.map(lambda job: count(job[2], job[3], job[1]), jobs),
                strict=True,
            )
        )
    rows = []
    for case in args.cases:
        n = DEFAULT_REQUESTS[case]
        row = {"case": case, "requests": n}
        for label, _tree in trees:
            row[label] = per_request(
                counts[(label, case, n)], counts[(label, case, SETUP_REQUESTS)], n
            )
        rows.append(row)
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    with args.csv.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["case", "requests", "before", "after"])
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


if __name__ == "__main__":
    main()
