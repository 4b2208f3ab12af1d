"""A polling loop counts the same whatever its timing: consecutive polls of an actor are one counted operation.

Rules, each with a test a mutation of it fails:

- a poll is a host step that only observes (a shared value's read, ``Queue.empty``, an event's or a stream's
  ``query``, a collective's ``is_completed``) or a sleep; of an actor's consecutive polls only the first is counted,
  so a loop that polls once and one that polls fifty times make the same counts (``HostActor.count``);
- a delay on the poll's index lands before its first step;
- any other host step ends the poll: the next poll is counted again, so straight-line queries between other
  steps are counted as before;
- an uncounted poll is a step all the same: its host time, a scheduling point, the trace;
- ``reference.cuda._Counter`` (the GPU's counter, plain Python) follows the same rule: the same sequence of steps
  gets the same indices and delays on both.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reference.cuda import _Counter
from reference.schedule import Delay, Schedule
from simdevice import SimDevice
from simdevice.runtime.execution import HostActor

#: what each kind of step is in a program; the polls first
POLLS = {
    "get": lambda dev, h: h["value"].value,
    "sleep": lambda dev, h: dev.sleep(1),
    "empty": lambda dev, h: h["queue"].empty(),
    "event": lambda dev, h: h["event"].query(),
    "stream": lambda dev, h: h["stream"].query(),
}
OTHERS = {
    "sync": lambda dev, h: dev.synchronize(),
    "set": lambda dev, h: setattr(h["value"], "value", 1),
    "put": lambda dev, h: h["queue"].put(0),
}
STEPS = {**POLLS, **OTHERS}


def expected_indices(kinds: list[str]) -> list[int | None]:
    """The rule, stated apart from both counters: a step is counted unless it is a poll right after a poll; its
    index is the number of counted steps before it."""
    counted = [k not in POLLS or i == 0 or kinds[i - 1] not in POLLS for i, k in enumerate(kinds)]
    return [sum(counted[:i]) if c else None for i, c in enumerate(counted)]


def straight_line(dev: Any, kinds: list[str]) -> None:
    h = {"value": dev.Value("i", 0), "queue": dev.Queue(), "event": dev.Event(), "stream": dev.Stream(name="side")}
    for k in kinds:
        STEPS[k](dev, h)


def simulate(kinds: list[str], delays: tuple[Delay, ...] = ()) -> tuple[Any, SimDevice]:
    dev = SimDevice(Schedule("test", "t", (), delays))
    run = dev.run(straight_line, kinds)
    assert not run.reports, run.reports
    return run, dev


def host_trace(run: Any) -> list[str]:
    return [what for _, actor, what in run.trace if actor == "host"]


def on_cuda_counter(kinds: list[str], delays: tuple[Delay, ...] = ()) -> tuple[list[int], _Counter]:
    """The units ``reference.cuda._Counter`` stalls each step by, as ``CudaDevice`` feeds it the steps."""
    counter = _Counter(Schedule("test", "t", (), delays), cycles_per_ms=1.0)
    return [counter.next("host", poll=k in POLLS) for k in kinds], counter


kind_lists = st.lists(st.sampled_from(sorted(STEPS)), min_size=1, max_size=12)


# -- a polling loop: the same counts however long it polls -------------------------------------------------


def setter(dev: Any, flag: Any) -> None:
    flag.value = 1


def poll_loop(dev: Any) -> None:
    """The trainer's wait for a worker's flag (``reference.zcc``'s barrier), between two other steps."""
    flag = dev.Value("i", 0)
    dev.synchronize()
    p = dev.Process(setter, (flag,), name="worker0")
    p.start()
    while flag.value != 1:
        dev.sleep(1)
    dev.synchronize()
    p.join()


def polled(stall: int, extra: tuple[Delay, ...] = ()) -> tuple[Any, int]:
    """The loop's run with the worker stalled ``stall`` units before it sets the flag; how often the host read it."""
    delays = (Delay("worker0", 0, stall),) if stall else ()
    run = SimDevice(Schedule("test", "t", (), (*delays, *extra))).run(poll_loop)
    assert not run.reports, run.reports
    return run, host_trace(run).count("Value.get")


def check_counts_do_not_depend_on_the_timing() -> None:
    (quick, reads_quick), (slow, reads_slow) = polled(0), polled(50)
    assert reads_quick < 3 < 40 < reads_slow  # one read or two against fifty: the timing differs
    assert quick.op_counts == slow.op_counts
    # synchronize, Process.start, the poll, synchronize, Process.join
    assert quick.op_counts["host"] == 5


def test_a_polling_loop_counts_the_same_whatever_its_timing() -> None:
    check_counts_do_not_depend_on_the_timing()


def test_a_delay_on_the_poll_lands_before_its_first_step() -> None:
    run, _ = polled(50, (Delay("host", 2, 7),))
    steps = host_trace(run)
    stall = steps.index("stall 7 units before #2")
    assert steps[stall - 2:stall] == ["synchronize", "Process.start(worker0)"]
    assert steps[stall + 1] == "Value.get"
    assert not run.unfired
    # the step after the poll is #3, however many reads and sleeps the poll took
    run, reads = polled(50, (Delay("host", 3, 7),))
    steps = host_trace(run)
    assert reads > 40
    stall = steps.index("stall 7 units before #3")
    assert steps[stall - 2:stall + 2] == ["sleep(1)", "Value.get", "stall 7 units before #3", "synchronize"]


def test_an_uncounted_poll_is_a_step_all_the_same() -> None:
    """Its host time, its trace line: fifty polls take the virtual time fifty steps and sleeps take."""
    run, reads = polled(50)
    assert reads > 40
    assert len(host_trace(run)) > 2 * 40
    assert run.trace[-1][0] > 50 * 1_000_000  # the sleeps waited out the worker's 50-unit stall


# -- straight-line steps: the simulator and the GPU's counter against the rule ----------------------------------


def check_straight_line(kinds: list[str]) -> None:
    want = expected_indices(kinds)
    n = sum(i is not None for i in want)
    run, _ = simulate(kinds)
    assert run.op_counts["host"] == n
    units, counter = on_cuda_counter(kinds)
    assert counter.counts["host"] == n
    assert units == [0] * len(kinds)


def check_delay_lands_on_its_step(kinds: list[str], index: int) -> None:
    """A delay on each counted index lands before the step the rule gives that index, on both counters."""
    want = expected_indices(kinds)
    step = want.index(index)
    delay = (Delay("host", index, 3),)
    run, _ = simulate(kinds, delay)
    trace = host_trace(run)
    stall = trace.index(f"stall 3 units before #{index}")
    assert stall == step  # as many host steps before the stall as steps before the counted one
    assert not run.unfired
    units, counter = on_cuda_counter(kinds, delay)
    assert units == [3 if i == step else 0 for i in range(len(kinds))]
    assert not counter.unfired()


@given(kind_lists)
def test_each_step_is_counted_by_the_rule_on_both_counters(kinds: list[str]) -> None:
    check_straight_line(kinds)


@given(kind_lists, st.data())
def test_a_delay_lands_on_the_same_step_on_both_counters(kinds: list[str], data: st.DataObject) -> None:
    n = sum(i is not None for i in expected_indices(kinds))
    check_delay_lands_on_its_step(kinds, data.draw(st.integers(0, n - 1)))


@pytest.mark.parametrize(
    ("kinds", "counted"),
    [
        (["get", "sync", "get", "set", "event", "put", "stream", "sync", "empty"], 9),  # each query after another op
        (["sync", "get", "sleep", "get", "empty", "event", "stream", "sleep"], 2),  # one poll
        (["sleep", "sleep", "sync", "sleep", "get", "set", "get"], 5),
    ],
)
def test_queries_after_another_step_are_counted_as_before(kinds: list[str], counted: int) -> None:
    check_straight_line(kinds)
    assert sum(i is not None for i in expected_indices(kinds)) == counted


def test_is_completed_is_a_poll_on_the_gpu_counter() -> None:
    """A rank polling ``work.is_completed()`` between two other steps: the counter sees an op, three polls, an op,
    a poll, and counts four (``CudaWork.is_completed`` and ``Runtime.work_is_completed`` both take a poll)."""
    counter = _Counter(None, cycles_per_ms=1.0)
    for poll in (False, True, True, True, False, True):
        counter.next("rank0", poll=poll)
    assert counter.counts == {"rank0": 4}


def test_polls_of_one_actor_do_not_end_another_actors_poll() -> None:
    """The rule is per actor: another actor's steps in between leave a poll one operation."""
    counter = _Counter(None, cycles_per_ms=1.0)
    for actor, poll in [("host", True), ("worker0", False), ("host", True), ("worker0", True), ("host", True)]:
        counter.next(actor, poll=poll)
    assert counter.counts == {"host": 1, "worker0": 2}


# -- mutations of the rule fail the tests above -------------------------------------------------------------------


def count_every_step(self: HostActor, poll: bool) -> int | None:
    self.steps += 1
    return self.steps - 1


def never_reset(self: HostActor, poll: bool) -> int | None:
    if poll and self.polling:
        return None
    self.polling = self.polling or poll  # forgets that any other step ends the poll
    self.steps += 1
    return self.steps - 1


def test_counting_every_poll_again_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(HostActor, "count", count_every_step)
    with pytest.raises(AssertionError):
        check_counts_do_not_depend_on_the_timing()
    with pytest.raises(AssertionError):
        check_straight_line(["sync", "get", "sleep", "get"])


def test_forgetting_to_reset_after_another_step_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(HostActor, "count", never_reset)
    with pytest.raises(AssertionError):
        check_straight_line(["get", "sync", "get"])
    with pytest.raises(AssertionError):
        check_delay_lands_on_its_step(["sleep", "put", "empty", "sync"], 2)


def test_a_gpu_counter_that_counts_every_poll_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    plain = _Counter.next
    monkeypatch.setattr(_Counter, "next", lambda self, actor, poll=False: plain(self, actor))
    with pytest.raises(AssertionError):
        check_straight_line(["sync", "get", "sleep", "get"])
    with pytest.raises(AssertionError):
        check_delay_lands_on_its_step(["get", "sleep", "sync"], 1)
