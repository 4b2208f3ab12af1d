"""``torch.distributed.checkpoint``'s staging of a state dict on the host (``StateDictStager``, what ``async_save``
runs before its executor writes the copy): each device tensor's storage is copied into a new host storage made by
the storage's own class (``type(storage)(n, device="cpu")``, ``_new_shared``), pinned by ``cudaHostRegister`` where
asked, and the tensor's instance attributes are copied onto the host copy. A simulated storage's class made no
such storage (``TypeError: SimStorage.__init__() got an unexpected keyword argument 'device'``) and a simulated
tensor's attributes are the simulator's own, which do not copy (``cannot serialize 'greenlet.greenlet' object``):
a correct program's staging failed (a host error). Now the host copy is torch's own storage, pinned or shared as
asked, with the program's attributes alone; staged without blocking into pinned memory, it is read before the D2H
lands unless the stream is synchronized, as on a GPU."""

from __future__ import annotations

import gc
import sys

import pytest
import torch
import torch.distributed.checkpoint  # (imported before the session, as a program imports it: patched there)
from torch.distributed.checkpoint._state_dict_stager import StateDictStager

import simdevice

N = 1 << 12


def staged(pin: bool, share: bool, non_blocking: bool, wait: bool) -> list[object]:
    w = torch.arange(N, dtype=torch.float32, device="cuda")
    w.tag = "kept"  # (an attribute of the program's: copied)
    copy = StateDictStager(pin_memory=pin, share_memory=share).stage({"w": w, "step": 3}, non_blocking=non_blocking)
    if wait:
        torch.cuda.current_stream().synchronize()
    c = copy["w"]
    assert torch.equal(c, torch.arange(N, dtype=torch.float32)), "read the staged copy before the D2H landed"
    return [type(c.untyped_storage()).__name__, c.device.type, c.is_pinned(), c.is_shared(),
            sorted(vars(c)), copy["step"]]


@pytest.mark.parametrize(("pin", "share"), [(False, False), (True, False), (False, True)])
def test_a_state_dict_staged_is_torch_s_host_copy(pin: bool, share: bool) -> None:
    s = simdevice.cuda()
    s.run(staged, pin, share, False, False)
    s.assert_clean()
    assert s.result.result == ["UntypedStorage", "cpu", pin, share, ["tag"], 3]


def test_a_copy_staged_without_blocking_is_read_after_the_wait_alone() -> None:
    s = simdevice.cuda()
    s.run(staged, True, False, True, True)
    s.assert_clean()
    s = simdevice.cuda()
    s.run(staged, True, False, True, False)
    assert any(r.kind in ("race", "stale-read") for r in s.result.reports), s.text()


def test_a_simulated_storage_s_class_makes_storages_as_torch_s() -> None:
    def program() -> list[object]:
        storage = torch.ones(4, device="cuda").untyped_storage()
        host = type(storage)(8, device="cpu")
        shared = type(storage)._new_shared(8, device="cpu")
        on_device = type(storage)(16, device="cuda")
        return [type(host).__name__, host.nbytes(), shared.is_shared(), on_device.device.type, on_device.nbytes()]

    s = simdevice.cuda()
    s.run(program)
    s.assert_clean()
    assert s.result.result == ["UntypedStorage", 8, True, "cuda", 16]


_KEPT: list[object] = []


def test_a_pinned_copy_that_dies_after_its_run_unpins_nothing() -> None:
    """The stager's finalizer of a storage it pinned (``unpin_memory``) runs when the storage dies: after the run that
    pinned it, nothing (the run's registrations ended with it); before, it called the CPU build's CUDA runtime
    and raised at whatever Python then ran (a ``compile`` in the next test's import: ``SystemError: AST constructor
    recursion depth mismatch``)."""

    def program() -> None:
        w = torch.ones(N, device="cuda")
        _KEPT.append(StateDictStager(pin_memory=True).stage({"w": w}))
        torch.cuda.synchronize()

    seen: list[object] = []
    hook = sys.unraisablehook
    sys.unraisablehook = seen.append
    try:
        s = simdevice.cuda()
        s.run(program)
        s.assert_clean()
        _KEPT.clear()
        gc.collect()
    finally:
        sys.unraisablehook = hook
    assert not seen, [getattr(u, "exc_value", u) for u in seen]
