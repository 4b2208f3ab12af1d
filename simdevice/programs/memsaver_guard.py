"""The harness of ``memsaver_guard`` (``reference/memsaver_guard.py``): configuration, expected weights, oracle.

The oracle checks what a user would see: the weights the engine received, the
handshakes, no transfer after a failed connection, the guard exited on every
path and never entered with offloading off. The allocator facts (allocations
served from paused segments, allocations made from the paused pool while it
is paused, fresh segments included, such as the barrier's one-element tensor
outside ``disable()``, and handles released) are checked by the property tests
on the simulated device's memory saver.

Hypothesis draws the configuration (offloading, reconnecting, a failing
connection, cycles, dropping gradients, sizes, the allocator's reuse choice)
and delays on the host, the compute stream and the communication stream.
The variant ``memsaver-free-while-paused-twice`` is the fixed protocol on a
simulated memory-saver library with the bug (:data:`VARIANTS`).
"""

from __future__ import annotations

import attrs
import torch

from reference import memsaver_guard as mg
from reference.contract import Device
from reference.schedule import in_range
from simdevice.programs import Program, register
from simdevice.runtime import Options
from simdevice.runtime.memsaver import LibraryFixes

#: variant -> (the protocol's fixes, the simulated memory-saver library's)
VARIANTS: dict[str, tuple[mg.Fixes, LibraryFixes]] = {
    "FIXED": (mg.FIXED, LibraryFixes()),
    "memsaver-connect-unguarded": (mg.CONNECT_UNGUARDED, LibraryFixes()),
    "memsaver-free-while-paused-twice": (mg.FIXED, LibraryFixes(release_paused_once=False)),
}


@attrs.frozen
class MemsaverConfig:
    #: model size, KiB (weights and one optimizer state, float32; a GPU run reads MiB)
    kib: int = attrs.field(default=4, validator=in_range(1, 1 << 20))
    #: gradient buffer and per-step activations, KiB (at least ``kib``)
    act_kib: int = attrs.field(default=32, validator=in_range(1, 1 << 20))
    #: the connection handshake's device tensor, KiB
    conn_kib: int = attrs.field(default=2, validator=in_range(1, 1 << 20))
    #: one transfer bucket, KiB
    bucket_kib: int = attrs.field(default=2, validator=in_range(1, 1 << 20))
    #: trainer offloading: sleep (pause) before each weight sync, wake (resume) after it
    offload: int = attrs.field(default=1, validator=in_range(0, 1))
    #: 1: the engines change every cycle, so each sync reconnects (asleep); 0: one connection, made awake
    reconnect: int = attrs.field(default=1, validator=in_range(0, 1))
    #: 1: the first reconnection inside update_weights raises
    fail: int = attrs.field(default=0, validator=in_range(0, 1))
    #: train / sleep / sync / wake cycles
    cycles: int = attrs.field(default=2, validator=in_range(1, 8))
    #: 1: asleep, the trainer drops its gradient buffer and empties the allocator's cache
    drop: int = attrs.field(default=1, validator=in_range(0, 1))
    #: the simulated caching allocator's reuse choice among fitting free blocks (0: best fit; CUDA ignores it)
    pick: int = attrs.field(default=0, validator=in_range(0, 7))

    def __attrs_post_init__(self) -> None:
        if self.act_kib < self.kib:
            raise ValueError(f"act_kib ({self.act_kib}) must be at least kib ({self.kib})")

    def plan(self) -> mg.Plan:
        return mg.Plan(
            n=self.kib * 256, act_n=self.act_kib * 256, conn_n=self.conn_kib * 256, bucket_n=self.bucket_kib * 256,
            offload=bool(self.offload), reconnect=bool(self.reconnect), fail=bool(self.fail), cycles=self.cycles,
            drop=bool(self.drop),
        )


def expected_weights(n: int, steps: int) -> torch.Tensor:
    """The trainer's weights after ``steps`` training steps (the values are exact in float32)."""
    w, m = mg.initial_weights(n), torch.zeros(n)
    for step in range(1, steps + 1):
        m = m * 0.5 + float(step)
        w = w - 0.25 * m
    return w


def oracle(cfg: MemsaverConfig, record: mg.SyncRecord) -> list[str]:
    """What the record shows wrong: values the engine received, the guard, the transfer after a failure."""
    problems = []
    n = cfg.kib * 256
    want_updated = [not (cfg.fail and cfg.reconnect and c == 0) for c in range(cfg.cycles)]
    if record.updated != want_updated:
        problems.append(f"updates completed per cycle {record.updated}, expected {want_updated}")
    if record.transfers != sum(want_updated):
        problems.append(f"{record.transfers} transfers, expected {sum(want_updated)} (none after a failed connection)")
    if record.guard_entries != record.guard_exits:
        problems.append(f"the guard was entered {record.guard_entries} times but exited {record.guard_exits} times")
    if not cfg.offload and record.guard_entries:
        problems.append(f"offloading is off but the guard was entered {record.guard_entries} times")
    if not all(record.handshakes):
        problems.append(f"connection handshakes returned other bytes than sent: {record.handshakes}")
    sent = torch.zeros(n)
    for cycle, got in enumerate(record.received):
        if cycle < len(want_updated) and want_updated[cycle]:
            sent = expected_weights(n, cycle + 1)
        if not torch.equal(got, sent):
            bad = int((got != sent).sum())
            problems.append(f"cycle {cycle}: {bad} of {n} engine weights differ from the trainer's")
    return problems


def body(dev: Device, variant: str, cfg: MemsaverConfig) -> mg.SyncRecord:
    return mg.run_lifecycle(dev, VARIANTS[variant][0], cfg.plan())


def sim_options(variant: str, cfg: MemsaverConfig) -> Options:
    return Options(library=VARIANTS[variant][1], alloc_pick=cfg.pick)


PROGRAM = register(
    Program(
        name="memsaver_guard",
        doc="a sleeping trainer (memory-saver region paused) reconnects to the rollout engines and sends its "
        "weights; allocations must go around the paused pool with disable()",
        clean=("FIXED",),
        buggy={
            "memsaver-connect-unguarded": "only the transfer runs inside disable(): the connection's handshake "
            "tensor is served from a cached block of a paused segment",
            "memsaver-free-while-paused-twice": "freeing a paused segment releases its physical handle again "
            "(the pause already released it): the process aborts",
        },
        actors=("host", "default", "nccl"),
        config=MemsaverConfig,
        body=body,
        oracle=oracle,
        config_space={
            "offload": ("1", "0"),
            "reconnect": ("1", "0"),
            "fail": ("0", "1"),
            "cycles": ("2", "1", "3"),
            "drop": ("1", "0"),
            "kib": ("4", "2", "16"),
            "conn_kib": ("2", "1", "8"),
            "act_kib": ("32", "16"),
            "pick": ("0", "1", "2"),
        },
        size_keys=("kib", "act_kib", "conn_kib", "bucket_kib"),
        sim_options=sim_options,
        pinned={
            "memsaver-connect-unguarded": (
                "memsaver_guard/memsaver-connect-unguarded:act_kib=128,bucket_kib=16,conn_kib=8,drop=0,kib=64",
            ),
        },
    )
)
