"""Rule (SimTensor.type): ``t.type()`` with no argument names the shown device's type; ``t.type(dtype)`` still
converts, as torch's does (only the no-argument form is rewritten)."""

from __future__ import annotations

import torch

import simdevice


def test_type_with_a_dtype_converts_and_without_names() -> None:
    with simdevice.cuda() as sim:
        x = torch.ones(3, device="cuda")
        name = x.type()
        y = x.type(torch.float64)
        assert isinstance(y, torch.Tensor), y
        got = (y.dtype, y.device.type, y.cpu().tolist())
    sim.assert_clean()
    assert name == "torch.cuda.FloatTensor"
    assert got == (torch.float64, "cuda", [1.0, 1.0, 1.0])
