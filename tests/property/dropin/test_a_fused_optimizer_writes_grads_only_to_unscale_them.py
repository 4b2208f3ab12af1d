"""A fused optimizer step (``torch.optim.Adam``, ``AdamW`` or ``SGD`` with ``fused=True``: ``_fused_adam_``,
``_fused_adamw_``, ``_fused_sgd_``) reads the gradients, and writes them only where it is given ``grad_scale`` (a
``GradScaler``'s step, which unscales them in place): CUDA's kernels store the gradient back only then (fused
adam's and sgd's "Conditional Gradient Store"). Their schemas mark ``grads`` as written whatever the call, so the
simulator took every fused step for a write of the gradients: a side stream offloading the gradients to pinned
memory while the step ran, ordered before the gradients are next written (``zero_grad``), was reported as a race
no GPU has. A step given ``grad_scale`` still writes them, and the same offload then races."""

from __future__ import annotations

import pytest
import torch

import simdevice
from simdevice import Race

N = 64


def _offload_grads(optimizer: str, scaled: bool, wait_before_zero: bool) -> None:
    """Backward, then the gradients copied to pinned memory on ``side`` while the fused step runs on the default
    stream; the default stream waits for the copies before ``zero_grad`` writes the gradients (``wait_before_zero``);
    ``scaled``: the step is a ``GradScaler``'s, which passes ``grad_scale``."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(N, N), torch.nn.Tanh(), torch.nn.Linear(N, N)).cuda()
    make = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW,
            "sgd": lambda ps, **kw: torch.optim.SGD(ps, momentum=0.9, **kw)}[optimizer]
    opt = make(model.parameters(), lr=0.01, fused=True)
    scaler = torch.amp.GradScaler("cuda", init_scale=4.0) if scaled else None
    side = torch.cuda.Stream()
    host_x = torch.randn(8, N)
    loss = model(host_x.cuda()).pow(2).sum()
    (scaler.scale(loss) if scaler is not None else loss).backward()
    side.wait_stream(torch.cuda.current_stream())  # wait: the copies read what backward wrote
    grads = [p.grad for p in model.parameters()]
    with torch.cuda.stream(side):
        offloaded = [g.to("cpu", non_blocking=True) for g in grads]
        done = torch.cuda.Event()
        done.record()
    if scaler is not None:
        scaler.step(opt)
        scaler.update()
    else:
        opt.step()
    if wait_before_zero:
        torch.cuda.current_stream().wait_event(done)  # wait: zero_grad writes what the copies read
    opt.zero_grad(set_to_none=False)
    done.synchronize()
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(N, N), torch.nn.Tanh(), torch.nn.Linear(N, N))
    ref(host_x).pow(2).sum().mul(4.0 if scaled else 1.0).backward()
    for got, p in zip(offloaded, ref.parameters(), strict=True):
        assert torch.allclose(got, p.grad, rtol=1e-4, atol=1e-4), "an offloaded gradient differs"


@pytest.mark.parametrize("optimizer", ["adam", "adamw", "sgd"])
def test_a_fused_step_beside_a_gradient_offload_is_clean(optimizer: str) -> None:
    r = simdevice.cuda()
    r.run(_offload_grads, optimizer, False, True)
    r.assert_clean()


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
@pytest.mark.parametrize(("scaled", "wait_before_zero", "racing"),
                         [(True, True, "_fused_"),  # a GradScaler's step unscales the gradients in place
                          (False, False, "zero_")])  # zero_grad writes the gradients under the copies
def test_a_write_of_the_gradients_under_the_offload_races(optimizer: str, scaled: bool, wait_before_zero: bool,
                                                          racing: str) -> None:
    r = simdevice.cuda()
    r.run(_offload_grads, optimizer, scaled, wait_before_zero)
    races = [x for x in r.reports if isinstance(x, Race)]
    assert races, r.text()
    assert any(racing in str(x) for x in races), r.text()
