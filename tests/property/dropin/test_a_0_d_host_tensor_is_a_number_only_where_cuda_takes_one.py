"""A 0-d host tensor given to an op on device tensors is taken as a number where CUDA takes it as one
(TensorIterator's ops: ``add``, ``mul``, ``pow``, ``maximum``; and composite ones, ``allclose``, ``fill``, ``ldexp``),
and refused with CUDA's error where the op's CUDA wrapper checks its tensors' devices (``clamp``'s bounds,
``logaddexp``, ``equal``, ``isin``): torchgen generates that check for a function native_functions.yaml gives a CUDA
kernel of its own and no ``device_check: NoCheck``. Before, every op took it as a number, so a program a GPU stops
ran here. Each answer here is the one an H100 gave (``scripts/api-sweep run --binary``, docs/confirmations.md,
fifty-first run: after this rule, no call the GPU takes is refused here)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import simdevice

TAKEN: dict[str, Callable[[torch.Tensor, torch.Tensor], Any]] = {
    "add": lambda t, s: t.add(s),
    "mul": lambda t, s: t.mul(s),
    "pow": lambda t, s: t.pow(s),
    "maximum": lambda t, s: t.maximum(s),
    "allclose": lambda t, s: torch.allclose(t, s),
    "fill": lambda t, s: torch.fill(t, s),
    "ldexp": lambda t, s: t.ldexp(s),
}
REFUSED: dict[str, Callable[[torch.Tensor, torch.Tensor], Any]] = {
    "clamp": lambda t, s: t.clamp(s),
    "logaddexp": lambda t, s: t.logaddexp(s),
    "equal": lambda t, s: t.equal(s),
    "isin": lambda t, s: torch.isin(t, s),
}


def _outcome(call: Callable[[torch.Tensor, torch.Tensor], Any]) -> str:
    got: list[str] = []

    def program() -> None:
        t = torch.full((4, 4), 0.5, device="cuda")
        try:
            call(t, torch.tensor(0.25))
        except RuntimeError as e:
            got.append(str(e))
        else:
            got.append("ok")

    s = simdevice.cuda()
    s.run(program)
    assert s.result is not None
    assert not s.result.reports, s.result.reports
    return got[0]


@pytest.mark.parametrize("name", sorted(TAKEN))
def test_an_op_cuda_takes_a_host_number_in_takes_it(name: str) -> None:
    assert _outcome(TAKEN[name]) == "ok"


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_an_op_whose_cuda_wrapper_checks_devices_refuses_it(name: str) -> None:
    assert _outcome(REFUSED[name]).startswith("Expected all tensors to be on the same device")
