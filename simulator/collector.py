"""Python's cyclic garbage collector held back while a simulation runs.

A run allocates and frees millions of small objects (requests, SimPy events, step rows), and
reference counting reclaims nearly all of them. The cyclic collector still starts a young
collection every 700 net container allocations (CPython's default), and every so often a
full one that walks every object the process holds: the imported libraries, a notebook's own
data, the run's live requests — time spent for no memory returned (measured in
docs/performance.md, "What makes it fast").

During a run the young threshold is raised to `RUN_GEN0_THRESHOLD` (at most that many
unreachable cycles wait, a few MiB), and the objects that existed before the run are frozen
out of collections, then everything is put back as it was. Results cannot change: the
collector only frees objects nothing can reach.

The command line raises the same threshold for its whole process from its first line
(`fewer_collections_for_this_process`): importing the simulator, numpy and pydantic and
building the scenario schema create some hundred thousand objects, all of which live until
the process ends, and the default threshold walked them in full collections again and again.
Before it exits it freezes every object (`skip_the_final_collection`): the interpreter's last
collection would otherwise walk them all to free memory the operating system takes back
anyway. Every output is written and closed explicitly before that point, so no finaliser is
waited for.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

RUN_GEN0_THRESHOLD = 50_000


def fewer_collections_for_this_process() -> None:
    """Raise the young-generation threshold for the rest of the process (a command-line
    process, not a library caller's: a notebook keeps its own settings)."""
    thresholds = gc.get_threshold()
    gc.set_threshold(max(thresholds[0], RUN_GEN0_THRESHOLD), *thresholds[1:])


def skip_the_final_collection() -> None:
    """Leave the objects of a command-line process that is about to exit to the operating
    system."""
    gc.freeze()


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
