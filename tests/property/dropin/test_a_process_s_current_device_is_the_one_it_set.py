"""Rule (drop-in: ``set_device``): ``torch.cuda.set_device(i)`` makes ``i`` the running process's current device, as
each rank of a torchrun script sets its ``LOCAL_RANK``: ``current_device()`` answers it, and the process's tensors,
storages and streams show ``cuda:i`` (``torch.cuda.device(i)`` for a block); every rank has the one simulated device,
whichever index names it. Before, every rank answered 0 and showed ``cuda:0``, and FSDP1 given
``device_id=local_rank`` with its module on the host refused rank 1 (``Inconsistent compute device and device_id on
rank 1: cuda:0 vs cuda:1``: a host error of a correct program)."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

import simdevice


def answers() -> list[object]:
    r = dist.get_rank()
    torch.cuda.set_device(r)
    x = torch.ones(2, device="cuda")
    y = torch.ones(2, device=r)
    with torch.cuda.device(0):
        inside = torch.cuda.current_device()
    return [torch.cuda.current_device(), str(x.device), x.get_device(), str(y.device),
            x.device == torch.device("cuda", r), str(x.untyped_storage().device), inside, torch.cuda.current_device(),
            str(torch.cuda.current_stream().device)]


def test_each_rank_s_tensors_show_the_device_it_set() -> None:
    s = simdevice.cuda()
    s.run(answers, world_size=2)
    assert not s.reports, s.text()
    assert s.result.result == [[0, "cuda:0", 0, "cuda:0", True, "cuda:0", 0, 0, "cuda:0"],
                               [1, "cuda:1", 1, "cuda:1", True, "cuda:1", 0, 1, "cuda:1"]]


def fsdp1_given_the_local_rank() -> None:
    from torch.distributed.fsdp import FullyShardedDataParallel

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = FullyShardedDataParallel(torch.nn.Linear(8, 8), device_id=local_rank)  # (the module on the host)
    model(torch.randn(2, 8, device="cuda")).sum().backward()
    torch.cuda.synchronize()


def test_fsdp1_given_the_local_rank_runs_on_every_rank() -> None:
    s = simdevice.cuda()
    s.run(fsdp1_given_the_local_rank, world_size=2)
    assert not s.reports, s.text()
