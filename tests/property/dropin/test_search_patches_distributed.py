"""Rule (dropin.session.held): a search over plain torch code keeps ``torch.distributed`` patched too, not only
``torch.cuda``, so a function that uses the default process group runs on the simulated ranks under explore."""

from __future__ import annotations

import torch
import torch.distributed as dist

import simdevice


def reduce_and_check() -> None:
    t = torch.ones(4, device="cuda")
    dist.all_reduce(t)
    assert t.cpu().tolist() == [float(dist.get_world_size())] * 4


def test_explore_runs_a_distributed_function_on_its_ranks() -> None:
    found = simdevice.explore(reduce_and_check, world_size=2, max_examples=5, seed=0)
    assert found.failure is None
