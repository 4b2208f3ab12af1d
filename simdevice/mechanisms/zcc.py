"""The zero-cost checkpoint barrier (``reference.zcc``) as the program ``zcc``.

The oracle replays the trainer's arithmetic on the CPU and compares every
dumped snapshot with the fused buffer as of the end of its step. Hypothesis
draws configurations outside the fixed protocol's documented gaps (a
step-begin mutation with several chunks or with the EMA-only branch): those
are shown by expected-failure tests in ``tests/property/test_zcc.py``.
"""

from __future__ import annotations

from typing import Any

import torch

from reference.zcc import VARIANTS, ZccConfig, expected_states, snapshot_steps, train
from simdevice.programs import Program, int_config, register


def zcc_body(dev: Any, variant: str, cfg: ZccConfig) -> dict[str, Any]:
    return train(dev, VARIANTS[variant], cfg)


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
        config=lambda values: int_config(ZccConfig, values),
        body=zcc_body,
        oracle=zcc_oracle,
        max_index=12,
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
    )
)
