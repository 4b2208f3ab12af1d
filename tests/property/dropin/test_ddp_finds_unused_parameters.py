"""``DistributedDataParallel(find_unused_parameters=True)`` in a run (``simdevice.dropin.ddp``), which was refused (no
verdict) though research code sets it often (a model with a branch a step may skip). As torch's reducer: the
parameters the forward's outputs do not reach through their graph are marked ready at the backward's first hook,
their bucket slots zeroed, so every bucket is all-reduced; the map of what each rank used is all-reduced after the
last bucket and read by the host at the backward's end (a blocking copy); a parameter no rank used keeps its
gradient (None), one that another rank used gets the world's mean in place of none. Without the option, a step that
skips a parameter makes the next forward raise torch's error, naming the option.

Each rule has a mutation this test fails: the zeroing of an unused slot (rank 1's second step would reduce its
first step's stale gradient of the branch rank 0 takes then), the gradient given to a parameter another rank used,
the search from the outputs (a bucket never fills: the second forward raises)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: N817  (as training scripts name it)

import simdevice


class Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Linear(8, 8)
        self.left = nn.Linear(8, 2)
        self.right = nn.Linear(8, 2)  # (rank 1's branch at step 0, rank 0's at step 1, nobody's at step 2)

    def forward(self, x: torch.Tensor, right: bool) -> torch.Tensor:
        h = torch.tanh(self.trunk(x))
        return self.right(h) if right else self.left(h)


def _right(rank: int, step: int) -> bool:
    return (rank, step) in ((1, 0), (0, 1))


def _train(find_unused: bool) -> list[Any]:
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Branchy().cuda()
    ddp = DDP(model, device_ids=[rank], find_unused_parameters=find_unused)
    got = []
    for step in range(3):
        model.zero_grad(set_to_none=True)
        x = torch.full((4, 8), float(rank + 1 + step), device="cuda")
        ddp(x, right=_right(rank, step)).square().sum().backward()
        got.append({n: None if p.grad is None else p.grad.cpu() for n, p in model.named_parameters()})
    return got


def _expected(step: int) -> dict[str, Any]:
    """The world's mean of the two ranks' gradients, on the host (a branch no rank took: None)."""
    torch.manual_seed(0)
    ref = Branchy()
    grads: list[dict[str, Any]] = []
    for rank in range(2):
        ref.zero_grad(set_to_none=True)
        x = torch.full((4, 8), float(rank + 1 + step))
        ref(x, right=_right(rank, step)).square().sum().backward()
        grads.append({n: p.grad for n, p in ref.named_parameters()})
    out: dict[str, Any] = {}
    for n in grads[0]:
        given = [g[n] for g in grads if g[n] is not None]
        out[n] = None if not given else sum(given) / 2
    return out


def test_unused_parameters_are_found_and_the_gradients_are_the_world_s_mean() -> None:
    s = simdevice.cuda()
    s.run(_train, True, world_size=2)
    s.assert_clean()
    for rank_got in s.result.result:
        for step, got in enumerate(rank_got):
            want = _expected(step)
            assert sorted(n for n, g in got.items() if g is None) == sorted(n for n, g in want.items() if g is None)
            for n, g in want.items():
                if g is not None:
                    assert torch.allclose(got[n], g, atol=1e-5), (step, n)
    assert _expected(1)["right.weight"] is not None  # (used by one rank: the mean given to both)
    assert _expected(2)["right.weight"] is None  # (used by none: left None)


def test_without_the_option_a_skipped_parameter_fails_the_next_forward() -> None:
    s = simdevice.cuda()
    s.run(_train, False, world_size=2)
    errors = [r for r in s.result.reports if r.kind == "host-error"]
    assert errors, s.text()
    assert "find_unused_parameters=True" in errors[0].error, errors[0].error


def side_read(wait: bool) -> None:
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Branchy().cuda()
    ddp = DDP(model, device_ids=[rank], find_unused_parameters=True)
    ddp(torch.ones(4, 8, device="cuda"), right=False).sum().backward()
    side = torch.cuda.Stream()
    if wait:
        side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        norm = model.trunk.weight.grad.norm()
    torch.cuda.current_stream().wait_stream(side)
    assert torch.isfinite(norm).item()


@pytest.mark.parametrize("wait", [True, False])
def test_the_gradients_are_ready_on_the_backward_s_stream(wait: bool) -> None:
    s = simdevice.cuda()
    s.run(side_read, wait, world_size=2)
    assert s.clean == wait, s.text()
