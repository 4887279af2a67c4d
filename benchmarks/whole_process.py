"""Speed as users feel it (issue 30): servesim and BLIS's Go binaries timed as whole processes.

`benchmarks/run.py --whole-process --blis-mar PATH [--blis-current PATH]` runs each case's
command line — the same v2 workload spec (Poisson, seeded) and the same deployment flags for
every program — as a subprocess, the programs taking turns (servesim, BLIS-Mar, BLIS-current,
servesim, …) so that all of them see the same machine load, and reports per program the
median and range of the wall clock of the whole process (start-up, workload generation,
simulation, the printed summary), requests per second (requests / median wall) and servesim's
speed relative to each BLIS build. Also measured: `servesim --help` and a 1-request
`servesim run` (start-up), and, on the way, that servesim reproduces BLIS-Mar request by
request when replaying BLIS's own trace.

Before anything is timed, servesim's package is compiled to bytecode once
(`python -m compileall -q`, with PYTHONDONTWRITEBYTECODE unset for that one process), as
`pip install` does for a user. Without it, on a machine that sets PYTHONDONTWRITEBYTECODE, every
servesim process would compile every module whose cached bytecode is stale or missing, and
its wall would include that compilation (0.5–0.8 s of case (a)'s 2.1–2.4 s when measured).

servesim is this checkout's (the console script next to this Python, the checkout first on
PYTHONPATH), or with run.py's --servesim another executable with the package it imports
itself; the report names the package and its commit. The report records the request-count
`scale`; a program that fails stops the run, and the report keeps what finished, marked
`incomplete` (`failed_checks` lists that and any check that did not hold).

This module is run.py's helper (running it on its own only says so); it holds no path to any
BLIS binary: they are arguments.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

MODEL = "meta-llama/llama-3.1-8b-instruct"
# The H100's own KV capacity for Llama-3.1-8B (BLIS-Mar's defaults.yaml: 29,205 blocks), for
# every case and program: the current BLIS slows down sharply with 1,000,000 blocks (the
# in-process case (a)'s capacity), and no case here comes near 29,205 blocks in use, so the
# simulated runs are the same either way.
KV_BLOCKS = 29_205
# Llama-3.1-8B's KV bytes per token (32 layers x 2 x 8 KV heads x 128 x 2 bytes, TP 1):
# servesim's and the current BLIS's default, derived from the model; BLIS-Mar's default is 512.
KV_BYTES_PER_TOKEN = 131_072
SEED = 42
WEIGHTED_SCORERS = "prefix-affinity:3,queue-depth:2,kv-utilization:2"  # servesim's = BLIS-Mar's
SATURATION_REQ_PER_S = 60.8  # as run.py: one H100, 512 -> 128 tokens
LOAD = 0.7

SERVESIM, MAR, CURRENT = "servesim", "BLIS-Mar", "BLIS-current"
PROGRAMS = (SERVESIM, MAR, CURRENT)
TIME_BIN = Path("/usr/bin/time")  # GNU time: the child's peak RSS (-f %M); omitted if absent


def bundled_model_config(model: str = MODEL) -> Path:
    """servesim's bundled config.json folder for `model`, handed to BLIS as
    --model-config-folder so that both read the same file (and BLIS-Mar needs no network)."""
    return ROOT / "simulator" / "catalog" / "data" / "model_configs" / model.split("/")[-1].lower()


def _client(rate_fraction: float, prompt: dict, output: dict) -> dict:
    return {
        "id": "c0",
        "rate_fraction": rate_fraction,
        "arrival": {"process": "poisson"},
        "input_distribution": prompt,
        "output_distribution": output,
    }


def workload_spec(rate: float, num_requests: int, prompt: dict, output: dict) -> dict:
    """A BLIS v2 workload spec: one Poisson client at `rate` req/s, seeded."""
    return {
        "version": "2",
        "seed": SEED,
        "aggregate_rate": rate,
        "num_requests": num_requests,
        "clients": [_client(1, prompt, output)],
    }


def _constant(value: int) -> dict:
    return {"type": "constant", "params": {"value": value}}


def _gaussian(mean: int, std_dev: int, low: int, high: int) -> dict:
    return {
        "type": "gaussian",
        "params": {"mean": mean, "std_dev": std_dev, "min": low, "max": high},
    }


@dataclass(frozen=True)
class Case:
    """One whole-process case: a workload spec and the command-line flags every program gets
    (`flags`), plus per-program extras (`extra`) and per-program reasons not to run it
    (`skip`: program -> why)."""

    name: str
    description: str
    spec: dict
    flags: tuple[str, ...]
    extra: dict[str, tuple[str, ...]] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    skip: dict[str, str] = field(default_factory=dict)

    @property
    def requests(self) -> int:
        return int(self.spec["num_requests"])


def _deployment(*more: str) -> tuple[str, ...]:
    return (
        "--model",
        MODEL,
        "--hardware",
        "H100",
        "--tp",
        "1",
        "--latency-model",
        "roofline",
        "--total-kv-blocks",
        str(KV_BLOCKS),
        "--seed",
        str(SEED),
        *more,
    )


def make_cases(scale: float = 1.0) -> dict[str, Case]:
    """The whole-process cases, named after run.py's in-process cases they follow; `scale`
    shrinks the request counts (for quick trials)."""

    def n(requests: int) -> int:
        return max(1, round(requests * scale))

    fixed = (_constant(512), _constant(128))
    return {
        "a": Case(
            "a",
            "standard: 1 instance, Poisson 42 req/s, 512 -> 128 tokens",
            workload_spec(42, n(10_000), *fixed),
            _deployment(),
        ),
        "c": Case(
            "c",
            "8 instances, weighted routing, 70% load (340.48 req/s), 512 -> 128 tokens",
            workload_spec(LOAD * SATURATION_REQ_PER_S * 8, n(50_000), *fixed),
            _deployment(
                "--num-instances",
                "8",
                "--routing-policy",
                "weighted",
                "--routing-scorers",
                WEIGHTED_SCORERS,
            ),
            notes=(
                "scorers given explicitly (the current BLIS's default profile differs); the "
                "current BLIS's queue-depth scorer reads the queue alone, BLIS-Mar's and "
                "servesim's queue + batch + in flight",
            ),
        ),
        "d": Case(
            "d",
            "PD 2 prefill + 2 decode, decider always, Poisson 20 req/s, 2000±500 -> 200±50 tokens",
            workload_spec(
                20, n(20_000), _gaussian(2000, 500, 100, 4000), _gaussian(200, 50, 10, 500)
            ),
            _deployment(
                "--num-instances",
                "4",
                "--prefill-instances",
                "2",
                "--decode-instances",
                "2",
                "--pd-decider",
                "always",
            ),
            extra={
                # servesim's default is the contended link; BLIS-Mar has none, the current
                # BLIS's is off by default.
                SERVESIM: (
                    "--pd-kv-bytes-per-token",
                    str(KV_BYTES_PER_TOKEN),
                    "--pd-transfer-contention",
                    "off",
                ),
                MAR: ("--pd-kv-bytes-per-token", str(KV_BYTES_PER_TOKEN)),
                # The current BLIS has no --pd-kv-bytes-per-token: it derives the same
                # 131,072 bytes from the model.
            },
            notes=(
                "KV transfer 131,072 bytes/token for all (BLIS-current derives it, it has no "
                "flag), no link contention; the current BLIS routes PD decode-first",
            ),
        ),
    }


CASES = make_cases()
DEFAULT_CASES = ("a", "c", "d")

# Flags each program gets in every case: servesim without its progress bar; the current BLIS
# with fresh load signals (its default is 50 ms stale, BLIS-Mar's and servesim's 0).
PROGRAM_FLAGS: dict[str, tuple[str, ...]] = {
    SERVESIM: ("--quiet",),
    MAR: (),
    CURRENT: ("--snapshot-refresh-interval", "0"),
}


@dataclass(frozen=True)
class Program:
    """How to start one program: argv before the subcommand, working directory, env."""

    name: str
    argv: tuple[str, ...]
    cwd: Path | None = None
    env: dict[str, str] | None = None
    blis: bool = False

    def command(self, *args: str) -> list[str]:
        return [*self.argv, *args]


def servesim_program(executable: Path | None = None) -> Program:
    """servesim as users start it. By default the console script next to this Python,
    importing this checkout first (on PYTHONPATH: the venv's editable install may point at
    another tree). With `executable` (run.py's --servesim), that program as it is, with the
    `simulator` package it imports itself (its own environment's install): nothing is put on
    PYTHONPATH. Which package that is, `compile_bytecode` finds out and the report records."""
    if executable is not None:
        return Program(SERVESIM, (str(executable),))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    script = Path(sys.executable).parent / "servesim"
    if script.exists():
        return Program(SERVESIM, (str(script),), env=env)
    code = "import sys; from simulator.cli import main; sys.exit(main())"
    return Program(SERVESIM, (sys.executable, "-c", code), env=env)


def program_python(program: Program) -> str | None:
    """The Python interpreter that runs `program` (its first argument when that is one, or
    its console script's `#!` line), or None when it is not started by a Python."""
    first = Path(program.argv[0])
    if first.name.startswith("python"):
        return str(first)
    if first.is_file():
        with first.open("rb") as f:
            head = f.readline()
        words = head[2:].decode(errors="replace").split() if head.startswith(b"#!") else []
        if words and Path(words[0]).name.startswith("python"):
            return words[0]
    return None


def compile_bytecode(program: Program) -> Path | None:
    """Compile the `simulator` package `program` imports to bytecode (once, before timing),
    as `pip install` does for a user; returns the package's folder (None for a program that
    is not a Python script). PYTHONDONTWRITEBYTECODE only stops Python from *writing*
    bytecode: a process that has it set still reads up-to-date .pyc files."""
    python = program_python(program)
    if python is None:
        return None
    env = dict(program.env if program.env is not None else os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    # The first entry of sys.path as the program sees it: a console script's own folder
    # (`python -c` would put the working directory there, and find a checkout's package in
    # it that the script does not import).
    first = program.argv[0]
    script_dir = "" if Path(first).name.startswith("python") else str(Path(first).resolve().parent)
    code = (
        "import os, sys\n"
        f"if sys.path and sys.path[0] == '': sys.path[0] = {script_dir!r}\n"
        "import simulator\n"
        "print(os.path.dirname(os.path.abspath(simulator.__file__)))"
    )
    where = subprocess.run(
        [python, "-c", code], capture_output=True, text=True, env=env, cwd=program.cwd
    )
    if where.returncode != 0:
        raise ProgramFailed(
            f"{program.name} ({program.argv[0]}): its Python {python} cannot import simulator: "
            f"{last_error_line(where.stderr)}"
        )
    package = Path(where.stdout.strip().splitlines()[-1])
    compile_package(python, package, env)
    return package


def compile_package(python: str, package: Path, env: dict[str, str]) -> None:
    """Compile the Python package in folder `package` to bytecode with `python`, as `pip
    install` does, PYTHONDONTWRITEBYTECODE unset for that one process (run.py's in-process
    cases use it too)."""
    env = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    out = subprocess.run(
        [python, "-m", "compileall", "-q", str(package)], capture_output=True, text=True, env=env
    )
    if out.returncode != 0:
        raise ProgramFailed(
            f"compiling {package} to bytecode failed: {last_error_line(out.stderr + out.stdout)}"
        )


def blis_program(name: str, binary: Path) -> Program:
    """A BLIS binary, run in its own folder: it reads defaults.yaml and hardware_config.json
    from its working directory."""
    binary = binary.resolve()
    return Program(name, (str(binary),), cwd=binary.parent, blis=True)


def check_binary(path: Path) -> str | None:
    """Why `path` cannot be run as a program, or None when it can."""
    if not path.exists():
        return f"no such file: {path}"
    if not path.is_file():
        return f"not a file: {path}"
    if not os.access(path, os.X_OK):
        return f"not executable: {path}"
    return None


def write_spec(case: Case, folder: Path) -> Path:
    """Write the case's v2 workload spec as YAML; the same file goes to every program."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{case.name}.workload.yaml"
    path.write_text(yaml.safe_dump(case.spec, sort_keys=False))
    return path


def program_args(case: Case, program: Program, spec: Path) -> list[str]:
    """The `run` subcommand's arguments for `program` in `case`."""
    args = ["run", *case.flags, "--workload-spec", str(spec)]
    args += case.extra.get(program.name, ())
    args += PROGRAM_FLAGS.get(program.name, ())
    if program.blis:
        args += ["--model-config-folder", str(bundled_model_config())]
    return args


def run_flags_of(program: Program) -> set[str] | None:
    """The flags `program run -h` lists, or None when it lists none (then nothing is
    checked)."""
    try:
        out = subprocess.run(
            program.command("run", "-h"),
            cwd=program.cwd,
            env=program.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    words = (out.stdout + out.stderr).replace("=", " ").replace(",", " ").split()
    flags = {w for w in words if w.startswith("--") and len(w) > 2}
    return flags or None


def missing_flags(args: Sequence[str], known: set[str] | None) -> list[str]:
    """Flags in `args` that a program's help does not list (none when its help is unknown)."""
    if known is None:
        return []
    return [a for a in args if a.startswith("--") and a not in known]


def alternate(programs: Sequence[str], rounds: int) -> list[tuple[int, str]]:
    """The run order: every program once per round, in the same order each round —
    A B A B … for two programs, A B C A B C … for three."""
    return [(r, p) for r in range(rounds) for p in programs]


@dataclass
class Timing:
    wall_s: float
    peak_rss_kib: int | None
    returncode: int
    stdout: str
    stderr: str


def time_process(program: Program, args: Sequence[str], rss: bool = True) -> Timing:
    """Run `program args` once: wall clock of the whole process (time.perf_counter around
    subprocess.run), and its peak RSS from GNU time when available. Output is captured
    (and only the summary is read)."""
    command = program.command(*args)
    rss_file = None
    if rss and TIME_BIN.exists():
        handle, name = tempfile.mkstemp(prefix="servesim-bench-rss-")
        os.close(handle)
        rss_file = Path(name)
        command = [str(TIME_BIN), "-f", "%M", "-o", str(rss_file), *command]
    try:
        start = time.perf_counter()
        out = subprocess.run(
            command, cwd=program.cwd, env=program.env, capture_output=True, text=True
        )
        wall_s = time.perf_counter() - start
        peak = None
        if rss_file is not None:
            lines = rss_file.read_text().split()
            peak = int(lines[-1]) if lines and lines[-1].isdigit() else None
    finally:
        if rss_file is not None:
            rss_file.unlink(missing_ok=True)
    return Timing(wall_s, peak, out.returncode, out.stdout, out.stderr)


def cluster_summary(stdout: str) -> dict | None:
    """The cluster-wide summary among the JSON objects printed after `=== ... ===` lines
    (BLIS prints one per instance, then the cluster's), or None."""
    decoder = json.JSONDecoder()
    found = None
    for chunk in stdout.split("===")[1:]:
        start = chunk.find("{")
        if start < 0:
            continue
        try:
            obj, _ = decoder.raw_decode(chunk[start:])
        except ValueError:
            continue
        if isinstance(obj, dict) and obj.get("instance_id") == "cluster":
            found = obj
    return found


def wall_stats(walls: Sequence[float], requests: int) -> dict:
    """Median and range of the walls, and requests per second at the median."""
    median = statistics.median(walls)
    return {
        "runs": len(walls),
        "median_wall_s": median,
        "min_wall_s": min(walls),
        "max_wall_s": max(walls),
        "requests_per_s": requests / median if median > 0 else float("inf"),
    }


def speed_ratio(servesim_median_s: float, other_median_s: float) -> float:
    """servesim's speed / the other's: > 1 when servesim is faster."""
    return other_median_s / servesim_median_s


@dataclass
class ProgramRuns:
    walls: list[float] = field(default_factory=list)
    peaks_kib: list[int] = field(default_factory=list)
    completed: list[int | None] = field(default_factory=list)

    def record(self, timing: Timing) -> None:
        self.walls.append(timing.wall_s)
        if timing.peak_rss_kib is not None:
            self.peaks_kib.append(timing.peak_rss_kib)
        summary = cluster_summary(timing.stdout)
        self.completed.append(summary.get("completed_requests") if summary else None)


class ProgramFailed(RuntimeError):
    """A program (or a step before timing) failed; the message is one line."""


def last_error_line(stderr: str) -> str:
    """The last line a failing process wrote that says why (a traceback's last line, say),
    skipping valgrind's own `==pid==` lines; "(no message)" when it wrote nothing."""
    lines = [
        line.strip()
        for line in stderr.splitlines()
        if line.strip() and not (line.startswith("==") and "==" in line[2:12])
    ]
    return lines[-1] if lines else "(no message)"


def run_case(
    case: Case,
    programs: Sequence[Program],
    pairs: int,
    folder: Path,
    log=print,
) -> dict:
    """Time `case` on `programs`, alternating, `pairs` rounds; the case's result record."""
    spec = write_spec(case, folder)
    args = {p.name: program_args(case, p, spec) for p in programs}
    skipped: dict[str, str] = {}
    for p in programs:
        if p.name in case.skip:
            skipped[p.name] = case.skip[p.name]
            continue
        missing = missing_flags(args[p.name], run_flags_of(p)) if p.blis else []
        if missing:
            skipped[p.name] = f"{p.name} has no {', '.join(missing)}"
    active = [p for p in programs if p.name not in skipped]
    for name, why in skipped.items():
        log(f"  ({case.name}) {name} skipped: {why}")
    runs = {p.name: ProgramRuns() for p in active}
    by_name = {p.name: p for p in active}
    for round_index, name in alternate([p.name for p in active], pairs):
        timing = time_process(by_name[name], args[name])
        if timing.returncode != 0:
            raise ProgramFailed(
                f"({case.name}) {name} exited {timing.returncode}: {last_error_line(timing.stderr)}"
            )
        runs[name].record(timing)
        log(f"  ({case.name}) round {round_index + 1}/{pairs} {name:<13} {timing.wall_s:8.3f} s")
    results: dict[str, dict] = {}
    for name, r in runs.items():
        stats = wall_stats(r.walls, case.requests)
        stats["walls_s"] = [round(w, 4) for w in r.walls]
        stats["peak_rss_mib"] = round(max(r.peaks_kib) / 1024, 1) if r.peaks_kib else None
        stats["completed"] = r.completed
        stats["command"] = by_name[name].command(*args[name])
        results[name] = stats
    if SERVESIM in results:
        base = results[SERVESIM]["median_wall_s"]
        for name, stats in results.items():
            if name != SERVESIM:
                stats["servesim_speed_ratio"] = speed_ratio(base, stats["median_wall_s"])
    return {
        "case": case.name,
        "description": case.description,
        "requests": case.requests,
        "workload_spec": case.spec,
        "notes": list(case.notes),
        "skipped": skipped,
        "programs": results,
        "completed_check": completed_check(case.requests, results),
    }


def completed_check(requests: int, results: dict[str, dict]) -> str:
    """Whether every run of every program completed the same number of requests."""
    counts = {name: set(stats["completed"]) for name, stats in results.items()}
    if any(None in c for c in counts.values()):
        unread = [name for name, c in counts.items() if None in c]
        return f"completed count not found in the output of {', '.join(unread)}"
    every = set().union(*counts.values()) if counts else set()
    if len(every) == 1:
        (count,) = every
        return f"agree: {count:,} completed of {requests:,} by every run"
    parts = ", ".join(f"{n} {sorted(c)}" for n, c in counts.items())
    return f"DIFFER: {parts}"


# --- start-up ----------------------------------------------------------------------------


def measure_startup(program: Program, runs: int, spec: Path, log=print) -> dict:
    """Median (and range) wall of `--help` and of a 1-request run of the standard case."""
    one = [*program_args(CASES["a"], program, spec), "--num-requests", "1"]
    out = {}
    for label, args in (("help", ["--help"]), ("one_request_run", one)):
        walls, completed = [], set()
        for _ in range(runs):
            timing = time_process(program, args, rss=False)
            if timing.returncode != 0:
                raise ProgramFailed(
                    f"{program.name} start-up ({label}) exited {timing.returncode}: "
                    f"{last_error_line(timing.stderr)}"
                )
            walls.append(timing.wall_s)
            summary = cluster_summary(timing.stdout)
            completed.add(summary.get("completed_requests") if summary else None)
        stats = wall_stats(walls, 1)
        stats.pop("requests_per_s")
        stats["walls_s"] = [round(w, 4) for w in walls]
        if label == "one_request_run":
            stats["completed"] = sorted(completed, key=str)
        out[label] = stats
        log(f"  start-up {program.name:<13} {label:<16} median {stats['median_wall_s']:.3f} s")
    return out


# --- replay parity -------------------------------------------------------------------------

PARITY_REQUESTS = 1_000


def parity_case(num_requests: int = PARITY_REQUESTS) -> Case:
    """One instance, varied lengths, no preemption: where servesim's and BLIS-Mar's
    semantics coincide, so that every request's TTFT and E2E must match."""
    return Case(
        "parity",
        "replay of BLIS-Mar's own trace, 1 instance, Poisson 30 req/s, 512±200 -> 128±64",
        workload_spec(30, num_requests, _gaussian(512, 200, 16, 2048), _gaussian(128, 64, 2, 512)),
        _deployment(),
    )


def _per_request(records: list[dict]) -> dict[str, tuple[int, int]]:
    """TTFT and E2E (µs) by request id, of the requests that were served: BLIS deletes a
    request it drops as unservable from its records, servesim keeps it with its state (the
    counts are compared instead)."""
    return {
        r["requestID"]: (round(r["ttft_ms"] * 1000), round(r["e2e_ms"] * 1000))
        for r in records
        if r.get("state") != "dropped_unservable"
    }


def compare_requests(blis: dict, ours: dict, tolerance_us: int = 1, name: str = MAR) -> str:
    """'outputs agree ...' or the first mismatch, comparing per-request TTFT and E2E (µs)
    of two results files (BLIS-Mar's --results-path or BLIS-current's --metrics-path,
    servesim's --results-path); `name` is the BLIS build the messages name."""
    theirs = _per_request(blis.get("requests", []))
    mine = _per_request(ours.get("requests", []))
    if set(theirs) != set(mine):
        only_blis = sorted(set(theirs) - set(mine))[:3]
        only_ours = sorted(set(mine) - set(theirs))[:3]
        return (
            f"MISMATCH: request sets differ ({len(theirs)} vs {len(mine)}; only in {name} "
            f"{only_blis}, only in servesim {only_ours})"
        )
    for request_id in sorted(theirs, key=lambda r: (len(r), r)):
        (bt, be), (st, se) = theirs[request_id], mine[request_id]
        if abs(bt - st) > tolerance_us or abs(be - se) > tolerance_us:
            return (
                f"MISMATCH at {request_id}: TTFT {st} µs (servesim) vs {bt} µs ({name}), "
                f"E2E {se} µs vs {be} µs"
            )
    for count in ("completed_requests", "dropped_unservable"):
        if blis.get(count) != ours.get(count):
            return f"MISMATCH: {count} {ours.get(count)} (servesim) vs {blis.get(count)} ({name})"
    return (
        f"outputs agree: {len(theirs):,} requests, TTFT and E2E within {tolerance_us} µs "
        f"of {name}'s each"
    )


def replay_parity(servesim: Program, mar: Program, folder: Path, log=print) -> str:
    """BLIS-Mar generates and simulates a ~1k-request workload and writes it as a trace;
    servesim replays that trace with the same deployment flags; every request is compared."""
    case = parity_case()
    spec = write_spec(case, folder)
    verdict = trace_and_replay(
        servesim, mar, program_args(case, mar, spec), case.flags, folder / "parity"
    )
    log(f"  replay parity: {verdict}")
    return verdict


# The flag with which each BLIS build writes one record per request.
PER_REQUEST_FLAG = {MAR: "--results-path", CURRENT: "--metrics-path"}


def trace_and_replay(
    servesim: Program, blis: Program, blis_args: Sequence[str], flags: Sequence[str], stem: Path
) -> str:
    """BLIS (`blis.name`: BLIS-Mar or BLIS-current) runs `blis_args` (a `run` command) and
    writes its trace and per-request results next to `stem`; servesim replays the trace with
    the deployment `flags`; the verdict of `compare_requests` (or 'not checked: …' when a
    program failed)."""
    trace = stem.with_name(stem.name + "-trace")
    blis_out = stem.with_name(stem.name + "-blis.json")
    ours_out = stem.with_name(stem.name + "-servesim.json")
    output = [PER_REQUEST_FLAG[blis.name], str(blis_out)]
    timing = time_process(blis, [*blis_args, "--trace-output", str(trace), *output], rss=False)
    if timing.returncode != 0:
        return (
            f"not checked: {blis.name} exited {timing.returncode}: {last_error_line(timing.stderr)}"
        )
    replay_args = [
        "replay",
        "--trace-header",
        f"{trace}.yaml",
        "--trace-data",
        f"{trace}.csv",
        *flags,
        "--results-path",
        str(ours_out),
        "--quiet",
    ]
    timing = time_process(servesim, replay_args, rss=False)
    if timing.returncode != 0:
        return (
            f"not checked: servesim replay exited {timing.returncode}: "
            f"{last_error_line(timing.stderr)}"
        )
    return compare_requests(
        json.loads(blis_out.read_text()), json.loads(ours_out.read_text()), name=blis.name
    )


# --- reporting ------------------------------------------------------------------------------

CSV_FIELDS = [
    "case",
    "program",
    "requests",
    "runs",
    "median_wall_s",
    "min_wall_s",
    "max_wall_s",
    "requests_per_s",
    "peak_rss_mib",
    "servesim_speed_ratio",
    "completed",
    "note",
]


def csv_rows(cases: list[dict]) -> list[dict]:
    rows = []
    for case in cases:
        for name in PROGRAMS:
            stats = case["programs"].get(name)
            if stats is None:
                if name in case["skipped"]:
                    rows.append(
                        {
                            "case": case["case"],
                            "program": name,
                            "requests": case["requests"],
                            "note": "skipped: " + case["skipped"][name],
                        }
                    )
                continue
            completed = sorted({c for c in stats["completed"] if c is not None})
            rows.append(
                {
                    "case": case["case"],
                    "program": name,
                    "requests": case["requests"],
                    "runs": stats["runs"],
                    "median_wall_s": round(stats["median_wall_s"], 3),
                    "min_wall_s": round(stats["min_wall_s"], 3),
                    "max_wall_s": round(stats["max_wall_s"], 3),
                    "requests_per_s": round(stats["requests_per_s"], 1),
                    "peak_rss_mib": stats["peak_rss_mib"],
                    "servesim_speed_ratio": (
                        round(stats["servesim_speed_ratio"], 3)
                        if "servesim_speed_ratio" in stats
                        else ""
                    ),
                    "completed": " ".join(str(c) for c in completed),
                    "note": "",
                }
            )
    return rows


def write_outputs(report: dict, out: Path) -> tuple[Path, Path]:
    """The report as JSON at `out` (.json) and its table as CSV beside it (.csv)."""
    json_path = out.with_suffix(".json")
    csv_path = out.with_suffix(".csv")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    with csv_path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(csv_rows(report["cases"]))
    return json_path, csv_path


def markdown_table(report: dict) -> str:
    """One line per case and program: median wall, range, requests per second, peak memory
    and servesim's speed relative to that program."""
    lines = [
        "| case | program | requests | median wall | min – max | req/s | peak MiB "
        "| servesim speed ÷ this |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for case in report["cases"]:
        for name in PROGRAMS:
            stats = case["programs"].get(name)
            if stats is None:
                if name in case["skipped"]:
                    lines.append(
                        f"| {case['case']} | {name} | {case['requests']:,} | skipped: "
                        f"{case['skipped'][name]} | | | | |"
                    )
                continue
            peak = stats["peak_rss_mib"]
            ratio = stats.get("servesim_speed_ratio")
            lines.append(
                f"| {case['case']} | {name} | {case['requests']:,} "
                f"| {stats['median_wall_s']:.2f} s "
                f"| {stats['min_wall_s']:.2f} – {stats['max_wall_s']:.2f} s "
                f"| {stats['requests_per_s']:,.0f} "
                f"| {'–' if peak is None else f'{peak:,.0f}'} "
                f"| {'–' if ratio is None else f'{ratio:.2f}×'} |"
            )
    return "\n".join(lines)


def startup_table(report: dict) -> str:
    lines = [
        "| program | `--help` median (min – max) | 1-request `run` median (min – max) |",
        "|---|---:|---:|",
    ]
    for name, figures in report.get("startup", {}).items():
        cells = []
        for label in ("help", "one_request_run"):
            s = figures[label]
            cells.append(
                f"{s['median_wall_s']:.3f} s ({s['min_wall_s']:.3f} – {s['max_wall_s']:.3f})"
            )
        lines.append(f"| {name} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def git_output(directory: str | Path, *args: str) -> str:
    """`git -C directory ARGS`'s output, stripped; "" outside a checkout or without git."""
    try:
        out = subprocess.run(
            ["git", "-C", str(directory), *args], check=True, capture_output=True, text=True
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def tree_commit(directory: str | Path) -> str:
    """The commit of the checkout holding `directory`, `-dirty` when its working tree has
    uncommitted changes (`git describe --always --dirty`); "" outside a checkout. run.py's
    in-process rows use it too, so both name an edited tree alike."""
    return git_output(directory, "describe", "--always", "--dirty")


def _commit() -> str:
    return tree_commit(ROOT)


def run(
    programs: list[Program],
    case_names: Sequence[str],
    pairs: int,
    startup_runs: int,
    parity: bool,
    scale: float = 1.0,
    log=print,
) -> dict:
    """Everything --whole-process measures, as one report. A program that fails (exits
    non-zero) stops the run: the report then holds what finished before it (the replay
    verdict, the start-up figures, the cases completed) and `incomplete` says what failed.
    A failure before anything is timed (servesim's package cannot be found or compiled)
    raises ProgramFailed."""
    cases = make_cases(scale)
    report: dict = {
        "when_utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "python": platform.python_version(),
        "servesim_commit": "",
        "pairs": pairs,
        "scale": scale,
        "order": " ".join(p.name for p in programs) + " (repeated)",
        "peak_rss_from": str(TIME_BIN) if TIME_BIN.exists() else None,
        "programs": {p.name: p.command() for p in programs},
        "cases": [],
    }
    by_name = {p.name: p for p in programs}
    if SERVESIM in by_name:
        package = compile_bytecode(by_name[SERVESIM])
        report["bytecode_compiled"] = None if package is None else str(package)
        # The package the timed servesim imports, and its checkout's commit ("" when it is
        # not in a checkout, or when servesim is not a Python script).
        report["servesim_package"] = None if package is None else str(package)
        report["servesim_commit"] = "" if package is None else tree_commit(package)
        if package is not None:
            log(
                f"servesim's bytecode compiled first: {package} "
                f"({report['servesim_commit'] or 'not in a git checkout'})"
            )
    with tempfile.TemporaryDirectory(prefix="servesim-whole-process-") as tmp:
        folder = Path(tmp)
        try:
            if parity and MAR in by_name:
                report["replay_parity"] = replay_parity(
                    by_name[SERVESIM], by_name[MAR], folder, log
                )
            if startup_runs > 0:
                spec = write_spec(CASES["a"], folder / "startup")
                report["startup"] = {}
                for p in programs:
                    report["startup"][p.name] = measure_startup(p, startup_runs, spec, log)
            for name in case_names:
                log(f"({name}) {cases[name].description}, {cases[name].requests:,} requests")
                record = run_case(cases[name], programs, pairs, folder / name, log)
                log(f"  ({name}) completed counts: {record['completed_check']}")
                report["cases"].append(record)
        except ProgramFailed as failure:
            report["incomplete"] = str(failure)
    return report


def failed_checks(report: dict) -> list[str]:
    """What went wrong in a report, one line each: a program that failed (`incomplete`), a
    replay parity that did not agree (a MISMATCH, or not checked because a program failed),
    a case whose completed counts differ or could not be read. Empty when all is well."""
    problems = []
    if report.get("incomplete"):
        problems.append(f"incomplete: {report['incomplete']}")
    parity = report.get("replay_parity")
    if parity is not None and not parity.startswith("outputs agree"):
        problems.append(f"replay parity: {parity}")
    for case in report["cases"]:
        if not case["completed_check"].startswith("agree"):
            problems.append(f"({case['case']}) completed: {case['completed_check']}")
    return problems


def print_report(report: dict, log=print) -> None:
    log("")
    scale = report.get("scale", 1.0)
    log(
        f"Whole processes, alternating {report['order']}, {report['pairs']} rounds, "
        f"{report['when_utc']} UTC, servesim {report['servesim_commit'] or '(commit unknown)'}"
        + (f" from {report['servesim_package']}" if report.get("servesim_package") else "")
        + ("" if scale == 1 else f", request counts scaled by {scale:g}")
    )
    log(markdown_table(report))
    if report.get("startup"):
        log("")
        log(startup_table(report))
    if "replay_parity" in report:
        log("")
        log(f"Replay parity (BLIS-Mar's trace, servesim replay): {report['replay_parity']}")
    for case in report["cases"]:
        log(f"({case['case']}) completed: {case['completed_check']}")
        for note in case["notes"]:
            log(f"({case['case']}) note: {note}")
        for name, why in case["skipped"].items():
            log(f"({case['case']}) {name} skipped: {why}")
    if report.get("incomplete"):
        log(f"INCOMPLETE, the run stopped: {report['incomplete']}")


def caption(report: dict) -> str:
    """The line under the generated markdown table: when, which servesim, how many rounds."""
    scale = report.get("scale", 1.0)
    return (
        f"Measured {report['when_utc']} UTC, servesim "
        f"`{report['servesim_commit'] or 'commit unknown'}`, {report['pairs']} rounds"
        + ("" if scale == 1 else f", request counts scaled by {scale:g}")
        + (f"; INCOMPLETE: {report['incomplete']}" if report.get("incomplete") else "")
        + "."
    )


if __name__ == "__main__":
    _USE = (
        "benchmarks/whole_process.py is a module, used by `benchmarks/run.py --whole-process`; "
        "run that (`benchmarks/run.py --help`)."
    )
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        print(_USE)
        sys.exit(0)
    print(_USE, file=sys.stderr)
    sys.exit(2)
