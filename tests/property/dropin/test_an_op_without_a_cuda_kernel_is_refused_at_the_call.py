"""An op native_functions.yaml gives no kernel a dense CUDA tensor reaches (a dispatch section with neither ``CUDA``
nor a composite key: ``histogram``'s is ``CPU, MPS``, the quantized queries' ``QuantizedCPU, QuantizedCUDA``) raises
``NotImplementedError`` at the call, as an H100 raised each of these (``scripts/api-sweep run``, docs/confirmations.md,
fifty-first run). Before, ``histogram`` of a device tensor ran here (a program a GPU stops was clean), and the others
raised from the stream, past the program's ``try``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import simdevice

NO_CUDA_KERNEL: dict[str, Callable[[torch.Tensor], Any]] = {
    "histogram": lambda t: torch.histogram(t, bins=4),
    "int_repr": lambda t: t.int_repr(),
    "q_scale": lambda t: t.q_scale(),
    "native_norm": lambda t: torch.native_norm(t),
}


def _raised(call: Callable[[torch.Tensor], Any]) -> str:
    got: list[str] = []

    def program() -> None:
        t = torch.full((4, 4), 0.5, device="cuda")
        try:
            call(t)
        except NotImplementedError as e:
            got.append(str(e))
        else:
            got.append("ok")

    with simdevice.cuda() as sim:
        program()
    sim.assert_clean()
    return got[0]


@pytest.mark.parametrize("name", sorted(NO_CUDA_KERNEL))
def test_an_op_a_gpu_has_no_kernel_of_raises_at_the_call(name: str) -> None:
    assert _raised(NO_CUDA_KERNEL[name]).startswith("Could not run 'aten::")


def test_its_kin_with_a_cuda_kernel_runs() -> None:
    """``histc`` (a CUDA kernel) and ``histogram`` of a host tensor run."""
    assert _raised(lambda t: torch.histc(t, bins=4, min=0, max=1)) == "ok"
    assert _raised(lambda t: torch.histogram(t.cpu(), bins=4)) == "ok"
