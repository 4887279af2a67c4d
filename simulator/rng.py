"""Seeded random streams, one per subsystem (docs/behaviour.md §A9).

Each subsystem's Generator is derived from the run seed and a stable hash of the subsystem's
name, so adding or changing one subsystem never perturbs the draws of another.
"""

from __future__ import annotations

import zlib

import numpy as np


def subsystem_rng(seed: int, name: str) -> np.random.Generator:
    """The subsystem `name`'s stream: `stream_seed` with that one name."""
    return stream_seed(seed, name)


def stream_seed(seed: int, *names: str) -> np.random.Generator:
    """The random stream `names` of a run seeded `seed`: one seeding rule for every stream of
    a client (its lengths and arrivals in the workload generator, its users' think times in
    closed_loop.py), so adding a stream never shifts another's draws."""
    key = tuple(zlib.crc32(n.encode("utf-8")) for n in names)
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=key)))
