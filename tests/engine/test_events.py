"""`Mailbox` delivers exactly where a `simpy.Store` with one consuming process would.

Law: for any pattern of producers putting items at random times and priorities, other events
at the same instants, and a consumer that itself puts, schedules and forwards while handling an
item, the whole simulation's log of what happened in which order is identical.
"""

from __future__ import annotations

import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.engine.events import Mailbox, event_after

# An action: (time, priority, kind, value). Kinds: put an item in box 0 or 1, or just log.
actions = st.lists(
    st.tuples(
        st.integers(0, 5),
        st.integers(0, 3),
        st.sampled_from(["put0", "put1", "mark"]),
        st.integers(0, 9),
    ),
    max_size=30,
)


def _run(plan, use_store: bool) -> list:
    env = simpy.Environment()
    log: list = []

    def handle(box: int, item: int) -> None:
        log.append((env.now, f"got{box}", item))
        if box == 0 and item % 3 == 0:
            boxes[1].put(item + 100)  # a consumer forwarding to the next box at once
        if item % 2 == 0:
            event_after(env, item % 2, 1).callbacks.append(
                lambda _e: log.append((env.now, "side", item))
            )

    if use_store:
        stores = [simpy.Store(env), simpy.Store(env)]

        def consume(box: int):
            while True:
                item = yield stores[box].get()
                handle(box, item)

        for box in (0, 1):
            env.process(consume(box))
        boxes = stores
    else:
        boxes = [Mailbox(env, lambda item: handle(0, item)), Mailbox(env, lambda i: handle(1, i))]

    for time_us, priority, kind, value in plan:

        def act(_e, kind=kind, value=value):
            log.append((env.now, kind, value))
            if kind != "mark":
                boxes[int(kind[-1])].put(value)

        event_after(env, time_us, priority).callbacks.append(act)
    env.run()
    return log


@settings(max_examples=300, deadline=None)
@given(actions)
def test_mailbox_orders_events_like_a_store(plan):
    assert _run(plan, use_store=False) == _run(plan, use_store=True)
