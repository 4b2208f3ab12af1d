"""A race whose earlier access is a host's (a thread's or another process's host reading or writing host memory),
as between a trainer overwriting a shared snapshot and the saver process still reading it, or a thread filling a
pinned buffer the main host reads: no event can be recorded after a host step, so the explanation proposed nothing
("race(s) begin at a host step"). Its fix is a handshake: the later side's host waits until that host is past its
access (a queue message, an event, ``join()``), inserted as an edge from the host's access and checked as any."""

from __future__ import annotations

import threading

import torch
import torch.multiprocessing as mp

import simdevice
from simdevice.explain import suggest
from simdevice.search.explore import as_target

N = 1024


def _saver(staging: torch.Tensor, q: object, acks: object) -> None:
    while True:
        step = q.get()  # type: ignore[attr-defined]
        if step is None:
            break
        acks.put(float(staging.sum()))  # type: ignore[attr-defined]


def _snapshots(through_the_device: bool) -> None:
    """The trainer writes each step's weights into the shared snapshot, a host ``copy_`` (or, ``through_the_device``,
    a blocking D2H from its device weights), tells the saver, and goes on to the next step without the saver's
    acknowledgement of the last one; the saver must have saved each step's."""
    ctx = mp.get_context("spawn")
    staging = torch.zeros(N).share_memory_()
    q, acks = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_saver, args=(staging, q, acks), name="saver", daemon=True)
    p.start()
    w = torch.zeros(N, device="cuda")
    for step in range(3):
        if through_the_device:
            w.add_(1.0)
            staging.copy_(w)
        else:
            staging.copy_(torch.full((N,), float(step + 1)))
        q.put(step)
    saved = [acks.get() for _ in range(3)]
    q.put(None)
    p.join()
    assert saved == [float(N * (k + 1)) for k in range(3)], saved


def snapshot_overwritten() -> None:
    _snapshots(through_the_device=False)


def filled_by_a_thread() -> None:
    """A thread fills a pinned buffer; the main host reads it without joining the thread first, and must see it
    filled."""
    buf = torch.zeros(N, pin_memory=True)
    t = threading.Thread(target=lambda: buf.fill_(1.0), name="filler")
    t.start()
    total = float(buf.sum())
    t.join()
    assert total == float(N), total


def test_a_snapshot_overwritten_before_the_saver_read_it_gets_a_checked_handshake() -> None:
    found = simdevice.explore(snapshot_overwritten, max_examples=40).failure
    assert found is not None
    assert "race" in {r.kind for r in found.run.reports}, found.text()
    fix = suggest(as_target(snapshot_overwritten), found, schedules=20)
    assert fix.checked, fix.lines()
    assert any("have the host wait for a handshake from the host of `saver` after `sum`" in a
               for a in fix.advice), fix.advice


def test_a_buffer_a_thread_fills_gets_a_checked_handshake() -> None:
    found = simdevice.explore(filled_by_a_thread, max_examples=40).failure
    assert found is not None
    fix = suggest(as_target(filled_by_a_thread), found, schedules=20)
    assert fix.checked, fix.lines()
    assert any("handshake from the host's thread `filler` after `fill_`" in a for a in fix.advice), fix.advice


def snapshot_copied_over() -> None:
    """The snapshot written by a blocking D2H: the copy, on the default stream, is what must wait for the saver."""
    _snapshots(through_the_device=True)


def copied_before_a_thread_filled_it() -> None:
    """A thread fills a pinned buffer; the main host copies it to the device before joining the thread."""
    buf = torch.zeros(N, pin_memory=True)
    t = threading.Thread(target=lambda: buf.fill_(1.0), name="filler")
    t.start()
    dev = buf.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    t.join()
    assert bool((dev == 1).all()), "the copy read the buffer before the thread filled it"


def test_a_copy_issued_before_another_host_s_access_waits_for_its_handshake() -> None:
    """The later side is a stream's copy: the host that issues it waits for the handshake (the edge holds the copy
    until that host's access is made; a stream held so moves on as soon as it is, though no stream completes
    then)."""
    for program, after in ((snapshot_copied_over, "from the host of `saver` after `sum`"),
                           (copied_before_a_thread_filled_it, "from the host's thread `filler` after `fill_`")):
        found = simdevice.explore(program, max_examples=40).failure
        assert found is not None
        fix = suggest(as_target(program), found, schedules=20)
        assert fix.checked, fix.lines()
        assert any("have the host that issues `" in a and after in a for a in fix.advice), fix.advice


def test_the_picture_flags_both_hosts_steps_and_draws_the_handshake() -> None:
    """The timeline finds the step each host's access was made in (an access checked within a step that began
    earlier, before its queue's get waited: it found none, and flagged one side of the race alone) and draws the
    handshake's edge from the host step it waits for (it looked among stream operations only)."""
    from simdevice import timeline

    found = simdevice.explore(snapshot_overwritten, max_examples=40).failure
    assert found is not None
    ss = timeline.slices(found)
    races = [r for r in found.run.reports if r.kind == "race"]
    assert races
    for race in races:  # (the next step's copy_ and the last step's sum, either one first)
        sides = [timeline._accessor(ss, found, x) for x in (race.previous, race.current)]
        assert all(s is not None and s.kind == "host" for s in sides), sides
        assert {s.actor for s in sides if s is not None} == {"host", "saver"}
    fix = suggest(as_target(snapshot_overwritten), found, schedules=5)
    (edge,) = fix.edges
    assert timeline._edge_ends(ss, edge), edge
