"""accelerate's ``Accelerator`` (accelerate 1.16.0 from PyPI, unmodified) on two simulated ranks: each rank is its
own process to it (``process_index``, ``num_processes``), ``prepare`` wraps the model in DDP, and after a step the
ranks' weights, gathered, agree. accelerate keeps its state in a "Borg" (``PartialState._shared_state``, the dict
every instance shares as its ``__dict__``): before each simulated process had its own
(:mod:`simdevice.runtime.process_state`), rank 1 was told it was process 0. Needs the extra ``upstream``; skipped
without it."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.distributed as dist

import simdevice

if importlib.util.find_spec("accelerate") is None:
    pytest.skip("accelerate is not installed (the extra 'upstream')", allow_module_level=True)


def _train() -> tuple[int, int]:
    from accelerate import Accelerator

    acc = Accelerator()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    x = torch.full((2, 4), float(dist.get_rank() + 1), device=acc.device)
    acc.backward(model(x).sum())
    opt.step()
    weights = acc.gather(acc.unwrap_model(model).weight.detach().reshape(1, -1))
    assert torch.equal(weights[0], weights[1]), weights
    return acc.process_index, acc.num_processes


@pytest.mark.parametrize("schedule", [None, "rank1#0+5", "rank0#3+5"])
def test_each_rank_is_its_own_process_to_accelerate(schedule: str | None) -> None:
    s = simdevice.cuda(schedule)
    s.run(_train, world_size=2)
    assert not s.reports, s.text()
    assert s.result.result == [(0, 2), (1, 2)]
