"""No false deadlock: a marker that passes on one stream wakes every stream waiting on it, whatever the order the
streams were made in.

A deadlock-free program (every wait is on an event recorded before it) must never be reported as a deadlock:
checked on random stream/event graphs, streams made in random orders, under random delays, and on the pinned
program that showed the lost wake-up (a stream made first waiting on one made after it).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import find, given
from hypothesis import strategies as st

from reference.schedule import Delay, Schedule
from simdevice import Deadlock, SimDevice
from simdevice.runtime.execution import Execution
from simdevice.search import search_settings


def lost_wakeup(dev: Any, n: int) -> bool:
    """s1 waits on s2, which waits on the default stream; s1 is made first."""
    x = torch.zeros(n, device=dev.device)
    dev.synchronize()
    s1, s2 = dev.Stream(name="s1"), dev.Stream(name="s2")
    with dev.stream(s2):
        x.add_(1)
    done = dev.Event()
    done.record(dev.default_stream())
    s2.wait_event(done)
    e = dev.Event()
    e.record(s2)
    s1.wait_event(e)
    dev.synchronize()
    return True


@pytest.mark.parametrize(("n", "schedule"), [(1 << 20, "t/t"), (256, "t/t::s2#0+1")])
def test_the_pinned_lost_wakeup_completes(n: int, schedule: str) -> None:
    run = SimDevice(Schedule.parse(schedule)).run(lost_wakeup, n)
    assert (run.result, run.reports) == (True, ())


def test_the_pinned_lost_wakeup_is_clean_at_every_schedule_of_at_most_two_delays() -> None:
    probe = SimDevice().run(lost_wakeup, 256)
    slots = [(a, k) for a, n in probe.op_counts.items() for k in range(n)]
    schedules = [()] + [(Delay(a, k, u),) for a, k in slots for u in (1, 5, 20)]
    schedules += [
        (Delay(a, k, u), Delay(b, j, v))
        for i, (a, k) in enumerate(slots) for b, j in slots[i + 1:] for u in (1, 20) for v in (1, 20)
    ]
    assert len(schedules) > 200
    for delays in schedules:
        run = SimDevice(Schedule("t", "t", (), delays)).run(lost_wakeup, 256)
        assert (run.result, run.reports) == (True, ()), delays


def test_the_lost_wakeup_needs_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    # the mutant, as before the fix: a completion (or a marker passing) looks at every stream once, in creation
    # order, not until none moves
    def one_pass(self: Execution) -> None:
        for s in list(self.streams.values()):
            self._advance(s)

    monkeypatch.setattr(Execution, "kick_all", one_pass)
    run = SimDevice().run(lost_wakeup, 1 << 20)
    assert [type(r) for r in run.reports] == [Deadlock]


# -- random stream/event graphs ----------------------------------------------------------------------------

_STEP = st.one_of(
    st.tuples(st.just("op"), st.integers(0, 3), st.integers(0, 3)),  # a kernel on stream i writing tensor j
    st.tuples(st.just("record"), st.integers(0, 3), st.integers(0, 3)),  # record event j on stream i
    st.tuples(st.just("wait"), st.integers(0, 3), st.integers(0, 3)),  # stream i waits event j (if recorded)
    st.tuples(st.just("sync"), st.integers(0, 3), st.integers(0, 1)),  # stream i (or the device) synchronize
)


def graph_program(order: list[int], steps: list[tuple[str, int, int]]) -> Any:
    def program(dev: Any) -> bool:
        # 64 KiB: a kernel outlasts a few host steps, so markers are enqueued behind work in flight
        xs = [torch.zeros(16384, device=dev.device) for _ in range(4)]
        dev.synchronize()
        made = {i: dev.Stream(name=f"g{i}") for i in order}  # made in the drawn order
        streams = [made[i] for i in range(4)]
        events: dict[int, Any] = {}
        for kind, i, j in steps:
            if kind == "op":
                with dev.stream(streams[i]):
                    xs[j].add_(1)
            elif kind == "record":
                events.setdefault(j, dev.Event()).record(streams[i])
            elif kind == "wait" and j in events:
                streams[i].wait_event(events[j])
            elif kind == "sync":
                streams[i].synchronize() if j else dev.synchronize()
        dev.synchronize()
        return True

    return program


@given(
    order=st.permutations(range(4)),
    steps=st.lists(_STEP, max_size=16),
    delays=st.lists(st.tuples(st.sampled_from(["host", "g0", "g1", "g2", "g3"]), st.integers(0, 6),
                              st.integers(1, 20)), max_size=2, unique_by=lambda d: d[:2]),
)
def test_no_deadlock_free_program_is_called_a_deadlock(
    order: list[int], steps: list[tuple[str, int, int]], delays: list[tuple[str, int, int]]
) -> None:
    schedule = Schedule("t", "t", (), [Delay(a, k, u) for a, k, u in delays])
    run = SimDevice(schedule).run(graph_program(order, steps))
    assert not any(isinstance(r, Deadlock) for r in run.reports), [str(r) for r in run.reports]
    assert run.result is True


def test_the_random_graphs_find_the_lost_wakeup(monkeypatch: pytest.MonkeyPatch) -> None:
    def one_pass(self: Execution) -> None:
        for s in list(self.streams.values()):
            self._advance(s)

    monkeypatch.setattr(Execution, "kick_all", one_pass)

    def deadlocks(case: tuple[list[int], list[tuple[str, int, int]]]) -> bool:
        run = SimDevice().run(graph_program(*case))
        return any(isinstance(r, Deadlock) for r in run.reports)

    found = find(st.tuples(st.permutations(range(4)), st.lists(_STEP, max_size=16)), deadlocks,
                 settings=search_settings(max_examples=2000))
    assert deadlocks(found)
