"""The harness of ``param_readiness`` (``reference/param_readiness.py``): weights, model, oracle, configuration.

The host actor spawns ranks ``rank0..`` (``dev.spawn_ranks``); each trains the
small model with its own ``default`` (compute), ``nccl`` and ``prefetch``
streams. In forward each layer reads its weight twice: itself, on compute,
after its pre-hook, and through the consumer's prefetched copy. The oracle
checks every row each rank read against the weights of the version that phase
must see.
"""

from __future__ import annotations

import functools
from typing import Any

import attrs
import torch

from reference import param_readiness as pr
from reference.contract import Device
from reference.schedule import in_range
from simdevice.programs import Program, register

_PERIOD = 1024


def weight_values(version: int, start: int, n: int) -> torch.Tensor:
    """The weights at flat bucket positions ``start..start+n`` after ``version`` optimizer steps."""
    return _pattern(start, n) + version * pr.STEP


@functools.lru_cache(maxsize=32)
def _pattern(start: int, n: int) -> torch.Tensor:
    # cached: on a GPU a layer is 64 MiB, and every trial loads and checks the same positions
    return (torch.arange(start, start + n) % _PERIOD).float()


def load(bucket: pr.Bucket, version: int) -> None:
    """The bucket holds the weights of ``version - 1``; its shard was just stepped to ``version``."""
    bucket.buffer.copy_(weight_values(version - 1, bucket.start, bucket.numel))
    lo = bucket.rank * bucket.shard_numel
    bucket.main_shard.copy_(weight_values(version, bucket.start + lo, bucket.shard_numel))


@attrs.frozen
class Model:
    layers: int
    bucket_layers: int
    numel: int
    iters: int
    overlap: bool
    #: start the first group's gather right after the optimizer step (else lazily, in the first pre-hook)
    eager: bool
    #: after each step, an evaluation forward with the hooks disabled
    evaluate: bool

    def rows(self) -> list[tuple[str, int]]:
        """What each row of a rank's result holds: (phase, weight version expected)."""
        out = []
        for it in range(self.iters):
            out.append((f"iteration {it} forward, the layer's own read", it))
            out.append((f"iteration {it} forward, the consumer's prefetched copy", it))
            if self.evaluate:
                out.append((f"evaluation after step {it + 1}", it + 1))
        return out


def layout(model: Model, world: int) -> list[int]:
    """Flat bucket position of each layer's weight, as the wrapper lays the buckets out."""
    starts, pos = [], 0
    for i in range(0, model.layers, model.bucket_layers):
        n = min(model.bucket_layers, model.layers - i)
        for j in range(n):
            starts.append(pos + j * model.numel)
        pos += -(-(n * model.numel) // world) * world
    return starts


def train(dev: Device, fixes: pr.Fixes, model: Model) -> torch.Tensor:
    """One rank: forward passes through a prefetching consumer, resets, optimizer steps; what forward read."""
    rank, world = dev.rank, dev.world_size
    layers = [pr.Param(f"layer{i}.weight", model.numel) for i in range(model.layers)]
    ddp = pr.DistributedDataParallel(dev, layers, model.bucket_layers, model.overlap, fixes, rank, world)
    for b in ddp.buckets:
        load(b, 0)
    consumer = pr.PrefetchingConsumer(dev, layers, fixes)
    rows = model.rows()
    seen = torch.empty(len(rows), model.layers, model.numel, dtype=torch.float32, device=dev.device)

    def after_step() -> None:
        if model.overlap and not model.eager:
            return  # lazy: the first pre-hook (or the consumer's callback) starts the first gather
        ddp.start_param_sync()

    after_step()
    row = 0
    for _ in range(model.iters):
        for i, w in enumerate(layers):
            if i == 0:
                consumer.prefetch(0)
            ddp.forward_pre_hook(w)
            if i + 1 < len(layers):
                consumer.prefetch(i + 1)
            # the layer's own forward reads its weight on compute, before it waits for the consumer's copy: compute
            # must have waited for the gather itself, whoever finished it
            seen[row, i].copy_(w.data)
            seen[row + 1, i].copy_(consumer.consume(i))
        row += 2
        ddp.finish_grad_sync()
        ddp.optimizer_step()
        after_step()
        if model.evaluate:
            ddp.disable_forward_pre_hook(param_sync=True)
            for i, w in enumerate(layers):
                seen[row, i].copy_(w.data)
            ddp.enable_forward_pre_hook()
            row += 1
    # wait (.cpu() synchronizes): the host reads what forward saw only once compute has copied it all
    return seen.cpu()


def problems(model: Model, world: int, results: list[torch.Tensor]) -> list[str]:
    """What the ranks read that was not the weights of the version each phase should see."""
    out = []
    starts = layout(model, world)
    for r, seen in enumerate(results):
        for k, (phase, version) in enumerate(model.rows()):
            for i, start in enumerate(starts):
                want = weight_values(version, start, model.numel)
                got = seen[k, i]
                if not torch.equal(got, want):
                    bad = got != want
                    off = ((got - want) / pr.STEP)[bad]
                    steps = sorted({int(v) for v in off[~off.isnan()].round().tolist()})
                    out.append(
                        f"rank {r} {phase}: layer {i} read {int(bad.sum())} of {model.numel} weights "
                        f"of another version (off by {steps} steps)"
                    )
    return out


@attrs.frozen
class ParamReadinessConfig:
    #: ranks of the data-parallel group
    ranks: int = attrs.field(default=2, validator=in_range(1, 8))
    layers: int = attrs.field(default=3, validator=in_range(1, 16))
    #: layers per bucket (one bucket per bucket group)
    bucket: int = attrs.field(default=1, validator=in_range(1, 16))
    iters: int = attrs.field(default=2, validator=in_range(1, 8))
    #: overlap the parameter all-gather with forward (1) or gather synchronously after the step (0)
    overlap: int = attrs.field(default=1, validator=in_range(0, 1))
    #: with overlap, start the first group's gather right after the step (1) or in the first pre-hook (0)
    eager: int = attrs.field(default=0, validator=in_range(0, 1))
    #: an evaluation forward with the hooks disabled after each step
    evaluate: int = attrs.field(default=1, validator=in_range(0, 1))
    #: one layer's weight in KiB (simulated; a GPU run multiplies it by 1024)
    kib: int = attrs.field(default=64, validator=in_range(1, 1 << 20))

    def model(self) -> Model:
        return Model(
            layers=self.layers,
            bucket_layers=self.bucket,
            numel=self.kib * 256,
            iters=self.iters,
            overlap=bool(self.overlap),
            eager=bool(self.eager),
            evaluate=bool(self.evaluate),
        )


def body(dev: Device, variant: str, cfg: ParamReadinessConfig) -> list[Any]:
    return dev.spawn_ranks(train, cfg.ranks, (pr.VARIANTS[variant], cfg.model()))


def oracle(cfg: ParamReadinessConfig, results: list[Any]) -> list[str]:
    if len(results) != cfg.ranks or any(r is None for r in results):
        return ["a rank returned no result"]
    return problems(cfg.model(), cfg.ranks, results)


_LAZY = "evaluate=0,iters=1,layers=2,ranks=1"
_EAGER = "eager=1,evaluate=0,iters=1,layers=2,ranks=1"
_EVAL = "bucket=2,eager=1,iters=1,layers=2,ranks=1"
#: the shrunk counterexample of each bug variant (``simdevice check``'s budget, derandomized)
SHRUNK = {
    "param-prefetch-no-ready": f"param_readiness/param-prefetch-no-ready:{_LAZY}",
    "param-ready-skips-undispatched": f"param_readiness/param-ready-skips-undispatched:{_LAZY}",
    "param-no-drain-on-disable": f"param_readiness/param-no-drain-on-disable:{_EVAL}",
}

MAX_RANKS = 3
ACTORS = ("host", *(f"rank{r}{s}" for r in range(MAX_RANKS) for s in ("", ".default", ".nccl", ".prefetch")))

PROGRAM = register(
    Program(
        name="param_readiness",
        doc="DDP's overlapped parameter all-gather and a prefetching consumer reading the next layer's weight",
        clean=("FIXED",),
        buggy={
            "param-prefetch-no-ready": "the consumer reads param.data without ensure_params_ready",
            "param-ready-skips-undispatched": "the readiness callback does not start a gather nobody dispatched",
            "param-no-drain-on-disable": "disabling the pre-hooks leaves an in-flight gather unwaited",
        },
        actors=ACTORS,
        config=ParamReadinessConfig,
        body=body,
        oracle=oracle,
        config_space={
            # smallest first: shrinking moves toward the first value
            "ranks": ("1", "2", "3"),
            "layers": ("2", "3", "4"),
            "bucket": ("1", "2", "4"),
            "iters": ("1", "2", "3"),
            "overlap": ("1", "0"),
            "eager": ("0", "1"),
            "evaluate": ("0", "1"),
        },
        size_keys=("kib",),
        # the shrunk schedules, and the same with NCCL stalled 2 ms so that the prefetch (or the evaluation) outruns
        # a gather still in flight (on the H200 the unstalled no-drain schedule read fresh weights)
        pinned={
            "param-prefetch-no-ready": (
                SHRUNK["param-prefetch-no-ready"],
                f"param_readiness/param-prefetch-no-ready:{_EAGER}:rank0.nccl#0+2",
            ),
            "param-ready-skips-undispatched": (SHRUNK["param-ready-skips-undispatched"],),
            "param-no-drain-on-disable": (
                f"param_readiness/param-no-drain-on-disable:{_EVAL}:rank0.nccl#1+2",
                SHRUNK["param-no-drain-on-disable"],
            ),
        },
    )
)
