"""Registers ``activation_offload``: reference/activation_offload.py as a program the tool fuzzes.

The body trains the reference's small model (layers x microbatches x
iterations, forward then backward through ``saved_tensors_hooks``) with one
variant's ``Fixes``. The oracle: every popped tensor equals the pushed one
and the final weights equal a CPU run of the same model without offload.
A ``Chunk mismatch`` ends the run as a host error.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from reference import activation_offload as ao
from simdevice.programs import Program, int_config, register


@functools.lru_cache(maxsize=16)
def _reference(cfg: ao.TrainConfig) -> tuple[torch.Tensor, ...]:
    return tuple(ao.reference_weights(cfg))


def body(dev: Any, variant: str, cfg: ao.TrainConfig) -> dict[str, Any]:
    return ao.train(dev, ao.VARIANTS[variant], cfg)


def oracle(cfg: ao.TrainConfig, result: dict[str, Any]) -> list[str]:
    problems = [f"{label}: the popped tensor differs from the pushed one" for label in result["mismatches"]]
    for k, (got, want) in enumerate(zip(result["weights"], _reference(cfg), strict=True)):
        if not torch.allclose(got, want, rtol=1e-4, atol=1e-5):
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
        config=lambda values: int_config(ao.TrainConfig, values),
        body=body,
        oracle=oracle,
        max_index=12,
        config_space={
            "layers": ("1", "2", "3", "4"),
            "mb": ("1", "2", "3"),
            "frac": ("0", "50", "100"),
            "iters": ("1", "2", "3"),
            "warmup": ("1", "0"),
            "evalfirst": ("0", "1"),
        },
        size_keys=("kib",),
    )
)
