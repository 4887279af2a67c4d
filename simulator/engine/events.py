"""Event priorities shared by the SimPy processes, and a helper to schedule with them.

SimPy orders events by (time, priority, insertion). servesim uses that priority to reproduce
BLIS's ordering of simultaneous events (docs/behaviour.md §1.2): arrivals and enqueues before a step
that starts at the same microsecond, and client timeouts after it (a completion wins a tie).
"""

from __future__ import annotations

from collections import deque

import simpy

ROUTER = 0  # admission and routing decisions: before any instance event at the same time
ARRIVAL = 1  # arrivals, enqueues (SimPy's NORMAL)
STEP = 2  # step boundaries and waking an idle instance
TIMEOUT = 5  # client cancellations at a deadline
# Instance k's priorities are the above + k * stride, so at equal times instance 0's events
# run before instance 1's (docs/behaviour.md §6.1). Arrival-side events of every instance keep
# priority <= 1 + k * stride, but routing always precedes them because it is what creates them.
INSTANCE_PRIORITY_STRIDE = 10


def event_after(env: simpy.Environment, delay_us: int, priority: int) -> simpy.Event:
    """A pre-triggered event that fires `delay_us` from now with the given priority.

    This is what `env.timeout` does, except that SimPy's Timeout always uses NORMAL priority.
    """
    event = simpy.Event(env)
    event._ok = True  # noqa: SLF001 - mirrors simpy.Timeout's own initialisation
    event._value = None  # noqa: SLF001
    env.schedule(event, priority, delay_us)
    return event


def trigger_with_priority(env: simpy.Environment, event: simpy.Event, priority: int) -> None:
    """Succeed `event` now, but let it fire after same-time events of higher priority."""
    event._ok = True  # noqa: SLF001
    event._value = None  # noqa: SLF001
    env.schedule(event, priority, 0)


class Mailbox:
    """A `simpy.Store` with one consumer callback, delivering at exactly the same point in the
    event order, without a process and the Store's per-item Put / Get event objects.

    A Store schedules its put event at the current time (NORMAL priority); when that fires and
    the consumer waits, a get event is scheduled the same way, and when that fires the consumer
    runs and then asks for the next item, which is scheduled at once if one is there. This
    schedules the same two plain events at the same moments, so the relative order of every
    event in the simulation is unchanged (tests/engine/test_events.py compares the two).
    """

    __slots__ = ("env", "consumer", "items", "_waiting")

    def __init__(self, env: simpy.Environment, consumer) -> None:
        self.env = env
        self.consumer = consumer
        self.items: deque = deque()
        self._waiting = True  # the consumer is ready for an item

    def put(self, item) -> None:
        self.items.append(item)
        event = simpy.Event(self.env)
        event._ok = True  # noqa: SLF001
        event._value = None  # noqa: SLF001
        event.callbacks.append(self._on_put)
        self.env.schedule(event, ARRIVAL, 0)

    def _on_put(self, _event: simpy.Event) -> None:
        if self._waiting and self.items:
            self._waiting = False
            self._schedule_delivery()

    def _schedule_delivery(self) -> None:
        event = simpy.Event(self.env)
        event._ok = True  # noqa: SLF001
        event._value = self.items.popleft()  # noqa: SLF001
        event.callbacks.append(self._deliver)
        self.env.schedule(event, ARRIVAL, 0)

    def _deliver(self, event: simpy.Event) -> None:
        self.consumer(event._value)  # noqa: SLF001
        if self.items:
            self._schedule_delivery()
        else:
            self._waiting = True
