"""An op given arguments a GPU refuses raises what the GPU raised, at the call: the error a program's ``except
RuntimeError`` sees. Each expectation is an H100's answer (``scripts/api-sweep run --binary`` over
``torch.nn.functional``, docs/confirmations.md, fifty-third run; and over Tensor methods and ``torch``, the fifty-first
run). Before, a Python meta kernel's own failure came out
(``conv1d``'s meta kernel indexing a 2-d weight's third size, an ``IndexError``; ``nll_loss``'s and ``embedding``'s
an ``AssertionError``), and an op whose CUDA wrapper checks its arguments' devices refused a host tensor's shape
before its device (``nll_loss`` given a 2-d host target), where CUDA's wrapper checks devices first; and an op given
a dtype its kernels do not cover (``bitwise_and`` of floats), or a random op given arguments it refuses, raised as
the stream ran it, past the program's ``try``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F  # noqa: N812 (as programs name it)

import simdevice

#: what each call raised on an H100 (type, and the message's start)
H100: dict[str, tuple[Callable[[torch.Tensor], Any], str, str]] = {
    "conv1d a 2-d weight": (lambda d: F.conv1d(d, d), "RuntimeError",
                            "weight should have at least three dimensions"),
    "conv_transpose1d a 2-d weight": (lambda d: F.conv_transpose1d(d, d), "RuntimeError",
                                      "weight should have at least three dimensions"),
    "embedding a 0-d weight": (lambda d: F.embedding(d, torch.tensor(0.25)), "RuntimeError",
                               "'weight' must be 2-D"),
    "nll_loss a 2-d target": (lambda d: F.nll_loss(d, d), "RuntimeError",
                              "0D or 1D target tensor expected, multi-target not supported"),
    "nll_loss a 2-d host target": (lambda d: F.nll_loss(d, torch.ones(4, 4)), "RuntimeError",
                                   "Expected all tensors to be on the same device, but got target is on cpu, "
                                   "different from other tensors on cuda:0"),
    "grid_sample a 0-d host grid": (lambda d: F.grid_sample(d, torch.tensor(0.25), align_corners=False),
                                    "RuntimeError", "Expected all tensors to be on the same device, but got grid is "
                                    "on cpu, different from other tensors on cuda:0"),
    # a dtype the op's kernels do not cover (raised at the call, named as CUDA's kernel: the stream's before)
    "bitwise_and of floats": (lambda d: d.bitwise_and(d), "NotImplementedError",
                              "\"bitwise_and_cuda\" not implemented for 'Float'"),
    "gcd of floats": (lambda d: torch.gcd(d, d), "NotImplementedError", "\"gcd_cuda\" not implemented for 'Float'"),
    "bincount of floats": (lambda d: torch.bincount(d.flatten()), "NotImplementedError",  # (its values shape it)
                           "\"bincount_cuda\" not implemented for 'Float'"),
    # in place, its devices before its dtype (whatever was tried of the same shapes on the device before)
    "bitwise_and_ of floats, then of a 2-d host tensor": (
        lambda d: (_raised_in(lambda: d.bitwise_and_(d.clone())), d.bitwise_and_(torch.ones(4, 4))),
        "RuntimeError",
        "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"),
    "gcd_ of a 2-d host tensor": (lambda d: d.gcd_(torch.ones(4, 4)), "RuntimeError",
                                  "Expected all tensors to be on the same device, but got other is on cpu, different "
                                  "from other tensors on cuda:0"),
    "poisson_nll_loss a 2-d host target": (lambda d: F.poisson_nll_loss(d, torch.ones(4, 4)), "RuntimeError",
                                           "Expected all tensors to be on the same device, but found at least two "
                                           "devices, cuda:0 and cpu!"),
}


def _raised_in(call: Callable[[], Any]) -> str:
    try:
        call()
    except Exception as e:  # (its type is what is compared)
        return type(e).__name__
    return "ok"


def _raised(call: Callable[[torch.Tensor], Any]) -> tuple[str, str]:
    got: list[tuple[str, str]] = []

    def program() -> None:
        d = torch.full((4, 4), 0.5, device="cuda")
        try:
            call(d)
        except Exception as e:  # (its type is what is compared)
            got.append((type(e).__name__, str(e)))

    s = simdevice.cuda()
    s.run(program)
    assert s.result is not None
    assert not s.result.reports, s.result.reports  # (raised at the call: the stream ran nothing that failed)
    assert got, "the call was taken"
    return got[0]


@pytest.mark.parametrize("name", sorted(H100))
def test_a_refused_call_raises_what_an_h100_raised(name: str) -> None:
    call, kind, start = H100[name]
    got_kind, got_text = _raised(call)
    assert (got_kind, got_text[:len(start)]) == (kind, start)


@torch.library.custom_op("simdevice_test::twice", mutates_args=())
def _twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_twice.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    raise IndexError("tuple index out of range")  # (a fake kernel's own failure, as conv1d's meta kernel has)


def test_a_meta_kernel_s_own_failure_gives_way_to_the_host_kernel_s_shapes() -> None:
    """Where an op's meta (fake) kernel fails on arguments its kernel takes, its outputs are shaped as the host
    kernel shapes them on zeros and it runs on the stream: a call the GPU runs is not refused here."""
    got: list[torch.Tensor] = []

    def program() -> None:
        t = torch.full((3, 5), 0.5, device="cuda")
        got.append(torch.ops.simdevice_test.twice(t).cpu())

    s = simdevice.cuda()
    s.run(program)
    assert s.result is not None
    assert not s.result.reports, s.result.reports
    assert torch.equal(got[0], torch.ones(3, 5))
