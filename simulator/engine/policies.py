"""Wait-queue schedulers and priority policies (docs/behaviour.md §1.6), registered by name."""

from __future__ import annotations

from collections.abc import Callable

from ..errors import unknown
from .preemption import vllm_priorities, vllm_priority
from .request import Request

# ---------------------------------------------------------------- priority policies


class PriorityPolicy:
    """Scores a queued request; recomputed before every step."""

    name = ""
    is_constant = False

    def priority(self, req: Request, now_us: int) -> float:
        raise NotImplementedError


class ConstantPriority(PriorityPolicy):
    name = "constant"
    is_constant = True

    def priority(self, req: Request, now_us: int) -> float:
        return 0.0


class SLOBasedPriority(PriorityPolicy):
    """+1.0 per second waited (SLO class is not used, as in BLIS)."""

    name = "slo-based"

    def priority(self, req: Request, now_us: int) -> float:
        return 1e-6 * (now_us - req.arrival_us)


class InvertedSLOPriority(PriorityPolicy):
    """Pathological: the longer a request waits, the lower its priority."""

    name = "inverted-slo"

    def priority(self, req: Request, now_us: int) -> float:
        return -1e-6 * (now_us - req.arrival_us)


class SLOClassPriority(PriorityPolicy):
    """The current BLIS's priority: static, from the SLO class (critical first, then standard
    or none, batch, sheddable, background), the negated vLLM priority so that `priority-fcfs`
    (highest first) serves the most urgent class first, as that release's `priority-fcfs`
    (lowest vLLM priority first) does."""

    name = "slo-class"

    def __init__(self, slo_priorities: dict[str, int] | None = None) -> None:
        self.table = vllm_priorities(slo_priorities)

    def priority(self, req: Request, now_us: int) -> float:
        return -float(vllm_priority(req.slo_class, self.table))


PRIORITY_POLICIES: dict[str, type[PriorityPolicy]] = {
    cls.name: cls
    for cls in (ConstantPriority, SLOBasedPriority, InvertedSLOPriority, SLOClassPriority)
}


def make_priority_policy(name: str, slo_priorities: dict[str, int] | None = None) -> PriorityPolicy:
    if name not in PRIORITY_POLICIES:
        raise unknown("priority policy", name, PRIORITY_POLICIES)
    cls = PRIORITY_POLICIES[name]
    return cls(slo_priorities) if cls is SLOClassPriority else cls()


# ---------------------------------------------------------------- schedulers


class Scheduler:
    """Orders the wait queue before each step. Sorts are stable; ties by arrival, then by
    request ID compared as text, as BLIS compares its IDs (`request_10` before `request_9`;
    requests of several clients arrive in the same microsecond)."""

    name = ""
    keeps_order = False
    sort_key: Callable[[Request], tuple] | None = None

    def order(self, queue: list[Request]) -> list[Request]:
        if self.keeps_order:
            return queue
        return sorted(queue, key=self.sort_key)


class FCFSScheduler(Scheduler):
    """Queue order unchanged; preempted requests sit at the front."""

    name = "fcfs"
    keeps_order = True


class PriorityFCFSScheduler(Scheduler):
    name = "priority-fcfs"

    @staticmethod
    def sort_key(r: Request) -> tuple:
        return (-r.priority, r.arrival_us, r.request_id)


class SJFScheduler(Scheduler):
    """Shortest prompt first (can starve long prompts)."""

    name = "sjf"

    @staticmethod
    def sort_key(r: Request) -> tuple:
        return (r.input_tokens, r.arrival_us, r.request_id)


class ReversePriorityScheduler(Scheduler):
    """Pathological: lowest priority first."""

    name = "reverse-priority"

    @staticmethod
    def sort_key(r: Request) -> tuple:
        return (r.priority, r.arrival_us, r.request_id)


SCHEDULERS: dict[str, type[Scheduler]] = {
    cls.name: cls
    for cls in (FCFSScheduler, PriorityFCFSScheduler, SJFScheduler, ReversePriorityScheduler)
}


def make_scheduler(name: str) -> Scheduler:
    if name not in SCHEDULERS:
        raise unknown("scheduler", name, SCHEDULERS)
    return SCHEDULERS[name]()
