"""The demonstration ``offload_reload`` (``reference/offload_reload.py``) as a program the tool fuzzes.

Variants ``correct`` and ``racy``; the oracle compares what each iteration
reloaded with the activation it offloaded.
"""

from __future__ import annotations

import attrs
import torch

from reference import offload_reload as demo
from reference.contract import Device
from reference.schedule import in_range
from simdevice.programs import Program, register


@attrs.frozen
class OffloadReloadConfig:
    #: activation size in KiB (simulated; the GPU test scales it)
    kib: int = attrs.field(default=16, validator=in_range(1, 1 << 20))
    #: compute kernels between the offload and the reload
    work: int = attrs.field(default=4, validator=in_range(0, 64))
    #: iterations (each with fresh activation values)
    iters: int = attrs.field(default=2, validator=in_range(1, 16))
    #: scratch buffer size, as a multiple of the activation
    scratch: int = attrs.field(default=16, validator=in_range(1, 1024))


def body(dev: Device, variant: str, cfg: OffloadReloadConfig) -> list[torch.Tensor]:
    return demo.offload_reload(dev, demo.VARIANTS[variant], cfg.kib * 256, cfg.work, cfg.iters, cfg.scratch)


def oracle(cfg: OffloadReloadConfig, seen: list[torch.Tensor]) -> list[str]:
    n = cfg.kib * 256
    problems = []
    for it, got in enumerate(seen):
        want = torch.arange(n, dtype=torch.float32) + it * n
        if not torch.equal(got, want):
            bad = int((got != want).sum())
            problems.append(f"iteration {it}: {bad} of {n} reloaded values differ from the offloaded ones")
    return problems


PROGRAM = register(
    Program(
        name="offload_reload",
        doc="D2H into a pinned buffer on a side stream, then an H2D reload on the compute stream",
        clean=("correct",),
        buggy={"racy": "the reload does not wait for the event recorded after the D2H"},
        actors=("host", "default", "d2h"),
        config=OffloadReloadConfig,
        body=body,
        oracle=oracle,
        size_keys=("kib",),
        pinned={"racy": ("offload_reload/racy::d2h#0+1",)},
    )
)
