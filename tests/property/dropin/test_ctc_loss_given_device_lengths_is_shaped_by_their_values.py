"""CTC's lengths given as device tensors are the device's values, not host values the op reads at the call
(``dispatch._host_values`` names a host tensor alone): the op is shaped by its meta kernel, and computed on the stream
with the program's lengths, as a GPU computes it. Only host lengths shape it on the host
(``test_common_modules_run_as_on_a_gpu.py``). Mutation caught (a sweep of the twenty-ninth sitting's rules): device
lengths taken for host ones, the op shaped on zeros in their place, so ``_ctc_loss``'s ``log_alpha`` had one state
where the program's target lengths give seven (a host error of the stream, "not simulated")."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 (as programs name it)

import simdevice


def _ctc(dev: str) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    log_probs = torch.randn(6, 2, 5).log_softmax(2).to(dev).requires_grad_()
    targets = torch.randint(1, 5, (2, 3)).to(dev)
    loss = F.ctc_loss(log_probs, targets, torch.tensor([6, 5]).to(dev), torch.tensor([3, 2]).to(dev))
    loss.backward()
    assert log_probs.grad is not None
    return loss.detach().cpu(), log_probs.grad.cpu()


def test_ctc_loss_of_device_lengths_computes_what_the_host_computes() -> None:
    got: list[Any] = []
    s = simdevice.cuda()
    s.run(lambda: got.append(_ctc("cuda")))
    s.assert_clean()
    want = _ctc("cpu")
    assert torch.allclose(got[0][0], want[0])
    assert torch.allclose(got[0][1], want[1], atol=1e-6)
