"""What a disaggregated run's PD flow leaves behind when the run ends (docs/pd.md): its parents,
the KV-transfer link's records and statistics, the pools' membership and the PD counters,
captured once so that a finished `Result` holds plain data rather than the live
`Disaggregator` (whose routing policies, `kv_probe` and link process reach every engine and
the SimPy environment).

The attribute names are the disaggregator's own (`parents`, `link.records`,
`link.peak_concurrency`, `pools.decode`, `dropped_at_decode_kv`, ...), so the PD views
(metrics/views/pd.py), the report, the end-of-run invariants and tests read a record as they
read the live object. The parents and the transfer records are taken by reference: in a run
that compacts finished requests they are rows of the request table, which the result keeps
anyway.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .instance_record import record_of

if TYPE_CHECKING:
    from ..cluster.kv_transfer import KVTransferLink, TransferRecords
    from ..cluster.pd import Disaggregator
    from ..cluster.pools import InstancePool, Pools


def lone_transfer_us(
    base_latency_us: float, bandwidth_bytes_per_us: float, size_bytes: float
) -> int:
    """BLIS's time for one KV transfer alone on a link: ceil(base latency + bytes /
    bandwidth), at least 1 µs. The live link (`cluster/kv_transfer.py`) schedules with it and
    its record (`LinkRecord`) reports with it."""
    return max(1, math.ceil(base_latency_us + size_bytes / bandwidth_bytes_per_us))


def time_weighted_concurrency(
    closed: Iterable[tuple[float, float]],
    open_transfers: Iterable[tuple[float, float | None]],
    until_us: float,
) -> float:
    """Mean number of transfers with bytes on a link over [0, until_us]: each transfer counts
    over [start_us, end_us) — `closed` the finished ones, `open_transfers` those unfinished
    when the run stopped (end None: still draining, counted to `until_us`); idle time counts
    as 0. Summed in the order given, so the live link and its record agree to the last bit."""
    if until_us <= 0:
        return 0.0
    area = 0.0
    # Streamed, never listed: a million transfers' (start, end) tuples were the largest
    # allocation of a PD run's report (about 150 MiB, its peak).
    for lo, hi in closed:
        area += max(0.0, min(hi, until_us) - lo)
    for lo, hi in open_transfers:
        area += max(0.0, min(until_us if hi is None else hi, until_us) - lo)
    return area / until_us


@dataclass(frozen=True, slots=True)
class LinkRecord:
    """The KV-transfer link at the end of the run: its completed transfers, counters and
    settings, and the transfers whose bytes were still on it (a run cut by a horizon)."""

    records: TransferRecords
    initiated: int
    peak_concurrency: int
    mean_concurrency_at_start: float
    bandwidth_bytes_per_us: float
    base_latency_us: float
    transfer_slots: int | None  # transfers in flight at most (None: no limit)
    # Transfers not completed when the run ended, as (start_us, end_us): end_us None for one
    # still draining (it counts until the end of the run), the due time for one whose bytes
    # were done; in the order the link reports them.
    open_transfers: tuple[tuple[float, int | None], ...]

    def lone_duration_us(self, size_bytes: float) -> int:
        """The link's time for one transfer alone (`lone_transfer_us`)."""
        return lone_transfer_us(self.base_latency_us, self.bandwidth_bytes_per_us, size_bytes)

    def time_weighted_mean_concurrency(self, until_us: float) -> float:
        """Mean number of transfers with bytes on the link over [0, until_us]."""
        return time_weighted_concurrency(self.records.intervals(), self.open_transfers, until_us)


class PoolMembers:
    """What a pool answers about its members, live (`cluster/pools.py: InstancePool`) or
    recorded (`PoolRecord`): iteration in index order, size, membership."""

    __slots__ = ()
    role: str
    members: tuple[int, ...]

    def __iter__(self) -> Iterator[int]:
        return iter(self.members)

    def __len__(self) -> int:
        return len(self.members)

    def __contains__(self, index: object) -> bool:
        return index in self.members


class RolePools:
    """The prefill, decode and unified pools together, live (`cluster/pools.py: Pools`) or
    recorded (`PoolsRecord`)."""

    __slots__ = ()
    prefill: PoolMembers
    decode: PoolMembers
    unified: PoolMembers

    def __iter__(self) -> Iterator[PoolMembers]:
        return iter((self.prefill, self.decode, self.unified))

    def role_of(self, index: int) -> str:
        """The role of the pool holding routing target `index`."""
        for pool in self:
            if index in pool:
                return pool.role
        raise KeyError(index)


@dataclass(frozen=True, slots=True)
class PoolRecord(PoolMembers):
    """One role's routing targets (instance or rank indices, in index order) and how many of
    them were serving when the run ended (its container's level)."""

    role: str
    members: tuple[int, ...]
    serving_at_end: int


@dataclass(frozen=True, slots=True)
class PoolsRecord(RolePools):
    """The prefill, decode and unified pools' membership (fixed for a PD run)."""

    prefill: PoolRecord
    decode: PoolRecord
    unified: PoolRecord


@dataclass(frozen=True, slots=True)
class PDRecord:
    """A disaggregated run's PD flow at its end."""

    # Every disaggregated parent in the order it was disaggregated: rows of the request table
    # and the parents still unfinished at the horizon (objects, by design), or, in a run that
    # keeps its requests as objects, those objects.
    parents: Sequence[Any]
    link: LinkRecord
    pools: PoolsRecord
    dropped_at_decode_kv: int
    prefill_completed: int
    decode_completed: int
    kv_bytes_per_token: float
    block_size: int


def capture_link(link: KVTransferLink) -> LinkRecord:
    """`link`'s record, once the run has stopped."""
    return record_of(LinkRecord, link, open_transfers=tuple(link.open_transfers()))


def _capture_pool(pool: InstancePool) -> PoolRecord:
    return PoolRecord(pool.role, tuple(pool.members), pool.serving_now)


def capture_pools(pools: Pools) -> PoolsRecord:
    return PoolsRecord(*(_capture_pool(p) for p in pools))


def capture_pd(pd: Disaggregator) -> PDRecord:
    """`pd`'s record, taken after `Disaggregator.finalize` (unfinished parents settled)."""
    return record_of(PDRecord, pd, link=capture_link(pd.link), pools=capture_pools(pd.pools))
