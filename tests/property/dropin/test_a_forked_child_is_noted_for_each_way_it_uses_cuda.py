"""A process forked after CUDA was in use is noted only where it then uses CUDA itself (CHANGELOG, twenty-sixth
sitting): on a GPU a forked child fails at its first CUDA call, whichever call that is. Each of the three ways
``processes._used_cuda`` names counts on its own: a stream of its own (nothing run on it), an operation on a tensor
it received (no memory of its own), device memory of its own (no operation). A child forked before the parent used
CUDA is never noted, whatever it does: on a GPU it initializes CUDA itself."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

import simdevice

N = 256


def _run(fn: Any) -> Any:
    s = simdevice.cuda()
    s.run(fn)
    assert s.result is not None
    return s.result


def _makes_a_stream(x: torch.Tensor, out: Any) -> None:
    torch.cuda.Stream()  # (no operation on it, no memory)
    out.put(float(x[0]))


def _adds_in_place(x: torch.Tensor, out: Any) -> None:
    x.add_(1.0)  # (an operation on the parent's tensor: no allocation of the child's own)
    out.put(1.0)


def _allocates(x: torch.Tensor, out: Any) -> None:
    torch.empty(N, device="cuda")  # (device memory of its own: no operation)
    out.put(float(x[0]))


def _host_only(x: torch.Tensor, out: Any) -> None:
    out.put(float(x[0]))


def _forked(child: Any, after_cuda: bool) -> Any:
    """The parent (``after_cuda``: having used CUDA first) forks ``child``, sends it a tensor (a device one for
    ``_adds_in_place``, which needs CUDA in use) and waits for its word."""

    def program() -> None:
        ctx = mp.get_context("fork")
        if after_cuda:
            torch.ones(N, device="cuda").sum()
        x = torch.ones(N, device="cuda") if child is _adds_in_place else torch.ones(N)
        out = ctx.Queue()
        p = ctx.Process(target=child, args=(x, out))
        p.start()
        out.get()
        p.join()

    return program


def _noted(run: Any) -> list[str]:
    return [n for n in run.notes if "fork method" in n]


@pytest.mark.parametrize("child", [_makes_a_stream, _adds_in_place, _allocates], ids=["stream", "op", "memory"])
def test_a_forked_child_that_uses_cuda_in_any_one_way_is_noted(child: Any) -> None:
    r = _run(_forked(child, after_cuda=True))
    assert r.reports == (), r.reports
    assert len(_noted(r)) == 1, r.notes


def test_a_forked_child_that_uses_the_host_alone_is_not_noted() -> None:
    r = _run(_forked(_host_only, after_cuda=True))
    assert r.reports == (), r.reports
    assert not _noted(r), r.notes


@pytest.mark.parametrize("child", [_makes_a_stream, _allocates], ids=["stream", "memory"])
def test_a_child_forked_before_cuda_was_in_use_is_not_noted(child: Any) -> None:
    """The parent had used no CUDA when it forked: the child's first CUDA call initializes CUDA there, as on a
    GPU."""
    r = _run(_forked(child, after_cuda=False))
    assert r.reports == (), r.reports
    assert not _noted(r), r.notes
