"""servesim's SimPy environment: SimPy's own, with one addition, events that carry their
tie-break priority.

SimPy orders events by (time, priority, insertion). servesim uses that priority to reproduce
BLIS's ordering of simultaneous events (docs/behaviour.md §1.2): routing decisions first, then
arrivals and enqueues, then a step that starts at the same microsecond, and client timeouts
after it (a completion wins a tie). SimPy's `Timeout` and `Event.succeed` always schedule with
NORMAL priority; `Environment.schedule` is the public hook they go through, so `Environment`
overrides it to honour a priority the event declares (`tie_priority`). Nothing here reads or
writes SimPy's private state; every actor keeps using SimPy's public API (processes, Stores,
Containers, `env.timeout`, `Event.succeed`, `env.peek`).
"""

from __future__ import annotations

import simpy
from simpy.core import NORMAL

ROUTER = 0  # admission and routing decisions: before any instance event at the same time
# A process that waits on `a | b` resumes right after whichever fired, before anything else at
# that time: as a callback on it would have run (the KV-transfer link).
LINK_RESUME = -1
ARRIVAL = 1  # arrivals, enqueues, Store deliveries (SimPy's NORMAL)
STEP = 2  # step boundaries and waking an idle instance
TIMEOUT = 5  # client cancellations at a deadline
# Instance k's priorities are the above + k * stride, so at equal times instance 0's events
# run before instance 1's (docs/behaviour.md §6.1). Arrival-side events of every instance keep
# priority <= 1 + k * stride, but routing always precedes them because it is what creates them.
INSTANCE_PRIORITY_STRIDE = 10

assert ARRIVAL == NORMAL, "Store deliveries must tie with arrivals"


_schedule = simpy.Environment.schedule


class Environment(simpy.Environment):
    """A `simpy.Environment` whose `schedule` honours an event's own `tie_priority`."""

    def schedule(self, event: simpy.Event, priority: int = NORMAL, delay: float = 0) -> None:
        # Every event passes here: the base method called directly, not through super().
        _schedule(self, event, getattr(event, "tie_priority", priority), delay)


class PriorityTimeout(simpy.Timeout):
    """`env.timeout(delay)` that fires after same-time events of higher priority (lower
    number) and before those of lower priority. Its priority is honoured by `Environment`;
    on a plain `simpy.Environment` it is an ordinary Timeout."""

    def __init__(self, env: simpy.Environment, delay: float, priority: int) -> None:
        self.tie_priority = priority
        super().__init__(env, delay)


class PriorityEvent(simpy.Event):
    """An event that, when it succeeds, fires after same-time events of higher priority.
    `tie_priority` may be changed before `succeed()` (it is read when the event is scheduled)."""

    def __init__(self, env: simpy.Environment, priority: int) -> None:
        super().__init__(env)
        self.tie_priority = priority


def event_after(env: simpy.Environment, delay_us: int, priority: int) -> simpy.Event:
    """An event that fires `delay_us` from now with the given priority (a `PriorityTimeout`)."""
    return PriorityTimeout(env, delay_us, priority)


_timeout_classes: dict[int, type[simpy.Timeout]] = {}


def timeout_at_priority(priority: int) -> type[simpy.Timeout]:
    """A `simpy.Timeout` subclass whose events carry `priority`: `cls(env, delay)` is
    `PriorityTimeout(env, delay, priority)` without a constructor of its own, for the loops
    that make one per engine step (a Python frame per event less: benchmarks/
    instructions.py). One class per priority, made on first use."""
    cls = _timeout_classes.get(priority)
    if cls is None:
        cls = type(f"PriorityTimeout{priority}", (PriorityTimeout,), {"tie_priority": priority})
        cls.__init__ = simpy.Timeout.__init__
        _timeout_classes[priority] = cls
    return cls
