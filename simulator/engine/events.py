"""Event priorities shared by the SimPy processes, and a helper to schedule with them.

SimPy orders events by (time, priority, insertion). servesim uses that priority to reproduce
BLIS's ordering of simultaneous events (SPEC §1.2): arrivals and enqueues before a step that
starts at the same microsecond, and client timeouts after it (a completion wins a tie).
"""

from __future__ import annotations

import simpy

ROUTER = 0  # admission and routing decisions: before any instance event at the same time
ARRIVAL = 1  # arrivals, enqueues (SimPy's NORMAL)
STEP = 2  # step boundaries and waking an idle instance
TIMEOUT = 5  # client cancellations at a deadline
# Instance k's priorities are the above + k * stride, so at equal times instance 0's events
# run before instance 1's (SPEC §6.1). Arrival-side events of every instance keep priority
# <= 1 + k * stride, but routing always precedes them because it is what creates them.
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
