"""A loop that sleeps and takes no other step (``while True: time.sleep(1)``) never gave another actor a turn nor
met the step bound or the stall horizon: the run, and the command, hung. Every so many sleeps without a step, one
is a polling step now: such a loop that waits for nothing is a deadlock, and one that waits for another actor lets
it run."""

from __future__ import annotations

import time

import torch

import simdevice


def test_a_loop_that_only_sleeps_is_a_deadlock() -> None:
    def program() -> None:
        torch.ones(2, device="cuda")
        while True:
            time.sleep(1)

    s = simdevice.cuda()
    s.run(program)
    assert s.result is not None
    assert [r.kind for r in s.result.reports] == ["deadlock"]


def test_a_sleep_loop_on_a_flag_another_rank_sets_lets_it_run() -> None:
    import torch.distributed as dist

    flag = [False]

    def program() -> None:
        if dist.get_rank() == 1:
            torch.ones(2, device="cuda")
            flag[0] = True
            return
        while not flag[0]:
            time.sleep(0.5)

    s = simdevice.cuda()
    s.run(program, world_size=2)
    assert s.result is not None
    assert s.result.reports == ()
