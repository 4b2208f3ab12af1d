"""Device-agnostic code asks ``torch.accelerator`` for the device and makes its streams and events with the generic
``torch.Stream`` and ``torch.Event`` (PyTorch's recommended spelling; torch's own ``DataLoader(pin_memory=True)``
pins its batches only where ``torch.accelerator.is_available()``). In a session the simulated CUDA device is the
accelerator: each call is ``torch.cuda``'s simulated one, and a generic stream or event is a ``torch.cuda`` one.
Before, the CPU build's answers stood: no accelerator (an assertion of the program failed, "found"), a generic
stream refused (no verdict), and a ``DataLoader``'s batches left pageable where a GPU pins them."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import strategies as st
from torch.utils.data import DataLoader, TensorDataset

import simdevice
from simdevice.search.explore import explore

N = 1 << 12


def test_the_accelerator_is_the_simulated_cuda_device() -> None:
    with simdevice.cuda() as sim:
        assert torch.accelerator.is_available()
        assert torch.accelerator.current_accelerator() == torch.device("cuda")
        assert torch.accelerator.device_count() == torch.cuda.device_count() == 1
        assert torch.accelerator.current_device_index() == 0
        with torch.accelerator.device_index(0):
            x = torch.ones(N, device=torch.accelerator.current_accelerator())
        assert x.is_cuda
        assert torch.accelerator.current_stream() == torch.cuda.current_stream()
        assert torch.accelerator.memory_allocated() == torch.cuda.memory_allocated() > 0
        assert torch.accelerator.memory.memory_reserved() == torch.cuda.memory_reserved()
        with pytest.raises(RuntimeError, match="invalid device ordinal"):
            torch.accelerator.set_device_index(1)
        assert torch.get_device_module() is torch.get_device_module("cuda") is torch.cuda  # (was torch.cpu)
    sim.assert_clean()
    assert torch.get_device_module() is torch.cpu  # (the CPU build's answer again)


def test_generic_streams_and_events_are_the_simulated_device_s() -> None:
    with simdevice.cuda() as sim:
        s = torch.Stream()
        e = torch.Event(enable_timing=True)
        assert isinstance(s, torch.cuda.Stream)
        assert isinstance(s, torch.Stream)
        assert isinstance(torch.cuda.Stream(), torch.Stream)
        assert isinstance(e, torch.cuda.Event)
        assert isinstance(e, torch.Event)
        assert issubclass(torch.cuda.Stream, torch.Stream)
        assert torch.Stream("cuda", priority=-1).priority == -1
        cpu = torch.Stream("cpu")
        assert type(cpu) is torch._C.Stream
        assert s.device == torch.device("cuda", 0)
    sim.assert_clean()
    assert torch.Stream is torch._C.Stream  # (torch's own again)


def _generic_set_stream(wait: int = 1) -> None:
    """A D2H on a generic stream made current with ``torch.accelerator.set_stream``; the host waits with
    ``torch.accelerator.synchronize()`` (``wait``), then reads the copy."""
    side = torch.Stream()
    x = torch.arange(N, dtype=torch.float32, device="cuda")
    host = torch.empty(N, pin_memory=True)
    side.wait_stream(torch.accelerator.current_stream())
    prev = torch.accelerator.current_stream()
    torch.accelerator.set_stream(side)
    host.copy_(x, non_blocking=True)
    torch.accelerator.set_stream(prev)
    if wait:
        torch.accelerator.synchronize()
    assert torch.equal(host, torch.arange(N, dtype=torch.float32)), "the host read the copy before it landed"


@pytest.mark.parametrize("program", ["tests/hazards.py::accelerator_reload", _generic_set_stream])
def test_device_agnostic_code_races_without_its_wait_and_is_clean_with_it(program: Any) -> None:
    """A D2H on a generic stream (``tests/hazards.py``'s: entered with ``with side:``, a generic event recorded there
    and synchronized on), or after ``torch.accelerator.set_stream`` and waited for by
    ``torch.accelerator.synchronize()``."""
    found = explore(program, max_examples=20, default_config={"wait": 0}, config=st.just({"wait": 0}))
    assert found.failure is not None
    assert "race" in {r.kind for r in found.failure.run.reports}, found.failure.text()
    assert "stream side" in found.failure.text()  # (named by its variable, as a torch.cuda.Stream is)
    assert explore(program, max_examples=20).failure is None


def _loader_batches_pinned(workers: int) -> list[bool]:
    xs = torch.arange(64.0).reshape(16, 4)
    loader = DataLoader(TensorDataset(xs), batch_size=4, pin_memory=True, num_workers=workers)
    pinned = []
    for (batch,) in loader:
        pinned.append(batch.is_pinned())
        batch.to("cuda", non_blocking=True)
    return pinned


@pytest.mark.parametrize("workers", [0, 2])
def test_a_data_loader_pins_its_batches_as_on_a_gpu(workers: int) -> None:
    """With worker processes torch pins on a thread of its own, which the simulator does not run: the iterating
    thread pins each batch as it takes it (before, with no accelerator, no batch was pinned; then, with one, the
    thread's pinning was refused)."""
    run = simdevice.cuda()
    pinned: list[bool] = []
    run.run(lambda: pinned.extend(_loader_batches_pinned(workers)))
    run.assert_clean()
    assert pinned == [True] * 4
    assert not [n for n in run.result.notes if "fork" in n], run.result.notes  # (its workers never use CUDA)


@pytest.mark.parametrize(("program", "stall"), [("accelerator_reload", "side#0+20"),
                                                ("loader_batch_reused", "default#0+20")])
def test_the_hazards_tests_gpu_runs_race_unwaited_and_not_waited(program: str, stall: str) -> None:
    """``tests/hazards.py``'s device-agnostic reload and a loader's pinned batch reused by the host (what tests/gpu
    runs on a GPU: 20/20 corrupted unwaited, 0/20 waited, counts equal): the simulator says the same. Before, the
    batch was pageable here, its copy staged at the call: the host's reuse raced with nothing (a missed race)."""
    from reference.schedule import Schedule
    from simdevice.search.targets import resolve

    line = f"tests/hazards.py::{program}"
    target = resolve(line)
    assert not target.run(Schedule.parse(f"{line}::{stall}")).corrupted
    out = target.run(Schedule.parse(f"{line}:wait=0:{stall}"))
    assert out.corrupted, out.text()
    assert "race" in {r.kind for r in out.run.reports}, out.text()
