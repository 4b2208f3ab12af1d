"""diffusers' real group offloading (``diffusers.hooks.apply_group_offloading``, diffusers 0.42.1 with accelerate
1.16.0 from PyPI, unmodified) on a small block model.

``offload(steps, stream, record_stream, level, low_cpu_mem_usage)`` is plain torch.cuda code: a model of a projection
in, four residual blocks in a ``ModuleList`` and a projection out, group-offloaded to the host (``block_level``, one
block a group, or ``leaf_level``), ``steps`` forwards under ``torch.no_grad()``; it asserts each output equals the
model's on the host. With ``stream`` the groups are onloaded on a side stream, one group ahead of the compute
(``param.data = pinned.to("cuda", non_blocking=True)`` there), the side stream synchronized before a group's
weights are used, and offloaded with ``param.data = pinned`` after the compute stream is synchronized (or, with
``record_stream``, the onloaded weights recorded on the compute stream instead).

The mutants run the same with one of its synchronizations made a no-op on diffusers' own objects (nothing of
diffusers is copied or edited): ``offload_without_side_sync``, the side stream's ``synchronize()`` before the
compute uses the onloaded weights; ``offload_without_compute_sync``, the compute stream's ``synchronize()`` before
a group's device weights are let go (without ``record_stream``).
"""

from __future__ import annotations

from typing import Any

import torch
from diffusers.hooks import apply_group_offloading

WIDTH, BLOCKS = 32, 4


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(WIDTH, WIDTH)
        self.b = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(torch.relu(self.a(x)))


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj_in = torch.nn.Linear(WIDTH, WIDTH)
        self.blocks = torch.nn.ModuleList([Block() for _ in range(BLOCKS)])
        self.proj_out = torch.nn.Linear(WIDTH, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj_in(x)
        for block in self.blocks:
            x = block(x)
        return self.proj_out(x)


def _net() -> Net:
    torch.manual_seed(0)
    return Net()


def _run(steps: int, stream: bool, record_stream: bool, level: str, low_cpu_mem_usage: bool,
         mutate: Any = None) -> None:
    x = torch.randn(4, WIDTH)
    with torch.no_grad():
        expected = _net()(x)
    model = _net()
    apply_group_offloading(model, onload_device=torch.device("cuda"), offload_type=level,
                           num_blocks_per_group=1 if level == "block_level" else None, use_stream=stream,
                           record_stream=record_stream and stream, low_cpu_mem_usage=low_cpu_mem_usage)
    if mutate is not None:
        mutate(_groups(model))
    with torch.no_grad():
        outs = [model(x.to("cuda")) for _ in range(steps)]
    for step, out in enumerate(outs):
        assert torch.allclose(out.cpu(), expected, atol=1e-5), f"forward {step} differs from the host's"


def _groups(model: torch.nn.Module) -> list[Any]:
    """The offloaded groups that have a stream (diffusers' ``ModuleGroup`` objects, from its hooks)."""
    out: list[Any] = []
    for m in model.modules():
        registry = getattr(m, "_diffusers_hook", None)
        for hook in registry.hooks.values() if registry is not None else ():
            group = getattr(hook, "group", None)
            if group is not None and group.stream is not None and group not in out:
                out.append(group)
    return out


def offload(steps: int = 2, stream: bool = True, record_stream: bool = False, level: str = "block_level",
            low_cpu_mem_usage: bool = False) -> None:
    _run(steps, stream, record_stream, level, low_cpu_mem_usage)


def offload_without_side_sync(steps: int = 2, level: str = "block_level") -> None:
    def mutate(groups: list[Any]) -> None:
        groups[0].stream.synchronize = lambda: None  # (one stream, shared by every group)

    _run(steps, True, False, level, False, mutate)


class _ComputeNotSynchronized:
    """diffusers' device module for a group, whose ``current_stream()``'s ``synchronize()`` does nothing."""

    def __init__(self, module: Any) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)

    def current_stream(self) -> Any:
        s = self._module.current_stream()
        s.synchronize = lambda: None
        return s


def offload_without_compute_sync(steps: int = 2, level: str = "block_level") -> None:
    def mutate(groups: list[Any]) -> None:
        for group in groups:
            group._torch_accelerator_module = _ComputeNotSynchronized(group._torch_accelerator_module)

    _run(steps, True, False, level, False, mutate)
