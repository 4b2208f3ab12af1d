"""An op given no dtype takes torch's default one where torch does (a factory; an integer tensor times a float),
whatever the default was when the same op was first seen. The simulator keeps each op's output shapes and dtypes
per signature, across runs; the default dtype was not part of it, so after ``torch.set_default_dtype`` (model-
construction code sets it around building the model) the same call still made its first dtype."""

from __future__ import annotations

import torch

import simdevice


def _dtypes() -> tuple[torch.dtype, ...]:
    ints = torch.arange(3, device="cuda")
    made = torch.empty(2, 3, device="cuda")
    return torch.ones(3, device="cuda").dtype, made.dtype, (ints * 0.5).dtype, torch.nn.Linear(3, 2).cuda().weight.dtype


def test_the_default_dtype_set_between_two_same_calls_is_taken() -> None:
    with simdevice.cuda() as sim:
        first = _dtypes()
        before = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            second = _dtypes()
        finally:
            torch.set_default_dtype(before)
        third = _dtypes()
    sim.assert_clean()
    assert first == third == (torch.float32,) * 4
    assert second == (torch.float64,) * 4
