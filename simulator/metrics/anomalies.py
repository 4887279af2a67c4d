"""Anomaly detectors and fairness (docs/behaviour.md §10.4).

Plain functions over finished request records and per-instance step statistics; each handles
its degenerate inputs (no requests, one instance, all zeros) without dividing by zero (R11, R20).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from ..engine.request import Request, RequestState
from .request_table import request_columns
from .summary import class_masks

# An inversion is an earlier arrival that took more than this many times as long end to end.
INVERSION_FACTOR = 2


def priority_inversions(requests: Iterable[Request], priority_policy: str) -> int:
    """Pairs (i, j) of completed requests on the same instance and SLO class where i arrived
    strictly earlier than j and E2E_i > 2·E2E_j. Zero under the constant priority policy,
    where reordering cannot come from priorities."""
    if priority_policy == "constant":
        return 0
    groups: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for r in requests:
        if r.state is RequestState.COMPLETED:
            key = (r.instance_id, r.slo_class)
            groups.setdefault(key, []).append((r.arrival_us, r.completion_us - r.arrival_us))
    return sum(_count_inversions(groups[k]) for k in sorted(groups))


def _count_inversions(arrival_e2e: list[tuple[int, int]]) -> int:
    """O(n log n): sweep by arrival, counting earlier E2Es > 2·E2E_j with a Fenwick tree over
    the ranks of the distinct E2E values."""
    if len(arrival_e2e) < 2:
        return 0
    arrival_e2e = sorted(arrival_e2e)
    values = sorted({e2e for _, e2e in arrival_e2e})
    size = len(values)
    tree = [0] * (size + 1)
    inserted = 0
    count = 0
    i = 0
    n = len(arrival_e2e)
    while i < n:
        # Requests with equal arrival are not "earlier" than each other: query the whole run of
        # equal arrivals before inserting any of it.
        j = i
        while j < n and arrival_e2e[j][0] == arrival_e2e[i][0]:
            j += 1
        for _, e2e in arrival_e2e[i:j]:
            # Earlier E2Es <= 2·e2e occupy ranks 1..k; the rest are inversions.
            k = bisect_right(values, INVERSION_FACTOR * e2e)
            at_most = 0
            while k > 0:
                at_most += tree[k]
                k -= k & -k
            count += inserted - at_most
        for _, e2e in arrival_e2e[i:j]:
            k = bisect_right(values, e2e)  # 1-based rank of e2e
            while k <= size:
                tree[k] += 1
                k += k & -k
            inserted += 1
        i = j
    return count


def hol_blocking_instances(mean_queue_by_instance: Mapping[str, float]) -> list[str]:
    """Instances whose mean per-step wait-queue length exceeds twice the mean across
    instances. Needs at least two instances (one instance has nothing to be compared with)."""
    if len(mean_queue_by_instance) < 2:
        return []
    names = sorted(mean_queue_by_instance)
    overall = math.fsum(mean_queue_by_instance[k] for k in names) / len(names)
    if overall <= 0:
        return []
    return [k for k in names if mean_queue_by_instance[k] > 2 * overall]


def jain_fairness(values: Iterable[float]) -> float:
    """Jain's index (Σx)²/(n·Σx²): 1 = perfectly even, 1/n = one party gets everything."""
    xs = [float(v) for v in values]
    squares = math.fsum(x * x for x in xs)
    if not xs or squares == 0:
        return 1.0
    total = math.fsum(xs)
    return total * total / (len(xs) * squares)


def tenant_tokens(requests: Sequence) -> dict[str, int]:
    """Output tokens of completed requests per tenant ("default" when untagged), by tenant,
    for every tenant that sent a request: one whose requests were all rejected, dropped or
    timed out has 0, so the fairness index sees it starved rather than absent (BLIS-current
    lists only tenants with a completion). Read as columns (`requests`: a run's records or
    request objects)."""
    columns = request_columns(requests, ("generated_tokens",), ("state", "tenant_id"))
    completed = columns["state"] == RequestState.COMPLETED
    tokens = np.where(completed, columns["generated_tokens"], 0)
    return {
        name: int(tokens[rows].sum()) for name, rows in class_masks(columns["tenant_id"]).items()
    }
