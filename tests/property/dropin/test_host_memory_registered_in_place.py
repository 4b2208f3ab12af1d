"""``torch.cuda.cudart().cudaHostRegister`` pins host memory the program already has, in place (as an offload
library pins the host pool it allocated): from then on its bytes are pinned memory, whose non-blocking copies with
the device are asynchronous and whose accesses are checked, until ``cudaHostUnregister``. Before, ``cudart()`` was
refused (no verdict) for every call. ``tests/hazards.py::registered_reload`` runs on a GPU in
``tests/gpu/test_dropin_gpu.py``."""

from __future__ import annotations

import torch
from hazard_checks import races_only_unwaited

import simdevice


def test_a_registered_buffer_s_copy_races_only_unwaited() -> None:
    races_only_unwaited("registered_reload", "side#0+20")


def test_registration_answers_cuda_s_codes_and_pins_until_unregistered() -> None:
    got: list[object] = []

    def program() -> None:
        cudart = torch.cuda.cudart()
        host = torch.zeros(256)
        view = host[64:]
        got.append(host.is_pinned())
        got.append(cudart.cudaHostRegister(host.data_ptr(), 1024, 0))
        got.append((host.is_pinned(), torch.zeros(256).is_pinned()))
        got.append(cudart.cudaHostRegister(host.data_ptr(), 1024, 0))
        got.append(cudart.cudaHostUnregister(host.data_ptr()))
        got.append((host.is_pinned(), view.is_pinned()))
        got.append(cudart.cudaHostUnregister(host.data_ptr()))
        got.append(cudart.cudaProfilerStart())

    s = simdevice.cuda()
    s.run(program)
    s.assert_clean()
    # (CUDA's codes: success, already registered, not registered)
    assert got == [False, 0, (True, False), 712, 0, (False, False), 713, 0]


def test_a_registered_buffer_reused_while_its_copy_is_in_flight_races() -> None:
    """The host refills the registered buffer while its H2D may still read it: a race, as with ``pin_memory()``'s."""

    def program() -> None:
        cudart = torch.cuda.cudart()
        host = torch.arange(1024, dtype=torch.float32)
        cudart.cudaHostRegister(host.data_ptr(), 4096, 0)
        d = host.to("cuda", non_blocking=True)
        host.fill_(-1.0)
        assert torch.equal(d.cpu(), torch.arange(1024, dtype=torch.float32)), "the H2D read the refilled buffer"
        cudart.cudaHostUnregister(host.data_ptr())

    found = simdevice.explore(program, max_examples=20)
    assert found.failure is not None
    assert "race" in {r.kind for r in found.failure.run.reports}, found.text()


def _registers_and_keeps(n: int = 0) -> None:
    host = torch.zeros(1024)
    cudart = torch.cuda.cudart()
    assert cudart.cudaHostRegister(host.data_ptr(), 4096, 0) == cudart.cudaError.success
    host.copy_(torch.arange(1024, dtype=torch.float32, device="cuda"), non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(host, torch.arange(1024, dtype=torch.float32))


def test_a_run_s_registrations_end_with_it() -> None:
    """A program that registers a buffer it never unregisters (a pool made at start-up), run again and again by a
    search: each run registers anew, as each process would (a registration kept across runs answered "already
    registered" where a later run's buffer took the freed one's address)."""
    from hypothesis import strategies as st

    found = simdevice.explore(_registers_and_keeps, config=st.fixed_dictionaries({"n": st.integers(0, 9)}),
                              max_examples=30)
    assert found.failure is None, found.text()
