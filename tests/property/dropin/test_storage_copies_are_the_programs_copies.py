"""A storage's ``copy_`` where either storage is the simulated device's is the program's copy, as torch makes it.

Offload and recompute code moves bytes by storage: ``p.untyped_storage().copy_(pinned.untyped_storage(),
non_blocking=True)`` to bring a released parameter back, ``pinned.untyped_storage().copy_(p.untyped_storage())`` to
offload it, ``out.untyped_storage().copy_(recomputed.untyped_storage())`` to restore a released output. The simulated
storage refused ``copy_`` (not simulated: no verdict), and a host storage's ``copy_`` given it raised ``TypeError``
in the program, a host error reported as the program's failure. Both are now one ``copy_`` between byte tensors over
the two storages, as torch's ``storage_copy`` makes it (``simdevice.dispatch.storage_copy``): an H2D, a D2H or a
device copy, blocking unless asked not to. Older code does the same through ``t.storage()`` (torch's deprecated
``TypedStorage``: ``t.storage().resize_(0)``, ``resize_(n)`` and ``copy_``, as ColossalAI's ``free_storage`` and
``alloc_storage``), which the simulator refused (no verdict): it is the tensor's storage counted in elements
(``simdevice.dispatch.SimTypedStorage``). Mutations caught: either path taken back out (the programs below fail
with the simulator's refusal or the C method's ``TypeError``); the typed storage refused again.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from hazard_checks import races_only_unwaited

import simdevice
from simdevice import HostError, Race


def test_a_parameter_brought_back_by_its_storage_races_only_unwaited() -> None:
    """``tests/hazards.py::storage_onload`` (run on a GPU in ``tests/gpu/test_dropin_gpu.py``)."""
    races_only_unwaited("storage_onload", "side#0+20")


def _result(program: Callable[[], None]) -> simdevice.Run:
    run = simdevice.cuda()
    run.run(program)
    return run.result


def _offloaded_by_storage(sync: bool) -> simdevice.Run:
    def program() -> None:
        src = torch.arange(4096, dtype=torch.float32, device="cuda")
        host = torch.empty(4096, pin_memory=True)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            host.untyped_storage().copy_(src.untyped_storage(), non_blocking=True)
        if sync:
            side.synchronize()
        assert torch.equal(host, torch.arange(4096, dtype=torch.float32))

    return _result(program)


def test_an_offload_by_storage_is_a_d2h_the_host_must_wait_for() -> None:
    assert not _offloaded_by_storage(True).reports
    reports = _offloaded_by_storage(False).reports
    races = [r for r in reports if isinstance(r, Race)]
    assert len(races) == 1, reports
    assert races[0].previous.op == "copy_ (D2H)", reports
    assert any(isinstance(r, HostError) for r in reports), reports


def test_a_blocking_copy_by_storage_waits_and_a_device_copy_gives_the_values() -> None:
    """Megatron's recompute restores a released output by storage; a blocking D2H by storage is the host's wait."""

    def program() -> None:
        x = torch.arange(1024, dtype=torch.float32, device="cuda")
        out = x * 3
        size = out.untyped_storage().size()
        out.untyped_storage().resize_(0)
        recomputed = x * 3
        out.untyped_storage().resize_(size)
        out.untyped_storage().copy_(recomputed.untyped_storage())
        host = torch.empty(1024, pin_memory=True)
        host.untyped_storage().copy_(out.untyped_storage())
        assert torch.equal(host, torch.arange(1024, dtype=torch.float32) * 3)

    run = simdevice.cuda()
    run.run(program)
    run.assert_clean()


def test_storages_of_other_sizes_are_refused_as_torch_refuses_them() -> None:
    def program() -> None:
        a = torch.zeros(4, device="cuda")
        with pytest.raises(RuntimeError, match="size does not match, self was 16 bytes but src was 32 bytes"):
            a.untyped_storage().copy_(torch.zeros(8, device="cuda").untyped_storage())
        with pytest.raises(RuntimeError, match="size does not match"):
            torch.zeros(2).untyped_storage().copy_(a.untyped_storage())

    run = simdevice.cuda()
    run.run(program)
    run.assert_clean()


def test_contract_code_copies_by_storage_too() -> None:
    seen: list[torch.Tensor] = []

    def program(dev: simdevice.SimDevice) -> None:
        a = torch.arange(8, dtype=torch.float32, device=dev.device)
        b = torch.zeros(8, device=dev.device)
        b.untyped_storage().copy_(a.untyped_storage())
        seen.append(b.cpu())

    dev = simdevice.SimDevice()
    run = dev.run(program)
    assert not run.reports, run.reports
    assert torch.equal(seen[0], torch.arange(8, dtype=torch.float32))


def _typed_free_and_back(wait: bool) -> simdevice.Run:
    """Freed and brought back through ``t.storage()``, in elements, the bytes from a pinned buffer's typed storage
    on ``side``; the current stream waits for ``side`` (``wait``) or not before it reads them."""

    def program() -> None:
        x = torch.arange(1024, dtype=torch.float32, device="cuda")
        host = torch.empty(1024, pin_memory=True)
        host.storage().copy_(x.storage())  # (a blocking D2H, by storage)
        assert x.storage().size() == 1024
        x.storage().resize_(0)
        assert (x.storage().size(), x.storage().nbytes()) == (0, 0)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            x.storage().resize_(1024)
            x.storage().copy_(host.storage(), non_blocking=True)
        if wait:
            torch.cuda.current_stream().wait_stream(side)
        assert torch.equal((x + 0).cpu(), torch.arange(1024, dtype=torch.float32))

    return _result(program)


def test_a_typed_storage_frees_and_brings_back_as_the_untyped_one() -> None:
    assert not _typed_free_and_back(True).reports
    reports = _typed_free_and_back(False).reports
    races = [r for r in reports if isinstance(r, Race)]
    assert races, reports
    assert races[0].previous.op == "copy_ (H2D)", reports
    assert any(isinstance(r, HostError) for r in reports), reports


def test_a_typed_storage_answers_as_a_cuda_one() -> None:
    got: list[object] = []

    def program() -> None:
        x = torch.arange(8, dtype=torch.float64, device="cuda")
        st = x.storage()
        got.extend([len(st), st.size(), st.nbytes(), st.element_size(), st.dtype, st.device.type, st.is_cuda,
                    st.data_ptr() == x.data_ptr(), st.untyped() == x.untyped_storage(), st.is_pinned()])

    run = simdevice.cuda()
    run.run(program)
    run.assert_clean()
    assert got == [8, 8, 64, 8, torch.float64, "cuda", True, True, True, False]
