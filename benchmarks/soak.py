"""Soak: 1,000,000 requests through a multi-instance cluster; memory must grow only by the
per-request records the result keeps (a constant number of bytes per request), and every
invariant must hold at the end.

    .venv/bin/python benchmarks/soak.py [--num-requests N] [--instances K] [--check-during]

The cluster: K instances of Llama-3.1-8B on H100 behind weighted routing (prefix-affinity,
queue-depth, kv-utilization), a modest KV cache so preemptions happen, three clients (chat
with a shared system prompt, RAG with long prompts, batch with client timeouts) at about
80 % of capacity. Requests are generated lazily, so the workload itself takes no memory.

Memory: the resident set size is sampled every `--sample-every` finished requests. What the
run must keep is one record per request (the result's request table) and one per engine step,
so memory grows linearly; a leak (state kept per finished request beyond its record, a queue
that never drains, an index that never evicts) shows up as a growth rate per request that
rises over the run. The check: the growth per finished request over the second half of the
run is at most FLAT_TOLERANCE x the rate over the first half (after a warm-up window). It
needs at least MIN_SAMPLES (3) samples after the warm-up (with the default `--sample-every`,
a sample every 1,000 finished requests below 50,000, runs of 4,000 requests or more); with
fewer, memory is not judged.

The report is JSON on stdout: `memory_flat` is true, false, or null when not judged, and
`memory_verdict` says which in words. Exit status: 0 memory flat (and every invariant held: a
broken one stops the run with InvariantViolation); 1 memory grows faster late in the run; 3
memory not judged (too few samples: a longer run or a smaller `--sample-every`); 2 a wrong
option.

Invariants: every end-of-run law, checked by the run itself while its engines are still live
(`simulate(..., end_checks=True)`: request conservation per instance and cluster, states,
in-flight counts, KV blocks of every engine, output tokens; the result keeps no engine, so a
check after `simulate` returns could not reach their KV blocks); `--check-during` also checks
every step and every finished request (several times slower).

The fleet changes during the run (`lifecycle_events()`): a node fails at 25 % of the run
(its requests are retried elsewhere), an instance is drained with redirect at 50 %, a node is
drained with wait at 75 %, and replacements are provisioned and loaded after each, so the
end-of-run laws also cover requests that were on a failed or drained instance.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import sys
import time
from pathlib import Path

import simulator

# One H100 serving Llama-3.1-8B saturates near 60.8 req/s at 512 -> 128 tokens
# (benchmarks/run.py, SATURATION_REQ_PER_S); this mix is longer on average, so aim a little
# lower.
PER_INSTANCE_REQ_PER_S = 38.0
FLAT_TOLERANCE = 1.5
WARM_UP_FRACTION = 0.1
# Samples after the warm-up needed to judge memory: two halves of at least two samples each
# (the halves share the middle one).
MIN_SAMPLES = 3
EXIT_FLAT, EXIT_GROWS, EXIT_NOT_JUDGED = 0, 1, 3


def lifecycle_events(instances: int, run_s: float) -> list[dict]:
    """Node failures, drains and replacements at fixed fractions of the run (one instance per
    one-GPU node, nodes `soak-0` .. `soak-<instances-1>`)."""
    if instances < 3 or run_s <= 0:
        return []
    return [
        {"at_s": 0.25 * run_s, "action": "fail_node", "node": "soak-1"},
        {"at_s": 0.25 * run_s, "action": "add_instance"},  # placed when a node is ready
        {"at_s": 0.25 * run_s, "action": "add_node", "pool": "soak"},
        {
            "at_s": 0.50 * run_s,
            "action": "drain_instance",
            "target": "instance_2",
            "drain_policy": "redirect",
        },  # fmt: skip
        {"at_s": 0.50 * run_s, "action": "add_instance"},
        {"at_s": 0.75 * run_s, "action": "drain_node", "node": "soak-0", "drain_policy": "wait"},
        {"at_s": 0.75 * run_s, "action": "add_instance"},
    ]


def fleet(instances: int, run_s: float) -> dict:
    """One-GPU nodes for the instances plus room for the replacements."""
    return {
        "node_pools": [
            {
                "name": "soak",
                "gpu_type": "H100",
                "gpus_per_node": 1,
                "initial_nodes": instances + 1,  # one spare: the redirect's replacement
                "max_nodes": instances + 3,
                "provisioning_delay": {"mean_s": 60, "stddev_s": 10},
                "cost_per_hour": 4.0,
            }
        ],
        "instance_lifecycle": {
            "initial_instances_loaded": True,
            "loading_delay": {"mean_s": 30, "stddev_s": 5},
            "warm_up_request_count": 20,
            "warm_up_ttft_factor": 1.5,
            "retry_on_failure": True,
        },
        "events": lifecycle_events(instances, run_s),
    }


def scenario(num_requests: int, instances: int, seed: int) -> dict:
    rate = PER_INSTANCE_REQ_PER_S * instances
    clients = [
        {
            "id": "chat",
            "rate_fraction": 0.6,
            "arrival": {"process": "poisson"},
            "prefix_group": "system-prompt",
            "prefix_length": 256,
            "input_distribution": {
                "type": "gaussian",
                "params": {"mean": 300, "std_dev": 120, "min": 16, "max": 1500},
            },
            "output_distribution": {"type": "exponential", "params": {"mean": 150}},
        },
        {
            "id": "rag",
            "rate_fraction": 0.25,
            "arrival": {"process": "gamma", "cv": 2.0},
            "prefix_group": "documents",
            "prefix_length": 1024,
            "input_distribution": {"type": "constant", "params": {"value": 256}},
            "output_distribution": {"type": "exponential", "params": {"mean": 80}},
        },
        {
            "id": "batch",
            "rate_fraction": 0.15,
            "arrival": {"process": "poisson"},
            "timeout": 20_000_000,  # µs: some requests give up under bursts
            "input_distribution": {
                "type": "gaussian",
                "params": {"mean": 800, "std_dev": 300, "min": 64, "max": 4000},
            },
            "output_distribution": {"type": "exponential", "params": {"mean": 300}},
        },
    ]
    doc = {
        "name": "soak",
        "seed": seed,
        "model": "meta-llama/llama-3.1-8b-instruct",
        "hardware": "H100",
        "tp": 1,
        "engine": {"total_kv_blocks": 1500, "max_num_running_reqs": 128},
        "cluster": {
            "num_instances": instances,
            "routing": {
                "policy": "weighted",
                "scorers": "prefix-affinity:3,queue-depth:2,kv-utilization:2",
            },
        },
        "workload": {
            "version": "2",
            "aggregate_rate": rate,
            "num_requests": num_requests,
            "clients": clients,
        },
    }
    doc.update(fleet(instances, num_requests / rate))
    return doc


def rss_bytes() -> int:
    """Current resident set size (Linux /proc; elsewhere the peak, which is what we have)."""
    statm = Path("/proc/self/statm")
    if statm.is_file():
        return int(statm.read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def growth_per_request(samples: list[tuple[int, int]]) -> float:
    (n0, m0), (n1, m1) = samples[0], samples[-1]
    return (m1 - m0) / (n1 - n0) if n1 > n0 else 0.0


def memory_verdict(
    samples: list[tuple[int, int]], num_requests: int
) -> tuple[bool | None, float | None, float | None, str]:
    """(flat, bytes per request in the first half, in the second half, verdict in words) from
    the (finished requests, RSS bytes) samples; flat and the rates are None when there are
    fewer than MIN_SAMPLES samples after the warm-up (not judged)."""
    warm = [s for s in samples if s[0] >= WARM_UP_FRACTION * num_requests]
    if len(warm) < MIN_SAMPLES:
        return (
            None,
            None,
            None,
            f"not judged: {len(warm)} memory samples after the warm-up, {MIN_SAMPLES} needed "
            "(run more requests or give a smaller --sample-every)",
        )
    half = len(warm) // 2
    first_rate = growth_per_request(warm[: half + 1])
    second_rate = growth_per_request(warm[half:])
    if second_rate <= FLAT_TOLERANCE * max(first_rate, 1.0):
        verdict = f"flat: {second_rate:.0f} B/request late vs {first_rate:.0f} early"
        return True, first_rate, second_rate, verdict
    verdict = (
        f"grows: {second_rate:.0f} B/request in the second half vs {first_rate:.0f} in the "
        f"first (tolerance x{FLAT_TOLERANCE})"
    )
    return False, first_rate, second_rate, verdict


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def description(doc: str) -> str:
    """The first paragraph of a docstring, as one line (not its first line, cut mid-sentence)."""
    return " ".join(doc.split("\n\n")[0].split())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="soak.py", description=description(__doc__))
    parser.add_argument("--num-requests", type=int, default=1_000_000)
    parser.add_argument("--instances", type=int, default=4)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--sample-every", type=int, default=0, help="default: 2%% of the run")
    parser.add_argument("--check-during", action="store_true", help="check every step too")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    for flag, value, least in (
        ("--num-requests", args.num_requests, 1),
        ("--instances", args.instances, 1),
        ("--sample-every", args.sample_every, 0),
    ):
        if value < least:
            parser.exit(2, f"soak.py: error: {flag} must be at least {least} (got {value})\n")

    sample_every = args.sample_every or max(1000, args.num_requests // 50)
    samples: list[tuple[int, int]] = []  # (finished requests, RSS bytes)
    next_sample = sample_every
    started_s = time.perf_counter()

    def progress(now_us: int, finished: int) -> None:
        nonlocal next_sample
        if finished >= next_sample:
            gc.collect()
            samples.append((finished, rss_bytes()))
            wall_s = time.perf_counter() - started_s
            print(
                f"  {finished:>9,} finished  simulated {now_us / 1e6:>9,.0f} s  "
                f"rss {samples[-1][1] / 2**20:>7.1f} MiB  wall {wall_s:.0f} s",
                file=sys.stderr,
                flush=True,
            )
            next_sample = finished + sample_every

    doc = scenario(args.num_requests, args.instances, args.seed)
    gc.collect()
    rss_start = rss_bytes()
    # Every end-of-run law, the engines' own included; raises InvariantViolation naming the
    # first broken one.
    result = simulator.simulate(
        doc, progress=progress, check_invariants=args.check_during, end_checks=True
    )
    wall_s = time.perf_counter() - started_s

    flat, first_rate, second_rate, verdict = memory_verdict(samples, args.num_requests)
    s = result.summary
    report = {
        "requests": args.num_requests,
        "instances": args.instances,
        "wall_s": round(wall_s, 1),
        "requests_per_wall_s": round(args.num_requests / wall_s, 1),
        "simulated_s": round(s["vllm_estimated_duration_s"], 1),
        "completed": s["completed_requests"],
        "timed_out": s["timed_out_requests"],
        "dropped_unservable": s["dropped_unservable"],
        "rejected": result.admission_rejections + result.routing_rejections,
        "preemptions": s["preemption_count"],
        "rss_start_mib": round(rss_start / 2**20, 1),
        "rss_end_mib": round(rss_bytes() / 2**20, 1),
        "memory_samples": len(samples),
        "bytes_per_request_first_half": _round(first_rate),
        "bytes_per_request_second_half": _round(second_rate),
        "memory_flat": flat,
        "memory_verdict": verdict,
        "invariants": "hold",
        "lifecycle_events": len(doc["events"]),
        "failed": s.get("failed_requests", 0),
        "dropped_on_drain": s.get("dropped_on_drain", 0),
        "retried": result.fleet_metrics["retried_requests"],
        "redirected": result.fleet_metrics["redirected_requests"],
        "gpu_cost_usd": round(result.fleet_metrics["gpu_cost_usd"], 2),
    }
    print(json.dumps(report, indent=2))
    if flat is None:
        print(f"memory {verdict}", file=sys.stderr)
        return EXIT_NOT_JUDGED
    if not flat:
        print(f"memory {verdict}", file=sys.stderr)
        return EXIT_GROWS
    return EXIT_FLAT


if __name__ == "__main__":
    sys.exit(main())
