"""The harness of ``activation_offload`` (``reference/activation_offload.py``): configuration, model, oracle.

The body trains a small model (layers x microbatches x iterations, forward
then backward through ``saved_tensors_hooks``) with one variant's ``Fixes``,
in a pipeline's microbatch order (``inflight``): every forward before any
backward (the default), or 1F1B with at most ``inflight`` microbatches between
their forward and their backward (``inflight=2``, three microbatches: F0 F1 B0
F2 B1 B2), where a later forward's D2H can take a pinned buffer that a
prefetch for an earlier backward still reads. The oracle: every popped tensor
equals the pushed one and the final weights equal a CPU run of the same model
without offload (the order changes neither). A ``Chunk mismatch`` ends the run
as a host error.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

import attrs
import torch

from reference import activation_offload as ao
from reference.contract import Device
from reference.schedule import in_range
from simdevice.programs import Program, register

# ---------------------------------------------------------------------------
# The configuration, and a small model that drives the manager: forwards and backwards of the microbatches in
# the configured order, then SGD


@attrs.frozen
class TrainConfig:
    #: layers, one offload group each
    layers: int = attrs.field(default=1, validator=in_range(1, 8))
    #: microbatches (chunks) per iteration
    mb: int = attrs.field(default=1, validator=in_range(1, 8))
    #: activation_offload_fraction, in percent
    frac: int = attrs.field(default=0, validator=in_range(0, 100))
    #: training iterations
    iters: int = attrs.field(default=1, validator=in_range(1, 8))
    #: whether the first pass is a warmup (offloads every group)
    warmup: int = attrs.field(default=1, validator=in_range(0, 1))
    #: a forward-only evaluation pass before training (its groups are offloaded, never reloaded)
    evalfirst: int = attrs.field(default=0, validator=in_range(0, 1))
    #: the microbatch order: 0 runs every forward before any backward; k > 0 runs 1F1B with at most k microbatches
    #: in flight (k forwards, then one backward and one forward in turn: a pipeline stage k stages from the last)
    inflight: int = attrs.field(default=0, validator=in_range(0, 8))
    #: size of each saved activation in KiB (the GPU run scales it)
    kib: int = attrs.field(default=64, validator=in_range(1, 1 << 20))
    #: compare every popped tensor with the pushed one at the end (keeps the pushed ones alive)
    check: int = attrs.field(default=1, validator=in_range(0, 1))
    #: use the offload manager at all (0: the plain model, for the benchmark's baseline)
    offload: int = attrs.field(default=1, validator=in_range(0, 1))
    #: varies every value: repeated GPU trials must not find the last trial's bytes in a recycled pinned block
    seed: int = attrs.field(default=0, validator=in_range(0, 1 << 20))


LR = 0.05


def host_values(cfg: TrainConfig, seed: float) -> torch.Tensor:
    """Deterministic host values, different for every seed, so a stale buffer never looks right (cached: never
    modify the result)."""
    return _host_values(cfg.kib * 256, seed + 13.0 * cfg.seed)


@functools.lru_cache(maxsize=32)
def _host_values(n: int, seed: float) -> torch.Tensor:
    return torch.sin(torch.arange(n, dtype=torch.float32) * (0.001 + 0.0007 * seed) + seed)


def input_seed(it: int, mb: int) -> float:
    return 1.0 + 7.0 * it + 3.0 * mb


def microbatch_order(mb: int, inflight: int) -> list[tuple[str, int]]:
    """One iteration's steps: ``("F", i)`` is microbatch i's forward, ``("B", i)`` its backward. Backwards run in
    forward order, as the manager's backward cursor requires. ``microbatch_order(3, 2)`` is F0 F1 B0 F2 B1 B2."""
    ahead = mb if inflight == 0 else min(inflight, mb)
    steps = [("F", i) for i in range(ahead)]
    for i in range(mb):
        steps.append(("B", i))
        if ahead + i < mb:
            steps.append(("F", ahead + i))
    return steps


def layer_forward(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """One layer: its saved tensors are the input and the tanh output (the weight is a parameter)."""
    return torch.tanh(x * w)


def train(
    dev: Device, fixes: ao.Fixes, cfg: TrainConfig, on_iteration: Callable[[int], None] | None = None
) -> dict[str, Any]:
    """Train the small model with activation offload; return the final weights and what the checks saw.

    ``on_iteration(it)``, if given, is called after each training iteration (a benchmark's clock).
    """
    names = [f"layer{k}" for k in range(cfg.layers)]
    weights = []
    for k in range(cfg.layers + 1):
        w = torch.empty(cfg.kib * 256, device=dev.device)
        w.copy_(1.0 + 0.25 * host_values(cfg, 100.0 + k))
        weights.append(w.requires_grad_(True))
    manager = ao.ActivationOffloadManager(dev, fixes, names, cfg.frac / 100, bool(cfg.warmup)) if cfg.offload else None
    if manager is not None:
        # Up front, as frameworks do: one pass offloads at most two tensors per group.
        manager.pool.reserve((cfg.kib * 256,), torch.float32, 2 * cfg.layers * cfg.mb)
    pairs: list[tuple[str, torch.Tensor, torch.Tensor]] = []

    # The manager's hooks, wrapped to remember (pushed, popped) pairs for the end-of-run comparison.
    def pack(t: torch.Tensor) -> Any:
        tag = manager.tensor_push(t) if manager else t
        # the values, detached: the tensor itself would hold its own graph node (which holds this), a cycle through
        # autograd that the garbage collector cannot see, so a graph never run backward would never be freed
        keep = cfg.check and isinstance(tag, ao.TensorTag)
        return tag, (t.detach() if keep else None), (weakref.ref(t) if keep else None)

    def unpack(saved: Any) -> torch.Tensor:
        tag, pushed, original = saved
        t = manager.tensor_pop(tag) if manager else tag
        if pushed is not None and original() is not t:  # a resident tensor comes back as itself: nothing to compare
            pairs.append((f"pass {manager.pass_index if manager else 0} {tag.group.name}", pushed, t))
        return t  # type: ignore[no-any-return]

    # Made before the first pass, so no forward spends host time between its D2Hs and the backward after it.
    inputs = {(it, mb): host_values(cfg, input_seed(it, mb)) for it in range(-cfg.evalfirst, cfg.iters)
              for mb in range(cfg.mb)}

    def forward(it: int, mb: int) -> torch.Tensor:
        x_in = torch.empty(cfg.kib * 256, device=dev.device)
        x_in.copy_(inputs[it, mb])
        x = x_in * weights[-1]  # an embedding, so the first group's start marker is on the gradient path
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            for k, w in enumerate(weights[:-1]):
                if manager is not None:
                    group = manager.group_start(names[k])
                    x = ao.GroupStart.apply(x, manager, group)
                x = layer_forward(x, w)
                if manager is not None:
                    x = ao.GroupCommit.apply(x, manager, group)
                    manager.group_commit(group)
        return (x * x).sum()

    try:
        if cfg.evalfirst:
            for mb in range(cfg.mb):
                forward(-1, mb)  # evaluation: the graph is dropped, nothing is reloaded
            if manager:
                manager.reset()
        for it in range(cfg.iters):
            losses: dict[int, torch.Tensor] = {}
            for step, mb in microbatch_order(cfg.mb, cfg.inflight):
                if step == "F":
                    losses[mb] = forward(it, mb)
                else:
                    losses.pop(mb).backward()
            with torch.no_grad():
                for w in weights:
                    w.sub_(LR * w.grad)
                    w.grad = None
            if manager:
                manager.reset()
            if on_iteration is not None:
                on_iteration(it)
    except BaseException:
        if manager:
            # an aborted step (a Chunk mismatch, the run stopped): the groups let go of the saved tensors, whose
            # graph holds the hooks that hold the manager (a cycle through autograd the collector cannot see)
            for handler in manager.handlers:
                handler.reset(manager.pool, clear_latches=True)
        raise
    # wait: the comparison and the weights must see every copy and kernel of the last pass landed
    dev.synchronize()
    # Only copies that went through a pinned buffer are compared.
    mismatches = [label for label, pushed, popped in pairs if not torch.equal(pushed, popped)]
    result = {
        "weights": [w.detach().cpu() for w in weights],
        "mismatches": mismatches,
        "pops": len(pairs),
        "waits": tuple(manager.waits) if manager else (),
        "reloads": tuple(manager.reloads) if manager else (),
        "pool_waits": manager.pool.waited if manager else 0,
    }
    if manager:
        # the manager and its chunks refer to each other (as upstream's do): let go of the chunks, so that the run's
        # tensors and the simulator's model of them are freed as the run ends, not when the collector next runs
        for handler in manager.handlers:
            handler.offload_groups.clear()
        manager.handlers.clear()
    return result


def reference_weights(cfg: TrainConfig) -> list[torch.Tensor]:
    """The same training on the CPU, without offload: what the weights must come out as."""
    weights = [(1.0 + 0.25 * host_values(cfg, 100.0 + k)).requires_grad_(True) for k in range(cfg.layers + 1)]
    for it in range(cfg.iters):
        for mb in range(cfg.mb):
            x = host_values(cfg, input_seed(it, mb)) * weights[-1]
            for w in weights[:-1]:
                x = layer_forward(x, w)
            (x * x).sum().backward()
        with torch.no_grad():
            for w in weights:
                w.sub_(LR * w.grad)
                w.grad = None
    return [w.detach() for w in weights]


def _reference(cfg: TrainConfig) -> tuple[torch.Tensor, ...]:
    """:func:`reference_weights`, cached on the fields it depends on (the offload's own fields, the order and the
    checks change nothing of it: keyed on the whole configuration, the cache missed across drawn schedules)."""
    return _reference_of(cfg.layers, cfg.mb, cfg.iters, cfg.kib, cfg.seed)


@functools.lru_cache(maxsize=64)
def _reference_of(layers: int, mb: int, iters: int, kib: int, seed: int) -> tuple[torch.Tensor, ...]:
    return tuple(reference_weights(TrainConfig(layers=layers, mb=mb, iters=iters, kib=kib, seed=seed)))


def body(dev: Device, variant: str, cfg: TrainConfig) -> dict[str, Any]:
    return train(dev, ao.VARIANTS[variant], cfg)


def oracle(cfg: TrainConfig, result: dict[str, Any]) -> list[str]:
    problems = [f"{label}: the popped tensor differs from the pushed one" for label in result["mismatches"]]
    for k, (got, want) in enumerate(zip(result["weights"], _reference(cfg), strict=True)):
        # equal first: a run that went right computed the reference's very bits, and equal costs a sixth of
        # allclose (which answers True wherever equal does)
        if not torch.equal(got, want) and not torch.allclose(got, want, rtol=1e-4, atol=1e-5):
            bad = int((~torch.isclose(got, want, rtol=1e-4, atol=1e-5)).sum())
            problems.append(f"weight {k}: {bad} of {want.numel()} values differ from the run without offload")
    return problems


PROGRAM = register(
    Program(
        name="activation_offload",
        doc="layer activations offloaded to pinned memory in forward and reloaded for backward (Megatron-LM)",
        clean=("FIXED",),
        buggy={
            "offload-inline-no-wait": "tensor_pop reloads inline on the compute stream with no edge on the D2H",
            "offload-queue-empty-cursor": "empty offload/reload queues end a chunk's forward early (fraction 0)",
        },
        actors=("host", "default", "d2h", "h2d"),
        config=TrainConfig,
        body=body,
        oracle=oracle,
        config_space={
            "layers": ("1", "2", "3", "4"),
            "mb": ("1", "2", "3"),
            "frac": ("0", "50", "100"),
            "iters": ("1", "2", "3"),
            "warmup": ("1", "0"),
            "evalfirst": ("0", "1"),
            "inflight": ("0", "1", "2"),
        },
        size_keys=("kib",),
        # the shrunk schedule, the same at upstream's 256 MiB per group (kib=128 on the GPU), and stalls of d2h
        # before the commit's copy (the upstream regression's)
        pinned={
            "offload-inline-no-wait": (
                "activation_offload/offload-inline-no-wait",
                "activation_offload/offload-inline-no-wait:kib=128",
                "activation_offload/offload-inline-no-wait:layers=2:d2h#0+20",
                "activation_offload/offload-inline-no-wait:layers=2,mb=2:d2h#0+50",
            ),
            "offload-queue-empty-cursor": ("activation_offload/offload-queue-empty-cursor:layers=2,warmup=0",),
        },
    )
)
