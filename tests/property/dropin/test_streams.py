"""torch.cuda streams and events on the simulated device: named by where the program made them, accepted by
torch's own record_stream, and ordered only by the synchronization the program wrote."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
import torch

import simdevice
from reference.naming import short_path
from simdevice import Race, StaleRead

#: how reports name this file (relative to the working directory when under it)
HERE = short_path(__file__)


class Offloader:
    def __init__(self) -> None:
        self._d2h_stream = torch.cuda.Stream()
        self.h2d = torch.cuda.Stream(priority=-1)


def test_streams_are_named_after_what_the_line_assigns_and_where_it_is() -> None:
    names: list[str] = []
    with simdevice.cuda() as sim:
        o = Offloader()
        side = torch.cuda.Stream()
        pool = [torch.cuda.Stream() for _ in range(2)]  # the list's name, then a suffix
        more: list[torch.cuda.Stream] = []
        more.append(torch.cuda.Stream())  # no assignment on the line: s1
        side_2 = torch.cuda.Stream()
        names = [s.name for s in (o._d2h_stream, o.h2d, side, *pool, *more, side_2)]
        sites = sim.device.runtime.site_of(names[0])
    sim.assert_clean()
    assert names == ["d2h_stream", "h2d", "side", "pool", "pool-2", "s1", "side_2"]
    assert sites is not None
    assert sites.startswith(f"{HERE}:")


def test_a_name_taken_twice_gets_a_suffix() -> None:
    with simdevice.cuda() as sim:
        made = []
        for _ in range(3):
            side = torch.cuda.Stream()
            made.append(side.name)
    sim.assert_clean()
    assert made == ["side", "side-2", "side-3"]


def test_reports_name_the_streams_by_their_names() -> None:
    with simdevice.cuda() as sim:
        d2h_stream = torch.cuda.Stream()
        act = torch.ones(1024, device="cuda")
        pinned = torch.empty(1024, pin_memory=True)
        d2h_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(d2h_stream):
            pinned.copy_(act, non_blocking=True)
        back = torch.empty_like(act)
        back.copy_(pinned, non_blocking=True)  # no wait on the D2H
    assert any(isinstance(r, Race) for r in sim.reports)
    assert "d2h_stream" in sim.text()
    assert "default" in sim.text()


def test_events_order_streams_and_query_and_time() -> None:
    with simdevice.cuda() as sim:
        side = torch.cuda.Stream()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        x = torch.zeros(4096, device="cuda")
        start.record()
        x.add_(1)
        end.record()
        side.wait_event(end)
        with torch.cuda.stream(side):
            y = x * 2
        torch.cuda.current_stream().wait_stream(side)
        end.synchronize()
        assert end.query()
        assert start.elapsed_time(end) > 0
        assert y.cpu().tolist() == [2.0] * 4096
        assert torch.cuda.current_stream() == torch.cuda.default_stream()
    sim.assert_clean()


def test_set_stream_changes_the_current_stream() -> None:
    with simdevice.cuda() as sim:
        side = torch.cuda.Stream()
        torch.cuda.set_stream(side)
        assert torch.cuda.current_stream() == side
        torch.cuda.set_stream(torch.cuda.default_stream())
        assert torch.cuda.current_stream() != side
    sim.assert_clean()


def _side_reads_then_dropped(record: bool) -> None:
    side = torch.cuda.Stream()
    out = torch.empty(4096, device="cuda")
    a = torch.ones(4096, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out.copy_(a)
    if record:
        a.record_stream(side)  # torch's own Tensor.record_stream, given a simulated stream
    del a
    torch.full((4096,), 2.0, device="cuda")  # the compute stream's next allocation of that size
    torch.cuda.synchronize()


def test_torch_record_stream_takes_a_simulated_stream_and_defers_reuse() -> None:
    recorded, dropped = simdevice.cuda(), simdevice.cuda()
    recorded.run(_side_reads_then_dropped, True)
    dropped.run(_side_reads_then_dropped, False)
    recorded.assert_clean()
    assert any(isinstance(r, (Race, StaleRead)) for r in dropped.reports)


def _recorded_inside_the_block(inside: bool) -> None:
    copy = torch.cuda.Stream()
    pinned = torch.ones(1024).pin_memory()
    with torch.cuda.stream(copy):
        w = pinned.to("cuda", non_blocking=True)  # allocated on copy
        if inside:
            w.record_stream(torch.cuda.current_stream())  # copy itself: a no-op
    if not inside:
        w.record_stream(torch.cuda.current_stream())  # the stream that reads it
    torch.cuda.current_stream().wait_stream(copy)
    total = w.sum()
    del w
    assert total.item() == 1024.0


def test_record_stream_naming_the_allocating_stream_is_noted_as_doing_nothing() -> None:
    """``w.record_stream(torch.cuda.current_stream())`` inside the copy stream's block names the stream ``w`` was
    allocated on, which torch's allocator ignores: the program meant the reading stream. The run says so (a run
    that fails for it, where a reuse races, shows the note beside the race)."""
    inside, outside = simdevice.cuda(), simdevice.cuda()
    inside.run(_recorded_inside_the_block, True)
    outside.run(_recorded_inside_the_block, False)
    assert inside.result is not None
    assert outside.result is not None
    line = _recorded_inside_the_block.__code__.co_firstlineno + 6
    assert [n for n in inside.result.notes if n.startswith("record_stream(")] == [
        f"record_stream(copy) at {HERE}:{line} does nothing: the tensor was allocated on copy, whose own order holds "
        "its block (torch's allocator ignores a use on the allocating stream); to keep the block from reuse until "
        "another stream is done with it, name that stream"]
    assert not [n for n in outside.result.notes if n.startswith("record_stream(")]


def test_an_idle_stream_and_a_stream_that_shares_nothing_are_noted() -> None:
    def program() -> None:
        side = torch.cuda.Stream()
        idle = torch.cuda.Stream()
        torch.ones(4, device="cuda")
        with torch.cuda.stream(side):
            torch.ones(4, device="cuda").mul_(2)
        torch.cuda.synchronize()
        del idle

    s = simdevice.cuda()
    s.run(program)
    notes = s.result.notes if s.result is not None else ()
    assert s.clean
    assert len(notes) == 2
    assert notes[0].startswith(f"stream side (made at {HERE}:")
    assert "touched no memory that another stream or the host touched" in notes[0]
    assert notes[1].startswith("stream idle ")
    assert "got no operation" in notes[1]
    assert "note: stream idle" in s.text()


def test_many_idle_streams_of_one_line_are_one_note_and_a_few_a_note_each() -> None:
    """A stream per layer, few of them used: the idle ones of a line are one note naming how many, the first two and
    the last, in the place of the first's; four or fewer of a line are a note each (``IDLE_NAMED``)."""
    def program(layers: int) -> None:
        streams = [torch.cuda.Stream() for _ in range(layers)]
        x = torch.ones(4, device="cuda")
        streams[0].wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(streams[0]):
            x.mul_(2)
        torch.cuda.synchronize()

    line = program.__code__.co_firstlineno + 1
    many, few = simdevice.cuda(), simdevice.cuda()
    many.run(program, 12)
    few.run(program, 5)
    assert many.result is not None
    assert few.result is not None
    assert many.result.notes == (f"11 streams, made at {HERE}:{line} (streams-2, streams-3, ..., streams-12) got no "
                                 "operation: nothing ran on them to race",)
    assert few.result.notes == tuple(f"stream streams-{k} (made at {HERE}:{line}) got no operation: nothing ran on it "
                                     "to race" for k in range(2, 6))


def test_no_note_when_every_stream_shares_memory_with_another() -> None:
    def program() -> None:
        side = torch.cuda.Stream()
        x = torch.ones(4, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            x.mul_(2)
        torch.cuda.current_stream().wait_stream(side)
        assert x.cpu().tolist() == [2.0] * 4

    s = simdevice.cuda()
    s.run(program)
    s.assert_clean()
    assert s.result is not None
    assert s.result.notes == ()


def test_a_non_blocking_copy_to_a_new_host_tensor_lands_in_pinned_memory_and_the_host_goes_on() -> None:
    # ATen's _to_copy pins its output for a non-blocking device-to-host copy: read at once, it is a race
    def fetch(sync: bool) -> list[float]:
        x = torch.arange(4, dtype=torch.float32, device="cuda")
        for _ in range(4):
            x.mul_(1.0)
        y = x.to("cpu", non_blocking=True)
        assert y.is_pinned()
        if sync:
            torch.cuda.current_stream().synchronize()
        got: list[float] = y.clone().tolist()  # (an op reads it: tolist alone reads the bytes without one)
        blocking = x.to("cpu")  # without non_blocking: pageable, and the host waits for it
        assert not blocking.is_pinned()
        assert blocking.tolist() == [0.0, 1.0, 2.0, 3.0]
        return got

    with simdevice.cuda() as racy:
        fetch(False)
    races = [r for r in racy.reports if isinstance(r, simdevice.Race)]
    assert len(races) == 1, racy.text()
    assert races[0].current.actor == "host"
    assert races[0].previous.op.startswith("_to_copy (D2H)")
    with simdevice.cuda() as synced:
        assert fetch(True) == [0.0, 1.0, 2.0, 3.0]
    synced.assert_clean()


def test_a_thread_the_program_starts_is_a_host_actor_of_its_process() -> None:
    """A thread the program starts is an actor of the run (it raised, naming the thread, where its work went
    unchecked): a device tensor it makes is its process's, and the main thread reads it after a synchronize
    (tests/property/dropin/test_threads.py has the rest)."""
    import threading

    def program() -> None:
        src = torch.arange(8.0).pin_memory()
        box = {}

        def worker() -> None:
            box["t"] = src.to("cuda", non_blocking=True)

        th = threading.Thread(target=worker, name="loader")
        th.start()
        th.join()
        torch.cuda.synchronize()
        assert box["t"].sum().item() == 28.0

    s = simdevice.cuda()
    s.run(program)
    assert s.result is not None
    assert not s.result.reports, s.result.reports
    assert s.result.op_counts["loader"] >= 1


def _in_a_thread(work: str) -> None:
    """The host copies a device tensor to pinned memory and waits; then a thread the program starts does ``work``."""
    import threading

    dev = torch.ones(8, device="cuda")
    pinned = torch.empty(8, pin_memory=True)
    pinned.copy_(dev, non_blocking=True)
    torch.cuda.synchronize()
    plain = torch.ones(8)
    box = {}

    def worker() -> None:
        if work == "pinned":
            box["out"] = pinned.clone()  # an op on the run's pinned memory
        elif work == "device":
            box["out"] = pinned.copy_(dev)  # an op on a device tensor, into pinned memory
        elif work == "device-only":
            box["out"] = dev * 2  # an op on a device tensor alone
        else:
            box["out"] = plain * 2  # host memory the run does not own

    th = threading.Thread(target=worker, name="writer")
    th.start()
    th.join()
    assert "out" in box


@pytest.mark.parametrize("work", ["pinned", "device", "device-only"])
def test_a_threads_work_on_the_runs_memory_is_its_own_actors(work: str) -> None:
    """A thread's host accesses are ordered against the streams as its own actor's (they were refused: unchecked):
    after the main thread's synchronize, its work on pinned and device memory is clean."""
    s = simdevice.cuda()
    s.run(_in_a_thread, work)
    assert s.result is not None
    assert not s.result.reports, s.text()
    assert s.result.op_counts["writer"] >= 1


def test_a_thread_doing_its_own_host_work_runs_unhindered() -> None:
    s = simdevice.cuda()
    s.run(_in_a_thread, "plain")
    s.assert_clean()


def _poll_with_sleeps() -> int:
    import time

    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)  # about 146 ms of GPU time
        done = torch.cuda.Event()
        done.record()
    polls = 1
    while not done.query():
        time.sleep(0.001)
        polls += 1
    return polls


def test_time_sleep_in_a_run_is_virtual_host_time() -> None:
    """A polling loop that sleeps between queries waits as long as on a GPU in as many polls as there (about one a
    millisecond), not one poll per host step, and does not sleep for real."""
    s = simdevice.cuda()
    s.run(_poll_with_sleeps)
    s.assert_clean()
    assert s.result is not None
    assert 140 <= s.result.result <= 160


def _deadline_wait() -> tuple[float, float, int]:
    """A wait for a side stream's work with a deadline, as a watchdog or a timed poll writes it: ``time.monotonic()``
    against the deadline, sleeping between queries; ``perf_counter`` around it."""
    from time import perf_counter  # (imported in the run: the session's clock)

    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)  # about 146 ms of GPU time
        done = torch.cuda.Event()
        done.record()
    start, wall = perf_counter(), time.time()
    deadline = time.monotonic() + 10.0
    polls = 0
    while not done.query():
        if time.monotonic() > deadline:
            raise TimeoutError("the side stream did not finish in 10 s")
        time.sleep(0.01)
        polls += 1
    return perf_counter() - start, time.time() - wall, polls


def test_the_clocks_a_run_reads_are_its_host_time() -> None:
    """``time.time``, ``monotonic`` and ``perf_counter`` in a run read the actor's host time, which ``time.sleep``
    moves: a wait with a deadline sees as much time pass as on a GPU, in every run alike. Before, sleeps were
    virtual and the clocks real, so a sleep of 10 ms read as none, and a loop sleeping until a deadline ran until
    that much real time had passed (a watchdog's 30 s: thousands of virtual sleeps)."""
    runs = [simdevice.cuda().run(_deadline_wait) for _ in range(2)]
    for run in runs:
        assert not run.reports, run.reports
    elapsed, wall, polls = runs[0].result
    assert 0.146 <= elapsed <= 0.16, elapsed
    assert wall == pytest.approx(elapsed, abs=1e-6)
    assert 14 <= polls <= 16, polls
    assert runs[1].result == runs[0].result  # the same run: no wall clock in it
    assert time.perf_counter() > 0  # outside a run: the real clocks


def _host_updates_pinned(sync: bool) -> list[float]:
    dev = torch.full((8,), 5.0, device="cuda")
    pinned = torch.zeros(8, pin_memory=True)
    pinned.copy_(dev, non_blocking=True)
    if sync:
        torch.cuda.synchronize()
    pinned.add_(1.0)  # reads what the D2H writes, then writes it
    torch.cuda.synchronize()
    return pinned.tolist()


def test_a_host_in_place_op_on_pinned_memory_reads_it_too() -> None:
    """``pinned.add_(1)`` on the host reads the buffer as well as writing it: while the D2H that fills it is in
    flight, it reads the old values (a stale read; on a GPU the D2H then overwrites the sum: a lost update, which
    the final ``tolist()`` reads)."""
    s = simdevice.cuda("default#1+1")  # the D2H stalled: the host's add_ comes first
    s.run(_host_updates_pinned, False)
    stale = [r for r in s.reports if isinstance(r, StaleRead)]
    assert len(stale) == 2, s.text()
    assert str(stale[0]).startswith("stale read: add_ on host host")
    assert str(stale[1]).startswith("stale read: tolist on host host"), s.text()
    assert "it saw copy_ (D2H) on stream default #1" in str(stale[1]), s.text()
    assert "expected the data of add_ on host host" in str(stale[1]), s.text()
    s = simdevice.cuda("default#1+1")
    s.run(_host_updates_pinned, True)
    s.assert_clean()
    assert s.result is not None
    assert s.result.result == [6.0] * 8


def _forward_on_a_side_stream(wait: bool) -> list[float]:
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8).cuda()
    x = torch.randn(4, 8).cuda().mul(2.0)  # a kernel on the default stream
    s = torch.cuda.Stream()
    if wait:
        s.wait_stream(torch.cuda.current_stream())  # the forward reads lin and x, made on the default stream
    with torch.cuda.stream(s):
        loss = torch.nn.functional.gelu(lin(x)).pow(2).mean()  # gelu, pow, mean: nodes of one call each
    loss.backward()  # on the default stream
    return lin.weight.grad.cpu().flatten().tolist()


def _reference_grad() -> list[float]:
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8).mul(2.0)
    torch.nn.functional.gelu(lin(x)).pow(2).mean().backward()
    return lin.weight.grad.flatten().tolist()


def test_backward_runs_each_op_on_its_forward_ops_stream() -> None:
    """As PyTorch's engine does: a forward on a side stream and ``backward()`` on the default one is ordered (each
    backward op on its forward op's stream, synced with the stream backward was called on); the gradients are right
    and the backward ops are the side stream's."""
    s = simdevice.cuda()
    s.run(_forward_on_a_side_stream, True)
    s.assert_clean()
    assert s.result is not None
    assert s.result.result == pytest.approx(_reference_grad())
    bwd = [what for _, actor, what in s.result.trace if actor == "s" and "backward" in what.lower()]
    assert bwd, s.result.trace
    racy = simdevice.cuda()
    racy.run(_forward_on_a_side_stream, False)
    assert any(isinstance(r, Race) for r in racy.reports)


def _backward_on_a_side_stream(forward_on_side: bool) -> list[float]:
    """``backward()`` called in a side stream's block, the gradients then used on the default stream with no wait
    for the side stream."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8).cuda()
    x = torch.randn(4, 8).cuda().mul(2.0)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    if forward_on_side:
        with torch.cuda.stream(s):
            loss = torch.nn.functional.gelu(lin(x)).pow(2).mean()
    else:
        loss = torch.nn.functional.gelu(lin(x)).pow(2).mean()  # on the default stream
    with torch.cuda.stream(s):
        loss.backward()
    return lin.weight.grad.mul(1.0).cpu().flatten().tolist()  # read on the default stream


def test_backward_on_a_side_stream_runs_default_stream_ops_on_the_default_stream() -> None:
    """A forward on the default stream and ``backward()`` in a side stream's block: PyTorch's engine runs each
    backward op, and the leaves' ``AccumulateGrad``, on the stream its node was made on (the default one), and the
    side stream waits for them at the end; the gradients, used on the default stream, are ordered. (They ran on the
    side stream, the stream ``backward()`` was called on: the default stream's read of them raced, with wrong
    values, in a program a GPU runs right.) A forward in the side stream's block runs its backward there: the same
    read races."""
    stalled = "s#0+5"
    s = simdevice.cuda(stalled)
    s.run(_backward_on_a_side_stream, False)
    s.assert_clean()
    assert s.result is not None
    assert s.result.result == pytest.approx(_reference_grad())
    on_side = [what for _, actor, what in s.result.trace if actor == "s" and what.startswith("start ")]
    assert on_side == ["start ones_like #0"], on_side  # the initial gradient only, made where backward was called
    racy = simdevice.cuda(stalled)
    racy.run(_backward_on_a_side_stream, True)
    assert any(isinstance(r, Race) for r in racy.reports), racy.text()


def test_a_stream_an_earlier_run_made_is_named_as_such() -> None:
    """A stream kept across runs where the tool cannot put it back (an object's, another module's) is refused with
    the reason: it was made by an earlier run."""
    kept: dict[str, Any] = {}

    def program() -> None:
        s = kept.setdefault("s", torch.cuda.Stream())
        with torch.cuda.stream(s):
            torch.ones(2, device="cuda")

    first, second = simdevice.cuda(), simdevice.cuda()
    first.run(program)
    second.run(program)
    first.assert_clean()
    assert "expected a stream of this SimDevice" in second.text()
    assert "made by an earlier run" in second.text()


def test_a_stream_keeps_its_priority_within_the_device_s_range() -> None:
    """``torch.cuda.Stream(priority=p)`` shows ``p`` clamped to ``Stream.priority_range()`` (least, greatest), as on
    an H200 (it showed 0, and ``priority_range`` was missing)."""
    with simdevice.cuda() as sim:
        shown = [torch.cuda.Stream(priority=p).priority for p in (0, -1, -3, -9, 2)]
        rng = torch.cuda.Stream.priority_range()
        default = torch.cuda.Stream().priority
    assert sim.result is not None
    assert shown == [0, -1, -3, -3, 0]
    assert rng == (0, -3)
    assert default == 0


def test_record_event_makes_a_torch_cuda_event() -> None:
    """``s.record_event()`` with no event makes a ``torch.cuda.Event`` (as torch does: one with ``ipc_handle``, that
    ``isinstance`` checks take), recorded on ``s``, and records a given one there (it made the contract's bare
    event class, which is no ``torch.cuda.Event``)."""
    with simdevice.cuda() as sim:
        side = torch.cuda.Stream()
        made = side.record_event()
        from_current = torch.cuda.current_stream().record_event()
        given = torch.cuda.Event()
        returned = side.record_event(given)
        kinds = [isinstance(e, torch.cuda.Event) for e in (made, from_current)]
        made.synchronize()
    sim.assert_clean()
    assert kinds == [True, True]
    assert returned is given


def test_a_stream_entered_again_inside_its_own_block_restores_each_stream_in_turn() -> None:
    """``with side: with other: with side:`` (and ``with s: with s:``): each block's end makes current what was
    current as it began, as torch's stream context does with its stack. (The handle kept one context: entering it
    again dropped the outer one's, whose generator, closed, ended the outer block at once: after the inner block the
    default stream was current inside the outer ``with``, and ops ran there.)"""
    with simdevice.cuda() as sim:
        side = torch.cuda.Stream()
        other = torch.cuda.Stream()
        seen = []
        with side:
            with side:
                seen.append(torch.cuda.current_stream().name)
            seen.append(torch.cuda.current_stream().name)
            with other:
                with side:
                    seen.append(torch.cuda.current_stream().name)
                seen.append(torch.cuda.current_stream().name)
            seen.append(torch.cuda.current_stream().name)
        seen.append(torch.cuda.current_stream().name)
    assert sim.result is not None
    assert seen == ["side", "side", "side", "other", "side", "default"]


def _undelayed() -> None:
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.ones(2, device="cuda").add_(1)
    torch.cuda.synchronize()


@pytest.mark.parametrize("delays", ["sidee#0+5", "side#9+5"])
def test_a_session_s_delay_that_never_applied_is_noted(delays: str) -> None:
    """A delay naming an actor the session never made (a typo) or an operation it never reached: the run went as if
    undelayed, and its text says so (as a replay's does), rather than nothing."""
    with simdevice.cuda(delays) as sim:
        _undelayed()
    assert sim.clean
    assert sim.text().splitlines()[1] == f"  note: delays never applied (their operation never came): {delays}"


@pytest.mark.parametrize(("line", "says"), [("side#0+", "bad delay 'side#0+'"), ("side#0+1,zz#", "bad delay 'zz#'")])
def test_a_session_s_malformed_delay_is_named(line: str, says: str) -> None:
    """Delays alone with a malformed one: the error names that delay, not a schedule's target."""
    with pytest.raises(simdevice.ScheduleError, match=re.escape(says)):
        simdevice.cuda(line)


def _side_after_backward() -> None:
    side = torch.cuda.Stream()
    w = torch.ones(4, 4, device="cuda", requires_grad=True)
    (w * 2).sum().backward()  # two ranks inside backward at once: the run starts again on threads
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        w.grad.mul_(1.0)
    torch.cuda.synchronize()


def test_a_run_started_again_on_threads_names_its_streams_as_the_first_run_did() -> None:
    """Where a run starts again on threads (two ranks inside backward at once), each stream keeps the name the line
    that made it gives (``rank0.side``), not the next one free after the first attempt's (``rank0.side-2``), so a
    schedule line names the same stream in every run."""
    s = simdevice.cuda("rank0.side#0+5")
    s.run(_side_after_backward, world_size=2)
    s.assert_clean()
    assert s.result is not None
    assert {"rank0.side", "rank1.side"} <= set(s.result.op_counts)
    assert not [k for k in s.result.op_counts if k.endswith("-2")]
    assert not s.result.unfired


def _hook_copies_on_the_current_stream(racy: bool, n: int = 1024) -> list[str]:
    s = torch.cuda.Stream()
    w = torch.ones(n, device="cuda", requires_grad=True)
    pinned = torch.empty(n, pin_memory=True)
    done = torch.cuda.Event()
    seen: list[str] = []

    def hook(g: torch.Tensor) -> torch.Tensor:
        seen.append(torch.cuda.current_stream().name)  # type: ignore[attr-defined]
        pinned.copy_(g, non_blocking=True)  # on s: the engine runs the node, and its hooks, there
        done.record(torch.cuda.default_stream() if racy else torch.cuda.current_stream())
        return g

    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        h = w * 3.0
        h.register_hook(hook)
        loss = h.sum()
    loss.backward()
    done.synchronize()
    assert torch.equal(pinned, torch.ones(n)), "the host read the pinned grad before the copy on s finished"
    return seen


def test_a_tensor_hook_runs_on_its_node_s_stream() -> None:
    """A hook the program puts on an output of a forward op made on ``s`` runs with ``s`` current, as PyTorch's engine
    switches to a node's stream before its hooks: an event recorded on the default stream then does not cover the
    hook's copy (found; it ran on the default stream, and the race was a clean verdict), one recorded on the current
    stream does (clean)."""
    s = simdevice.cuda()
    s.run(_hook_copies_on_the_current_stream, False)
    s.assert_clean()
    assert s.result is not None
    assert s.result.result == ["s"]
    found = simdevice.explore(_hook_racy_event, max_examples=30)
    assert found.failure is not None


def _hook_racy_event() -> None:
    _hook_copies_on_the_current_stream(True)


def test_a_default_stream_s_cuda_handle_is_zero() -> None:
    """CUDA's legacy default stream has the null handle: ``default_stream().cuda_stream`` is 0 on a GPU (a program
    asking whether it runs on the default stream compares it with 0), each rank's too; any other stream's is a
    distinct non-zero number. Mutation caught: the handle as the stream's order number (2 for the host's)."""

    def program() -> tuple[int, int, int]:
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            inside = torch.cuda.current_stream().cuda_stream
        return torch.cuda.default_stream().cuda_stream, torch.cuda.current_stream().cuda_stream, inside

    s = simdevice.cuda()
    run = s.run(program)
    s.assert_clean()
    default, current, inside = run.result
    assert (default, current) == (0, 0)
    assert inside != 0
    ranks = simdevice.cuda()
    assert all(r[:2] == (0, 0) and r[2] != 0 for r in ranks.run(program, world_size=2).result)
