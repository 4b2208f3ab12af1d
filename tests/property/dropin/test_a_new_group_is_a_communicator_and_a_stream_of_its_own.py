"""Rule (distributed.new_group, Collectives.comm_stream, World.group): a group ``new_group`` makes of every rank is a
process group of its own, as each ProcessGroupNCCL is: a communicator whose collectives match only each other's, in
their own order, and a stream of its own on each rank (``rank0.pg1-nccl``), which waits for the calling stream and
for nothing of another group's. A ZeRO step that reduce-scatters its gradients on one group and all-gathers the shard
on another without waiting for the first races, as on a GPU; with the wait it is clean. Ranks that issue two groups'
collectives in different orders each get their own group's data. Before, ``new_group`` handed back the world itself:
the two collectives ran on one stream, in order, and the racy step was clean (a missed race); the crossed orders
matched one group's collective with the other's and failed with "tensors of different sizes" (a false error)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

import simdevice

N = 256


def _run(fn: Any, *args: Any, schedule: str | None = None) -> Any:
    s = simdevice.cuda(schedule)
    s.run(fn, *args, world_size=2)
    assert s.result is not None
    return s


def zero_step(wait: bool) -> None:
    """Gradients reduce-scattered on one group, the reduced shard all-gathered on another (a group per stream, as
    ZeRO implementations make them); ``wait``: the reduce-scatter's work waited for before the all-gather is issued."""
    w = dist.get_world_size()
    rs_group = dist.new_group(list(range(w)))
    ag_group = dist.new_group(list(range(w)))
    grads = torch.full((w * N,), float(dist.get_rank() + 1), device="cuda")
    shard = torch.empty(N, device="cuda")
    full = torch.empty(w * N, device="cuda")
    rs = dist.reduce_scatter_tensor(shard, grads, group=rs_group, async_op=True)
    if wait:
        rs.wait()  # wait: the all-gather, on the other group's stream, must not read the shard before it is reduced
    ag = dist.all_gather_into_tensor(full, shard, group=ag_group, async_op=True)
    ag.wait()
    rs.wait()
    assert torch.equal(full.cpu(), torch.full((w * N,), 3.0)), "the gathered shards are not the reduced gradients"


@pytest.mark.parametrize("schedule", [None, "rank0.pg1-nccl#0+5", "rank1.pg2-nccl#0+5", "rank0#1+5"])
def test_a_step_that_waits_for_the_other_group_s_collective_is_clean(schedule: str | None) -> None:
    s = _run(zero_step, True, schedule=schedule)
    assert s.clean, s.text()


def test_a_step_that_does_not_wait_for_the_other_group_s_collective_races() -> None:
    s = _run(zero_step, False)
    races = [r for r in s.result.reports if r.kind == "race"]
    assert races, s.text()
    text = s.text()
    assert "all_gather (send) on stream rank0.pg2-nccl #0" in text, text
    assert "reduce_scatter (receive) on stream rank0.pg1-nccl" in text, text


def crossed(blocking: bool) -> None:
    """Rank 0 issues group a's all-reduce first, rank 1 group b's: legal for async calls, as each communicator matches
    its own; blocking ones wait for each other forever (each rank's current stream waits for its first collective,
    the second's stream for the current one), as on a GPU."""
    r = dist.get_rank()
    ga, gb = dist.new_group(), dist.new_group()
    x = torch.full((N,), float(r + 1), device="cuda")
    y = torch.full((2 * N,), float(10 * (r + 1)), device="cuda")
    first, second = ((x, ga), (y, gb)) if r == 0 else ((y, gb), (x, ga))
    works = [dist.all_reduce(t, group=g, async_op=not blocking) for t, g in (first, second)]
    for work in works:
        if work is not None:
            work.wait()
    assert (x.sum().item(), y.sum().item()) == (3 * N, 30 * 2 * N), "a group's all-reduce took another's data"


def test_ranks_may_interleave_two_groups_async_collectives_differently() -> None:
    s = _run(crossed, False)
    assert s.clean, s.text()


def test_two_groups_blocking_collectives_in_crossed_orders_deadlock() -> None:
    s = _run(crossed, True)
    assert [r.kind for r in s.result.reports] == ["deadlock"], s.text()


def group_and_world() -> None:
    """A group's collectives, point-to-point calls and batches beside the world's."""
    r = dist.get_rank()
    g = dist.new_group()
    a = torch.full((N,), float(r + 1), device="cuda")
    b = torch.full((N,), float(r + 1), device="cuda")
    got = torch.empty(N, device="cuda")
    dist.all_reduce(a, group=g)
    dist.all_reduce(b)
    if r == 0:
        dist.send(a, 1, group=g)
    else:
        dist.recv(got, 0, group=g)
        assert got.sum().item() == 3 * N, "the group's send"
    peer = 1 - r
    for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, b, peer, group=g),
                                        dist.P2POp(dist.irecv, got, peer, group=g)]):
        work.wait()
    assert a.sum().item() == b.sum().item() == got.sum().item() == 3 * N


def test_a_group_s_point_to_point_calls_run_on_its_own_streams() -> None:
    s = _run(group_and_world)
    assert s.clean, s.text()
    counts = s.result.op_counts
    # the group's all-reduce and its batch (a send, a receive) on its stream, its send and receive on its pair's;
    # the world's all-reduce on nccl
    assert (counts["rank0.pg1-nccl"], counts["rank0.pg1-p2p1-nccl"], counts["rank1.pg1-p2p0-nccl"],
            counts["rank0.nccl"]) == (3, 1, 1, 1), counts


def destroy_one(use_after: bool) -> None:
    g = dist.new_group()
    t = torch.ones(N, device="cuda")
    dist.all_reduce(t, group=g)
    dist.destroy_process_group(g)
    dist.all_reduce(t)  # the default group lives on
    if use_after:
        dist.all_reduce(t, group=g)
    assert t.sum().item() == 4 * N


def test_destroying_a_group_ends_that_group_alone() -> None:
    s = _run(destroy_one, False)
    assert s.clean, s.text()
    s = _run(destroy_one, True)
    assert any("was destroyed (destroy_process_group)" in str(r) for r in s.result.reports), s.text()
