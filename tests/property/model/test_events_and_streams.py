"""Events and streams as the contract offers them, and two rules the model relies on, each shown needed.

- ``event.record`` snapshots its stream's clock: work enqueued on the stream after the record is not ordered by
  a wait on the event (a mutant that keeps the live clock is caught).
- A write races with earlier unordered *reads*, not only with writes (a mutant that skips reads is caught).
- Streams one completion releases at once move in their creation order, whatever order they came to wait in (a
  mutant that moves them in the reverse order is caught): the order of the trace's lines at that moment is fixed.
- ``Event(enable_timing=True)`` and ``elapsed_time`` in virtual milliseconds; ``Stream(priority=)``;
  ``stream(None)`` changes nothing; unnamed streams are ``s1``, ``s2``, ... counted over unnamed streams only
  (never taking a name already in use, and not advanced by the internal ``nccl`` stream).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from reference.schedule import Schedule
from simdevice import Race, SimDevice
from simdevice.runtime import execution, memory, sync
from simdevice.runtime.streams import EventRecord, SimStream


def run(body: Any, schedule: str = "t/t") -> Any:
    return SimDevice(Schedule.parse(schedule)).run(body)


def record_then_write(dev: Any) -> None:
    """s1 writes x after recording e; s2 waits e and reads x: the wait does not order that later write."""
    x = torch.zeros(1024, device=dev.device)
    dev.synchronize()
    s1, s2 = dev.Stream(name="s1"), dev.Stream(name="s2")
    e = dev.Event()
    e.record(s1)
    with dev.stream(s1):
        x.fill_(1.0)
    s2.wait_event(e)
    with dev.stream(s2):
        x.sum()
    dev.synchronize()


def test_a_wait_orders_only_the_work_before_the_record() -> None:
    r = run(record_then_write)
    assert [(x.current.op, x.previous.op) for x in r.reports if isinstance(x, Race)] == [("sum", "fill_")]


def test_the_snapshot_is_needed(monkeypatch: pytest.MonkeyPatch) -> None:
    def live(stream: SimStream) -> EventRecord:  # the mutant: the record keeps the stream's live clock
        return EventRecord(stream, stream.enqueued, stream.clock)

    monkeypatch.setattr(sync, "record", live)
    assert run(record_then_write).reports == ()


def read_then_write(dev: Any) -> None:
    x = torch.ones(1024, device=dev.device)
    dev.synchronize()
    side = dev.Stream(name="side")
    with dev.stream(side):
        x.sum()
    x.fill_(2.0)  # the compute stream overwrites what the side stream may still read
    dev.synchronize()


def test_a_write_after_an_unordered_read_is_a_race() -> None:
    r = run(read_then_write)
    assert [(x.current.kind, x.previous.kind) for x in r.reports] == [("write", "read")]


def test_write_after_read_is_needed(monkeypatch: pytest.MonkeyPatch) -> None:
    original = memory.Memory.issue_write

    def blind_to_reads(self: memory.Memory, st: memory.Storage, access: Any, clock: Any) -> Any:
        for _, _, cell in st.cells(access.lo, access.hi):
            cell.reads = []  # the mutant: reads are forgotten before the check
        return original(self, st, access, clock)

    monkeypatch.setattr(memory.Memory, "issue_write", blind_to_reads)
    assert run(read_then_write).reports == ()


def test_elapsed_time_is_virtual_milliseconds_between_completions() -> None:
    def program(dev: Any) -> float:
        start, end = dev.Event(enable_timing=True), dev.Event(enable_timing=True)
        x = torch.zeros(1024, device=dev.device)
        start.record()
        x.add_(1)
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    r = run(program, "t/t::default#1+3")  # the add is stalled 3 ms before it starts
    assert r.reports == ()
    cfg = SimDevice().config
    # start completes with the zeros; the add is enqueued one host step later, stalled 3 ms, then runs
    assert r.result == pytest.approx(3.0 + (cfg.host_step_ns + cfg.kernel_ns(4096)) / 1e6)


@pytest.mark.parametrize("busy", [False, True])
def test_two_timing_events_at_one_stream_position_keep_their_own_times(busy: bool) -> None:
    """Two timing events recorded with no work between them, the host sleeping 10 ms in between, are 10 ms apart
    (each is stamped when its stream reaches it: the second, on an idle stream, as it is recorded), whether the
    first was recorded behind running work (``busy``) or on an idle stream. A mutant that keeps one time per
    stream position (the later record overwrote it) gives 0."""

    def program(dev: Any) -> float:
        start, end = dev.Event(enable_timing=True), dev.Event(enable_timing=True)
        if busy:
            torch.ones(1 << 20, device=dev.device).mul_(2)
        start.record()
        dev.synchronize()
        dev.sleep(10)  # host work while the stream is idle
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    r = run(program)
    assert r.reports == ()
    assert r.result >= 10.0


@pytest.mark.parametrize(
    ("timing", "sync", "message"),
    [
        (False, True, "both events must be created with enable_timing=True"),
        (True, False, "an event has not completed yet"),
    ],
)
def test_elapsed_time_refuses_what_cuda_refuses(timing: bool, sync: bool, message: str) -> None:
    def program(dev: Any) -> float:
        start, end = dev.Event(enable_timing=timing), dev.Event(enable_timing=timing)
        start.record()
        torch.zeros(1 << 16, device=dev.device)
        end.record()
        if sync:
            end.synchronize()
        return start.elapsed_time(end)

    [err] = run(program).reports
    assert message in str(err)


def test_streams_accept_priority_and_stream_none_is_a_no_op() -> None:
    def program(dev: Any) -> tuple[str, str]:
        s = dev.Stream(name="high", priority=-1)
        with dev.stream(None):
            inner = dev.current_stream().name
        return s.name, inner

    assert run(program).result == ("high", "default")


def test_unnamed_streams_count_only_unnamed_ones_and_skip_taken_names() -> None:
    def program(dev: Any) -> list[str]:
        named = dev.Stream(name="s1")
        out = torch.zeros(2, device=dev.device)
        dev.all_gather_into_tensor(out, torch.ones(2, device=dev.device)).wait()  # makes the nccl stream
        return [named.name, dev.Stream().name, dev.Stream().name]

    assert run(program).result == ["s1", "s2", "s3"]


def test_a_stream_of_another_device_is_refused() -> None:
    other = SimDevice()

    def make(dev: Any) -> Any:
        return dev.Stream(name="theirs")

    theirs = other.run(make).result

    def program(dev: Any) -> None:
        dev.current_stream().wait_stream(theirs)

    [err] = run(program).reports
    assert "expected a stream of this SimDevice" in str(err)


def released_together(dev: Any) -> None:
    """Three streams wait for one event, in the reverse of their creation order; one completion releases all."""
    x = torch.zeros(1 << 16, device=dev.device)
    first, second, third = dev.Stream(name="first"), dev.Stream(name="second"), dev.Stream(name="third")
    e = dev.Event()
    x.mul_(2.0)
    e.record()
    for s in (third, second, first):
        s.wait_event(e)
        with dev.stream(s):
            x.sum()
    dev.synchronize()


def _passes(run_: Any) -> list[tuple[int, str]]:
    return [(t, where) for t, where, what in run_.trace if what.startswith("pass ")]


def test_streams_released_at_once_move_in_their_creation_order() -> None:
    passes = _passes(run(released_together))
    assert [where for _, where in passes] == ["first", "second", "third"]
    assert len({t for t, _ in passes}) == 1


def test_the_creation_order_is_needed(monkeypatch: pytest.MonkeyPatch) -> None:
    def backwards(self: Any) -> None:  # the mutant: the streams move in the reverse of their creation order
        moved = True
        while moved:
            moved = False
            for s in reversed(self.streams.values()):
                if not s.busy and s.queue:
                    ready = s.queue[0].ready
                    if ready is None or ready():
                        moved |= self._advance(s)

    monkeypatch.setattr(execution.Execution, "kick_all", backwards)
    assert [where for _, where in _passes(run(released_together))] == ["third", "second", "first"]
