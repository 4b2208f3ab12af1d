"""Both backends offer the same contract, so a mechanism written once runs on either (no GPU needed)."""

import inspect

import pytest

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
        "trace", "now_units", "config", "schedule", "runtime", "stream_of", "record_of"
    }


@pytest.mark.parametrize(
    ("on_cuda", "on_sim"),
    [
        (cuda.CudaStream, sim.StreamHandle),
        (cuda.CudaEvent, sim.EventHandle),
        (cuda.CudaValue, sim.SharedValueHandle),
        (cuda.CudaQueue, sim.SharedQueueHandle),
        (cuda.CudaProcess, sim.ProcessHandle),
        (cuda.CudaWork, sim.SimWork),
    ],
)
def test_handles_have_the_same_methods_and_parameters(on_cuda: type, on_sim: type) -> None:
    assert public(on_cuda) - {"raw", "dev", "counts"} == public(on_sim) - {"name"}
    for name in public(on_sim) & public(on_cuda):
        a, b = getattr(on_cuda, name), getattr(on_sim, name)
        if callable(a) and callable(b):
            assert list(inspect.signature(a).parameters) == list(inspect.signature(b).parameters), name


@pytest.mark.parametrize("name", ["Stream", "Event", "stream", "Process", "Value", "Queue", "sleep",
                                  "all_gather_into_tensor", "spawn_ranks", "run"])
def test_device_methods_take_the_same_parameters(name: str) -> None:
    a, b = getattr(cuda.CudaDevice, name), getattr(sim.SimDevice, name)
    assert list(inspect.signature(a).parameters) == list(inspect.signature(b).parameters)


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
