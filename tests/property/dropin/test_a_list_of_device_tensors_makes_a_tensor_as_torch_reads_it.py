"""Rule (facade: ``_elements_read``): ``torch.tensor`` (``as_tensor``, ``asarray``) of a list holding device tensors
reads each as torch's ``recursive_store`` does, a synchronizing read of a one-element tensor, its dtype the
result's, and a tensor of more than one element raises torch's own error. A simulated tensor is a sequence to
Python's C API, where torch's own is not, so torch took it for one more level of the list: ``torch.tensor([[norm
for t in ts]])`` raised ``len() of a 0-d tensor`` (Megatron's ``local_multi_tensor_l2_norm``, which its
distributed optimizer's gradient clipping calls)."""

from __future__ import annotations

import pytest
import torch

import simdevice


def made() -> list[object]:
    ts = [torch.full((3,), float(k), device="cuda") for k in range(2)]
    norms = [torch.norm(t) for t in ts]
    nested = torch.tensor([norms])
    flat = torch.as_tensor(norms)
    on_device = torch.tensor([[norms[1]], [norms[0]]], device="cuda")
    half = torch.tensor([torch.ones(2, dtype=torch.half, device="cuda")[0]])
    with pytest.raises(ValueError, match="only one element tensors can be converted to Python scalars"):
        torch.tensor([ts[0]])
    return [nested.tolist(), flat.tolist(), on_device.device.type, on_device.cpu().tolist(), half.dtype,
            torch.tensor([[]]).shape]


def test_a_list_of_device_tensors_is_read_element_by_element() -> None:
    s = simdevice.cuda()
    s.run(made)
    s.assert_clean()
    root3 = 3.0 ** 0.5 * 1.0
    got = s.result.result
    assert got[0] == [[0.0, pytest.approx(root3)]]
    assert got[1] == [0.0, pytest.approx(root3)]
    assert got[2] == "cuda"
    assert got[3] == [[pytest.approx(root3)], [0.0]]
    assert got[4] == torch.float16
    assert got[5] == torch.Size([1, 0])


def unordered() -> float:
    side = torch.cuda.Stream()
    x = torch.zeros((), device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        x.fill_(2.0)  # not ordered before the read below
    return float(torch.tensor([x]).item())


def test_each_element_s_read_is_the_host_s_and_races_as_one() -> None:
    s = simdevice.cuda("side#0+5")
    s.run(unordered)
    kinds = {r.kind for r in s.result.reports}
    assert "host-error" not in kinds, s.text()
    assert {"race", "stale-read"} & kinds, s.text()
