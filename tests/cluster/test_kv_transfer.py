"""The KV-transfer link (docs/behaviour.md §7.2, §A4): hand-computed timings and processor
sharing."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.cluster.kv_transfer import KVTransferLink, SharedLink, TransferRecord
from simulator.errors import ConfigError

GB = 1_000_000_000


def run_transfers(
    starts: list[tuple[int, int]],
    *,
    bandwidth_gb_per_s: float = 1.0,
    base_latency_ms: float = 0.0,
    contention: bool = True,
    slots: int | None = None,
) -> tuple[KVTransferLink, dict[int, int]]:
    """Start transfer i (size starts[i][1] bytes) at time starts[i][0]; return end time per i.

    Every on_done is checked to fire at exactly the end time it reports, once.
    """
    env = simpy.Environment()
    link = KVTransferLink(
        env, bandwidth_gb_per_s, base_latency_ms, contention=contention, slots=slots
    )
    ends: dict[int, int] = {}

    def on_done(i: int, end_us: int) -> None:
        assert i not in ends, "on_done called twice"
        assert env.now == end_us
        ends[i] = end_us

    def starter(i: int, at_us: int, size: int):
        yield env.timeout(at_us)
        link.start(i, size, lambda end_us: on_done(i, end_us))

    for i, (at_us, size) in enumerate(starts):
        env.process(starter(i, at_us, size))
    env.run()
    return link, ends


# --------------------------------------------------------------------------- hand-computed


@pytest.mark.parametrize("contention", [True, False])
def test_lone_transfer_one_gb_per_s(contention):
    # 1 GB/s = 1000 B/µs, so 1,000,000 B take 1000 µs, after 0.05 ms = 50 µs of base latency.
    link, ends = run_transfers([(100, 1_000_000)], base_latency_ms=0.05, contention=contention)
    assert ends == {0: 100 + 50 + 1000}
    (rec,) = link.records
    assert rec == TransferRecord(0, 1_000_000, 100, 150.0, 1150, 1, 1050)


@pytest.mark.parametrize("contention", [True, False])
def test_blis_formula_rounds_the_sum_once(contention):
    # base 0.0005 ms = 0.5 µs; 1,000,200 B at 1000 B/µs = 1000.2 µs. BLIS: ceil(1000.7) = 1001.
    # Rounding the parts separately (or starting the bytes at a whole µs) would give 1002.
    link, ends = run_transfers([(7, 1_000_200)], base_latency_ms=0.0005, contention=contention)
    assert ends == {0: 7 + 1001}
    assert link.lone_duration_us(1_000_200) == 1001


@pytest.mark.parametrize("contention", [True, False])
def test_blis_default_link(contention):
    # BLIS defaults: 25 GB/s, 0.05 ms. 1000 tokens * 131072 B/token (an 8B model's KV) =
    # 131,072,000 B / 25,000 B/µs = 5242.88 µs; + 50 -> ceil(5292.88) = 5293.
    size = 1000 * 131_072
    link, ends = run_transfers(
        [(0, size)], bandwidth_gb_per_s=25.0, base_latency_ms=0.05, contention=contention
    )
    assert ends == {0: 5293}
    assert link.lone_duration_us(size) == math.ceil(0.05 * 1000 + size / (25.0 * 1000))


def test_minimum_duration_is_one_us():
    _, ends = run_transfers([(3, 0)])
    assert ends == {0: 4}


def test_two_equal_simultaneous_transfers_take_twice_as_long():
    _, lone = run_transfers([(0, 3_333_333)], bandwidth_gb_per_s=2.5)
    _, pair = run_transfers([(0, 3_333_333), (0, 3_333_333)], bandwidth_gb_per_s=2.5)
    lone_us = lone[0]
    # 3,333,333 B / 2500 B/µs = 1333.3332 -> 1334 alone; shared: 2666.6664 -> 2667.
    assert lone_us == 1334
    assert pair == {0: 2667, 1: 2667}
    exact_lone = 3_333_333 / 2500
    assert pair[0] == math.ceil(2 * exact_lone)


def test_two_equal_transfers_without_contention_do_not_interfere():
    _, ends = run_transfers([(0, 1_000_000), (0, 1_000_000)], contention=False)
    assert ends == {0: 1000, 1: 1000}


def test_second_transfer_halfway_through_the_first():
    # A: 1,000,000 B at t=0 (1000 µs alone). B: 1,000,000 B at t=500.
    # At 500, A has 500,000 B left; both now drain at 500 B/µs, so A needs 1000 µs more and
    # ends at 1500 = 1.5x its lone time. B has drained 500,000 B by then; alone again at
    # 1000 B/µs it needs 500 µs more: ends at 2000 (takes 1500 µs).
    link, ends = run_transfers([(0, 1_000_000), (500, 1_000_000)])
    assert ends == {0: 1500, 1: 2000}
    by_id = {r.transfer_id: r for r in link.records}
    assert by_id[0].duration_us == 1500 and by_id[1].duration_us == 1500
    assert by_id[0].concurrency_at_start == 1 and by_id[1].concurrency_at_start == 2


def test_stale_wake_ups_are_ignored():
    # A alone would finish at 1000; B joins at 500, so the wake-up scheduled for 1000 is stale:
    # the link must do nothing then, and A must end at 1500, not 1000. Joins do not wake the
    # link: B's, at 500, is applied at the 1000 wake-up, in exact-time order (A drained alone
    # over [0, 500), then both at half the bandwidth), which is why A's end moves to 1500.
    env = simpy.Environment()
    link = KVTransferLink(env, 1.0, 0.0)
    processed_at: list[int] = []
    original = link._process_until

    def spy(now: int) -> None:
        processed_at.append(now)
        original(now)

    link._process_until = spy
    ends: dict[str, int] = {}

    def starter(name: str, at_us: int):
        yield env.timeout(at_us)
        link.start(name, 1_000_000, lambda end_us: ends.__setitem__(name, end_us))

    env.process(starter("A", 0))
    env.process(starter("B", 500))
    env.run()
    assert ends == {"A": 1500, "B": 2000}
    assert processed_at == [1000, 1500, 2000]
    assert link.in_flight == 0 and link.initiated == 2


def test_a_run_stopped_at_a_horizon_settles_the_joins_before_it():
    # Joins wait for the link's next wake-up; a run stopped at a horizon applies those that
    # happened by then, as if the link had woken for each. A: requested at 0, 0.5 ms = 500 µs
    # of base latency, then 1,000,000 B at 1,000 B/µs: on the link over [500, 1500). B:
    # requested at 600, joins at 1100 (after the horizon). Horizon 1000.
    env = simpy.Environment()
    link = KVTransferLink(env, 1.0, 0.5)
    link.start("A", 1_000_000, lambda _end_us: None)

    def later():
        yield env.timeout(600)
        link.start("B", 1_000_000, lambda _end_us: None)

    env.process(later())
    env.run(until=1001)
    assert link.open_transfers() == []  # A's join at 500 not applied yet: nothing woke the link
    link.settle(1000)
    assert link.open_transfers() == [(500.0, None)]  # A on the link; B still in base latency
    assert link.peak_concurrency == 1 and link.mean_concurrency_at_start == 1.0
    assert link.in_flight == 2 and not link.records
    # Over [0, 1000): A's bytes were on the link for 500 µs.
    assert link.time_weighted_mean_concurrency(1000) == pytest.approx(0.5)


def test_transfer_started_from_on_done_callback():
    # A chain: each completion starts the next transfer at the same microsecond.
    env = simpy.Environment()
    link = KVTransferLink(env, 1.0, 0.0)
    ends: list[int] = []

    def on_done(end_us: int) -> None:
        ends.append(end_us)
        if len(ends) < 3:
            link.start(len(ends), 1_000_000, on_done)

    link.start(0, 1_000_000, on_done)
    env.run()
    assert ends == [1000, 2000, 3000]


def test_stats_peak_and_mean_concurrency():
    # Three together (depths 1, 2, 3), then one alone after they finish (depth 1).
    link, ends = run_transfers(
        [(0, 1_000_000), (0, 1_000_000), (0, 1_000_000), (10_000, 1_000_000)]
    )
    assert ends == {0: 3000, 1: 3000, 2: 3000, 3: 11_000}
    assert link.peak_concurrency == 3
    assert link.mean_concurrency_at_start == pytest.approx((1 + 2 + 3 + 1) / 4)
    # Over [0, 20000): 3 transfers for 3000 µs + 1 for 1000 µs = 10,000 transfer-µs.
    assert link.time_weighted_mean_concurrency(20_000) == pytest.approx(0.5)
    assert link.time_weighted_mean_concurrency(0) == 0.0


def test_base_latency_does_not_share_bandwidth():
    # Base latency 1 ms. A requested at 0: bytes on the link 1000..2000. B requested at 1500 is
    # in setup until 2500, after A's bytes are done, so A is not slowed and B runs alone too.
    link, ends = run_transfers([(0, 1_000_000), (1500, 1_000_000)], base_latency_ms=1.0)
    assert ends == {0: 2000, 1: 3500}
    assert [r.concurrency_at_start for r in link.records] == [1, 1]


def test_duplicate_and_bad_sizes_rejected():
    env = simpy.Environment()
    link = KVTransferLink(env, 1.0, 0.0)
    link.start("x", 10, lambda _: None)
    with pytest.raises(ValueError, match="already in flight"):
        link.start("x", 10, lambda _: None)
    for bad in (-1, math.nan, math.inf, True):
        with pytest.raises(ValueError):
            link.start("y", bad, lambda _: None)


@pytest.mark.parametrize("bad", [0, -1.0, math.inf, math.nan, True, "25"])
def test_bad_bandwidth(bad):
    with pytest.raises(ConfigError, match="pd.transfer_bandwidth_gb_per_s"):
        KVTransferLink(simpy.Environment(), bad, 0.05)


@pytest.mark.parametrize("bad", [-0.01, math.inf, math.nan, True, "0"])
def test_bad_base_latency(bad):
    with pytest.raises(ConfigError, match="pd.transfer_base_latency_ms"):
        KVTransferLink(simpy.Environment(), 25.0, bad)


# --------------------------------------------------------------------------- core


def test_shared_link_core():
    link = SharedLink(1000.0, contention=True)
    link.add(0.0, "a", 1_000_000)
    assert link.next_completion() == (1000.0, "a")
    link.add(500.0, "b", 1_000_000)
    assert link.active_count == 2
    assert link.next_completion() == (1500.0, "a")
    # Advancing past A's finish: A stops sharing at 1500, B drains alone afterwards.
    link.advance(1750.0)
    assert link.active_count == 1
    assert link.next_completion() == (1500.0, "a")
    link.remove("a")
    assert link.next_completion() == (2000.0, "b")
    with pytest.raises(ValueError, match="backwards"):
        link.advance(1000.0)


def test_shared_link_without_contention():
    link = SharedLink(1000.0, contention=False)
    link.add(0.0, "a", 1_000_000)
    link.add(500.0, "b", 1_000_000)
    assert link.next_completion() == (1000.0, "a")
    link.advance(1000.0)
    link.remove("a")
    assert link.next_completion() == (1500.0, "b")


# --------------------------------------------------------------------------- reference model


def reference_ends(
    joins: list[tuple[Fraction, int]], bw: Fraction, requested: list[int], contention: bool
) -> list[int]:
    """Independent exact (rational) processor-sharing simulation; returns integer end times."""
    pending = sorted(range(len(joins)), key=lambda i: (joins[i][0], i))
    active: dict[int, Fraction] = {}
    finish: dict[int, Fraction] = {}
    t = Fraction(0)
    while pending or active:
        rate = (bw / len(active) if contention else bw) if active else None
        next_finish = None
        if active:
            i_min = min(active, key=lambda i: active[i])
            next_finish = t + active[i_min] / rate
        next_join = joins[pending[0]][0] if pending else None
        if next_finish is not None and (next_join is None or next_finish <= next_join):
            dt = next_finish - t
            for i in list(active):
                active[i] -= rate * dt
                if active[i] <= 0:
                    finish[i] = next_finish
                    del active[i]
            t = next_finish
        else:
            if active:
                for i in active:
                    active[i] -= rate * (next_join - t)
            t = next_join
            i = pending.pop(0)
            if joins[i][1] == 0:
                finish[i] = t
            else:
                active[i] = Fraction(joins[i][1])
    return [max(math.ceil(finish[i]), requested[i] + 1) for i in range(len(joins))]


@settings(max_examples=150, deadline=None)
@given(
    transfers=st.lists(
        st.tuples(st.integers(0, 5_000), st.integers(0, 5_000_000)), min_size=1, max_size=8
    ),
    bandwidth_gb_per_s=st.sampled_from([1.0, 2.5, 25.0, 0.3]),
    base_latency_ms=st.sampled_from([0.0, 0.05, 0.0125, 1.0]),
    contention=st.booleans(),
)
def test_matches_reference_processor_sharing(
    transfers, bandwidth_gb_per_s, base_latency_ms, contention
):
    link, ends = run_transfers(
        transfers,
        bandwidth_gb_per_s=bandwidth_gb_per_s,
        base_latency_ms=base_latency_ms,
        contention=contention,
    )
    assert len(ends) == len(transfers)  # every transfer ends
    # Decimal-exact parameters (0.05 ms is 50 µs, not the binary float's 50.0000000000000028).
    bw = Fraction(str(bandwidth_gb_per_s)) * 1000
    base = Fraction(str(base_latency_ms)) * 1000
    requested = [at for at, _ in transfers]
    ref = reference_ends([(at + base, size) for at, size in transfers], bw, requested, contention)
    for i, expected in enumerate(ref):
        assert abs(ends[i] - expected) <= 1, (i, ends[i], expected)
    if not contention:
        for i, (at, size) in enumerate(transfers):
            assert ends[i] == at + link.lone_duration_us(size)
    # Work conservation: the link cannot move the bytes faster than its bandwidth.
    total_bytes = sum(size for _, size in transfers)
    first_start = min(r.start_us for r in link.records)
    makespan = max(ends.values())
    if contention:
        assert total_bytes / float(bw) <= makespan - first_start + 1e-6
    assert link.in_flight == 0
    assert len(link.records) == len(transfers) == link.initiated
    assert 1 <= link.peak_concurrency <= len(transfers)


# --------------------------------------------------------------------------- the process


def test_the_link_is_a_process_fed_through_a_store_and_resumes_where_its_wake_up_fires() -> None:
    """`start` puts the transfer into the link's `requests` Store (in flight from then on);
    the link process takes it, arms its wake-up, and when the wake-up fires it resumes at
    LINK_RESUME, ahead of events of the wake-up's own priority at that microsecond made after
    the wake-up was armed: the order a callback on the wake-up had."""
    from simulator.engine.events import ROUTER, Environment, event_after

    env = Environment()
    link = KVTransferLink(env, 1.0, 0.0, contention=True, priority=ROUTER)
    assert isinstance(link.requests, simpy.Store)
    order: list[str] = []
    # 1,000,000 bytes at 1 GB/s (1,000 B/µs) = 1,000 µs.
    link.start("kv", 1_000_000, lambda end_us: order.append(f"link@{end_us}"))
    assert link.in_flight == 1 and len(link.requests.items) == 1

    def later():
        yield env.timeout(5)  # the link armed its wake-up at 0, when it took the request
        event_after(env, 995, ROUTER).callbacks.append(lambda _e: order.append("other@1000"))

    env.process(later())
    env.run()
    assert order == ["link@1000", "other@1000"]
    assert link.in_flight == 0 and not link.requests.items


# --------------------------------------------------------------------------- transfer slots


@pytest.mark.parametrize("contention", [True, False])
def test_one_slot_makes_simultaneous_transfers_queue(contention):
    """Slots: 1. Three transfers of 1,000,000 B requested together at t = 0 on a 1 GB/s link
    with 50 µs of base latency: each alone takes 50 + 1,000,000 / 1,000 = 1,050 µs, and each
    starts (base latency first) when the one before is reported done: ends 1,050, 2,100 and
    3,150 µs, bytes joining at 50, 1,100 and 2,150 µs; contention has nothing to share."""
    link, ends = run_transfers(
        [(0, 1_000_000)] * 3, base_latency_ms=0.05, contention=contention, slots=1
    )
    assert ends == {0: 1050, 1: 2100, 2: 3150}
    assert [r.start_us for r in link.records] == [50.0, 1100.0, 2150.0]
    assert [r.concurrency_at_start for r in link.records] == [1, 1, 1]
    assert link.peak_concurrency == 1
    assert link.in_flight == 0 and link.awaiting_slot == 0


def test_two_slots_share_the_link_and_the_third_waits():
    """Slots: 2, contention on, no base latency, 1 GB/s. Three 1,000,000 B transfers at t = 0:
    the first two share the link (500 B/µs each) and both end at 2,000 µs; the third starts
    then, alone, and ends at 3,000 µs."""
    link, ends = run_transfers([(0, 1_000_000)] * 3, contention=True, slots=2)
    assert ends == {0: 2000, 1: 2000, 2: 3000}
    assert link.peak_concurrency == 2


@settings(max_examples=150, deadline=None)
@given(
    transfers=st.lists(
        st.tuples(st.integers(0, 3000), st.integers(0, 3_000_000)), min_size=1, max_size=12
    ),
    slots=st.integers(1, 4),
    contention=st.booleans(),
    base_latency_ms=st.sampled_from([0.0, 0.05, 0.3]),
)
def test_slot_laws(transfers, slots, contention, base_latency_ms):
    """With k slots: every transfer is reported once; at no time are more than k transfers in
    flight (from their slot's start, requested or freed, to their reported end); slots are
    handed out first come first served; a transfer waits for a slot only while k others are in
    flight; and with at least as many slots as transfers the link is the unlimited one."""
    base_us = base_latency_ms * 1000
    link, ends = run_transfers(
        transfers, base_latency_ms=base_latency_ms, contention=contention, slots=slots
    )
    assert sorted(ends) == list(range(len(transfers)))
    records = {r.transfer_id: r for r in link.records}
    slot_start = {i: records[i].start_us - base_us for i in ends}  # when its slot was taken
    for i, (requested, _size) in enumerate(transfers):
        assert slot_start[i] >= requested - 1e-9
        # Waiting only while every slot is held by a transfer that took its slot before.
        if slot_start[i] > requested + 1e-9:
            holders = [j for j in ends if slot_start[j] <= requested + 1e-9 < ends[j]]
            assert len(holders) >= slots
    moments = sorted({t for i in ends for t in (slot_start[i], ends[i])})
    for t in moments:
        in_flight = sum(1 for i in ends if slot_start[i] <= t < ends[i])
        assert in_flight <= slots
    # First come first served: requested earlier (or at once, started first) -> slot no later.
    order = sorted(range(len(transfers)), key=lambda i: (transfers[i][0], i))
    starts_in_order = [slot_start[i] for i in order]
    assert starts_in_order == sorted(starts_in_order)
    if slots >= len(transfers):
        _, unlimited = run_transfers(
            transfers, base_latency_ms=base_latency_ms, contention=contention
        )
        assert ends == unlimited


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_bad_slots(bad):
    with pytest.raises(ConfigError, match=r"cluster\.pd\.transfer_slots"):
        KVTransferLink(simpy.Environment(), 25.0, 0.05, slots=bad)


_record_values = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False, width=64),
)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.text(max_size=4),
            _record_values,
            st.integers(min_value=0, max_value=2**62),
            _record_values,
            st.integers(min_value=0, max_value=2**62),
            st.integers(min_value=1, max_value=2**40),
        ),
        max_size=12,
    ),
    flush_rows=st.integers(min_value=1, max_value=5),
    reads_after=st.lists(st.integers(min_value=0, max_value=12), max_size=3),
    base_latency_us=st.sampled_from([0.0, 250.0, 0.5]),
)
def test_transfer_records_read_back_what_was_appended(
    rows, flush_rows, reads_after, base_latency_us
):
    """Law: whatever was appended — narrow or huge integers, fractions, reads in between
    (which move the buffered rows into the columns) — reads back as the same values of the
    same types, in order; a start that is the request time plus the base latency is derived,
    any other is kept."""
    from simulator.cluster.kv_transfer import TransferRecords

    records = TransferRecords(base_latency_us)
    records.FLUSH_ROWS = flush_rows
    expected = []
    for k, (tid, size, requested, start, end, concurrency) in enumerate(rows):
        records.append(tid, size, requested, start, end, concurrency)
        expected.append(
            TransferRecord(tid, size, requested, start, end, concurrency, end - requested)
        )
        if k in reads_after:
            assert len(records) == k + 1  # a read mid-way
    got = list(records)
    assert got == expected
    for record, want in zip(got, expected, strict=True):
        assert [type(getattr(record, f)) for f in ("size_bytes", "start_us", "duration_us")] == [
            type(want.size_bytes),
            type(want.start_us),
            type(want.duration_us),
        ]
