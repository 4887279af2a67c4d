"""The pooled ITL holds the gaps of completed requests only (docs/engine.md, "The ITL pool").

Every run under the test suite also checks the law in `invariants.check_run` (the pool holds
Σ(n − 1) gaps over the completed requests, adding up to their first-to-last-token times);
these cases pin hand-computed pools for each way a request can leave without completing.
"""

from __future__ import annotations

import numpy as np
import pytest

from simulator.cluster.cluster import run_simulation
from simulator.engine.batching import EngineConfig
from simulator.engine.request import Request, RequestState
from simulator.latency.blackbox import BlackboxModel
from simulator.metrics.summary import CountedValues, pooled_itl_us

# Every step costs 1,000 µs plus 10 µs per prefill token and 5 µs per decode token, and a
# token reaches the client 100 µs per token after its step's end (alpha2).
STEP_MODEL = BlackboxModel([0, 0, 100], [1000, 10.0, 5.0])
CONFIG = EngineConfig(total_kv_blocks=200, block_size=16, max_num_running_reqs=8)


def _pool(requests, horizon_us=None, config=CONFIG):
    result = run_simulation(requests, config, STEP_MODEL, horizon_us, check_invariants=True)
    return result, pooled_itl_us(result.instance_records)


def _expanded(pool: CountedValues) -> list[int]:
    return np.repeat(pool.values, pool.counts).tolist()


def test_a_timed_out_request_leaves_no_gap_in_the_pool():
    # Both prompts (10 tokens each) are prefilled in step 1: 1,000 + 10 * 20 = 1,200 µs. Then
    # both decode: each step 1,000 + 5 * 2 = 1,010 µs, so each gap is 1,010 + 100 = 1,110 µs
    # (the step plus one alpha2: token k reaches the client at its step's end + k * 100).
    # `short` has 4 tokens: 3 gaps, done at the end of step 4. `long` asks for 40 tokens
    # and its client gives up at 8,000 µs, after 6 tokens of its own.
    short = Request("short", 0, 10, 4)
    long = Request("long", 0, 10, 40, deadline_us=8_000)
    result, pool = _pool([short, long])
    states = {r.request_id: r.state for r in result.request_records}
    assert states == {"short": RequestState.COMPLETED, "long": RequestState.TIMED_OUT}
    assert _expanded(pool) == [1_110, 1_110, 1_110]
    assert result.summary["itl_mean_ms"] == pytest.approx(1.11)


def test_a_request_cut_by_the_horizon_leaves_no_gap_in_the_pool():
    short = Request("short", 0, 10, 4)
    long = Request("long", 0, 10, 40)
    result, pool = _pool([short, long], horizon_us=10_000)
    assert result.summary["still_running"] == 1
    assert _expanded(pool) == [1_110, 1_110, 1_110]


def test_nothing_completed_means_no_pool():
    result, pool = _pool([Request("long", 0, 10, 40)], horizon_us=10_000)
    assert len(pool) == 0
    assert result.summary["itl_mean_ms"] is None


def test_a_preempted_request_that_completes_keeps_its_long_gap_and_one_that_times_out_does_not():
    # A cache of 6 blocks of 4 tokens forces preemptions: the pool must hold exactly the
    # completed requests' gaps, irregular (after a preemption) ones included.
    config = EngineConfig(total_kv_blocks=6, block_size=4, max_num_running_reqs=4)
    requests = [
        Request("a", 0, 4, 12),
        Request("b", 0, 4, 12),
        Request("c", 0, 4, 12, deadline_us=20_000),
    ]
    result, pool = _pool(requests, config=config)
    assert result.summary["preemption_count"] > 0
    completed = [r for r in result.request_records if r.state is RequestState.COMPLETED]
    assert len(pool) == sum(r.generated_tokens - 1 for r in completed)
    assert int(np.dot(pool.values, pool.counts)) == sum(
        r.last_token_us - r.first_token_us for r in completed
    )
    # The irregular gaps survive only for the completed requests: the pool's largest gap is
    # longer than a step (a preempted request's wait), so the case exercises breaks.
    assert pool.values.max() > 1_110 + 1_000


def test_counted_values_refuse_taking_out_more_than_was_put_in():
    with pytest.raises(ValueError, match="taken out more often"):
        CountedValues(np.array([5, 5]), np.array([1, -2]))
    taken = CountedValues(np.array([5, 7, 5]), np.array([2, 1, -2]))
    assert taken.values.tolist() == [7] and taken.counts.tolist() == [1]
