"""Where a call given a host tensor among device ones also has arguments a kernel refuses, the error raised at the
call is the one a GPU raises first (``dispatch._devices_first``): TensorIterator computes its shapes before it checks
devices, so a shape that does not broadcast is refused before a host tensor; it refuses a host tensor before a
kernel's dtypes, but a 0-d host tensor is a number to it (the dtype is refused); and an op that copies its host
argument to the device itself (``bernoulli_``'s ``p``) refuses its dtype, not the host tensor. Mutations caught (a
sweep of the twenty-ninth sitting's rules): the host tensor refused before any error, a 0-d host tensor counted as a
host tensor, an op that copies its host arguments refusing one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import simdevice

CASES: dict[str, tuple[Callable[[], Any], str, str]] = {
    "add_ of a host tensor that does not broadcast": (
        lambda: torch.full((4, 4), 0.5, device="cuda").add_(torch.ones(3)), "RuntimeError",
        "The size of tensor a (4) must match the size of tensor b (3) at non-singleton dimension 1"),
    "bitwise_and_ of floats and a 0-d host tensor": (
        lambda: torch.full((4, 4), 0.5, device="cuda").bitwise_and_(torch.tensor(1.0)), "NotImplementedError",
        "\"bitwise_and_cuda\" not implemented for 'Float'"),
    "bernoulli_ of a complex destination and host probabilities": (
        lambda: torch.zeros(4, dtype=torch.complex64, device="cuda").bernoulli_(torch.full((4,), 0.5)),
        "NotImplementedError", "not implemented for 'ComplexFloat'"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_first_refusal_a_gpu_makes_is_raised_at_the_call(case: str) -> None:
    call, kind, words = CASES[case]
    got: list[tuple[str, str]] = []

    def program() -> None:
        try:
            call()
        except Exception as e:  # (its type is what is compared)
            got.append((type(e).__name__, str(e)))

    s = simdevice.cuda()
    s.run(program)
    s.assert_clean()
    assert len(got) == 1
    assert got[0][0] == kind, got
    assert words in got[0][1], got
