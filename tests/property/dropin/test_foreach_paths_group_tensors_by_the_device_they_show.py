"""The foreach paths of ``clip_grad_norm_``, ``clip_grad_value_`` and the optimizers group their tensors with
``torch._C._group_tensors_by_device_and_dtype``, whose C++ keys a simulated tensor by its ``meta`` shell. So
``clip_grad_norm_(foreach=True)`` raised "can't use the foreach API on meta tensors" (a host error reported as
found, for a program a GPU runs), and without ``foreach`` it took the per-tensor path (``vector_norm`` and
``mul_`` per gradient where a GPU runs ``_foreach_norm`` and ``_foreach_mul_``: other ops, other counts for a
replay). The groups are keyed by the device their tensors show, ``cuda:0``, as on a GPU. And the optimizers'
default (``foreach=None``) and the clipping's ask ``type(t) in _foreach_supported_types``, which a simulated tensor's
type was not: they too took the per-tensor path; a simulated tensor is of a supported type now, as on a GPU."""

from __future__ import annotations

import pytest
import torch

import simdevice
from simdevice import Race

N = 16


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(N, N), torch.nn.Tanh(), torch.nn.Linear(N, N))


def _clip_then_offload(foreach: bool | None, by_value: bool, wait: bool) -> None:
    """Backward, clip the gradients on the default stream, copy them to pinned memory on ``side``; ``wait``: the
    side stream waits for the clipping first."""
    host_x = torch.randn(4, N)
    model = _model().cuda()
    model(host_x.cuda()).pow(2).sum().backward()
    if by_value:
        torch.nn.utils.clip_grad_value_(model.parameters(), 0.05, foreach=foreach)
    else:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5, foreach=foreach)
    side = torch.cuda.Stream()
    if wait:
        side.wait_stream(torch.cuda.current_stream())  # wait: the copies read the clipped gradients
    pinned = [torch.empty(p.shape, pin_memory=True) for p in model.parameters()]
    with torch.cuda.stream(side):
        for c, p in zip(pinned, model.parameters(), strict=True):
            c.copy_(p.grad, non_blocking=True)
    side.synchronize()
    ref = _model()
    ref(host_x).pow(2).sum().backward()
    if by_value:
        torch.nn.utils.clip_grad_value_(ref.parameters(), 0.05, foreach=False)
    else:
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5, foreach=False)
    for c, p in zip(pinned, ref.parameters(), strict=True):
        assert torch.allclose(c, p.grad, atol=1e-6), "a clipped gradient differs"


@pytest.mark.parametrize("by_value", [False, True])
@pytest.mark.parametrize("foreach", [None, True])
def test_clipping_with_foreach_runs_as_on_a_gpu(foreach: bool | None, by_value: bool) -> None:
    r = simdevice.cuda()
    r.run(_clip_then_offload, foreach, by_value, True)
    r.assert_clean()


@pytest.mark.parametrize(("by_value", "racing"), [(False, "_foreach_mul_"), (True, "_foreach_clamp_max_")])
def test_the_foreach_clipping_is_what_an_unordered_copy_races_with(by_value: bool, racing: str) -> None:
    """By default (``foreach=None``) a GPU clips with the foreach kernels: the race names them."""
    r = simdevice.cuda()
    r.run(_clip_then_offload, None, by_value, False)
    races = [x for x in r.reports if isinstance(x, Race)]
    assert races, r.text()
    assert all(racing in str(x) for x in races), r.text()


def test_groups_are_keyed_by_the_device_the_tensors_show() -> None:
    def group() -> None:
        a, b = torch.ones(2, device="cuda"), torch.ones(3, device="cuda", dtype=torch.float64)
        grouped = torch._C._group_tensors_by_device_and_dtype([[a, b, torch.ones(2)]], False)
        assert sorted(map(str, grouped)) == ["(device(type='cpu'), torch.float32)",
                                             "(device(type='cuda', index=0), torch.float32)",
                                             "(device(type='cuda', index=0), torch.float64)"], grouped.keys()

    r = simdevice.cuda()
    r.run(group)
    r.assert_clean()


def _step_beside_a_parameter_offload(optimizer: str) -> None:
    """The parameters copied to pinned memory on ``side`` while the default stream's step writes them."""
    model = _model().cuda()
    opt = {"adam": torch.optim.Adam, "sgd": lambda ps, **kw: torch.optim.SGD(ps, momentum=0.9, **kw)}[optimizer](
        model.parameters(), lr=0.01)
    model(torch.randn(4, N).cuda()).pow(2).sum().backward()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    opt.step()
    with torch.cuda.stream(side):
        snapshot = [p.detach().to("cpu", non_blocking=True) for p in model.parameters()]
    side.synchronize()
    assert len(snapshot) == 4


@pytest.mark.parametrize(("optimizer", "racing"), [("adam", "_foreach_addcdiv_"), ("sgd", "_foreach_add_")])
def test_an_optimizer_steps_with_the_foreach_kernels_by_default(optimizer: str, racing: str) -> None:
    r = simdevice.cuda()
    r.run(_step_beside_a_parameter_offload, optimizer)
    races = [x for x in r.reports if isinstance(x, Race)]
    assert races, r.text()
    assert all(racing in str(x) for x in races), r.text()
