"""The harness of ``zcc`` (``reference/zcc.py``): configuration, expected states, oracle.

The oracle replays the trainer's arithmetic on the CPU and compares every
dumped snapshot with the fused buffer as of the end of its step. Hypothesis
draws configurations outside the fixed protocol's documented gaps (a
step-begin mutation with several chunks or with the EMA-only branch): those
are shown by expected-failure tests in ``tests/property/mechanisms/test_zcc.py``.
"""

from __future__ import annotations

import functools
from typing import Any

import attrs
import torch

from reference import zcc
from reference.contract import Device
from reference.schedule import in_range
from simdevice.programs import Program, int_config, register


@attrs.frozen
class ZccConfig:
    #: training steps
    steps: int = attrs.field(default=3, validator=in_range(1, 6))
    #: save a checkpoint every ``save`` steps
    save: int = attrs.field(default=1, validator=in_range(1, 6))
    #: EMA-only snapshot every ``ema`` steps that are not save steps (0: never)
    ema: int = attrs.field(default=0, validator=in_range(0, 6))
    #: worker processes
    workers: int = attrs.field(default=1, validator=in_range(1, 3))
    #: ``offload_chunks`` = ``pipeline_hooks_steps`` = gradient-accumulation micro-steps
    chunks: int = attrs.field(default=1, validator=in_range(1, 3))
    #: 1: an ``on_step_begin`` callback rescales the parameters in place (FP8 quantization)
    mutate: int = attrs.field(default=1, validator=in_range(0, 1))
    #: 1: the trainer logs the loss with ``.item()`` before ``on_step_end`` (a host sync the fix relies on)
    log: int = attrs.field(default=1, validator=in_range(0, 1))
    #: how long writing a dump to disk takes, in units (the simulator knows no file system)
    dump: int = attrs.field(default=8, validator=in_range(0, 1000))
    #: size of the parameters in KiB (the fused buffer holds twice that: parameters and moments)
    kib: int = attrs.field(default=128, validator=in_range(1, 1 << 20))

    def plan(self) -> zcc.Plan:
        return zcc.Plan(
            steps=self.steps, save=self.save, ema=self.ema, workers=self.workers, chunks=self.chunks,
            mutate=bool(self.mutate), log=bool(self.log), dump=self.dump, numel=self.kib * 256,
        )


def snapshot_steps(cfg: ZccConfig) -> list[tuple[int, str]]:
    """The (step, kind) of every snapshot the run takes, in order."""
    out = []
    plan = cfg.plan()
    for step in range(1, cfg.steps + 1):
        if plan.is_save_step(step):
            out.append((step, "checkpoint"))
        elif plan.is_ema_step(step):
            out.append((step, "ema"))
    return out


@functools.lru_cache(maxsize=32)
def expected_states(steps: int, chunks: int, mutate: bool, n: int) -> tuple[torch.Tensor, ...]:
    """The fused buffer at the end of each step 0..steps, replayed on the CPU (read-only)."""
    storage = zcc.initial_storage(n)
    params, moments = storage[:n], storage[n:]
    grads = torch.zeros(n, dtype=torch.float32)
    states = [storage.clone()]
    for _ in range(steps):
        if mutate:
            zcc.quantize_fp8_scale(params)
        for _ in range(chunks):
            zcc.forward_backward(params, grads)
        zcc.optimizer_update(params, moments, grads)
        states.append(storage.clone())
    return tuple(states)


def zcc_body(dev: Device, variant: str, cfg: ZccConfig) -> dict[str, Any]:
    return zcc.train(dev, zcc.VARIANTS[variant], cfg.plan())


def zcc_oracle(cfg: ZccConfig, result: dict[str, Any]) -> list[str]:
    n = cfg.kib * 256
    states = expected_states(cfg.steps, cfg.chunks, bool(cfg.mutate), n)
    problems = []
    want = snapshot_steps(cfg)
    got = [(step, kind) for step, kind, _, _ in result["snapshots"]]
    if got != want:
        problems.append(f"snapshots dumped for {got}, expected for {want}")
    for step, kind, worker, data in result["snapshots"]:
        if not torch.equal(data, states[step]):
            bad = int((data != states[step]).sum())
            problems.append(
                f"{kind} snapshot of step {step} (worker{worker}) differs from the buffers at the end of "
                f"step {step} in {bad} of {data.numel()} values"
            )
    if not torch.equal(result["final"], states[cfg.steps]):
        problems.append(f"the trainer's buffers after step {cfg.steps} are wrong")
    return problems


def in_documented_gap(values: dict[str, str]) -> bool:
    """Whether a configuration reaches a gap the upstream fix leaves open (see ``reference.zcc``)."""
    cfg = int_config(ZccConfig, values)
    return bool(cfg.mutate) and (cfg.chunks > 1 or any(kind == "ema" for _, kind in snapshot_steps(cfg)))


PROGRAM = register(
    Program(
        name="zcc",
        doc="zero-cost checkpoint: worker processes copy the trainer's fused buffers over IPC, "
        "a shared-value echo is the only barrier",
        clean=("FIXED",),
        buggy={
            "zcc-frozen-step": "the manager's step is set only at the first save: a reused worker's old echo "
            "releases the barrier",
            "zcc-late-barrier": "the barrier waits only at on_optimizer_begin, after on_step_begin mutated the buffers",
            "zcc-no-step-begin-guard": "the step-begin barrier waits for a chunk that only this step dispatches",
        },
        actors=("host", "default", "worker0", "worker0.d2h", "worker1", "worker1.d2h", "worker2", "worker2.d2h"),
        config=ZccConfig,
        body=zcc_body,
        oracle=zcc_oracle,
        config_space={
            "steps": ("3", "1", "2", "4", "5", "6"),
            "save": ("1", "2", "3"),
            "ema": ("0", "2", "3"),
            "workers": ("1", "2", "3"),
            "chunks": ("1", "2", "3"),
            "mutate": ("1", "0"),
        },
        size_keys=("kib",),
        config_filter=lambda values: not in_documented_gap(values),
        # shrunk searches for a torn snapshot (one chunk, a step-begin mutation): they tear in values, not only in
        # the race detector
        pinned={
            "zcc-frozen-step": ("zcc/zcc-frozen-step::worker0.d2h#1+1",),
            "zcc-late-barrier": ("zcc/zcc-late-barrier::worker0#0+1",),
        },
    )
)
