"""Preemption policies: which running request gives up its KV when a step cannot allocate
(docs/engine.md "Preemption"), registered by name.

vLLM (V1, recompute mode) and BLIS's `--preemption-policy fcfs` evict the most recently
admitted request. BLIS's current release adds `priority`: evict the least urgent request,
where urgency comes from the request's SLO class. A policy only chooses the victim; what
preemption does to the victim (KV released, re-prefill of prompt and delivered tokens, back at
the head of the wait queue) is the engine's, the same for every policy.

Every policy here is served by the engine's decode fast path unchanged: the fast path runs a
step only when no request can be preempted in it, so the victim rule never comes into play there.
"""

from __future__ import annotations

from ..errors import unknown
from .request import Request

# BLIS's SLO-class priorities (higher = more important) and the class of a request without one.
SLO_CLASS_PRIORITY = {"critical": 4, "standard": 3, "batch": -1, "sheddable": -2, "background": -3}
DEFAULT_SLO_PRIORITY = 3
# The range BLIS accepts for a class priority set by a bundle's `admission.slo_priorities`.
SLO_PRIORITY_BOUND = 100


def vllm_priorities(overrides: dict[str, int] | None = None) -> dict[str, int]:
    """Per SLO class, its vLLM-convention priority (lower = more urgent). vLLM's convention is
    the reverse of the class priority's: BLIS inverts it at enqueue as max(3, every class
    priority) - priority, so by default critical 0, standard 1, batch 5, sheddable 6,
    background 7. `overrides` replaces class priorities (engine.slo_priorities, BLIS's
    `admission.slo_priorities`); the maximum is taken over the table they give."""
    table = SLO_CLASS_PRIORITY | (overrides or {})
    top = max(DEFAULT_SLO_PRIORITY, *table.values())
    return {slo_class: top - priority for slo_class, priority in table.items()} | {
        "": top - DEFAULT_SLO_PRIORITY
    }


_DEFAULT_VLLM_PRIORITIES = vllm_priorities()


def vllm_priority(slo_class: str, table: dict[str, int] = _DEFAULT_VLLM_PRIORITIES) -> int:
    """The request's vLLM-convention priority in `table` (`vllm_priorities`); an empty or
    unknown class counts as one without a class."""
    return table.get(slo_class, table[""])


class PreemptionPolicy:
    """Chooses the victim among the running requests (admission order, oldest first)."""

    name = ""

    def victim_index(self, running: list[Request]) -> int:
        raise NotImplementedError


class NewestFirst(PreemptionPolicy):
    """vLLM's rule: the most recently admitted request (the batch's tail)."""

    name = "fcfs"

    def victim_index(self, running: list[Request]) -> int:
        return len(running) - 1


class LeastUrgentFirst(PreemptionPolicy):
    """BLIS's `priority`: the request with the largest (vLLM priority, arrival time), found
    scanning from the tail to the head and replaced only by a strictly larger pair, so exact
    ties go to the request nearest the tail."""

    name = "priority"

    def __init__(self, slo_priorities: dict[str, int] | None = None) -> None:
        self.table = vllm_priorities(slo_priorities)

    def victim_index(self, running: list[Request]) -> int:
        table = self.table
        best = len(running) - 1
        victim = running[best]
        best_key = (vllm_priority(victim.slo_class, table), victim.arrival_us)
        for i in range(best - 1, -1, -1):
            req = running[i]
            key = (vllm_priority(req.slo_class, table), req.arrival_us)
            if key > best_key:
                best, best_key = i, key
        return best


PREEMPTION_POLICIES: dict[str, type[PreemptionPolicy]] = {
    cls.name: cls for cls in (NewestFirst, LeastUrgentFirst)
}


def make_preemption_policy(
    name: str, slo_priorities: dict[str, int] | None = None
) -> PreemptionPolicy:
    if name not in PREEMPTION_POLICIES:
        raise unknown("preemption policy", name, PREEMPTION_POLICIES)
    cls = PREEMPTION_POLICIES[name]
    return cls(slo_priorities) if cls is LeastUrgentFirst else cls()
