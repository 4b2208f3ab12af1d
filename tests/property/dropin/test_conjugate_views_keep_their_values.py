"""Lazily conjugated and negated views of device tensors (``conj()`` of a complex tensor, its imaginary part of a
conjugate) compute as torch computes them: on their conjugated values, not on their bytes as they lie."""

from __future__ import annotations

import torch

import simdevice


def _ops(device: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, dtype=torch.complex64, generator=g).to(device)
    out = {
        "mul": x * x.conj(),
        "mm": x @ x.mH,
        "imag_of_conj": x.conj().imag + 1,
        "clone": x.conj().clone(),
        "sum": x.conj().sum(),
    }
    z = x.clone()
    z.conj().mul_(2j)  # an in-place write through the conjugate view
    out["inplace"] = z
    flags = torch.tensor([x.conj().is_conj(), x.conj().imag.is_neg()])
    return {**{k: v.cpu() for k, v in out.items()}, "flags": flags}


def test_a_conjugate_view_computes_on_conjugated_values() -> None:
    want = _ops("cpu")
    with simdevice.cuda() as sim:
        got = _ops("cuda")
    sim.assert_clean()
    assert got["flags"].tolist() == [True, True]
    for name, value in want.items():
        assert torch.allclose(got[name], value, atol=1e-5), (name, got[name], value)


def _offload_conjugate() -> None:
    x = (torch.arange(8, device="cuda") * (1 + 1j)).to(torch.complex64)
    pinned = torch.empty(8, dtype=torch.complex64, pin_memory=True)
    pinned.copy_(x.conj(), non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(pinned, (torch.arange(8) * (1 - 1j)).to(torch.complex64)), pinned


def test_a_copy_of_a_conjugate_view_to_pinned_memory_lands_conjugated() -> None:
    s = simdevice.cuda()
    s.run(_offload_conjugate)
    s.assert_clean()
