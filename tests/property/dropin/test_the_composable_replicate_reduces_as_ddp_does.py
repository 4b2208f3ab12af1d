"""torch's composable ``replicate`` (``torch.distributed._composable.replicate``: DDP applied to a module through its
forward hooks, which call DDP's ``_pre_forward`` and ``_post_forward``) runs on the simulated DDP: each rank's
gradient is the mean of the ranks' own. Before, the simulated DDP had neither method (an ``AttributeError`` inside
torch: a host error of a correct program)."""

from __future__ import annotations

import torch
import torch.distributed as dist

import simdevice


def replicated() -> list[float]:
    from torch.distributed._composable.replicate import replicate

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1, bias=False).cuda()
    replicate(model)
    x = torch.full((1, 4), float(dist.get_rank() + 1), device="cuda")
    model(x).sum().backward()
    torch.cuda.synchronize()
    return model.weight.grad.flatten().tolist()  # type: ignore[union-attr, no-any-return]


def test_replicate_averages_the_ranks_gradients() -> None:
    s = simdevice.cuda()
    s.run(replicated, world_size=2)
    assert not s.reports, s.text()
    assert s.result.result == [[1.5] * 4, [1.5] * 4]  # (the inputs' mean: (1 + 2) / 2)
