"""Data-parallel attention ranks stepping together (simulator/engine/dp_group.py).

The rule: while any rank has work every rank steps; a step lasts as long as the slowest rank's
batch would alone; a rank with nothing to run runs a one-token dummy batch. The hand-computed
cases use a blackbox step model, step = 1000 + 10 x prefill tokens + 5 x decode tokens (µs).
"""

from __future__ import annotations

import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.engine.batching import EngineConfig, VLLMEngine
from simulator.engine.dp_group import DUMMY_BATCH, LockstepGroup, lockstep_step_us
from simulator.engine.events import STEP, Environment
from simulator.engine.instance import Instance
from simulator.engine.request import Request, RequestState
from simulator.latency import BlackboxModel

MODEL = BlackboxModel([0, 0, 0], [1000, 10.0, 5.0])


def test_step_is_the_slowest_rank_and_idle_ranks_run_the_dummy() -> None:
    assert lockstep_step_us([2000, 1200], 1005) == 2000
    assert lockstep_step_us([1200, None], 1500) == 1500  # the idle rank's dummy is slower
    assert lockstep_step_us([1200, None], 1005) == 1200
    assert lockstep_step_us([None, None], 1005) == 0  # nobody runs: no step
    # The dummy batch is one decode token: 1000 + 5 x 1.
    assert MODEL.step_time_us(DUMMY_BATCH) == 1005


def _steps(rank: Instance) -> dict[str, list[int]]:
    log = rank.engine.steps
    return {
        name: [int(v) for v in log.column(name)]
        for name in ("start_us", "step_us", "prefill_tokens", "decode_tokens")
    }


def _group(dp: int, blocks: int = 1000):
    env = Environment()
    group = LockstepGroup(env, "instance_0", MODEL, STEP)
    finished: list[Request] = []
    ranks = [
        Instance(
            env,
            f"instance_0.dp{r}",
            VLLMEngine(EngineConfig(total_kv_blocks=blocks, block_size=16)),
            MODEL,
            finished.append,
            index=r,
            lockstep=group,
        )
        for r in range(dp)
    ]
    return env, group, ranks, finished


def test_two_ranks_wait_for_each_other() -> None:
    env, group, (rank0, rank1), finished = _group(2)
    a = Request("a", 0, 100, 3, index=0)
    b = Request("b", 0, 20, 3, index=1)
    rank0.inbox.put(a)
    rank1.inbox.put(b)
    env.run()
    # Step 1 at 0: a prefills 100 tokens (1000 + 10 x 100 = 2000 µs), b 20 (1000 + 200 = 1200):
    # the step lasts 2000 and both get their first token then. Steps 2 and 3 decode one token
    # each on both ranks (1000 + 5 = 1005): 2000 + 1005 + 1005 = 4010. Alone, b would have
    # finished at 1200 + 1005 + 1005 = 3210.
    assert (a.first_token_us, b.first_token_us) == (2000, 2000)
    assert (a.completion_us, b.completion_us) == (4010, 4010)
    assert group.lockstep_steps == 3 and group.dummy_rank_steps == 0
    for rank in (rank0, rank1):
        frame = _steps(rank)
        assert list(frame["start_us"]) == [0, 2000, 3005]
        assert list(frame["step_us"]) == [2000, 1005, 1005]
    assert {r.state for r in finished} == {RequestState.COMPLETED}


def test_an_idle_rank_runs_dummies_and_logs_no_step() -> None:
    env, group, (rank0, rank1), finished = _group(2)
    rank1.inbox.put(Request("b", 0, 20, 2, index=0))
    env.run()
    # Rank 1 alone: 1200 (prefill 20) then 1005 (one decode); rank 0 runs the dummy batch
    # (1005 µs) both times, which is never slower here.
    assert [r.completion_us for r in finished] == [2205]
    assert group.lockstep_steps == 2 and group.dummy_rank_steps == 2
    assert len(rank0.engine.steps) == 0


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    dp=st.integers(1, 4),
    jobs=st.lists(
        st.tuples(
            st.integers(0, 3), st.integers(0, 20_000), st.integers(1, 300), st.integers(1, 20)
        ),
        min_size=1,
        max_size=25,
    ),
)
def test_lockstep_laws(dp: int, jobs: list[tuple[int, int, int, int]]) -> None:
    """Random requests on random ranks: every request completes once; every rank's steps are
    steps of the group (same start, same duration), never overlapping; each rank's step lasts
    at least its own batch's price."""
    env, group, ranks, finished = _group(dp, blocks=10_000)

    def feed(rank: Instance, req: Request, at_us: int):
        yield env.timeout(at_us)
        rank.inbox.put(req)

    requests = []
    for i, (rank, at_us, prompt, output) in enumerate(jobs):
        req = Request(f"r{i}", at_us, prompt, output, index=i)
        requests.append(req)
        env.process(feed(ranks[rank % dp], req, at_us))
    env.run()
    assert sorted(r.request_id for r in finished) == sorted(r.request_id for r in requests)
    assert all(r.state is RequestState.COMPLETED for r in finished)
    for req in requests:  # causality
        assert req.arrival_us <= req.first_token_us <= req.completion_us
    steps: dict[int, int] = {}
    for rank in ranks:
        frame = _steps(rank)
        for start, duration, prefill, decode in zip(
            frame["start_us"],
            frame["step_us"],
            frame["prefill_tokens"],
            frame["decode_tokens"],
            strict=True,
        ):
            assert steps.setdefault(start, duration) == duration  # one step, one duration
            # Never shorter than the rank's own batch (prefill and decode tokens priced).
            assert duration >= 1000 + 10 * prefill + 5 * decode
    starts = sorted(steps)
    for earlier, later in zip(starts, starts[1:], strict=False):
        assert earlier + steps[earlier] <= later  # the group's steps never overlap
    assert len(starts) <= group.lockstep_steps


def test_group_process_is_a_simpy_process_over_instance_inboxes() -> None:
    env, group, ranks, _ = _group(2)
    assert all(isinstance(rank.inbox, simpy.Store) for rank in ranks)
    assert group.ranks == ranks
