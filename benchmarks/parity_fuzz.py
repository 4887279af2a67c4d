"""Random parity cases against BLIS-Mar's binary: does servesim reproduce BLIS request by
request outside the handful of reference runs the suite replays?

    .venv/bin/python benchmarks/parity_fuzz.py --blis-mar PATH [--cases 50] [--first-seed 1]

Each case draws a deployment (model, GPU, TP, step-time backend, batch knobs, instances) and a
workload from its seed. BLIS-Mar generates and simulates the workload and writes it as a trace
(`--trace-output`) with its per-request results; servesim replays that trace with the same
flags; every request's TTFT and E2E must agree to 1 µs, and the completed and dropped counts
exactly (`whole_process.compare_requests`). Exit status 1 when any case differs.

The cases stay where the two simulators mean the same thing (docs/accuracy.md, "Parity with
BLIS"), so a difference is a bug on one side, not a documented departure:

* a burst: every request arrives (1 µs apart) before the first step ends, and every request
  has at least 2 output tokens, so no arrival meets a step that finishes every running request
  (BLIS counts the instance idle from that step's start and overlaps a second step;
  docs/latency-models.md, "Where servesim differs from BLIS-current");
* KV capacity that never runs short (no preemption) and no shared prefixes;
* roofline only for dense models (servesim prices MoE expert weights, behaviour §A5);
* several instances only with round-robin routing (load-aware policies break ties with Go's
  random generator in BLIS, NumPy's in servesim).

This module holds no path to a BLIS binary: it is an argument. It needs no network: BLIS-Mar
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
    MAR,
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
GPUS = ("H100", "A100-80", "A100-SXM", "L40S")  # the GPUs BLIS-Mar's hardware table has
BACKENDS = ("roofline", "crossmodel", "trained-roofline")
KV_BLOCKS = 2_000_000  # never short: no preemption
BURST_RATE = 1_000_000  # requests per second: 1 µs apart


@dataclass(frozen=True)
class ParityCase:
    seed: int
    spec: dict  # a BLIS v2 workload spec
    flags: tuple[str, ...]  # `run` flags both programs get

    @property
    def model(self) -> str:
        return self.flags[self.flags.index("--model") + 1]


def _lengths(rng: random.Random, mean: int, low: int) -> dict:
    return {
        "type": "gaussian",
        "params": {"mean": mean, "std_dev": max(1, mean // 3), "min": low, "max": 8000},
    }


def make_case(seed: int) -> ParityCase:
    """The case drawn from `seed` (the same seed always gives the same case)."""
    rng = random.Random(seed)
    model, tps, dense = rng.choice(MODELS)
    backend = rng.choice(BACKENDS if dense else BACKENDS[1:])
    spec = {
        "version": "2",
        "seed": seed,
        "category": "language",
        "aggregate_rate": BURST_RATE,
        "num_requests": rng.choice((20, 50, 100, 200)),
        "clients": [
            {
                "id": "c",
                "rate_fraction": 1.0,
                "arrival": {"process": "constant"},
                "input_distribution": _lengths(rng, rng.choice((64, 256, 512, 1024, 3000)), 1),
                "output_distribution": _lengths(rng, rng.choice((8, 64, 128, 300)), 2),
            }
        ],
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
    if rng.random() < 0.5:
        flags += ["--max-num-running-reqs", str(rng.choice((4, 16, 64, 256)))]
    if rng.random() < 0.5:
        flags += ["--max-num-scheduled-tokens", str(rng.choice((512, 2048, 8192, 16384)))]
    if rng.random() < 0.3:
        flags += ["--long-prefill-token-threshold", str(rng.choice((128, 512)))]
    instances = rng.choice((1, 1, 2, 3))
    if instances > 1:
        flags += ["--num-instances", str(instances), "--routing-policy", "round-robin"]
    return ParityCase(seed, spec, tuple(flags))


def run_case(case: ParityCase, blis_mar: Path, folder: Path) -> str:
    """'outputs agree …', 'MISMATCH …' or 'not checked: …' for one case."""
    import yaml

    spec_path = folder / f"case{case.seed}.workload.yaml"
    spec_path.write_text(yaml.safe_dump(case.spec, sort_keys=False))
    blis_args = [
        "run",
        *case.flags,
        "--model-config-folder",
        str(bundled_model_config(case.model)),
        "--workload-spec",
        str(spec_path),
    ]
    mar = blis_program(MAR, blis_mar)
    return trace_and_replay(
        servesim_program(), mar, blis_args, case.flags, folder / f"case{case.seed}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blis-mar", type=Path, required=True, help="BLIS-Mar's binary")
    parser.add_argument("--cases", type=int, default=50, help="how many cases (default 50)")
    parser.add_argument("--first-seed", type=int, default=1, help="seed of the first case")
    parser.add_argument("--keep", type=Path, help="folder to keep each case's files in")
    args = parser.parse_args(argv)
    problem = check_binary(args.blis_mar)
    if problem:
        parser.error(f"--blis-mar: {problem}")
    if args.cases < 1:
        parser.error(f"--cases: invalid value {args.cases}; give a positive count")
    folder = args.keep or Path(tempfile.mkdtemp(prefix="servesim-parity-fuzz-"))
    folder.mkdir(parents=True, exist_ok=True)
    verdicts = {"agree": 0, "differ": 0, "not checked": 0}
    for seed in range(args.first_seed, args.first_seed + args.cases):
        case = make_case(seed)
        verdict = run_case(case, args.blis_mar, folder)
        kind = (
            "agree"
            if verdict.startswith("outputs agree")
            else "not checked"
            if verdict.startswith("not checked")
            else "differ"
        )
        verdicts[kind] += 1
        print(f"seed {seed}: {' '.join(case.flags)}: {verdict}", flush=True)
    print(
        f"{verdicts['agree']} of {args.cases} cases agree request by request, "
        f"{verdicts['differ']} differ, {verdicts['not checked']} not checked (files in {folder})"
    )
    return 1 if verdicts["differ"] else 0


if __name__ == "__main__":
    sys.exit(main())
