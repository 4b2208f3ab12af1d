"""``replay --gpu`` of a plain program counts ``torch_memory_saver``'s ``pause`` and ``resume`` as one host step each,
as the simulated library does (``simdevice.runtime.memsaver``); ``region`` and ``disable`` take none on either. The
GPU run counted none, so a schedule's host indices after the first pause meant other operations there
(``reference.cuda_plain``; patching only: no GPU needed to check it)."""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

import simdevice
from reference.cuda_plain import counting_torch_cuda


class FakeTorchMemorySaver:
    """The library's class, logging what is called (the real one needs CUDA)."""

    log: ClassVar[list[str]] = []

    @contextlib.contextmanager
    def region(self, tag: str = "default", enable_cpu_backup: bool = False) -> Iterator[None]:
        self.log.append(f"region({tag})")
        yield

    @contextlib.contextmanager
    def disable(self) -> Iterator[None]:
        self.log.append("disable")
        yield

    def pause(self, tag: str | None = None) -> None:
        self.log.append(f"pause({tag})")

    def resume(self, tag: str | None = None) -> None:
        self.log.append(f"resume({tag})")


class Dev:
    """What counting_torch_cuda needs of CudaDevice: host steps logged."""

    cycles_per_ms = 1.0
    prefix = ""

    def host_step(self, poll: bool = False) -> None:
        FakeTorchMemorySaver.log.append("step")


def sleep_and_wake() -> None:
    """A plain program's use of the library, as a user writes it."""
    from torch_memory_saver import torch_memory_saver as tms

    with tms.region("train"):
        pass
    tms.pause("train")
    with tms.disable():
        pass
    tms.resume("train")


@pytest.fixture
def fake_library(monkeypatch: pytest.MonkeyPatch) -> type[FakeTorchMemorySaver]:
    module = types.ModuleType("torch_memory_saver")
    module.TorchMemorySaver = FakeTorchMemorySaver  # type: ignore[attr-defined]
    module.torch_memory_saver = FakeTorchMemorySaver()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch_memory_saver", module)
    FakeTorchMemorySaver.log = []
    return FakeTorchMemorySaver


def test_pause_and_resume_are_each_one_host_step_on_the_gpu(fake_library: Any) -> None:
    with counting_torch_cuda(Dev()):  # type: ignore[arg-type]
        sleep_and_wake()
    assert fake_library.log == ["region(train)", "step", "pause(train)", "disable", "step", "resume(train)"]
    # the library's class is itself again afterwards
    fake_library.log = []
    sleep_and_wake()
    assert "step" not in fake_library.log


def test_the_simulator_counts_the_same_steps() -> None:
    def steps(trace: Any) -> list[str]:
        return [what for _, actor, what in trace if actor == "host"]

    run = simdevice.cuda().run(sleep_and_wake)
    assert not run.reports
    assert steps(run.trace) == ["memory_saver.pause(train)", "memory_saver.resume(train)"]
