"""Score the default model on three vLLM 0.23.0 cells nothing was fitted on, from their
published summaries alone (docs/accuracy.md, "Held out: three cells known only by their
summaries").

`scripts/heldout/agg_{5,15,20}rps.summary.json` are the load generator's summaries of three
rate-sweep cells of the same experiment as groundtruth/vllm-0.23.0-h100-qwen3-14b (Qwen3-14B,
one H100, `vllm serve` without flags, five tenants with Poisson arrivals, 1,024-token prompts,
128 output tokens, 600 s); inference-sim/residency-vllm commit 92cd609,
`results/sweep_rate/agg_*rps/vanilla/summary.json`, copied unchanged. Their per-request
timings were not all published with them, so each cell is simulated with fresh Poisson
arrivals at its configured rate (tenants x `rate`) until its number of requests, over several
seeds (the send times that were published run at the configured rate: in agg_20rps tenant A
sent about 3.95 requests a second throughout), and the aggregates are compared:
TTFT and E2E means (each tenant's mean weighted by its successful requests), ITL = (E2E −
TTFT) / (output tokens − 1) as the ground-truth READMEs define it, and the completion rate
(requests / the run's duration, first send to last response). Seed-to-seed spread is part
of the result: near saturation one realisation of the arrivals differs from another.

    .venv/bin/python scripts/heldout_summaries.py                    # the table, 5 seeds
    .venv/bin/python scripts/heldout_summaries.py --max-num-seqs 256 --seeds 3
    .venv/bin/python scripts/heldout_summaries.py --latency-model trained-physics
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import simulator

HERE = Path(__file__).resolve().parent / "heldout"
CELLS = ("agg_5rps", "agg_15rps", "agg_20rps")
# What the server counted for a 1,024-token request in the traced cells of the same
# experiment (groundtruth/vllm-0.23.0-h100-qwen3-14b/README.md: server_input_tokens).
SERVER_INPUT_TOKENS = 986
OUTPUT_TOKENS = 128
# groundtruth/vllm-0.23.0-h100-qwen3-14b/server_config.json
SERVER = {
    "model": "qwen/qwen3-14b",
    "hardware": "H100",
    "tp": 1,
    "latency": {"model": "physics", "vllm_version": "0.23.0"},
    "engine": {
        "total_kv_blocks": 18038,
        "block_size_tokens": 16,
        "max_num_scheduled_tokens": 8192,
        "max_model_len": 40960,
        "enable_prefix_caching": True,
    },
}


def measured(summary: dict) -> dict[str, float]:
    tenants = summary["per_tenant"].values()
    ok = sum(t["num_successful"] for t in tenants)

    def mean(metric: str) -> float:
        return sum(t[metric]["mean"] * t["num_successful"] for t in tenants) / ok

    ttft, e2e = mean("ttft_ms"), mean("e2e_ms")
    totals = summary["totals"]
    return {
        "requests": totals["total_requests"],
        "ttft_ms": ttft,
        "e2e_ms": e2e,
        "itl_ms": (e2e - ttft) / (OUTPUT_TOKENS - 1),
        "completed_rps": totals["total_requests"] / totals["total_duration_s"],
    }


def simulated(
    summary: dict, seed: int, max_num_seqs: int, latency_model: str = "physics"
) -> dict[str, float]:
    config = summary["config"]
    tenants = config["tenants"]
    n = summary["totals"]["total_requests"]
    workload = {
        "version": "2",
        "seed": seed,
        "aggregate_rate": config["rate"] * len(tenants),
        "num_requests": n,
        "clients": [
            {
                "id": tenant,
                "rate_fraction": 1 / len(tenants),
                "arrival": {"process": "poisson"},
                "input_distribution": {
                    "type": "constant",
                    "params": {"value": SERVER_INPUT_TOKENS},
                },
                "output_distribution": {"type": "constant", "params": {"value": OUTPUT_TOKENS}},
            }
            for tenant in tenants
        ],
    }
    scenario = {**SERVER, "seed": seed, "workload": workload}
    scenario["engine"] = {**SERVER["engine"], "max_num_running_reqs": max_num_seqs}
    if latency_model != "physics":
        scenario["latency"] = {"model": latency_model}
    result = simulator.simulate(scenario)
    s = result.summary
    requests = result.requests
    span_s = (requests["completion_us"].max() - requests["arrival_us"].min()) / 1e6
    return {
        "ttft_ms": s["ttft_mean_ms"],
        "e2e_ms": s["e2e_mean_ms"],
        "itl_ms": (s["e2e_mean_ms"] - s["ttft_mean_ms"]) / (OUTPUT_TOKENS - 1),
        "completed_rps": s["completed_requests"] / span_s,
        "preemptions": s["preemption_count"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5, help="seeds per cell (42, 43, ...)")
    parser.add_argument(
        "--max-num-seqs",
        type=int,
        default=1024,
        help="the server's sequence limit (vLLM's default on an H100: 1,024)",
    )
    parser.add_argument(
        "--latency-model", default="physics", help="step-time backend (default physics)"
    )
    args = parser.parse_args()
    metrics = ("ttft_ms", "e2e_ms", "itl_ms", "completed_rps")
    print(
        f"{args.latency_model}"
        f"{', vLLM 0.23.0 fit' if args.latency_model == 'physics' else ''}, "
        f"max_num_seqs {args.max_num_seqs}, {args.seeds} seeds: "
        "signed error, mean over seeds (min to max)"
    )
    header = " | ".join(metrics)
    print(f"| cell | measured TTFT / E2E / ITL ms, req/s | {header} | preempted |")
    print("|---|---|" + "---|" * len(metrics) + "---|")
    for cell in CELLS:
        summary = json.loads((HERE / f"{cell}.summary.json").read_text())
        real = measured(summary)
        runs = [
            simulated(summary, 42 + i, args.max_num_seqs, args.latency_model)
            for i in range(args.seeds)
        ]
        cells = []
        for metric in metrics:
            errors = [100 * (run[metric] / real[metric] - 1) for run in runs]
            cells.append(
                f"{statistics.mean(errors):+.1f} % ({min(errors):+.1f} to {max(errors):+.1f})"
            )
        preempted = statistics.mean(run["preemptions"] for run in runs)
        real_text = (
            f"{real['ttft_ms']:,.0f} / {real['e2e_ms']:,.0f} / {real['itl_ms']:.1f}, "
            f"{real['completed_rps']:.2f}"
        )
        print(f"| {cell} | {real_text} | " + " | ".join(cells) + f" | {preempted:,.0f} |")


if __name__ == "__main__":
    main()
