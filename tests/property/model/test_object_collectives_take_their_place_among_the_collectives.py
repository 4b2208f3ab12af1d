"""Rule (collectives.World.instance_for, exchange_objects): an object collective (``all_gather_object``,
``broadcast_object_list``) is one of its world's collectives, in order with the tensor ones, as torch runs it
through NCCL collectives: ranks that issue an object collective where a peer issued another collective are told
so, at the call, as for two tensor collectives. Before, object collectives were counted apart: ranks issuing an
all-reduce and an all_gather_object in opposite orders (a hang, or one's bytes taken for the other's, under
NCCL) ran to a clean verdict."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

import simdevice


def _program(swapped: str) -> None:
    r = dist.get_rank()
    t = torch.ones(4, device="cuda")
    objs: list[Any] = [None] * dist.get_world_size()

    def exchange() -> None:
        if swapped == "all_gather_object":
            dist.all_gather_object(objs, r)
        else:
            dist.broadcast_object_list(objs, src=0)

    if r == 0:
        dist.all_reduce(t)
        exchange()
    else:
        exchange()
        dist.all_reduce(t)
    torch.cuda.synchronize()


@pytest.mark.parametrize("kind", ["all_gather_object", "broadcast_object_list"])
def test_ranks_that_order_an_object_collective_differently_are_told_so(kind: str) -> None:
    s = simdevice.cuda()
    s.run(_program, kind, world_size=2)
    text = s.text()
    assert f"collective #0: rank1 issued {kind} where another rank issued all_reduce" in text, text


def test_object_and_tensor_collectives_in_one_order_run_clean() -> None:
    got: dict[int, list[Any]] = {}

    def program() -> None:
        r = dist.get_rank()
        t = torch.ones(4, device="cuda")
        objs: list[Any] = [None] * dist.get_world_size()
        dist.all_reduce(t)
        dist.all_gather_object(objs, r)
        listed: list[Any] = [r]
        dist.broadcast_object_list(listed, src=1)
        dist.all_reduce(t)
        got[r] = [t.cpu().tolist(), objs, listed]

    s = simdevice.cuda()
    s.run(program, world_size=2)
    s.assert_clean()
    assert got[0] == got[1] == [[4.0] * 4, [0, 1], [1]]
