"""A tiny model trained through torchao's real ``CPUOffloadOptimizer`` (torchao, from PyPI, unmodified).

``train(steps, accum, minimal_size, offload_gradients)`` is plain torch.cuda code: two ``Linear`` layers on
"cuda", ``CPUOffloadOptimizer(model.parameters(), torch.optim.AdamW, ...)``, ``accum`` backwards per step (the
gradients go D2H into pinned memory on the optimizer's side stream in post-accumulate-grad hooks), ``step()`` (the
AdamW step on the CPU, the parameters back H2D ``non_blocking`` on the side stream), ``zero_grad()``; it asserts
the final weights equal a CPU run of ``torch.optim.AdamW`` without offload. ``simdevice check
tests/upstream/torchao_offload.py::train`` runs it on the simulator; with ``--gpu`` the same line runs it on a GPU.

``train_skipping`` skips one step's update (``zero_grad()`` without ``step()``); ``train_scaled`` trains through
torch's ``GradScaler("cuda")`` with SGD on the host. Both run the optimizer unmodified.

The mutants (``train_without_*``) run the same module with one of its synchronizations turned into a no-op on the
optimizer's own objects (nothing of torchao is copied or edited): the side stream's ``wait_stream`` on the
compute stream in the gradient hook, the D2H event's ``synchronize()`` before the CPU step, the side stream's
``synchronize()`` after the H2D, and (with ``offload_gradients``) the gradient's ``record_stream``.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from typing import Any

import torch

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    # quiet while it imports: "Failed to load ..._C_*.so" (torchao's kernels, which the optimizer does not use) and
    # torch 2.13's deprecation of torchao's pytree registration of an Enum
    _quiet = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    _levels = [log.level for log in _quiet]
    for log in _quiet:
        log.setLevel(logging.ERROR)
    try:
        from torchao.optim import CPUOffloadOptimizer
    finally:
        for log, level in zip(_quiet, _levels, strict=True):
            log.setLevel(level)

LR = 0.01
WIDTH = 64  # a weight of 64 x 64 = 4096 elements: offloaded at torchao's default minimal_size; a bias stays on the GPU


def _model(device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, WIDTH)
    ).to(device)


def _batches(steps: int, accum: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(8, WIDTH, generator=g) for _ in range(steps * accum)]


def reference(steps: int, accum: int) -> list[torch.Tensor]:
    """The same training on the CPU with ``torch.optim.AdamW`` (fused, as torchao makes its CPU optimizers)."""
    model = _model("cpu")
    opt = torch.optim.AdamW(model.parameters(), lr=LR, fused=True)
    batches = iter(_batches(steps, accum))
    for _ in range(steps):
        for _ in range(accum):
            model(next(batches)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    return [p.detach() for p in model.parameters()]


def _trained(steps: int, accum: int, minimal_size: int, offload_gradients: bool,
             mutate: Any = None) -> list[torch.Tensor]:
    model = _model("cuda")
    opt = CPUOffloadOptimizer(model.parameters(), torch.optim.AdamW, lr=LR, minimal_size=minimal_size,
                              offload_gradients=offload_gradients)
    with mutate(opt) if mutate is not None else contextlib.nullcontext():
        batches = iter(_batches(steps, accum))
        for _ in range(steps):
            for _ in range(accum):
                model(next(batches).cuda()).square().mean().backward()
            opt.step()
            opt.zero_grad()
    return [p.detach().cpu() for p in model.parameters()]


def _check(got: list[torch.Tensor], steps: int, accum: int) -> None:
    want = reference(steps, accum)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert torch.allclose(g, w, rtol=1e-4, atol=1e-6), f"parameter {k} differs from the run without offload"


def train(steps: int = 2, accum: int = 1, minimal_size: int = 4096, offload_gradients: bool = False) -> None:
    """Train the tiny model through torchao's ``CPUOffloadOptimizer``; the weights must equal ``reference``'s."""
    _check(_trained(steps, accum, minimal_size, offload_gradients), steps, accum)


# -- the optimizer unmodified, with a step skipped and with a gradient scaler ----------------------------------------


def train_skipping(steps: int = 2, skip: int = 0, minimal_size: int = 4096) -> None:
    """``train``, but step ``skip`` calls ``zero_grad()`` without ``step()`` (what a loop does when it skips an
    update: a gradient scaler's inf, a loss spike); the reference skips the same update."""
    model = _model("cuda")
    opt = CPUOffloadOptimizer(model.parameters(), torch.optim.AdamW, lr=LR, minimal_size=minimal_size)
    ref = _model("cpu")
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=LR, fused=True)
    for i, x in enumerate(_batches(steps, 1)):
        model(x.cuda()).square().mean().backward()
        ref(x).square().mean().backward()
        if i != skip:
            opt.step()
            ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()
    for k, (p, q) in enumerate(zip(model.parameters(), ref.parameters(), strict=True)):
        assert torch.allclose(p.detach().cpu(), q.detach(), rtol=1e-4, atol=1e-6), (
            f"parameter {k} differs from the run without offload")


def train_scaled(steps: int = 2, minimal_size: int = 4096) -> None:
    """Mixed-precision training's loop with torch's ``GradScaler("cuda")`` (``scale(loss).backward()``,
    ``scaler.step(opt)``, ``scaler.update()``) through the optimizer with SGD on the host (AdamW's update hardly
    changes with its gradients' scale; SGD's shows a gradient left scaled). The scale is a power of two, so the
    unscaled gradients, and the weights, equal those of SGD on the CPU without a scaler."""
    model = _model("cuda")
    opt = CPUOffloadOptimizer(model.parameters(), torch.optim.SGD, lr=LR, minimal_size=minimal_size)
    scaler = torch.amp.GradScaler("cuda", init_scale=1024.0)
    ref = _model("cpu")
    ref_opt = torch.optim.SGD(ref.parameters(), lr=LR)
    for x in _batches(steps, 1):
        scaler.scale(model(x.cuda()).square().mean()).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        ref(x).square().mean().backward()
        ref_opt.step()
        ref_opt.zero_grad()
    for k, (p, q) in enumerate(zip(model.parameters(), ref.parameters(), strict=True)):
        assert torch.allclose(p.detach().cpu(), q.detach(), rtol=1e-4, atol=1e-6), (
            f"parameter {k} differs from the run without offload")


def train_autocast(steps: int = 2, minimal_size: int = 4096, event_sync: bool = True) -> None:
    """The loop under ``torch.autocast("cuda", dtype=torch.bfloat16)``, mixed precision's usual pairing with an
    offloaded optimizer: the linear layers in bfloat16, the loss in float32, the float32 weights' gradients float32,
    offloaded as without autocast. The reference is the same loop on the CPU under ``torch.autocast("cpu",
    dtype=torch.bfloat16)``, which casts the linear layers alike; a GPU's bfloat16 matmuls round otherwise than the
    CPU's, so the weights are compared to bfloat16's precision. ``event_sync=False``: the D2H event's
    ``synchronize()`` before the CPU step made a no-op (the CPU step reads gradients the D2H has not written)."""
    model = _model("cuda")
    opt = CPUOffloadOptimizer(model.parameters(), torch.optim.AdamW, lr=LR, minimal_size=minimal_size)
    ref = _model("cpu")
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=LR, fused=True)
    with contextlib.nullcontext() if event_sync else _no_event_sync(opt):
        for x in _batches(steps, 1):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = model(x.cuda())
            assert out.dtype == torch.bfloat16
            out.float().square().mean().backward()
            opt.step()
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                want = ref(x)
            want.float().square().mean().backward()
            ref_opt.step()
            ref_opt.zero_grad()
    for k, (p, q) in enumerate(zip(model.parameters(), ref.parameters(), strict=True)):
        assert p.dtype == torch.float32
        assert torch.allclose(p.detach().cpu(), q.detach(), rtol=1e-2, atol=1e-3), (
            f"parameter {k} differs from the run without offload")


# -- the mutants: one synchronization of the optimizer made a no-op ------------------------------------------------


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


@contextlib.contextmanager
def _no_backward_wait(opt: Any) -> Iterator[None]:
    """The gradient hook's ``self.stream.wait_stream(current_stream())``: the D2H no longer waits for backward."""
    opt.stream.wait_stream = _nothing
    yield


@contextlib.contextmanager
def _no_event_sync(opt: Any) -> Iterator[None]:
    """``grad_d2h_event.synchronize()`` in ``step()``: the CPU step no longer waits for the gradient's D2H."""
    record = opt.stream.record_event

    def record_event(*args: Any) -> Any:
        event = record(*args)
        event.synchronize = _nothing
        return event

    opt.stream.record_event = record_event
    yield


@contextlib.contextmanager
def _no_stream_sync(opt: Any) -> Iterator[None]:
    """``self.stream.synchronize()`` at the end of ``step()``: the next forward no longer waits for the H2D."""
    opt.stream.synchronize = _nothing
    yield


@contextlib.contextmanager
def _no_record_stream(opt: Any) -> Iterator[None]:
    """``p_device.grad.record_stream(self.stream)`` (``offload_gradients``): the gradient freed as its D2H reads it."""
    real = torch.Tensor.record_stream

    def record_stream(self: torch.Tensor, stream: Any) -> None:
        if stream is not opt.stream:
            real(self, stream)

    torch.Tensor.record_stream = record_stream  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.Tensor.record_stream = real  # type: ignore[method-assign]


def train_without_backward_wait(steps: int = 2, minimal_size: int = 4096) -> None:
    _check(_trained(steps, 1, minimal_size, False, _no_backward_wait), steps, 1)


def train_without_event_sync(steps: int = 2, minimal_size: int = 4096) -> None:
    _check(_trained(steps, 1, minimal_size, False, _no_event_sync), steps, 1)


def train_without_stream_sync(steps: int = 2, minimal_size: int = 4096) -> None:
    _check(_trained(steps, 1, minimal_size, False, _no_stream_sync), steps, 1)


def train_without_record_stream(steps: int = 2, minimal_size: int = 4096) -> None:
    _check(_trained(steps, 1, minimal_size, True, _no_record_stream), steps, 1)
