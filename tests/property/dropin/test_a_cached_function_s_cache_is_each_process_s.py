"""Rule (``simdevice.runtime.process_state``, the places of cached functions): a module-level function cached with
``functools.lru_cache`` has a cache of its own in each simulated process, empty as a fresh process's is, and so has
the run's first process at each run. A workspace buffer such a function makes on the device is each rank's own:
before, the ranks shared rank 0's, and their all-reduces of it were false races; and a second run of a program read
the first run's buffer ("a tensor of another simulated run", no verdict). Mutations: a process that has not run
given the module's cache (the ranks share it), no fresh cache at a run's start (the second run's error)."""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist

import simdevice
from simdevice.search.explore import explore


@functools.cache
def workspace(n: int) -> torch.Tensor:
    return torch.zeros(n, device="cuda")


def _reduced() -> list[float]:
    buf = workspace(16)
    assert workspace(16) is buf  # (cached within the process)
    buf.fill_(dist.get_rank() + 1)
    dist.all_reduce(buf)
    return buf.tolist()


def test_each_rank_has_its_own_cache() -> None:
    s = simdevice.cuda()
    s.run(_reduced, world_size=2)
    assert s.result is not None
    assert s.result.reports == (), s.result.reports
    assert s.result.result == [[3.0] * 16] * 2


def _filled() -> float:
    buf = workspace(16)
    buf.fill_(2.0)
    return buf.sum().item()


def test_each_run_starts_with_an_empty_cache() -> None:
    found = explore(_filled, max_examples=5)
    assert found.failure is None, found.failure.text()
    assert found.examples > 1, found
