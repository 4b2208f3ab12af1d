"""A tiny model trained through Megatron-LM's real ``HybridDeviceOptimizer`` (megatron-core 0.16.1 from PyPI,
unmodified): its optimizer state offloaded to the host.

``train(steps, fraction, overlap)`` is plain torch.cuda code: a two-layer model on "cuda", ``HybridDeviceOptimizer``
with AdamW on the host for ``fraction`` of the parameters (the rest on the device), ``steps`` steps; it asserts the
final weights equal a host run of AdamW. The protocol (``overlap``, the default): ``step()`` makes its D2H stream
wait for the compute stream, copies each offloaded parameter's gradient D2H into pinned memory there and records an
event; each host AdamW step waits for that event; a post-step hook makes the H2D stream wait for the compute stream
and copies the parameters back H2D there, and makes the compute stream wait for an event recorded after them.

The mutants run the same with one of its synchronizations made a no-op on the optimizer's own objects (nothing of
megatron is copied or edited): ``train_without_d2h_event_sync``, the host's wait for the D2H's event before the
host step; ``train_without_d2h_stream_wait``, the D2H stream's wait for the compute stream.

    simdevice check tests/upstream/megatron_hybrid_optimizer.py::train                          # clean
    simdevice check tests/upstream/megatron_hybrid_optimizer.py::train_without_d2h_event_sync   # found
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

with warnings.catch_warnings():  # "Transformer Engine and Apex are not installed": expected here
    warnings.simplefilter("ignore")
    from megatron.core.optimizer.cpu_offloading.hybrid_optimizer import HybridDeviceOptimizer

LR = 0.01


def _model(device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16)).to(device)


def _train(model: torch.nn.Module, opt: Any, steps: int, device: str) -> None:
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(8, 32, generator=g).to(device)
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()


def _run(steps: int, fraction: float, overlap: bool, mutate: Any = None) -> None:
    ref = _model("cpu")
    _train(ref, torch.optim.AdamW(ref.parameters(), lr=LR), steps, "cpu")
    model = _model("cuda")
    opt = HybridDeviceOptimizer(list(model.parameters()), offload_fraction=fraction, lr=LR,
                                cpu_optimizer_cls=torch.optim.AdamW, gpu_optimizer_cls=torch.optim.AdamW,
                                overlap_cpu_optimizer_d2h_h2d=overlap)
    if mutate is not None:
        mutate(opt)
    _train(model, opt, steps, "cuda")
    for i, (p, q) in enumerate(zip(model.parameters(), ref.parameters(), strict=True)):
        assert torch.allclose(p.detach().cpu(), q.detach(), atol=1e-5), f"parameter {i} differs from the host run"


def train(steps: int = 2, fraction: float = 1.0, overlap: bool = True) -> None:
    _run(steps, fraction, overlap)


def train_without_d2h_event_sync(steps: int = 2, fraction: float = 1.0) -> None:
    def mutate(opt: Any) -> None:
        real = opt._set_sub_optimizer_grads

        def set_grads() -> None:
            real()
            for event in opt._cpu_optimizer_map_data_event.values():
                event.synchronize = lambda: None

        opt._set_sub_optimizer_grads = set_grads

    _run(steps, fraction, True, mutate)


def train_without_d2h_stream_wait(steps: int = 2, fraction: float = 1.0) -> None:
    def mutate(opt: Any) -> None:
        opt._d2h_stream.wait_stream = lambda stream: None

    _run(steps, fraction, True, mutate)
