"""A host step autograd's engine issues costs ``engine_step_ns``, any other ``host_step_ns``.

On a GPU the backward pass's own operations (derivative formulas, gradient accumulation) come from autograd's C++
engine with no Python before them, faster than the forward's, which the program's Python issues.
``reference.origin`` tells the two apart on both backends; the simulator charges an engine step its own cost
(measured on the GPU by ``scripts/calibrate``), so a race window between a forward's copy and a backward's read
is as wide as on the GPU. Shown here: the classification on plain CPU autograd (formulas and accumulation from
the engine; the forward, a saved-tensor hook, a custom ``Function.backward`` and a tensor hook from Python; a
thread with no program frame is the engine's, as CUDA's device thread is), and the simulator's charge, which a
mutant that ignores the origin fails.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

import attrs
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from reference.origin import Origin
from reference.schedule import Schedule
from simdevice import SimDevice
from simdevice.runtime import execution
from simdevice.runtime.config import SimConfig

#: the recording mode's own code, compiled under a file name of its own: the backend's frames, skipped as
#: reference/cuda.py's are on the GPU (this test's file is the program)
_MODE = "<recording-mode>"
_SOURCE = """
class Recording(TorchDispatchMode):
    def __init__(self, origin):
        super().__init__()
        self.origin = origin
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append((func.overloadpacket.__name__, self.origin.from_engine()))
        return func(*args, **(kwargs or {}))
"""
_space: dict[str, Any] = {"TorchDispatchMode": TorchDispatchMode}
exec(compile(_SOURCE, _MODE, "exec"), _space)


def _recording() -> Any:
    return _space["Recording"](Origin(lambda f: f == _MODE or "/torch/" in f.replace("\\", "/")))


class _Twice(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad.mul(2)  # the program's Python, though the engine called it


def test_the_engine_issues_formulas_and_accumulation_python_the_rest() -> None:
    w = torch.ones(4, requires_grad=True)
    mode = _recording()

    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t.clone()  # a saved-tensor hook: Python

    with mode, torch.autograd.graph.saved_tensors_hooks(lambda t: t, unpack):
        y = (w * torch.full((4,), 3.0)).tanh()
        z = _Twice.apply(y)
        z.register_hook(lambda g: g.neg())  # a tensor hook: Python
        z.sum().backward()
    assert mode.seen == [
        # the forward: the program's Python (the custom Function's forward among it), and the gradient's seed
        ("full", False), ("mul", False), ("tanh", False), ("mul", False), ("sum", False), ("ones_like", False),
        ("expand", True),  # sum's formula
        ("neg", False), ("mul", False),  # the tensor hook, then the custom backward: Python the engine called
        ("clone", False), ("detach", True), ("tanh_backward", True),  # the hook unpacks tanh's output; its formula
        ("clone", False), ("mul", True),  # the hook unpacks mul's input; mul's formula
        ("detach", True),  # the gradient's accumulation
    ]
    assert w.grad is not None


def test_a_thread_with_no_program_frame_is_the_engines() -> None:
    """CUDA runs a device's backward nodes on the engine's own thread: no Python frame below the backend's."""
    origin = Origin(lambda f: True)  # every frame the backend's: as on that thread
    got: list[bool] = []
    t = threading.Thread(target=lambda: got.append(origin.from_engine()))
    t.start()
    t.join()
    assert got == [True]
    assert Origin(lambda f: False).from_engine() is False  # this test's own frame: the program's Python


def _train(dev: Any) -> None:
    w = torch.ones(1 << 12, device=dev.device, requires_grad=True)
    x = torch.full((1 << 12,), 2.0, device=dev.device)
    (w * x).tanh().sum().backward()
    dev.synchronize()


def _host_gaps(config: SimConfig, actors: str = "greenlet") -> list[tuple[str, int]]:
    run = SimDevice(Schedule.parse("t/t"), attrs.evolve(config, actors=actors)).run(_train)
    host = [(t, what) for t, actor, what in run.trace if actor == "host"]
    return [(what, b - a) for (a, _), (b, what) in itertools.pairwise(host)]


@pytest.mark.parametrize("actors", ["greenlet", "thread"])
def test_an_engine_step_comes_its_own_cost_after_the_last(actors: str) -> None:
    gaps = _host_gaps(SimConfig(host_step_ns=100_000, engine_step_ns=7_000), actors)
    # the forward and the gradient's seed (torch's Python: autograd's _make_grads) a host step each; tanh's and
    # mul's formulas (sum's is a view, no step) the engine's; the synchronize the program's again
    assert gaps == [("full", 100_000), ("mul", 100_000), ("tanh", 100_000), ("sum", 100_000),
                    ("ones_like", 100_000), ("tanh_backward", 7_000), ("mul", 7_000), ("synchronize", 100_000)]
    # unset (the fast default): one cost for every step
    assert {g for _, g in _host_gaps(SimConfig(host_step_ns=100_000))} == {100_000}


def test_a_mutant_that_ignores_the_origin_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    step = execution.Execution.host_step

    def blind(self: Any, desc: str, poll: bool = False, engine: bool = False) -> Any:
        return step(self, desc, poll, False)

    monkeypatch.setattr(execution.Execution, "host_step", blind)
    with pytest.raises(AssertionError):
        test_an_engine_step_comes_its_own_cost_after_the_last("greenlet")
