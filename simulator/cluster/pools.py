"""The prefill, decode and unified pools of a disaggregated cluster as separate resource groups
(docs/pd.md, "Pools and flow").

Each role's pool holds its routing targets (instance indices, or rank indices when instances
have data-parallel ranks) and their serving capacity as a `simpy.Container`: capacity = the
pool's members, level = the members serving now. The router's PD decisions (`pd.py`) read
their candidates from the pool of the role they route to.

Membership is fixed for the run (INV-PD-5), and PD pools run on a fixed fleet only (a
scenario combining them with node pools, loading delays, warm-up, events or an autoscaler
is refused before the run), so every member serves from t = 0 to the end and the level
stays at the capacity. Nothing takes from or gives to these containers during a run; they
carry the pool's size as a SimPy resource that the laws check (tests/cluster/
test_capacity_resources.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import simpy

from ..metrics.pd_record import PoolMembers, RolePools

ROLES = ("prefill", "decode", "unified")


class InstancePool(PoolMembers):
    """One role's routing targets, in index order (the order candidate lists are built in)."""

    def __init__(self, env: simpy.Environment, role: str, members: Iterable[int]) -> None:
        self.role = role
        self.members: tuple[int, ...] = tuple(members)
        # SimPy refuses a container of capacity 0, and a cluster may have no unified
        # instances: an empty pool has no container and serves nothing.
        self.serving: simpy.Container | None = (
            simpy.Container(env, capacity=len(self.members), init=len(self.members))
            if self.members
            else None
        )

    @property
    def serving_now(self) -> int:
        """Members serving right now (the container's level)."""
        return 0 if self.serving is None else int(self.serving.level)

    def __repr__(self) -> str:
        return f"InstancePool({self.role!r}, {list(self.members)})"


@dataclass(frozen=True)
class Pools(RolePools):
    """The three pools of a disaggregated cluster; together they partition its targets."""

    prefill: InstancePool
    decode: InstancePool
    unified: InstancePool

    @classmethod
    def from_roles(cls, env: simpy.Environment, roles: Sequence[str]) -> Pools:
        """Pools from each routing target's role (prefill first, then decode, then unified:
        the setups keep them contiguous)."""
        unknown = sorted(set(roles) - set(ROLES))
        if unknown:
            raise ValueError(f"unknown pool role {unknown[0]!r}; valid: {', '.join(ROLES)}")
        return cls(
            *(InstancePool(env, r, (i for i, role in enumerate(roles) if role == r)) for r in ROLES)
        )
