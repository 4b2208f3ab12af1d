"""``torch.save`` (and ``pickle``, which runs torch's legacy save for a tensor) of pinned memory reads its bytes on
the host, in C++, below the dispatcher: the zip writer's ``write_record`` and ``storage._write_file`` write the whole
storage. An asynchronous checkpoint that saves its pinned snapshot before the non-blocking D2H into it is done
writes stale bytes on a GPU; the read is checked as the host's (``facade._host_reads_storage``), and the fix named
is the synchronization before the save. Before, no op read the snapshot: a save that was not read back ran clean
(a missed race), and one read back was wrong values with no race to name and no fix."""

from __future__ import annotations

import io
import pickle

import torch

import simdevice
from simdevice.explain import suggest
from simdevice.search.explore import as_target

N = 1024


def checkpoint(sync: bool = False, how: str = "save") -> None:
    """The weights snapshotted D2H into pinned memory on a side stream, overlapped with the next step, then written
    out; the file is not read back. ``how``: ``save`` (``torch.save`` of a state dict) or ``pickle``."""
    side = torch.cuda.Stream()
    w = torch.arange(N, dtype=torch.float32, device="cuda") * 1.0
    snapshot = torch.empty(N, pin_memory=True)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        snapshot.copy_(w, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record()
    w.record_stream(side)
    if sync:
        copied.synchronize()  # wait: the save reads the snapshot the D2H fills
    if how == "save":
        torch.save({"model": {"w": snapshot}, "step": 1}, io.BytesIO())
    else:
        pickle.dumps(snapshot)
    copied.synchronize()


def checkpoint_synced() -> None:
    checkpoint(sync=True)


def test_a_save_before_the_snapshot_s_copy_is_done_races_with_it() -> None:
    run = simdevice.cuda().run(checkpoint)
    races = [r for r in run.reports if isinstance(r, simdevice.Race)]
    assert len(races) == 1, run.reports
    text = str(races[0])
    assert text.startswith("race: torch.save on host host ("), text
    assert "which copy_ (D2H) on stream side #0" in text
    synced = simdevice.cuda()
    synced.run(checkpoint, True)
    synced.assert_clean()


def test_pickling_the_snapshot_reads_it_too() -> None:
    run = simdevice.cuda().run(checkpoint, False, "pickle")
    assert [r.kind for r in run.reports if r.kind == "race"] == ["race"], run.reports
    synced = simdevice.cuda()
    synced.run(checkpoint, True, "pickle")
    synced.assert_clean()


def test_the_fix_is_the_synchronization_before_the_save() -> None:
    found = simdevice.explore(checkpoint, max_examples=20).failure
    assert found is not None
    fix = suggest(as_target(checkpoint), found, schedules=20)
    assert fix.checked, fix.lines()
    assert "synchronize on an event recorded on `side` after `copy_ (D2H)`" in fix.advice[0], fix.advice
    assert "before `torch.save` on the host" in fix.advice[0], fix.advice
    assert simdevice.explore(checkpoint_synced, max_examples=20).failure is None


def test_a_saved_slice_writes_its_whole_storage() -> None:
    """torch writes the storage of a view whole: saving one slice of a pinned arena reads the slice the D2H still
    fills too."""

    def arena(sync: bool) -> None:
        side = torch.cuda.Stream()
        src = torch.ones(N, device="cuda")
        buf = torch.zeros(2 * N, pin_memory=True)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            buf[N:].copy_(src, non_blocking=True)
            copied = side.record_event()
        src.record_stream(side)
        if sync:
            copied.synchronize()
        torch.save(buf[:N], io.BytesIO())
        copied.synchronize()

    run = simdevice.cuda().run(arena, False)
    races = [r for r in run.reports if isinstance(r, simdevice.Race)]
    assert len(races) == 1, run.reports
    assert "torch.save on host host" in str(races[0]), races
    assert f"reads pinned#2[0:{8 * N}]" in str(races[0]), races
    synced = simdevice.cuda()
    synced.run(arena, True)
    synced.assert_clean()


def test_the_gpu_confirmation_s_program_gets_the_same_verdicts() -> None:
    """``tests/hazards.py::pinned_snapshot_saved`` (what tests/gpu runs stalled): a race without the sync, whatever
    the stall; clean with it."""
    from reference.schedule import Schedule
    from simdevice.search.targets import resolve

    line = "tests/hazards.py::pinned_snapshot_saved"
    for suffix, clean in (("", False), ("::default#1+20", False), (":wait=1:default#1+20", True)):
        s = Schedule.parse(line + suffix)
        out = resolve(s.program).run(s)
        assert out.clean is clean, (suffix, out.verdict())
        assert clean or out.races, out.verdict()
