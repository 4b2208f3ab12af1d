"""The ``param_readiness`` program: ``reference.param_readiness`` on 1..3 ranks in one simulation.

The host actor spawns ranks ``rank0..`` (``dev.spawn_ranks``); each trains the
small model with its own ``default`` (compute), ``nccl`` and ``prefetch``
streams. The oracle checks every row each rank read against the weights of
the version that phase must see.
"""

from __future__ import annotations

from typing import Any

import attrs

from reference import param_readiness as pr
from reference.schedule import in_range
from simdevice.programs import Program, int_config, register


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

    def model(self) -> pr.Model:
        return pr.Model(
            layers=self.layers,
            bucket_layers=self.bucket,
            numel=self.kib * 256,
            iters=self.iters,
            overlap=bool(self.overlap),
            eager=bool(self.eager),
            evaluate=bool(self.evaluate),
        )


def body(dev: Any, variant: str, cfg: ParamReadinessConfig) -> list[Any]:
    return dev.spawn_ranks(pr.train, cfg.ranks, (pr.VARIANTS[variant], cfg.model()))  # type: ignore[no-any-return]


def oracle(cfg: ParamReadinessConfig, results: list[Any]) -> list[str]:
    if len(results) != cfg.ranks or any(r is None for r in results):
        return ["a rank returned no result"]
    return pr.problems(cfg.model(), cfg.ranks, results)


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
        config=lambda values: int_config(ParamReadinessConfig, values),
        body=body,
        oracle=oracle,
        max_index=12,
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
    )
)
