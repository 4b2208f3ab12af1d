"""Processes the program starts itself (``multiprocessing.Process``) that call ``init_process_group(...,
rank=r, world_size=N)`` make one process group of N, as PyTorch's "Writing distributed applications" tutorial
starts its workers: a rendezvous (``simdevice.dropin.distributed._Rendezvous``), each waiting for the others, the
world's ranks in the order of their ``rank``. Before, each was a world of one: an ``all_reduce`` returned the
caller's own values, and a correct program's check of them failed (a wrong verdict).

Rules, each with a test a mutation of it fails:

- the processes' collectives are one world's (the sum of every rank's), their device count the world's (so
  ``set_device(rank)`` runs), their environment their own (not torchrun's, as a launched rank's); a read of an
  async collective's output without its wait races, with it is clean;
- the world is made when its last member arrives, each leaving after all arrived: fewer processes than the world
  asks for is the run's deadlock, as on a machine;
- a rank given twice, two sizes at one meeting place, a rank outside the world are errors, as torch's rendezvous
  refuses them.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import simdevice
from simdevice import Deadlock, Race


def _worker(rank: int, size: int, wait: bool) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = "29533"
    dist.init_process_group("nccl", rank=rank, world_size=size)
    torch.cuda.set_device(rank)
    assert (dist.get_rank(), dist.get_world_size(), torch.cuda.device_count()) == (rank, size, size)
    # (its environment its own, as no launcher set torchrun's variables in it)
    assert os.environ["MASTER_PORT"] == "29533", os.environ["MASTER_PORT"]
    t = torch.full((1024,), float(rank + 1), device="cuda")
    work = dist.all_reduce(t, async_op=True)
    if wait:
        work.wait()
    total = t.sum().item()
    work.wait()
    assert total == 1024 * size * (size + 1) / 2, f"rank {rank} read {total} before the all-reduce landed"
    dist.destroy_process_group()


def _start(size: int, wait: bool, ranks: list[int] | None = None) -> None:
    ctx = mp.get_context("spawn")
    ps = [ctx.Process(target=_worker, args=(r, size, wait)) for r in (range(size) if ranks is None else ranks)]
    for p in ps:
        p.start()
    for p in ps:
        p.join()
    assert [p.exitcode for p in ps] == [0] * len(ps), [p.exitcode for p in ps]


@pytest.mark.parametrize("size", [2, 3])
def test_processes_that_meet_in_init_process_group_reduce_as_one_world(size: int) -> None:
    for schedule in (None, "SpawnProcess-2.nccl#0+20", "SpawnProcess-1.default#1+5"):
        s = simdevice.cuda(schedule)
        s.run(lambda: _start(size, True))
        s.assert_clean()
    s = simdevice.cuda("SpawnProcess-2.nccl#0+20")
    s.run(lambda: _start(size, False))
    assert any(isinstance(r, Race) for r in s.reports), s.text()


def test_fewer_processes_than_the_world_asks_for_is_a_deadlock() -> None:
    s = simdevice.cuda()
    s.run(lambda: _start(2, True, ranks=[1]))
    assert any(isinstance(r, Deadlock) for r in s.reports), s.text()


def _joins(rank: int, size: int) -> None:
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29500", rank=rank, world_size=size)


@pytest.mark.parametrize(("calls", "said"), [
    ([(0, 2), (0, 2)], "RuntimeError: init_process_group at tcp://127.0.0.1:29500: rank 0 joined twice"),
    ([(0, 2), (1, 3)], "RuntimeError: init_process_group at tcp://127.0.0.1:29500: a world of 3 asked where one "
                       "of 2"),
    ([(2, 2)], "ValueError: init_process_group: rank 2 of a world of 2"),
])
def test_what_a_rendezvous_refuses_is_the_caller_s_error(calls: list[tuple[int, int]], said: str) -> None:
    def program() -> None:
        ctx = mp.get_context("spawn")
        ps = [ctx.Process(target=_joins, args=call) for call in calls]
        for p in ps:
            p.start()
        for p in ps:
            p.join()

    s = simdevice.cuda()
    s.run(program)
    assert any(said in str(r) for r in s.reports), s.text()
