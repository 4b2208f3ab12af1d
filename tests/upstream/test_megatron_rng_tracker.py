"""Megatron's CUDA RNG tracker (``megatron.core.tensor_parallel.random``), installed from PyPI and run unmodified in a
session: ``CudaRNGStatesTracker.add`` and ``fork`` and ``tensor_parallel.checkpoint`` (which restores the tracker's
states before it recomputes) set the device generator's state through ``torch.cuda.default_generators``, where
torch has no ``_cuda_setRNGState`` (torch 2.x). It raised ``IndexError`` here (a host error of a correct program).
Needs the extra ``upstream``; skipped without it."""

from __future__ import annotations

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed (the extra 'upstream')")

import torch

import simdevice


def _tracker_and_checkpoint() -> None:
    from megatron.core import tensor_parallel
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    torch.cuda.manual_seed(3)
    tracker = get_cuda_rng_tracker()
    tracker.reset()
    tracker.add("model-parallel-rng", 77)
    x = torch.ones(1 << 10, device="cuda")
    with tracker.fork():
        a = torch.nn.functional.dropout(x, 0.5)
    with tracker.fork():
        b = torch.nn.functional.dropout(x, 0.5)
    assert not torch.equal(a, b)  # the tracked generator moved on
    lin = torch.nn.Linear(64, 64).cuda()

    def block(h: torch.Tensor) -> torch.Tensor:
        with tracker.fork():
            h = torch.nn.functional.dropout(lin(h), 0.3)
        return torch.nn.functional.dropout(h.relu(), 0.2)

    h = torch.randn(8, 64, device="cuda", requires_grad=True)
    state, states = torch.cuda.get_rng_state(), tracker.get_states()
    out = tensor_parallel.checkpoint(block, False, h)
    out.sum().backward()
    grad = h.grad.clone()
    h.grad = None
    torch.cuda.set_rng_state(state)
    tracker.set_states(states)
    ref = block(h)
    ref.sum().backward()
    assert torch.equal(out, ref)
    assert torch.allclose(grad, h.grad)  # the recompute drew the forward's masks


def test_megatron_s_rng_tracker_and_checkpoint_run_clean() -> None:
    run = simdevice.cuda()
    run.run(_tracker_and_checkpoint)
    run.assert_clean()
