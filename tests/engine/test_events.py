"""servesim's Environment orders events by (time, declared priority, creation), through
SimPy's public `schedule` hook only.

Laws: for any set of prioritised timeouts, plain timeouts and prioritised events succeeded
along the way, the order they fire in is the order of (time, priority, scheduling sequence);
on a plain simpy.Environment a PriorityTimeout is an ordinary Timeout. And nothing in
`simulator/` touches SimPy's private state.
"""

from __future__ import annotations

import re
from pathlib import Path

import simpy
from hypothesis import given, settings
from hypothesis import strategies as st
from simpy.core import NORMAL

from simulator.engine.events import Environment, PriorityEvent, PriorityTimeout

timers = st.lists(st.tuples(st.integers(0, 4), st.integers(0, 6), st.booleans()), max_size=25)


def _fire_order(plan, env) -> list[int]:
    fired: list[int] = []
    for label, (delay, priority, prioritised) in enumerate(plan):
        event = PriorityTimeout(env, delay, priority) if prioritised else env.timeout(delay)
        event.callbacks.append(lambda _e, label=label: fired.append(label))
    env.run()
    return fired


@settings(max_examples=200, deadline=None)
@given(timers)
def test_events_fire_by_time_then_priority_then_creation(plan):
    expected = sorted(
        range(len(plan)),
        key=lambda i: (plan[i][0], plan[i][1] if plan[i][2] else NORMAL, i),
    )
    assert _fire_order(plan, Environment()) == expected


@settings(max_examples=50, deadline=None)
@given(timers)
def test_on_a_plain_environment_priorities_are_ignored(plan):
    expected = sorted(range(len(plan)), key=lambda i: (plan[i][0], i))
    assert _fire_order(plan, simpy.Environment()) == expected


def test_a_priority_event_succeeded_now_waits_for_same_time_events_of_higher_priority():
    env = Environment()
    log: list[str] = []
    wake = PriorityEvent(env, 2)
    wake.callbacks.append(lambda _e: log.append("wake"))

    def at_one(_e):
        log.append("arrival")
        wake.succeed()  # scheduled at priority 2: after the arrival at priority 1 below

    PriorityTimeout(env, 1, 0).callbacks.append(at_one)
    PriorityTimeout(env, 1, 1).callbacks.append(lambda _e: log.append("late arrival"))
    PriorityTimeout(env, 1, 5).callbacks.append(lambda _e: log.append("timeout"))
    env.run()
    assert log == ["arrival", "late arrival", "wake", "timeout"]


def test_a_store_delivers_at_arrival_priority():
    """A Store's put and get events are NORMAL (1): after routing (0), before a step (2)."""
    env = Environment()
    store = simpy.Store(env)
    log: list[str] = []

    def consumer():
        while True:
            item = yield store.get()
            log.append(f"got {item}")

    env.process(consumer())
    PriorityTimeout(env, 3, 2).callbacks.append(lambda _e: log.append("step"))
    PriorityTimeout(env, 3, 0).callbacks.append(lambda _e: store.put("r1"))
    env.run()
    assert log == ["got r1", "step"]


SIMPY_PRIVATE = re.compile(r"\._queue\b|\._eid\b|\._ok\b|\._value\b|heapreplace|\._now\b")


def test_nothing_in_the_package_touches_simpys_private_state():
    root = Path(__file__).resolve().parents[2] / "simulator"
    offenders = [
        f"{path.relative_to(root)}:{n}: {line.strip()}"
        for path in root.rglob("*.py")
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if SIMPY_PRIVATE.search(line)
    ]
    assert offenders == []
