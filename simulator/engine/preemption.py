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
# vLLM's convention is the reverse (lower = more urgent): BLIS inverts the class priority at
# enqueue as max(3, every class priority) - priority, so critical 0, standard 1, batch 5,
# sheddable 6, background 7.
_MAX_SLO_PRIORITY = max(DEFAULT_SLO_PRIORITY, *SLO_CLASS_PRIORITY.values())


def vllm_priority(slo_class: str) -> int:
    """The request's vLLM-convention priority (lower = more urgent) from its SLO class; an
    empty or unknown class counts as `standard`."""
    return _MAX_SLO_PRIORITY - SLO_CLASS_PRIORITY.get(slo_class, DEFAULT_SLO_PRIORITY)


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

    def victim_index(self, running: list[Request]) -> int:
        best = len(running) - 1
        victim = running[best]
        best_key = (vllm_priority(victim.slo_class), victim.arrival_us)
        for i in range(best - 1, -1, -1):
            req = running[i]
            key = (vllm_priority(req.slo_class), req.arrival_us)
            if key > best_key:
                best, best_key = i, key
        return best


PREEMPTION_POLICIES: dict[str, type[PreemptionPolicy]] = {
    cls.name: cls for cls in (NewestFirst, LeastUrgentFirst)
}


def make_preemption_policy(name: str) -> PreemptionPolicy:
    if name not in PREEMPTION_POLICIES:
        raise unknown("preemption policy", name, PREEMPTION_POLICIES)
    return PREEMPTION_POLICIES[name]()
