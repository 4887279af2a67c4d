"""Python's cyclic garbage collector held back while a simulation runs.

A run allocates and frees millions of small objects (requests, SimPy events, step rows), and
reference counting reclaims nearly all of them. The cyclic collector still starts a young
collection every 700 net container allocations (CPython's default), and every so often a
full one that walks every object the process holds: the imported libraries, a notebook's own
data, the run's live requests. In the benchmark cases that was 4-7 % of a run's time (case
(a): 88 ms of 1.27 s, 65 ms of it one full collection), for no memory returned.

During a run the young threshold is raised to `RUN_GEN0_THRESHOLD` (at most that many
unreachable cycles wait, a few MiB), and the objects that existed before the run are frozen
out of collections, then everything is put back as it was. Results cannot change: the
collector only frees objects nothing can reach.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

RUN_GEN0_THRESHOLD = 50_000


@contextmanager
def fewer_collections() -> Iterator[None]:
    """Raise the young-generation threshold and freeze pre-existing objects for the block.

    Usable as a decorator. Freezing is skipped when the caller has frozen objects itself
    (`gc.unfreeze` would thaw theirs too) or has the collector disabled.
    """
    thresholds = gc.get_threshold()
    freeze = gc.isenabled() and gc.get_freeze_count() == 0
    if freeze:
        gc.freeze()
    gc.set_threshold(max(thresholds[0], RUN_GEN0_THRESHOLD), *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        if freeze:
            gc.unfreeze()
