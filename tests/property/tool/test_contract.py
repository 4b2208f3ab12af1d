"""Both backends offer the same contract, so a mechanism written once runs on either (no GPU needed)."""

import inspect

import pytest
import torch

from reference import contract, cuda
from simdevice import api as sim
from simdevice.runtime.memsaver import SimMemorySaver


def public(obj: object) -> set[str]:
    return {n for n in dir(obj) if not n.startswith("_")}


def test_both_devices_provide_the_whole_protocol() -> None:
    wanted = public(contract.Device) - public(object)
    assert wanted <= public(cuda.CudaDevice)
    assert wanted <= public(sim.SimDevice(None))
    assert public(sim.SimDevice(None)) - public(cuda.CudaDevice) <= {
        "trace", "now_units", "config", "schedule", "runtime", "stream_of", "record_of", "event_of", "outcome",
        "shown", "shown_now", "show_at", "here", "from_host",
    }


@pytest.mark.parametrize(
    ("protocol", "on_cuda", "on_sim"),
    [
        (contract.Stream, cuda.CudaStream, sim.StreamHandle),
        (contract.Event, cuda.CudaEvent, sim.EventHandle),
        (contract.SharedValue, cuda.CudaValue, sim.SharedValueHandle),
        (contract.SharedQueue, cuda.CudaQueue, sim.SharedQueueHandle),
        (contract.Process, cuda.CudaProcess, sim.ProcessHandle),
        (contract.Work, cuda.CudaWork, sim.SimWork),
    ],
)
def test_handles_have_the_contract_s_methods_and_parameters(protocol: type, on_cuda: type, on_sim: type) -> None:
    wanted = public(protocol) - public(object)
    assert wanted <= public(on_cuda)
    assert wanted <= public(on_sim)
    for name in wanted:
        a, b, c = getattr(protocol, name), getattr(on_cuda, name), getattr(on_sim, name)
        if callable(a):
            params = list(inspect.signature(a).parameters)
            assert list(inspect.signature(b).parameters) == params, name
            assert list(inspect.signature(c).parameters) == params, name


def test_both_backends_streams_are_torch_streams() -> None:
    # so that torch's own record_stream, set_stream and torch.cuda.stream take them
    assert issubclass(sim.StreamHandle, torch.Stream)
    assert issubclass(cuda.CudaStream, torch.cuda.Stream)


@pytest.mark.parametrize("name", sorted(public(contract.Device) - public(object)))
def test_device_methods_take_the_contract_s_parameters(name: str) -> None:
    a, b, c = getattr(contract.Device, name), getattr(cuda.CudaDevice, name), getattr(sim.SimDevice, name)
    if callable(a) and not isinstance(a, property):
        params = list(inspect.signature(a).parameters)
        assert list(inspect.signature(b).parameters) == params
        assert list(inspect.signature(c).parameters) == params


@pytest.mark.parametrize("implementation", [cuda.ProcessWideMemorySaver, sim.MemorySaverHandle, SimMemorySaver])
def test_every_memory_saver_has_the_contract_s_methods(implementation: type) -> None:
    for name in ("region", "disable", "pause", "resume"):
        a, b = getattr(contract.MemorySaver, name), getattr(implementation, name)
        assert list(inspect.signature(a).parameters) == list(inspect.signature(b).parameters), name


def test_the_process_wide_memory_saver_pauses_the_whole_process(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, object]] = []

    class Library:  # records what torch_memory_saver would be asked
        def pause(self, tag: object) -> None:
            calls.append(("pause", tag))

        def resume(self, tag: object) -> None:
            calls.append(("resume", tag))

        def disable(self) -> str:
            calls.append(("disable", None))
            return "the library's disable()"

    monkeypatch.setenv("TMS_INIT_ENABLE_CPU_BACKUP", "1")
    saver = cuda.ProcessWideMemorySaver(Library())
    with saver.region("train", enable_cpu_backup=True):
        saver.pause("train")
        assert saver.disable() == "the library's disable()"
        saver.resume("train")
    assert calls == [("pause", None), ("disable", None), ("resume", None)]
    with pytest.raises(ValueError, match="TMS_INIT_ENABLE_CPU_BACKUP=1"), saver.region("train"):
        pass
