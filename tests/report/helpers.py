"""Helpers of the report tests: reading a page's embedded JSON, a synthetic run of any size
and hand-made sweep points."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd

from simulator.report.run_source import RequestColumns, RunSource


def embedded(page: str, element_id: str):
    """The JSON a page embeds in `<script type="application/json" id=element_id>`."""
    match = re.search(
        rf'<script type="application/json" id="{element_id}">(.*?)</script>', page, re.S
    )
    assert match is not None, f"no #{element_id} in the page"
    return json.loads(match.group(1))


def synthetic_run(n_requests: int, n_instances: int, steps_per_instance: int) -> RunSource:
    """A run of `n_requests` Poisson-ish arrivals over an hour on `n_instances` instances."""
    rng = np.random.default_rng(1)
    arrival = np.sort(rng.integers(0, 3_600_000_000, n_requests))
    first = arrival + rng.integers(10_000, 500_000, n_requests)
    done = first + rng.integers(100_000, 5_000_000, n_requests)
    ids = np.array([f"instance_{i}" for i in range(n_instances)], dtype=object)
    requests = RequestColumns(
        arrival_us=arrival,
        first_token_us=first,
        completion_us=done,
        generated_tokens=np.full(n_requests, 100),
        state=np.full(n_requests, "completed", object),
        instance_id=ids[rng.integers(0, n_instances, n_requests)],
        slo_class=np.full(n_requests, "", object),
        tpot_ms=rng.uniform(5, 50, n_requests),
    )
    frames = []
    for iid in ids:
        start = np.sort(rng.integers(0, 3_600_000_000, steps_per_instance))
        frames.append(
            pd.DataFrame(
                {
                    "instance_id": iid,
                    "start_us": start,
                    "step_us": 10_000,
                    "batch_size": rng.integers(1, 256, steps_per_instance),
                    "prefill_tokens": 0,
                    "decode_tokens": rng.integers(1, 256, steps_per_instance),
                    "kv_used_blocks": rng.integers(0, 29_000, steps_per_instance),
                    "queue_length": rng.integers(0, 50, steps_per_instance),
                    "running_requests": rng.integers(1, 256, steps_per_instance),
                    "preemptions_total": np.cumsum(rng.integers(0, 2, steps_per_instance)),
                }
            )
        )
    steps = pd.concat(frames, ignore_index=True)
    caps = pd.DataFrame({"instance_id": ids, "kv_blocks": 29_205, "max_num_running_reqs": 256})
    summary = {"completed_requests": n_requests, "vllm_estimated_duration_s": 3605.0}
    return RunSource(
        "saved", summary, {}, requests, steps=steps, capacities=caps, instance_ids=list(ids)
    )


class FakeSweep:
    """A SweepResult's attributes, for hand-made points."""

    def __init__(self, points: pd.DataFrame, params: list[str], seeds: list[int]) -> None:
        self.points = points
        self.params = params
        self.seeds = seeds
        self.runs = pd.DataFrame(index=range(len(points) * len(seeds)))
        self.ci_method = "student-t (table)"
