"""An in-place or ``out=`` op whose destination overlaps one of its inputs in part (``x[1:].copy_(x[:-1])``, a shift
written as one copy), or overlaps itself (an expanded destination), raises torch's memory-overlap error at the call,
on the host, as TensorIterator's check does before CUDA launches anything. Before, the partial overlap ran clean with
a value no GPU computes (the destination was computed on a copy of itself), and the internal overlap was raised from
the stream, past the program's ``try``."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import simdevice

CASES: dict[str, Callable[[torch.Tensor], object]] = {
    "copy_ shifted": lambda x: x[1:].copy_(x[:-1]),
    "add_ shifted": lambda x: x[1:].add_(x[:-1]),
    "add out= shifted": lambda x: torch.add(x[:-1], 1.0, out=x[1:]),
    "add_ expanded": lambda x: x[:1].expand(4).add_(1.0),
}


@pytest.mark.parametrize("case", list(CASES))
def test_an_overlapping_destination_raises_at_the_call_as_torch_does(case: str) -> None:
    def program() -> None:
        x = torch.arange(16, dtype=torch.float32, device="cuda")
        with pytest.raises(RuntimeError, match="single memory location"):  # (a program's own try, in a test)
            CASES[case](x)
        assert torch.equal(x.cpu(), torch.arange(16, dtype=torch.float32)), "the refused op wrote"

    host = torch.arange(16, dtype=torch.float32)  # torch's own check, on host memory
    with pytest.raises(RuntimeError, match="single memory location"):
        CASES[case](host)
    with simdevice.cuda() as sim:
        program()
    sim.assert_clean()


def test_disjoint_parts_of_one_allocation_run_as_ever() -> None:
    def program() -> None:
        x = torch.arange(16, dtype=torch.float32, device="cuda")
        x[8:].copy_(x[:8])
        x[::2].mul_(x[1::2])
        assert x[8:].cpu().tolist() == (x[:8].cpu()).tolist()

    with simdevice.cuda() as sim:
        program()
    sim.assert_clean()


def test_a_foreach_op_is_not_refused_as_its_fast_route_does_not_check() -> None:
    """``_foreach_add_`` of lists whose tensors overlap in part: CUDA's multi-tensor fast route (each tensor
    contiguous, the lists' sizes and strides equal) has no overlap check, so it runs; the CPU's per-tensor fallback,
    which a trial on the CPU would take, refuses it."""

    def program() -> None:
        x = torch.arange(16, dtype=torch.float32, device="cuda")
        torch._foreach_add_([x[1:5]], [x[0:4]])
        torch.cuda.synchronize()

    host = torch.arange(16, dtype=torch.float32)
    with pytest.raises(RuntimeError, match="single memory location"):
        torch._foreach_add_([host[1:5]], [host[0:4]])
    with simdevice.cuda() as sim:
        program()
    sim.assert_clean()
