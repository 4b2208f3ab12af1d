"""A plain program's ``import torch_memory_saver`` gets the session's simulated memory saver, with the library's
interface; the module is there only while a session is open (an import of it in a run was a host error,
ModuleNotFoundError, reported as a bug of the program)."""

from __future__ import annotations

import sys

import pytest
import torch

import simdevice
from simdevice.dropin.memsaver import STAND_IN


def sync_then_pause(synchronize: bool = True) -> None:
    from torch_memory_saver import torch_memory_saver as tms

    with tms.region("train", enable_cpu_backup=True):
        w = torch.zeros(4096, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        w.add_(1)
    if synchronize:
        torch.cuda.synchronize()
    reserved = torch.cuda.memory_reserved()
    tms.pause("train")
    tms.resume("train")
    assert torch.cuda.memory_reserved() == reserved
    torch.cuda.current_stream().wait_stream(side)
    assert w.sum().item() == 4096


def unsynchronized() -> None:
    sync_then_pause(False)


def handshake_while_paused(guarded: bool = False) -> None:
    import torch_memory_saver

    tms = torch_memory_saver.torch_memory_saver
    with tms.region("train", enable_cpu_backup=True):
        w = torch.ones(4096, device="cuda")
        tmp = w * 2.0  # a step's temporary: its block stays cached in the region's segment
        del tmp
        torch.cuda.synchronize()
        tms.pause("train")
        with tms.disable() if guarded else torch_memory_saver.configure_subprocess():
            h = torch.ones(512, device="cuda")
            assert h.sum().item() == 512
            del h
        tms.resume("train")
    assert w.sum().item() == 4096


def test_the_module_is_the_simulated_one_only_in_a_session() -> None:
    assert "torch_memory_saver" not in sys.modules or sys.modules["torch_memory_saver"].__file__
    with simdevice.cuda() as sim:
        import torch_memory_saver

        assert torch_memory_saver.torch_memory_saver.enabled
        torch_memory_saver.torch_memory_saver.hook_mode = "preload"
    sim.assert_clean()
    assert "torch_memory_saver" not in sys.modules or sys.modules["torch_memory_saver"].__file__


def test_a_synchronized_pause_is_clean_and_an_unsynchronized_one_is_found() -> None:
    assert simdevice.explore(sync_then_pause, max_examples=30).failure is None
    found = simdevice.explore(unsynchronized, max_examples=100)
    assert found.failure is not None


def test_an_allocation_in_the_paused_region_is_an_illegal_access_and_disable_guards_it() -> None:
    run = simdevice.cuda().run(handshake_while_paused)
    assert {r.kind for r in run.reports} == {"illegal-access"}
    assert "handed out again from the caching allocator's free list while paused" in str(run.reports[0])
    assert not simdevice.cuda().run(handshake_while_paused, guarded=True).reports


def test_what_it_does_not_model_gives_no_verdict() -> None:
    def graph() -> None:
        from torch_memory_saver import torch_memory_saver as tms

        with tms.cuda_graph(None):
            pass

    run = simdevice.cuda().run(graph)
    assert [r.kind for r in run.reports] == ["host-error"]
    assert "NotImplementedError: torch_memory_saver's cuda_graph() is not simulated" in str(run.reports[0])
    with pytest.raises(RuntimeError, match=r"only inside a simdevice\.cuda"):
        STAND_IN.torch_memory_saver.pause()
