"""A tiny model trained through Megatron-LM's real fine-grained activation offload (megatron-core, from PyPI).

``train(layers, mb, iters, ...)`` is plain torch.cuda code: each microbatch runs ``layers`` layers (one offload
group each) through ``FineGrainedActivationOffloadingInterface`` exactly as megatron's transformer layer calls it,
backward per microbatch, an SGD step, ``reset()``; it asserts the final weights equal a CPU run without offload,
so a stale reload fails it. ``simdevice check tests/upstream/megatron_offload.py::train`` runs it on the
simulator; with ``--gpu`` the same line runs it on a GPU.

Stubs (megatron imports without TransformerEngine, but its offload context refuses to run without TE's CPU
offload flag): ``megatron.core.extensions.transformer_engine.cpu_offload``, set to an object with a
``CPUOffloadEnabled`` attribute for the duration of a run and put back after. Nothing else is stubbed.

Fixes written here (``with fixes():``), as the upstream pull requests describe them: a ``reload_pending`` latch
per group (set when its D2H is enqueued; an inline pop waits on the group's offload event and leaves the reload
LIFO; a prefetch and ``reset()`` clear it); and the chunk cursor judged by the groups remaining after it.
"""

from __future__ import annotations

import contextlib
import types
import warnings
from collections.abc import Iterator
from typing import Any

import torch

with warnings.catch_warnings():  # "Transformer Engine and Apex are not installed": expected here
    warnings.simplefilter("ignore")
    import megatron.core.extensions.transformer_engine as te_ext
    import megatron.core.pipeline_parallel.fine_grained_activation_offload as fgo

off = fgo.FineGrainedActivationOffloadingInterface
LR = 0.05


def _values(n: int, seed: float) -> torch.Tensor:
    return torch.sin(torch.arange(n, dtype=torch.float32) * 0.01 + seed)


@contextlib.contextmanager
def _te_cpu_offload_flag() -> Iterator[None]:
    saved = te_ext.cpu_offload
    te_ext.cpu_offload = types.SimpleNamespace(CPUOffloadEnabled=False)
    try:
        yield
    finally:
        te_ext.cpu_offload = saved


def reference(layers: int, mb: int, iters: int, n: int) -> list[torch.Tensor]:
    """The same training on the CPU without offload."""
    ws = [(1.0 + 0.25 * _values(n, 100.0 + k)).requires_grad_(True) for k in range(layers)]
    for it in range(iters):
        for m in range(mb):
            x = _values(n, 1.0 + 7.0 * it + 3.0 * m)
            for w in ws:
                x = torch.tanh(x * w)
            (x * x).sum().backward()
        with torch.no_grad():
            for w in ws:
                w.sub_(LR * w.grad)
                w.grad = None
    return [w.detach() for w in ws]


def _trained(layers: int, mb: int, iters: int, n: int) -> list[torch.Tensor]:
    """The weights after training through megatron's offload manager (its graphs die with this frame)."""
    fgo.PipelineOffloadManager.reset_instance()
    ws = [(1.0 + 0.25 * _values(n, 100.0 + k)).cuda().requires_grad_(True) for k in range(layers)]
    for w in ws:
        off.mark_not_offloadable(w)  # parameters stay resident, as gpt_model marks them
    inputs = {(it, m): _values(n, 1.0 + 7.0 * it + 3.0 * m) for it in range(iters) for m in range(mb)}
    for it in range(iters):
        for m in range(mb):
            off.init_chunk_handler(vp_size=None, vp_stage=None, min_offloaded_tensor_size=1)
            x = inputs[it, m].cuda()
            for k, w in enumerate(ws):
                with off(True, x, f"layer{k}") as x:
                    y = torch.tanh(x * w)
                # x is needed only by backward, from its offloaded copy: released once its D2H is queued
                x = off.group_commit(y, f"layer{k}", forced_released_tensors=[x])
            (x * x).sum().backward()
        with torch.no_grad():
            for w in ws:
                w.sub_(LR * w.grad)
                w.grad = None
        off.reset()
    torch.cuda.synchronize()
    return [w.detach().cpu() for w in ws]


def train(layers: int = 1, mb: int = 1, iters: int = 1, n: int = 16384) -> None:
    """Train the tiny model through megatron's offload manager; the weights must equal ``reference``'s."""
    with _te_cpu_offload_flag(), contextlib.redirect_stdout(None):  # its warmup summary table goes nowhere
        got = _trained(layers, mb, iters, n)
        # leave nothing for the next run: the manager's pinned pool calls torch.cuda.empty_cache() when it dies,
        # which would otherwise happen (and count) inside the next run's reset_instance()
        fgo.PipelineOffloadManager.OFFLOAD_MGR = None
    want = reference(layers, mb, iters, n)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert torch.allclose(g, w, rtol=1e-4, atol=1e-5), f"weight {k} differs from the run without offload"


# -- the fixes, written here, put in place by monkeypatching for a while ----------------------------------------


def _fixed_bulk_offload_group(original: Any) -> Any:
    def bulk_offload_group(self: Any) -> None:
        group = self._groups_to_offload[-1]
        original(self)
        group.reload_pending = True  # its D2H is enqueued: a reload must order after it

    return bulk_offload_group


def _fixed_tensor_pop(self: Any, tensor_tag: Any) -> torch.Tensor:
    group_id, _ = tensor_tag
    group = self.offload_groups[group_id - 1]
    tensor = group.pop_tensor(tensor_tag)
    if isinstance(tensor, tuple):
        if getattr(group, "reload_pending", False):
            # wait: the D2H filling this pinned buffer may still be in flight
            group.wait_offload_event(torch.cuda.current_stream())
            if group in self._groups_to_reload:
                self._groups_to_reload.remove(group)  # so that the next prefetch advances
            group.reload_pending = False
        tensor = self.reload(tensor)
    return tensor


def _fixed_bulk_reload_group(original: Any) -> Any:
    def bulk_reload_group(self: Any) -> None:
        group = self._groups_to_reload[-1]
        original(self)
        group.reload_pending = False  # the prefetch waited on the offload event already

    return bulk_reload_group


def _fixed_reset(original: Any) -> Any:
    def reset(self: Any) -> None:
        for group in self.offload_groups:
            group.reload_pending = False  # offloaded and never reloaded: its event is stale from now on
        original(self)

    return reset


def _fixed_finish_all_groups(self: Any, name: Any = None) -> bool:
    assert name is not None, "Name is required"
    return self.find_group_with_name(name, self._offloaded_group_index) is None


@contextlib.contextmanager
def fixes() -> Iterator[None]:
    """The upstream fixes, monkeypatched into megatron's ``ChunkOffloadHandler`` for the duration."""
    h = fgo.ChunkOffloadHandler
    saved = {name: h.__dict__[name] for name in
             ("bulk_offload_group", "tensor_pop", "bulk_reload_group", "reset", "finish_all_groups")}
    h.bulk_offload_group = _fixed_bulk_offload_group(saved["bulk_offload_group"])
    h.tensor_pop = _fixed_tensor_pop
    h.bulk_reload_group = _fixed_bulk_reload_group(saved["bulk_reload_group"])
    h.reset = _fixed_reset(saved["reset"])
    h.finish_all_groups = _fixed_finish_all_groups
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(h, name, fn)


def train_fixed(layers: int = 1, mb: int = 1, iters: int = 1, n: int = 16384) -> None:
    """``train`` with the fixes in place."""
    with fixes():
        train(layers, mb, iters, n)
