"""Rule (FunctionTarget._run_cuda): on the GPU (``replay --gpu``, ``backend="cuda"``) a target runs as it is
written, as on the simulator: plain torch.cuda code (no ``dev`` parameter) through ``CudaDevice.run_plain`` and
called with its configuration alone; contract code (``fn(dev, ...)``) through ``CudaDevice.run``, given the
device. (No GPU here: ``reference.cuda.CudaDevice`` is replaced by a stand-in that records which way it was
asked to run the function and runs it that way.)"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

import reference.cuda
from reference.contract import Run
from simdevice.search import targets
from simdevice.search.targets import from_function


class FakeCudaDevice:
    """``CudaDevice``'s surface that ``_run_cuda`` uses, without a GPU."""

    calls: ClassVar[list[str]] = []

    def __init__(self, schedule: Any, cycles_per_ms: float | None = None) -> None:
        self.schedule = schedule
        self.cycles_per_ms = cycles_per_ms or 1.0

    def run(self, program: Any, *args: Any) -> Run:
        self.calls.append("run")
        return Run(result=program(self, *args))

    def run_plain(self, fn: Any, *args: Any, world_size: int | None = None, **kwargs: Any) -> Run:
        self.calls.append("run_plain")
        return Run(result=fn(*args, **kwargs))


def plain(n: int = 4) -> tuple[str, int]:
    return "plain", n


def contract(dev: Any, n: int = 4) -> tuple[str, int]:
    assert isinstance(dev, FakeCudaDevice), f"contract code was given {dev!r}, not the device"
    return "contract", n


@pytest.mark.parametrize(("fn", "way"), [(plain, "run_plain"), (contract, "run")])
def test_a_gpu_run_calls_the_function_in_its_own_style(monkeypatch: pytest.MonkeyPatch, fn: Any, way: str) -> None:
    monkeypatch.setattr(reference.cuda, "CudaDevice", FakeCudaDevice)
    monkeypatch.setattr(FakeCudaDevice, "calls", [])
    monkeypatch.setattr(targets, "_CYCLES", [])
    target = from_function(fn, name=f"t.py::{fn.__name__}")
    assert target.style == fn.__name__
    out = target.run(target.schedule({"n": 7}), backend="cuda")
    assert FakeCudaDevice.calls == [way], f"{fn.__name__} code ran through CudaDevice.{FakeCudaDevice.calls}"
    assert out.problems == (), out.problems
    assert out.run.result == (fn.__name__, 7)
