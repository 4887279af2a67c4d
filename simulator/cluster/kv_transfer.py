"""The KV-transfer link between the prefill and decode pools (docs/behaviour.md §7.2, §A4).

One link is shared by the whole cluster. A transfer first pays a fixed base latency (connection
setup; it does not use bandwidth), then its bytes join the link. Two bandwidth models:

* contention on (default): processor sharing. Every transfer whose bytes are on the link drains
  at bandwidth / (number of such transfers), recomputed whenever one joins or finishes, so two
  equal transfers started together each take twice as long as one alone.
* contention off (BLIS's model): every transfer drains at the full bandwidth, independently.

Optionally the link has transfer slots (`cluster.pd.transfer_slots`, a `simpy.Resource`): at
most that many transfers are in flight (base latency, bytes or completion due); one that
finds them all taken waits, first come first served, and starts — base latency first — when a
slot frees. Without it (the default, as BLIS) transfers never wait for one another to start.

`SharedLink` is the plain-Python core, in exact (float) microseconds. `KVTransferLink` is the
link's SimPy process on the integer µs clock: requesters put transfers into its `requests`
Store; the process waits for the next of a new request and its own next wake-up (a finish,
with the joins before it applied in exact-time order), and a transfer completes at the first
integer µs at or after its exact finish time.
A transfer that never shared the link (always, with contention off) takes exactly BLIS's
`ceil(base_ms*1000 + bytes / (GBps*1000))` µs, minimum 1.
"""

from __future__ import annotations

import heapq
import itertools
import math
import operator
from array import array
from collections import deque
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass

import simpy

from ..engine.events import LINK_RESUME, PriorityEvent, PriorityTimeout
from ..errors import invalid, is_finite_positive
from ..limits import MAX_TIME_US, check_time_us, duration_us
from ..metrics.pd_record import lone_transfer_us, time_weighted_concurrency
from ..metrics.request_table import StringColumn, extend_widening

BANDWIDTH_FIELD = "cluster.pd.transfer_bandwidth_gb_per_s"
BASE_LATENCY_FIELD = "cluster.pd.transfer_base_latency_ms"
SLOTS_FIELD = "cluster.pd.transfer_slots"

TransferId = Hashable


def _float_slack_us(t_us: float) -> float:
    """Float noise allowed around an exact time before it counts as the next microsecond.

    Exact finish times are sums of quotients; without slack, 2000.0000000000002 would be
    delivered at 2001 and two equal transfers would not take exactly twice a lone one.
    """
    return 1e-6 + 16 * math.ulp(t_us)


def ceil_us(t_us: float) -> int:
    """The first integer µs at or after `t_us`, ignoring float noise."""
    return math.ceil(t_us - _float_slack_us(t_us))


def _wake_no_later_than(t_us: float) -> int:
    """`ceil_us(t_us)`, or a microsecond before it when `t_us` lies within float noise of
    the rounding boundary: a wake-up for a finish the link will compute another way (a lone
    transfer's, reached through its drains) must not come after that finish."""
    return math.ceil(t_us - _float_slack_us(t_us) - 64 * math.ulp(t_us))


# --------------------------------------------------------------------------- core


class SharedLink:
    """Processor-sharing bandwidth model in exact (float) µs; no SimPy.

    `add` and `advance` move the link's clock forward (never back). `advance` drains piecewise:
    a transfer that runs out of bytes before `now_us` stops sharing bandwidth at its exact
    finish time, and stays reported by `next_completion` until `remove` takes it out.
    """

    def __init__(self, bandwidth_bytes_per_us: float, contention: bool) -> None:
        if not is_finite_positive(bandwidth_bytes_per_us):
            raise invalid(
                "bandwidth_bytes_per_us", bandwidth_bytes_per_us, "must be a finite number > 0"
            )
        self.bandwidth_bytes_per_us = float(bandwidth_bytes_per_us)
        self.contention = contention
        self.now_us = 0.0
        # id -> (remaining bytes, insertion order); order breaks ties between equal remainders.
        self._remaining: dict[TransferId, list[float]] = {}
        # Transfers whose bytes are done but that the caller has not removed: id -> finish time.
        self._finished: dict[TransferId, float] = {}
        self._order = itertools.count()

    @property
    def active_count(self) -> int:
        """Transfers whose bytes are still draining (the ones sharing the bandwidth)."""
        return len(self._remaining)

    def __contains__(self, transfer_id: TransferId) -> bool:
        return transfer_id in self._remaining or transfer_id in self._finished

    def _rate(self) -> float:
        if self.contention:
            return self.bandwidth_bytes_per_us / len(self._remaining)
        return self.bandwidth_bytes_per_us

    def add(self, now_us: float, transfer_id: TransferId, size_bytes: float) -> None:
        if transfer_id in self:
            raise ValueError(f"transfer {transfer_id!r} is already on the link")
        if not (math.isfinite(size_bytes) and size_bytes >= 0):
            raise ValueError(f"transfer size must be finite and >= 0, got {size_bytes!r}")
        self.advance(now_us)
        if size_bytes == 0:
            self._finished[transfer_id] = self.now_us
        else:
            self._remaining[transfer_id] = [float(size_bytes), float(next(self._order))]

    def _next_drain(self) -> tuple[float, TransferId] | None:
        remaining = self._remaining
        if len(remaining) == 1:  # nearly always: transfers seldom overlap
            tid, (rem, _) = next(iter(remaining.items()))
        elif remaining:
            tid, (rem, _) = min(remaining.items(), key=_remaining_then_order)
        else:
            return None
        # `_rate()`, written out: this runs a few times per transfer.
        rate = (
            self.bandwidth_bytes_per_us / len(remaining)
            if self.contention
            else self.bandwidth_bytes_per_us
        )
        return self.now_us + rem / rate, tid

    def next_completion(self) -> tuple[float, TransferId] | None:
        """(exact finish time, id) of the earliest finishing transfer not yet removed."""
        finished = self._finished
        if not finished:
            return self._next_drain()
        tid = min(finished, key=finished.__getitem__)
        return finished[tid], tid

    def advance(self, now_us: float) -> None:
        """Drain bytes up to `now_us`, finishing transfers in order along the way."""
        if now_us < self.now_us:
            if self.now_us - now_us > _float_slack_us(self.now_us):
                raise ValueError(f"link time moves backwards: {now_us} < {self.now_us}")
            return
        while self._remaining:
            finish_us, first = self._next_drain()
            if finish_us > now_us:
                break
            self._drain_to(finish_us, first)
        if self._remaining:
            self._drain_to(now_us, None)
        self.now_us = now_us

    def _drain_to(self, t_us: float, finishing: TransferId | None) -> None:
        drained = self._rate() * (t_us - self.now_us)
        for tid, entry in list(self._remaining.items()):
            # The transfer we computed the finish time for ends exactly; others with the same
            # remainder hit 0 through the same arithmetic.
            entry[0] = 0.0 if tid == finishing else entry[0] - drained
            if entry[0] <= 0.0:
                del self._remaining[tid]
                self._finished[tid] = t_us
        self.now_us = max(self.now_us, t_us)

    def is_draining(self, transfer_id: TransferId) -> bool:
        """True while the transfer still has bytes left (it shares the bandwidth)."""
        return transfer_id in self._remaining

    def remove(self, transfer_id: TransferId) -> None:
        """Take a transfer off the link (finished or not)."""
        if transfer_id in self._finished:
            del self._finished[transfer_id]
        else:
            del self._remaining[transfer_id]


def _remaining_then_order(item: tuple[TransferId, list[float]]) -> tuple[float, float]:
    return item[1][0], item[1][1]


# --------------------------------------------------------------------------- SimPy wrapper


@dataclass
class TransferRecord:
    """One completed transfer. Times are absolute µs; `start_us` may be fractional when the
    base latency is not a whole number of µs."""

    transfer_id: TransferId
    size_bytes: float
    requested_us: int
    start_us: float  # bytes join the link: requested + base latency
    end_us: int
    concurrency_at_start: int  # transfers on the link when its bytes joined, itself included
    duration_us: int  # end - requested


class TransferRecords(Sequence):
    """The completed transfers as columns (a million transfers would otherwise keep a
    million objects); reading one builds its `TransferRecord`, with the values and types it
    was recorded with. Integers are stored as narrow as their values allow; a column meeting
    a value of another type (a fractional size) keeps plain values from then on. A start is
    the request time plus the base latency, computed as the link computes it, so it is kept
    only where it is not (never, from the link).

    Appends go to a buffer of row tuples, moved into the columns in bulk every `FLUSH_ROWS`
    rows and before any read (the column attributes flush first): one list append per
    transfer on the link's path instead of five column appends."""

    FLUSH_ROWS = 4096
    COLUMNS = ("size_bytes", "requested_us", "duration_us", "concurrency_at_start")

    def __init__(self, base_latency_us: float = 0.0) -> None:
        self.base_latency_us = base_latency_us
        self._transfer_id = StringColumn()  # a request id each, from the PD flow
        self._columns: dict[str, array | list] = {name: array("b") for name in self.COLUMNS}
        self._other_starts: dict[int, float] = {}
        self._pending: list[tuple] = []

    def append(
        self,
        transfer_id: TransferId,
        size_bytes: float,
        requested_us: int,
        start_us: float,
        end_us: int,
        concurrency_at_start: int,
    ) -> None:
        pending = self._pending
        pending.append(
            (transfer_id, size_bytes, requested_us, start_us, end_us, concurrency_at_start)
        )
        if len(pending) >= self.FLUSH_ROWS:
            self._flush()

    def _flush(self) -> None:
        rows, self._pending = self._pending, []
        if not rows:
            return
        first = len(self._transfer_id)
        base = self.base_latency_us
        ids, sizes, requested, starts, ends, concurrency = zip(*rows, strict=True)
        for k, (start, asked) in enumerate(zip(starts, requested, strict=True)):
            if start != asked + base or type(start) is not float:
                self._other_starts[first + k] = start
        self._transfer_id.extend(ids)
        self._extend("size_bytes", sizes)
        self._extend("requested_us", requested)
        self._extend("duration_us", list(map(operator.sub, ends, requested)))
        self._extend("concurrency_at_start", concurrency)

    def _extend(self, name: str, values: Sequence) -> None:
        column = self._columns[name]
        if type(column) is array:
            if set(map(type, values)) <= {int}:
                try:
                    self._columns[name] = extend_widening(column, values, "q")
                    return
                except OverflowError:  # beyond eight bytes: plain values from now on
                    pass
            column = self._columns[name] = list(column)
        column.extend(values)

    @property
    def transfer_id(self) -> StringColumn:
        self._flush()
        return self._transfer_id

    def _column(self, name: str) -> array | list:
        self._flush()
        return self._columns[name]

    size_bytes = property(lambda self: self._column("size_bytes"))
    requested_us = property(lambda self: self._column("requested_us"))
    duration_us = property(lambda self: self._column("duration_us"))
    concurrency_at_start = property(lambda self: self._column("concurrency_at_start"))

    @property
    def other_starts(self) -> dict[int, float]:
        self._flush()
        return self._other_starts

    def start_us(self, i: int) -> float:
        start = self.other_starts.get(i)
        return self.requested_us[i] + self.base_latency_us if start is None else start

    def starts(self) -> Iterator[float]:
        """start_us of every record, in order."""
        return map(self.start_us, range(len(self)))

    def __len__(self) -> int:
        return len(self.transfer_id)

    def _at(self, i: int) -> TransferRecord:
        requested, duration = self.requested_us[i], self.duration_us[i]
        return TransferRecord(
            self.transfer_id[i],
            self.size_bytes[i],
            requested,
            self.start_us(i),
            requested + duration,
            self.concurrency_at_start[i],
            duration,
        )

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._at(k) for k in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError("transfer record index out of range")
        return self._at(i)

    def __iter__(self) -> Iterator[TransferRecord]:
        return map(self._at, range(len(self)))

    def intervals(self) -> Iterator[tuple[float, int]]:
        """(start_us, end_us) of every record, in order."""
        ends = map(operator.add, self.requested_us, self.duration_us)
        return zip(self.starts(), ends, strict=True)


@dataclass
class _Pending:
    transfer_id: TransferId
    size_bytes: float
    requested_us: int
    start_us: float
    on_done: Callable[[int], None]
    concurrency_at_start: int = 0
    shared: bool = False  # ever had company on the link (then BLIS's formula does not apply)
    slot: simpy.Event | None = None  # its request for a transfer slot, once made


class KVTransferLink:
    """The cluster's KV-transfer link: a SimPy process fed through its `requests` Store.

    `start(id, size_bytes, on_done)` puts a transfer request into the Store now; the link
    process takes it, adds its bytes after the base latency, and calls `on_done(end_us)` (the
    requester's continuation) at `end_us`. The process waits for whichever of
    `requests.get()` and its wake-up fires first: both have a callback (`_rouse`) that succeeds
    the event it waits on (`_alarm`, at `LINK_RESUME`), so it resumes right after whichever
    woke it — what a `get | wake-up` condition would do, without building a condition per
    wait — and a completion is handled where a callback on the wake-up would have been. Its
    wake-ups carry `priority`.

    `slots` (None: no limit) bounds the transfers in flight with a `simpy.Resource` the
    process holds (`slot_pool`): a transfer takes a slot when the process takes its request,
    or waits in the pool's queue and comes back through `requests` when a slot frees (its base
    latency starts then), and gives it back when its completion is reported.

    `bandwidth_field` and `base_latency_field` name the settings in errors (the PD link's by
    default; an instance's host link passes the engine's). A transfer that would end beyond
    the simulator's clock is refused with a ConfigError naming them.
    """

    def __init__(
        self,
        env: simpy.Environment,
        bandwidth_gb_per_s: float,
        base_latency_ms: float,
        contention: bool = True,
        priority: int = 0,
        *,
        slots: int | None = None,
        bandwidth_field: str = BANDWIDTH_FIELD,
        base_latency_field: str = BASE_LATENCY_FIELD,
    ) -> None:
        if slots is not None and (
            isinstance(slots, bool) or not isinstance(slots, int) or slots < 1
        ):
            raise invalid(SLOTS_FIELD, slots, "must be a whole number >= 1, or null for no limit")
        if not is_finite_positive(bandwidth_gb_per_s):
            raise invalid(bandwidth_field, bandwidth_gb_per_s, "must be a finite number > 0")
        if (
            isinstance(base_latency_ms, bool)
            or not isinstance(base_latency_ms, int | float)
            or not math.isfinite(base_latency_ms)
            or base_latency_ms < 0
        ):
            raise invalid(base_latency_field, base_latency_ms, "must be a finite number >= 0")
        self.env = env
        self.bandwidth_field = bandwidth_field
        self.base_latency_field = base_latency_field
        self.bandwidth_gb_per_s = float(bandwidth_gb_per_s)
        self.base_latency_ms = float(base_latency_ms)
        self.contention = contention
        self.priority = priority
        # Same arithmetic as BLIS: 1 GB/s = 1e9 B / 1e6 µs = 1000 B/µs.
        self.bandwidth_bytes_per_us = self.bandwidth_gb_per_s * 1000.0
        self.base_latency_us = self.base_latency_ms * 1000.0
        self.core = SharedLink(self.bandwidth_bytes_per_us, contention)
        self.records = TransferRecords(self.base_latency_us)
        self.initiated = 0
        self.peak_concurrency = 0
        self._concurrency_sum = 0
        self._joined = 0
        # In base latency, in join order (the base latency is the same for all, so FIFO).
        self._waiting: deque[_Pending] = deque()
        self._on_link: dict[TransferId, _Pending] = {}
        # Bytes done, callback due at end_us: heap of (end_us, seq, pending).
        self._due: list[tuple[int, int, _Pending]] = []
        self._seq = itertools.count()
        self.requests = simpy.Store(env)
        self.transfer_slots = slots
        self.slot_pool = simpy.Resource(env, capacity=slots) if slots is not None else None
        # Waiting for a slot, in request order (the pool's queue holds their requests).
        self._awaiting_slot: dict[TransferId, _Pending] = {}
        self._alarm: simpy.Event | None = None  # what the process waits on with a wake-up armed
        env.process(self._run())

    # ------------------------------------------------------------------ public
    def lone_duration_us(self, size_bytes: float) -> int:
        """BLIS's transfer time: ceil(base_ms*1000 + bytes / (GBps*1000)), at least 1 µs."""
        return lone_transfer_us(self.base_latency_us, self.bandwidth_bytes_per_us, size_bytes)

    def start(
        self, transfer_id: TransferId, size_bytes: float, on_done: Callable[[int], None]
    ) -> None:
        if not (
            isinstance(size_bytes, int | float)
            and not isinstance(size_bytes, bool)
            and math.isfinite(size_bytes)
            and size_bytes >= 0
        ):
            raise ValueError(f"transfer size_bytes must be finite and >= 0, got {size_bytes!r}")
        if (
            transfer_id in self._on_link
            or transfer_id in self._awaiting_slot
            or any(p.transfer_id == transfer_id for p in (*self._waiting, *self.requests.items))
        ):
            raise ValueError(f"transfer {transfer_id!r} is already in flight")
        now = int(self.env.now)
        self._check_on_clock(size_bytes, now)
        self.initiated += 1
        self.requests.put(
            _Pending(transfer_id, size_bytes, now, now + self.base_latency_us, on_done)
        )

    @property
    def in_flight(self) -> int:
        """Transfers started and not yet reported done (waiting for a slot included)."""
        return (
            len(self.requests.items)
            + len(self._awaiting_slot)
            + len(self._waiting)
            + len(self._on_link)
            + len(self._due)
        )

    @property
    def awaiting_slot(self) -> int:
        """Transfers requested that wait for a free slot."""
        return len(self._awaiting_slot)

    @property
    def active_count(self) -> int:
        """Transfers whose bytes are on the link now."""
        return self.core.active_count

    @property
    def mean_concurrency_at_start(self) -> float:
        """Mean of `concurrency_at_start` over every transfer whose bytes joined the link."""
        return self._concurrency_sum / self._joined if self._joined else 0.0

    def time_weighted_mean_concurrency(self, until_us: float) -> float:
        """Mean number of transfers with bytes on the link over [0, until_us].

        Each transfer counts over [start_us, end_us) (end rounded up to the µs, so this can
        overstate by under 1 µs per transfer); idle time counts as 0.
        """
        return time_weighted_concurrency(self.records.intervals(), self.open_transfers(), until_us)

    def open_transfers(self) -> list[tuple[float, int | None]]:
        """The transfers not finished now, as (start_us, end_us): bytes on the link (end None:
        still draining), then bytes done with the continuation due (end: when it is due)."""
        out: list[tuple[float, int | None]] = [(p.start_us, None) for p in self._on_link.values()]
        out += [(p.start_us, end_us) for end_us, _seq, p in self._due]
        return out

    # ------------------------------------------------------------------ internals
    def _settings(self) -> str:
        return (
            f"{self.bandwidth_field} ({self.bandwidth_gb_per_s:g} GB/s) and "
            f"{self.base_latency_field} ({self.base_latency_ms:g} ms)"
        )

    def _check_on_clock(self, size_bytes: float, now: int) -> None:
        """Once per transfer: even alone on the link it must end on the clock. (Sharing only
        stretches it; `_reschedule` catches that.)"""
        lone = self.base_latency_us + size_bytes / self.bandwidth_bytes_per_us
        if now + lone > MAX_TIME_US:
            what = f"{self._settings()}: a KV transfer of {size_bytes:.6g} bytes"
            check_time_us(now + duration_us(lone, what), f"{what} requested at {now} µs ends")

    def _next_event_us(self) -> int | None:
        """Integer µs at which something next needs doing: a transfer's bytes done or a
        continuation due. Joins do not wake the process: `_process_until` applies them in
        exact-time order at its next wake-up, and nothing reads the link in between (a run
        stopped at a horizon calls `settle`). A join can only delay the transfers already on
        the link, so their next finish computed without it is never late; a transfer still in
        its base latency ends no sooner than it would alone on the link."""
        wake_us = None
        for pending in self._waiting:
            lone_us = _wake_no_later_than(
                pending.start_us + pending.size_bytes / self.bandwidth_bytes_per_us
            )
            if wake_us is None or lone_us < wake_us:
                wake_us = lone_us
        nxt = self.core.next_completion()
        if nxt is not None:
            done_us = ceil_us(nxt[0])
            if wake_us is None or done_us < wake_us:
                wake_us = done_us
        if self._due:
            due_us = self._due[0][0]
            if wake_us is None or due_us < wake_us:
                wake_us = due_us
        return wake_us

    def settle(self, until_us: int) -> None:
        """Apply the joins (and finishes) due by `until_us`: what the link holds when a run
        stops at that horizon. (A run that ends by running out of events has nothing left to
        apply: a transfer in its base latency keeps a wake-up scheduled.)"""
        self._process_until(until_us)

    def _run(self):
        """The link's process: take new transfers, wake at each finish (applying the joins
        before it), report the finished ones. A wake-up whose time has not changed is kept
        (the same event), so simultaneous events keep the order they had when it was made."""
        env = self.env
        rouse = self._rouse
        get = self.requests.get()
        get.callbacks.append(rouse)
        timer: simpy.Event | None = None
        timer_us = -1
        while True:
            wake_us = self._next_event_us()
            if wake_us is None:
                yield get
            else:
                now = int(env.now)
                wake_us = max(wake_us, now)
                if timer is None or timer.processed or timer_us != wake_us:
                    if wake_us > MAX_TIME_US:  # sharing stretched transfers beyond the clock
                        check_time_us(
                            wake_us,
                            f"{self._settings()}: {self.active_count} KV transfers sharing the "
                            "link end",
                        )
                    if timer is not None and not timer.processed:
                        timer.callbacks.remove(rouse)  # superseded: it must not wake the link
                    timer, timer_us = PriorityTimeout(env, wake_us - now, self.priority), wake_us
                    timer.callbacks.append(rouse)
                # Whichever of the two fires first succeeds this event, which resumes the
                # process at LINK_RESUME: what `get | timer` does, without a condition's cost.
                self._alarm = PriorityEvent(env, LINK_RESUME)
                yield self._alarm
            if get.processed:
                self._take(get.value)
                get = self.requests.get()
                get.callbacks.append(rouse)
            if timer is not None and timer.processed and timer_us == int(env.now):
                timer = None
                self._wake()

    def _rouse(self, _event: simpy.Event) -> None:
        alarm = self._alarm
        if alarm is not None and not alarm.triggered:
            alarm.succeed()

    def _take(self, pending: _Pending) -> None:
        """A transfer request reaches the process: it goes into its base latency now, unless
        every slot is taken (then it queues for one, `_granted`)."""
        pool = self.slot_pool
        if pool is None or pending.slot is not None:
            self._waiting.append(pending)
            return
        pending.slot = pool.request()
        if pending.slot.triggered:  # a slot was free
            self._waiting.append(pending)
        else:
            self._awaiting_slot[pending.transfer_id] = pending
            pending.slot.callbacks.append(lambda _ev, p=pending: self._granted(p))

    def _granted(self, pending: _Pending) -> None:
        """A slot freed for a queued transfer: its base latency starts now, and it comes back
        to the process through `requests` (the process waits on that Store)."""
        del self._awaiting_slot[pending.transfer_id]
        pending.start_us = int(self.env.now) + self.base_latency_us
        self.requests.put(pending)

    def _wake(self) -> None:
        now = int(self.env.now)
        self._process_until(now)
        done: list[tuple[int, _Pending]] = []
        while self._due and self._due[0][0] <= now:
            end_us, _, pending = heapq.heappop(self._due)
            done.append((end_us, pending))
        for end_us, pending in done:
            self._record(pending, end_us)
            if pending.slot is not None:
                self.slot_pool.release(pending.slot)
        # Continuations last: they may start new transfers (into `requests`).
        for end_us, pending in done:
            pending.on_done(end_us)

    def _process_until(self, now: int) -> None:
        """Apply joins and byte completions with exact time <= now, in exact-time order."""
        while True:
            nxt = self.core.next_completion()
            join = self._waiting[0] if self._waiting else None
            # A finish and a join at the same exact time: finish first (no sharing at an instant).
            if nxt is not None and (join is None or nxt[0] <= join.start_us):
                finish_us, tid = nxt
                if ceil_us(finish_us) > now:
                    return
                self.core.advance(finish_us)
                self.core.remove(tid)
                self._bytes_done(self._on_link.pop(tid), finish_us, now)
            elif join is not None:
                if ceil_us(join.start_us) > now:
                    return
                self._waiting.popleft()
                self.core.add(join.start_us, join.transfer_id, join.size_bytes)
                self._on_link[join.transfer_id] = join
                self._join(join)
            else:
                return

    def _join(self, pending: _Pending) -> None:
        count = self.core.active_count
        if not self.core.is_draining(pending.transfer_id):
            count += 1  # zero bytes: finished on arrival, but it was there
        pending.concurrency_at_start = count
        self.peak_concurrency = max(self.peak_concurrency, count)
        self._concurrency_sum += count
        self._joined += 1
        if self.contention and self.core.active_count > 1:
            for other in self._on_link.values():
                other.shared = True

    def _bytes_done(self, pending: _Pending, finish_us: float, now: int) -> None:
        # `now` only matters if a wake-up came late, which would be a bug; never report the past.
        end_us = max(ceil_us(finish_us), pending.requested_us + 1, now)
        if not pending.shared:
            # Never shared the link: BLIS's single-ceil formula, so contention on and off agree
            # for a lone transfer. It differs from ceil(finish) only by float noise.
            end_us = max(end_us, pending.requested_us + self.lone_duration_us(pending.size_bytes))
        heapq.heappush(self._due, (end_us, next(self._seq), pending))

    def _record(self, pending: _Pending, end_us: int) -> None:
        self.records.append(
            pending.transfer_id,
            pending.size_bytes,
            pending.requested_us,
            pending.start_us,
            end_us,
            pending.concurrency_at_start,
        )
