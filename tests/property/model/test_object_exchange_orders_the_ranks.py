"""Rule (collectives.exchange_objects, sync.publish): ``all_gather_object`` is a host-side rendezvous: every rank
leaves it ordered after what every rank did before it, so a rank's read of what another rank wrote and synchronized
before the exchange is no race. So is a gloo collective of host tensors (``Collectives.exchange_objects`` with no
stream to wait for: the rendezvous alone orders the ranks)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

import simdevice


@pytest.mark.parametrize("how", ["all_gather_object", "gloo_all_reduce"])
def test_a_rank_reads_what_another_synchronized_before_the_exchange(how: str) -> None:
    """Mutation: the exchange not publishing each giver's past (``sync.publish``): after the gloo all-reduce, rank
    1's read of the pinned buffer races rank 0's copy (the NCCL exchange orders it through rank 0's stream too)."""
    shared: dict[str, Any] = {}

    def program() -> None:
        rank = dist.get_rank()
        gloo = dist.new_group(backend="gloo")
        if rank == 0:
            buf = torch.empty(1024, pin_memory=True)
            buf.copy_(torch.full((1024,), 3.0, device="cuda"), non_blocking=True)
            torch.cuda.synchronize()  # rank 0's copy is done before it gives its object
            shared["buf"] = buf
        if how == "all_gather_object":
            objs: list[object] = [None] * dist.get_world_size()
            dist.all_gather_object(objs, rank)
        else:
            dist.all_reduce(torch.ones(4), group=gloo)
        if rank == 1:
            shared["sum"] = shared["buf"].to("cuda", non_blocking=True).sum().item()

    s = simdevice.cuda()
    s.run(program, world_size=2)
    s.assert_clean()
    assert shared["sum"] == 3.0 * 1024
