"""A new segment is bounded by what the device holds (``CachingAllocator._reserve``): every process's segments on it,
less what a pause gave back. Its reserved bytes are asked first and the walk of every segment (``held()``) only past
them (CHANGELOG, twenty-ninth sitting), which must change nothing of the outcome: another process's segments on the
device count (a second rank's allocation past the capacity runs out of memory, as on a GPU), and a segment a pause
released does not (a rollout that fits in it makes no retry, as cudaMalloc succeeds on a GPU). Mutations caught (a
sweep of the twenty-ninth sitting's rules): the device's bound asked of the allocating process's own reserved bytes
(the second rank's allocation fit), the walk's answer ``or``-ed with the reserved bytes' (the cache emptied and a
retry counted where the device held enough)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

import simdevice
from simdevice import SimConfig

MIB = 1 << 20


def _each_rank_takes_40_mib(out: dict[int, str]) -> None:
    rank = dist.get_rank()
    x = torch.empty(40 * MIB, dtype=torch.uint8, device="cuda") if rank == 0 else None
    dist.barrier()
    if rank == 1:
        try:
            torch.empty(40 * MIB, dtype=torch.uint8, device="cuda")
            out[rank] = "fit"
        except torch.OutOfMemoryError:
            out[rank] = "out of memory"
    dist.barrier()
    del x


def test_another_process_s_segments_bound_a_new_one() -> None:
    out: dict[int, str] = {}
    s = simdevice.cuda(config=SimConfig(device_memory=64 * MIB, values=False))
    s.run(_each_rank_takes_40_mib, out, world_size=2)
    s.assert_clean()
    assert out == {1: "out of memory"}


def _rollout_in_what_the_trainer_released() -> dict[str, Any]:
    from torch_memory_saver import torch_memory_saver as tms

    with tms.region("train"):
        w = torch.ones(40 * MIB, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    tms.pause("train")
    kv = torch.zeros(40 * MIB, dtype=torch.uint8, device="cuda")  # fits only in what the pause gave back
    stats = torch.cuda.memory_stats()
    del kv, w
    return {"retries": stats["num_alloc_retries"], "ooms": stats["num_ooms"]}


def test_a_segment_a_pause_released_makes_no_retry() -> None:
    run = simdevice.cuda(config=SimConfig(device_memory=64 * MIB, values=False)).run(
        _rollout_in_what_the_trainer_released)
    assert not run.reports, [str(r) for r in run.reports]
    assert run.result == {"retries": 0, "ooms": 0}
