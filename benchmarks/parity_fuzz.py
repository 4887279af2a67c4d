"""Random parity cases against BLIS's binaries (the March release, the current one): does
servesim reproduce BLIS request by request outside the reference runs the suite replays?

    .venv/bin/python benchmarks/parity_fuzz.py --blis-mar PATH [--blis-current PATH]
        [--cases 50] [--first-seed 1]

Each case draws a deployment (model, GPU, TP, step-time backend with random blackbox
coefficients, batch knobs, scheduler and priority policy, admission latency, instances) and a
workload of one to three clients with SLO classes from its seed. BLIS generates and
simulates the workload and writes it as a trace (`--trace-output`) with its per-request
results; servesim replays that trace with the same flags; every request's TTFT and E2E must
agree to 1 µs, and the completed and dropped counts exactly (`whole_process.compare_requests`).
Exit status: 0 when every case of every build agrees; 1 when any case differs; 3 when none
differs but some case was not checked (a program failed: BLIS's run or servesim's replay);
2 for a wrong option.

The cases stay where the two simulators mean the same thing (docs/accuracy.md, "Parity with
BLIS"), so a difference is a bug on one side, not a documented departure:

* a burst: every request arrives (1 µs apart) before the first step ends, and every request
  has at least 2 output tokens, so no arrival meets a step that finishes every running request
  (BLIS counts the instance idle from that step's start and overlaps a second step;
  docs/latency-models.md, "Where servesim differs from BLIS-current");
* KV capacity that never runs short (no preemption);
* shared prompt prefixes only for the current BLIS with trained-physics: BLIS-Mar's trace
  leaves its prefix_group column empty, so a replay cannot share what the run shared, and
  BLIS-Mar's roofline prices a cached prefix as no context (behaviour §3; the current
  build's roofline differed too when tried);
* BLIS-Mar's roofline only for dense models (servesim prices MoE expert weights, behaviour
  §A5, as the current BLIS does);
* several instances only with round-robin routing (load-aware policies break ties with Go's
  random generator in BLIS, NumPy's in servesim).

This module holds no path to a BLIS binary: they are arguments. It needs no network: BLIS
reads servesim's bundled config.json for each model (`--model-config-folder`).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from whole_process import (  # noqa: E402 - benchmarks/ helpers, one definition
    CURRENT,
    MAR,
    Program,
    blis_program,
    bundled_model_config,
    check_binary,
    servesim_program,
    trace_and_replay,
)

# (model, tensor-parallel sizes it divides evenly, dense?)
MODELS = (
    ("meta-llama/llama-3.1-8b-instruct", (1, 2), True),
    ("meta-llama/llama-2-7b-hf", (1,), True),
    ("meta-llama/llama-2-70b-hf", (4, 8), True),
    ("qwen/qwen3-14b", (1, 2), True),
    ("mistralai/mixtral-8x7b-v0.1", (2, 4), False),
    ("qwen/qwen3-30b-a3b", (1, 2), False),
)
GPUS = ("H100", "A100-80", "A100-SXM", "L40S")  # the GPUs both BLIS hardware tables have
# Each build's backends. BLIS-Mar's roofline leaves MoE expert weights unpriced (behaviour
# §A5), so it gets dense models only; the current build fixed that.
BACKENDS = {
    MAR: ("roofline", "crossmodel", "trained-roofline", "blackbox"),
    CURRENT: ("roofline", "trained-physics"),
}
# Blackbox coefficients, each drawn from its own list: alpha (queueing µs, µs per prompt
# token, µs per output token), beta (µs per step, per prefill token, per decode token).
ALPHAS = ((0, 500, 5000), (0, 0.5, 3), (0, 10, 100))
BETAS = ((1000, 5000), (0, 1.5, 20), (0, 0.2, 8))
SCHEDULERS = ("fcfs", "priority-fcfs", "sjf", "reverse-priority")
PRIORITY_POLICIES = ("constant", "slo-based", "inverted-slo")
SLO_CLASSES = ("critical", "standard", "sheddable", "batch", "background")
PREFIX_LENGTHS = (16, 100, 512, 1000)  # tokens of a shared prompt prefix
KV_BLOCKS = 2_000_000  # never short: no preemption
EXIT_DIFFER, EXIT_NOT_CHECKED = 1, 3
BURST_RATE = 1_000_000  # requests per second: 1 µs apart


@dataclass(frozen=True)
class ParityCase:
    seed: int
    build: str  # MAR or CURRENT: the BLIS build it is for
    spec: dict  # a BLIS v2 workload spec
    flags: tuple[str, ...]  # `run` flags both programs get

    @property
    def model(self) -> str:
        return self.flags[self.flags.index("--model") + 1]

    @property
    def servesim_flags(self) -> tuple[str, ...]:
        """The flags servesim's replay gets: the case's, and for the current BLIS the priority
        its schedulers always use (it has no `--priority-policy`; servesim's default is
        BLIS-Mar's `constant`)."""
        if self.build == CURRENT:
            return (*self.flags, "--priority-policy", "slo-class")
        return self.flags


def _lengths(rng: random.Random, mean: int, low: int) -> dict:
    return {
        "type": "gaussian",
        "params": {"mean": mean, "std_dev": max(1, mean // 3), "min": low, "max": 8000},
    }


def _client(rng: random.Random, index: int) -> dict:
    return {
        "id": f"c{index}",
        "rate_fraction": 1.0,
        "arrival": {"process": "constant"},
        "slo_class": rng.choice(SLO_CLASSES),
        "input_distribution": _lengths(rng, rng.choice((64, 256, 512, 1024, 3000)), 1),
        "output_distribution": _lengths(rng, rng.choice((8, 64, 128, 300)), 2),
    }


def _share_prefixes(rng: random.Random, clients: list[dict]) -> None:
    """Give some clients a shared prompt prefix: a group of their own, or one group `g` that
    several share (at one length: a trace records each row's length, and a group is replayed
    at its first)."""
    shared_length = rng.choice(PREFIX_LENGTHS)
    for i, client in enumerate(clients):
        choice = rng.choice(("none", "own", "shared"))
        if choice == "own":
            client["prefix_group"] = f"g{i}"
            client["prefix_length"] = rng.choice(PREFIX_LENGTHS)
        elif choice == "shared":
            client["prefix_group"] = "g"
            client["prefix_length"] = shared_length


def _coefficients(rng: random.Random, choices: tuple[tuple[float, ...], ...]) -> str:
    return ",".join(str(rng.choice(values)) for values in choices)


def make_case(seed: int, build: str = MAR) -> ParityCase:
    """The case drawn from `seed` for BLIS build `build` (the same seed and build always give
    the same case)."""
    rng = random.Random(seed)
    model, tps, dense = rng.choice(MODELS)
    backends = BACKENDS[build]
    if build == MAR and not dense:
        backends = tuple(b for b in backends if b != "roofline")
    backend = rng.choice(backends)
    clients = [_client(rng, i) for i in range(rng.choice((1, 2, 3)))]
    if build == CURRENT and backend == "trained-physics":
        _share_prefixes(rng, clients)
    spec = {
        "version": "2",
        "seed": seed,
        "category": "language",
        "aggregate_rate": BURST_RATE,
        "num_requests": rng.choice((20, 50, 100, 200)),
        "clients": clients,
    }
    flags = [
        "--model",
        model,
        "--hardware",
        rng.choice(GPUS),
        "--tp",
        str(rng.choice(tps)),
        "--latency-model",
        backend,
        "--total-kv-blocks",
        str(KV_BLOCKS),
        "--seed",
        str(seed),
    ]
    if backend == "blackbox":
        flags += ["--alpha-coeffs", _coefficients(rng, ALPHAS)]
        flags += ["--beta-coeffs", _coefficients(rng, BETAS)]
    flags += ["--scheduler", rng.choice(SCHEDULERS)]
    if build == MAR:  # the current build has no priority policies
        flags += ["--priority-policy", rng.choice(PRIORITY_POLICIES)]
    if rng.random() < 0.3:
        flags += ["--admission-latency", str(rng.choice((10, 1000)))]
    if rng.random() < 0.5:
        flags += ["--max-num-running-reqs", str(rng.choice((4, 16, 64, 256)))]
    if rng.random() < 0.5:
        flags += ["--max-num-scheduled-tokens", str(rng.choice((512, 2048, 8192, 16384)))]
    if rng.random() < 0.3:
        flags += ["--long-prefill-token-threshold", str(rng.choice((128, 512)))]
    instances = rng.choice((1, 1, 2, 3))
    if instances > 1:
        flags += ["--num-instances", str(instances), "--routing-policy", "round-robin"]
    return ParityCase(seed, build, spec, tuple(flags))


def run_case(case: ParityCase, blis: Program, folder: Path) -> str:
    """'outputs agree …', 'MISMATCH …' or 'not checked: …' for one case."""
    import yaml

    stem = folder / f"{'mar' if case.build == MAR else 'current'}-case{case.seed}"
    spec_path = stem.with_name(stem.name + ".workload.yaml")
    spec_path.write_text(yaml.safe_dump(case.spec, sort_keys=False))
    blis_args = [
        "run",
        *case.flags,
        "--model-config-folder",
        str(bundled_model_config(case.model)),
        "--workload-spec",
        str(spec_path),
    ]
    if case.build == CURRENT:
        blis_args += ["--timeout", "-1"]  # its default gives every request a 300 s deadline
    return trace_and_replay(servesim_program(), blis, blis_args, case.servesim_flags, stem)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blis-mar", type=Path, help="BLIS-Mar's binary")
    parser.add_argument("--blis-current", type=Path, help="the current BLIS's binary")
    parser.add_argument("--cases", type=int, default=50, help="cases per build (default 50)")
    parser.add_argument("--first-seed", type=int, default=1, help="seed of the first case")
    parser.add_argument("--keep", type=Path, help="folder to keep each case's files in")
    args = parser.parse_args(argv)
    builds = {MAR: args.blis_mar, CURRENT: args.blis_current}
    builds = {name: path for name, path in builds.items() if path is not None}
    if not builds:
        parser.error("give --blis-mar PATH, --blis-current PATH or both")
    for name, path in builds.items():
        problem = check_binary(path)
        if problem:
            parser.error(f"--blis-{'mar' if name == MAR else 'current'}: {problem}")
    if args.cases < 1:
        parser.error(f"--cases: invalid value {args.cases}; give a positive count")
    folder = args.keep or Path(tempfile.mkdtemp(prefix="servesim-parity-fuzz-"))
    folder.mkdir(parents=True, exist_ok=True)
    differ = unchecked = 0
    for name, path in builds.items():
        blis = blis_program(name, path)
        verdicts = {"agree": 0, "differ": 0, "not checked": 0}
        for seed in range(args.first_seed, args.first_seed + args.cases):
            case = make_case(seed, name)
            verdict = run_case(case, blis, folder)
            kind = (
                "agree"
                if verdict.startswith("outputs agree")
                else "not checked"
                if verdict.startswith("not checked")
                else "differ"
            )
            verdicts[kind] += 1
            print(f"{name} seed {seed}: {' '.join(case.flags)}: {verdict}", flush=True)
        print(
            f"{name}: {verdicts['agree']} of {args.cases} cases agree request by request, "
            f"{verdicts['differ']} differ, {verdicts['not checked']} not checked"
        )
        differ += verdicts["differ"]
        unchecked += verdicts["not checked"]
    print(f"files in {folder}")
    if differ:
        return EXIT_DIFFER
    if unchecked:
        print(
            f"parity_fuzz.py: {unchecked} case(s) not checked (a program failed; see above)",
            file=sys.stderr,
        )
        return EXIT_NOT_CHECKED
    return 0


if __name__ == "__main__":
    sys.exit(main())
