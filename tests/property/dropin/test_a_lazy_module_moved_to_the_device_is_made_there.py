"""A lazy module (``nn.LazyLinear``, ``nn.LazyBatchNorm1d``, ...) moved to the device before its first forward, as
model code does (``LazyLinear(4).cuda()``): on a GPU torch moves its empty placeholders and makes each parameter on
the device as the first forward infers its shape. Here it was a host error of a correct program ("found"): the
uninitialized parameter refused the session's ``Tensor.to`` (torch's allowlist names the function it had at
import), and the simulator read its ``shape``, which it refuses. Now each placeholder stays uninitialized, the same
object, and is made on the simulated device at the first forward."""

from __future__ import annotations

import torch
from torch import nn

import simdevice
from simdevice.explain import not_run
from simdevice.search.explore import explore


def _lazy_train() -> None:
    model = nn.Sequential(nn.LazyLinear(8), nn.ReLU(), nn.LazyBatchNorm1d(), nn.LazyLinear(4)).cuda()
    first = model[0].weight
    x = torch.ones(6, 16, device="cuda")
    y = model(x)
    assert y.shape == (6, 4)
    assert y.is_cuda
    assert model[0].weight is first  # (the same object, now made)
    assert isinstance(first, nn.Parameter)
    assert first.is_cuda
    assert first.shape == (8, 16)
    assert model[2].running_mean.is_cuda
    assert model[2].running_mean.shape == (8,)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    y.sum().backward()
    opt.step()
    assert first.grad is not None
    assert first.grad.is_cuda


def test_a_lazy_module_moved_before_its_first_forward_is_made_on_the_device() -> None:
    run = simdevice.cuda()
    run.run(_lazy_train)
    run.assert_clean()


def test_to_with_a_device_argument_moves_it_too_and_the_host_one_stays_on_the_host() -> None:
    def program() -> None:
        on_device = nn.LazyLinear(3).to(device="cuda")
        on_host = nn.LazyLinear(3)
        assert on_device(torch.ones(2, 5, device="cuda")).is_cuda
        assert not on_host(torch.ones(2, 5)).is_cuda

    run = simdevice.cuda()
    run.run(program)
    run.assert_clean()


def converted_as_it_moves() -> None:
    nn.LazyLinear(3).to("cuda", torch.float16)


def test_converted_to_another_dtype_as_it_moves_is_no_verdict() -> None:
    found = explore(converted_as_it_moves, max_examples=1)
    assert found.failure is not None
    unrun = not_run(found.failure)
    assert unrun is not None, found.failure.text()
    assert unrun.error.startswith("NotImplementedError: a lazy module's uninitialized parameter"), unrun.error


def test_the_hazard_tests_gpu_runs_counts_as_an_h100_counted_it() -> None:
    """``tests/hazards.py::lazy_model_reload`` on an H100 (docs/confirmations.md, thirty-eighth run): default 13,
    host 17, side 1, each placeholder's move to the device an operation (``_to_copy`` of no bytes), the parameters'
    initialization at the first forward on the device; the unwaited read of the D2H races."""
    from reference.schedule import Schedule
    from simdevice.search.targets import resolve

    line = "tests/hazards.py::lazy_model_reload"
    target = resolve(line)
    counts = target.run(Schedule.parse(line)).run.op_counts
    assert {k: v for k, v in counts.items() if v} == {"default": 13, "host": 17, "side": 1}, counts
    assert target.run(Schedule.parse(f"{line}:wait=0:side#0+20")).corrupted
