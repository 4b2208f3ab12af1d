"""A wrapper tensor subclass over device tensors (a program's own, as a float8 training library's scaled weight;
torchao's quantized tensors; ``torch.nested``'s jagged tensor) runs as on a GPU: the simulator's mode declines an
op with such a tensor among its arguments, so the subclass's ``__torch_dispatch__`` takes it, and the ops that makes
on the tensors it wraps are simulated. Made for the simulated device, the subclass's tensor lives on the meta device
as a simulated tensor does and shows the device it was made for (``device``, ``is_cuda``, ``is_meta``,
``get_device()``).

Before, every op of such a tensor raised "on a simulated device tensor outside SimDevice.run" (the mode handed it
to the subclass with itself taken off, and the wrapped tensors' ops reached no mode): a host error where the
program was correct, reported as found. And a subclass's tensor made with the CUDA device aborted the whole process
where autograd ran its backward (a CPU build has no CUDA device guard). ``tests/hazards.py::subclass_reload`` and
``nested_reload`` run on a GPU in ``tests/gpu/test_dropin_gpu.py``."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hazard_checks import races_only_unwaited
from hazards import ScaledWeight

import simdevice


@pytest.mark.parametrize("program", ["subclass_reload", "nested_reload"])
def test_a_subclass_s_result_races_only_unwaited(program: str) -> None:
    races_only_unwaited(program, "side#0+20")


def test_a_subclass_made_for_the_device_shows_it_and_its_class_is_put_back() -> None:
    got: dict[str, Any] = {}

    def program() -> None:
        w = ScaledWeight(torch.ones(4, 4, dtype=torch.bfloat16, device="cuda"), torch.tensor(0.5, device="cuda"))
        h = ScaledWeight(torch.ones(4, 4, dtype=torch.bfloat16), torch.tensor(0.5))
        got["device"] = (w.device, w.is_cuda, w.is_meta, w.get_device())
        got["host"] = (h.device, h.is_cuda, h.get_device())
        got["values"] = (w @ torch.eye(4, device="cuda")).cpu()

    s = simdevice.cuda()
    s.run(program)
    s.assert_clean()
    assert got["device"] == (torch.device("cuda", 0), True, False, 0)
    assert got["host"] == (torch.device("cpu"), False, -1)
    assert torch.equal(got["values"], torch.full((4, 4), 0.5))
    assert "device" not in vars(ScaledWeight)
    assert "is_cuda" not in vars(ScaledWeight)


def test_ops_of_a_subclass_are_the_wrapped_tensors_ops_on_the_streams() -> None:
    """The subclass's backward writes the input's gradient on the compute stream: a side stream that reads it without
    waiting races, and with ``wait_stream`` does not."""

    def program(wait: bool) -> None:
        w = ScaledWeight(torch.ones(8, 8, dtype=torch.bfloat16, device="cuda"), torch.tensor(0.5, device="cuda"),
                         requires_grad=True)
        x = torch.ones(2, 8, device="cuda", requires_grad=True)
        (x @ w).sum().backward()
        side = torch.cuda.Stream()
        if wait:
            side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            assert x.grad is not None
            x.grad.mul_(2)
        torch.cuda.synchronize()

    clean = simdevice.cuda()
    clean.run(lambda: program(True))
    clean.assert_clean()
    racy = simdevice.cuda()
    racy.run(lambda: program(False))
    assert any(r.kind == "race" and "mul_" in str(r) for r in racy.reports), [str(r) for r in racy.reports]


def test_torch_asks_its_accelerator_and_gets_the_simulated_device() -> None:
    """``torch._C._get_accelerator()``, which torch's own code asks (FSDP2's default mesh, ``distributed_c10d``'s
    default device): on a GPU machine CUDA, so in a run too (the CPU build answers the CPU)."""
    got: list[Any] = []
    s = simdevice.cuda()
    s.run(lambda: got.append(torch._C._get_accelerator()))
    assert got == [torch.device("cuda")]
    assert torch._C._get_accelerator() == torch.device("cpu")


@pytest.mark.skipif(not hasattr(torch.distributed, "all_gather_single"), reason="torch 2.13's names")
def test_the_single_tensor_collectives_by_torch_s_new_names() -> None:
    """torch 2.13 names the one-tensor all-gather and reduce-scatter ``all_gather_single`` and
    ``reduce_scatter_single`` (FSDP2 calls those): simulated as ``all_gather_into_tensor`` and
    ``reduce_scatter_tensor`` are, where they raised "not simulated" before. A read of the gathered tensor before the
    work's ``wait()`` races."""
    import torch.distributed as dist

    got: dict[int, list[float]] = {}

    def program(wait: bool) -> None:
        r = dist.get_rank()
        full = torch.empty(8, device="cuda")
        work = dist.all_gather_single(full, torch.full((4,), float(r + 1), device="cuda"), async_op=True)
        if wait:
            work.wait()
        out = torch.empty(4, device="cuda")
        dist.reduce_scatter_single(out, full * 1.0)
        got[r] = out.cpu().tolist()
        work.wait()

    s = simdevice.cuda()
    s.run(lambda: program(True), world_size=2)
    s.assert_clean()
    assert got == {0: [2.0] * 4, 1: [4.0] * 4}
    racy = simdevice.cuda()
    racy.run(lambda: program(False), world_size=2)
    assert "race" in {r.kind for r in racy.reports}
