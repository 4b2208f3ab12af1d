"""``torch.profiler`` with its CUDA activity, as a training loop profiles a step: in a run CUDA is among the
profiler's supported activities, as on a GPU machine, so the profiler records its CPU activity and no device
activity, noted, and leaving its block synchronizes the device, as torch's profiler does when it profiles CUDA.

Before, the CPU build's profiler fell back to timing each op with CUDA events, which failed with a warning and a
C++ stack trace per op on stderr and made a run tens of times slower; ``torch.profiler.supported_activities()``
answered the CPU alone. ``tests/hazards.py::profiled_reload`` runs on a GPU in ``tests/gpu/test_dropin_gpu.py``."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hazard_checks import races_only_unwaited
from hazards import profiled_reload

import simdevice
from simdevice.dropin.facade import PROFILER_NOTE


def test_a_read_inside_the_profiler_races_only_unwaited() -> None:
    races_only_unwaited("profiled_reload", "side#0+20")


@pytest.mark.parametrize("wait", [0, 1])
def test_leaving_the_profiler_synchronizes_the_device(wait: int) -> None:
    """Read once the block is left, the copy has landed whether or not the program waited for ``side``."""
    s = simdevice.cuda()
    s.run(profiled_reload, wait, 1 << 12, 0)
    s.assert_clean()


def test_the_profiler_times_no_op_with_cuda_events_and_notes_it(capfd: pytest.CaptureFixture[str]) -> None:
    s = simdevice.cuda()
    run = s.run(profiled_reload)
    s.assert_clean()
    err = capfd.readouterr().err
    assert "Failed to record CUDA event" not in err, err[:2000]
    assert PROFILER_NOTE in run.notes
    assert torch.profiler.supported_activities() == {torch.profiler.ProfilerActivity.CPU}


def _offload(make: Any, wait: bool) -> None:
    """``arange`` copied D2H into pinned memory on a side stream inside the block of the profiler ``make`` makes;
    the host reads it there, after ``side.synchronize()`` (``wait``) or at once."""
    y = torch.arange(1 << 12, dtype=torch.float32, device="cuda")
    pinned = torch.empty(1 << 12, pin_memory=True)
    side = torch.cuda.Stream()
    with make():
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            pinned.copy_(y, non_blocking=True)
        if wait:
            side.synchronize()
        assert torch.equal(pinned, torch.arange(1 << 12, dtype=torch.float32)), "the host read the copy early"


@pytest.mark.parametrize("make", [lambda: torch.autograd.profiler.profile(use_device="cuda"),
                                  lambda: torch.autograd.profiler.emit_nvtx()],
                         ids=["legacy profile", "emit_nvtx"])
def test_the_autograd_profilers_run_and_races_inside_them_are_found(make: Any,
                                                                   capfd: pytest.CaptureFixture[str]) -> None:
    """``torch.autograd.profiler.profile(use_device="cuda")`` (no kineto: the CPU build's fallback timed each op with
    CUDA events, each failing with a warning and a stack trace) and ``emit_nvtx()`` (the CPU build refused it: "PyTorch
    was compiled without CUDA", a correct program's host error) run; each synchronizes the device as it is left."""
    for wait in (True, False):
        s = simdevice.cuda()
        run = s.run(_offload, make, wait)
        kinds = {r.kind for r in run.reports}
        assert kinds == (set() if wait else {"race", "stale-read", "host-error"}), run.reports
        assert [n for n in run.notes if "profiler" in n], run.notes
    assert "Failed to record CUDA event" not in capfd.readouterr().err


def test_emit_nvtx_synchronizes_the_device_as_it_is_entered() -> None:
    """A copy issued before the block, read inside it unwaited: its entry waited for the device."""

    def program() -> None:
        y = torch.arange(1 << 12, dtype=torch.float32, device="cuda")
        pinned = torch.empty(1 << 12, pin_memory=True)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            pinned.copy_(y, non_blocking=True)
        with torch.autograd.profiler.emit_nvtx():
            assert torch.equal(pinned, torch.arange(1 << 12, dtype=torch.float32))

    s = simdevice.cuda()
    s.run(program)
    s.assert_clean()
