"""Rule (dropin.distributed.barrier): ``dist.barrier()`` blocks each rank's host until every rank reached it, so what
a rank did before the barrier is seen by every rank after it, however late that rank came."""

from __future__ import annotations

import time

import torch.distributed as dist

import simdevice


def test_no_rank_leaves_the_barrier_before_the_last_one_reached_it() -> None:
    arrived: list[int] = []
    seen: dict[int, list[int]] = {}

    def program() -> None:
        r = dist.get_rank()
        if r == dist.get_world_size() - 1:
            time.sleep(0.001)  # the last rank comes late (virtual host time)
        arrived.append(r)
        dist.barrier()
        seen[r] = sorted(arrived)

    s = simdevice.cuda()
    s.run(program, world_size=2)
    s.assert_clean()
    assert seen == {0: [0, 1], 1: [0, 1]}
