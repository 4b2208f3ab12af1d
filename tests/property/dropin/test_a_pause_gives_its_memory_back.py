"""A pause gives the region's physical memory back to the device (the addresses stay reserved): ``mem_get_info``'s
free memory rises by it, and another allocation may take it, though torch's caching allocator, which knows nothing
of the pause, still counts the segments as reserved. (Before, a paused region still took the device's memory: a
rollout that fits in what the trainer's pause released ran out of memory here, and free memory did not rise.)"""

from __future__ import annotations

import torch

import simdevice
from simdevice import SimConfig

MIB = 1 << 20


def trainer_sleeps_rollout_runs() -> tuple[int, int, int, int]:
    from torch_memory_saver import torch_memory_saver as tms

    with tms.region("train"):
        w = torch.ones(40 * MIB, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    free0, _ = torch.cuda.mem_get_info()
    reserved = torch.cuda.memory_reserved()
    tms.pause("train")
    free1, _ = torch.cuda.mem_get_info()
    assert torch.cuda.memory_reserved() == reserved
    with tms.region("kv"):
        kv = torch.zeros(40 * MIB, dtype=torch.uint8, device="cuda")  # fits only in what the pause gave back
    del kv
    torch.cuda.synchronize()  # wait: the zeros must finish before the pause unmaps their memory
    tms.pause("kv")
    tms.resume("train")
    w.fill_(1)
    free2, _ = torch.cuda.mem_get_info()
    return free0, free1, free2, torch.cuda.memory_reserved()


def test_a_pause_gives_its_memory_back() -> None:
    config = SimConfig(device_memory=64 * MIB, values=False)
    run = simdevice.cuda(config=config).run(trainer_sleeps_rollout_runs)
    assert not run.reports
    free0, free1, free2, reserved = run.result
    assert free1 - free0 == 40 * MIB
    assert free2 == free0  # the kv region paused, the trainer's resumed
    assert reserved == 80 * MIB


def resume_while_the_rollout_holds_the_memory() -> None:
    from torch_memory_saver import torch_memory_saver as tms

    with tms.region("train"):
        torch.ones(40 * MIB, dtype=torch.uint8, device="cuda")  # (its block stays cached in the segment)
    torch.cuda.synchronize()
    tms.pause("train")
    kv = torch.zeros(40 * MIB, dtype=torch.uint8, device="cuda")
    tms.resume("train")  # no room to map the trainer's memory again while kv holds it
    del kv


def test_a_resume_with_no_memory_left_ends_the_process() -> None:
    run = simdevice.cuda(config=SimConfig(device_memory=64 * MIB, values=False)).run(
        resume_while_the_rollout_holds_the_memory)
    assert [r.kind for r in run.reports] == ["host-error"]
    assert "memory_saver.resume('train') cannot map seg#1 of region 'train' again" in str(run.reports[0])
