"""Rule (distributed.new_group, World.new_group, Collectives.world_of): a group ``new_group`` makes of some ranks is
a ProcessGroupNCCL of its own, of its members alone, as torch makes it: every rank calls ``new_group`` for every
group, with the same ranks, in one order; a member's rank in it is its index among the sorted members and its size
the member count; a non-member gets ``GroupMember.NON_GROUP_MEMBER``, and its calls on that do as torch's do (most
warn and return None, ``get_rank``/``get_world_size`` answer -1, a root or peer given as a global rank raises). The
group's collectives and point-to-point calls run among its members, on its own stream of each member
(``rank0.pg3-nccl``), roots and peers given as global ranks (``src``, ``dst``, ``peer``) or group ranks
(``group_src``, ...), unordered with another group's. With world size 4, tensor-parallel groups {0,1},{2,3} and
data-parallel groups {0,2},{1,3} (as Megatron's ``parallel_state`` makes them): a step that waits is clean under
search, one that reads the data-parallel all-gather's output before its wait races on that group's stream, and ranks
that issue two groups' collectives in different orders get each group's own data. Before, ``new_group`` of a subset
raised ``NotImplementedError``."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
import torch.distributed as dist

import simdevice

N = 64
W = 4


def _run(fn: Any, *args: Any) -> Any:
    s = simdevice.cuda()
    s.run(fn, *args, world_size=W)
    assert s.result is not None
    return s


def _groups() -> tuple[Any, Any, list[Any], list[Any]]:
    """Megatron's layout for 4 ranks, 2-way tensor parallel: every rank makes every group (ids 1..4, in this order),
    and keeps the two it is a member of."""
    tp = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    dp = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    r = dist.get_rank()
    return tp[r // 2], dp[r % 2], tp, dp


def _tp_then_dp(wait: bool) -> None:
    """An all-reduce in the tensor-parallel group, then an all-gather of its result in the data-parallel group, the
    gathered values read on the host (``wait``: after the all-gather's work is waited for)."""
    r = dist.get_rank()
    tp, dp, _, _ = _groups()
    x = torch.full((N,), float(r + 1), device="cuda")
    dist.all_reduce(x, group=tp)  # (blocking: the current stream waits for it)
    full = torch.empty(2 * N, device="cuda")
    work = dist.all_gather_into_tensor(full, x, group=dp, async_op=True)
    assert work is not None
    if wait:
        work.wait()  # wait: the host reads what the data-parallel all-gather writes
    got = full.cpu()
    work.wait()
    # tp sums: ranks 0,1 -> 3; ranks 2,3 -> 7; each dp group gathers one of each
    assert got[:N].eq(3.0).all(), "the gathered values are not the tp groups' sums"
    assert got[N:].eq(7.0).all(), "the gathered values are not the tp groups' sums"


def tp_then_dp() -> None:
    _tp_then_dp(True)


def tp_then_dp_early() -> None:
    _tp_then_dp(False)


def test_a_tensor_and_data_parallel_step_that_waits_is_clean_under_search() -> None:
    s = _run(tp_then_dp)
    assert s.clean, s.text()
    counts = s.result.op_counts
    # rank 0: its tp group (id 1) and its dp group (id 3), each on its own stream; the other groups not its own
    assert counts["rank0.pg1-nccl"] == counts["rank0.pg3-nccl"] == 1, counts
    assert counts["rank3.pg2-nccl"] == counts["rank3.pg4-nccl"] == 1, counts
    assert not any(name.startswith(("rank0.pg2-", "rank0.pg4-")) for name in counts), counts
    found = simdevice.explore(tp_then_dp, max_examples=8, world_size=W)
    assert found.failure is None, found.failure


def test_reading_the_data_parallel_all_gather_before_its_wait_races_on_that_group_s_stream() -> None:
    found = simdevice.explore(tp_then_dp_early, max_examples=8, world_size=W).failure
    assert found is not None
    assert found.races, found
    texts = [str(r) for r in found.races]
    # the host's read against the all-gather's receive on the rank's data-parallel group's stream (id 3 or 4)
    assert any("all_gather (receive) on stream rank" in t and ("pg3-nccl" in t or "pg4-nccl" in t)
               for t in texts), texts


def crossed() -> None:
    """Ranks 0 and 2 issue their tp group's all-reduce first, ranks 1 and 3 their dp group's: each communicator
    matches its own, as NCCL's do."""
    r = dist.get_rank()
    tp, dp, _, _ = _groups()
    x = torch.full((N,), float(r + 1), device="cuda")
    y = torch.full((2 * N,), float(10 * (r + 1)), device="cuda")
    calls = [(x, tp), (y, dp)] if r % 2 == 0 else [(y, dp), (x, tp)]
    works = [dist.all_reduce(t, group=g, async_op=True) for t, g in calls]
    for work in works:
        assert work is not None
        work.wait()
    tp_sum = {0: 3, 1: 3, 2: 7, 3: 7}[r]
    dp_sum = {0: 40, 1: 60, 2: 40, 3: 60}[r]
    assert (x.cpu()[0].item(), y.cpu()[0].item()) == (tp_sum, dp_sum), "a group's all-reduce took another's data"


def test_two_groups_collectives_issued_in_different_orders_are_no_error() -> None:
    s = _run(crossed)
    assert s.clean, s.text()


def test_a_member_s_rank_and_size_are_the_group_s() -> None:
    got: dict[int, Any] = {}

    def program() -> None:
        r = dist.get_rank()
        tp, dp, tps, _ = _groups()
        other = tps[1 - r // 2]
        got[r] = (dist.get_rank(tp), dist.get_world_size(tp), tp.rank(), tp.size(), dist.get_rank(dp),
                  dist.get_process_group_ranks(dp), dist.get_global_rank(dp, 1), dist.get_group_rank(dp, r),
                  other == dist.GroupMember.NON_GROUP_MEMBER, dist.get_rank(other), dist.get_world_size(other),
                  dist.get_rank(), dist.get_world_size())

    s = _run(program)
    assert s.clean, s.text()
    assert got == {
        0: (0, 2, 0, 2, 0, [0, 2], 2, 0, True, -1, -1, 0, 4),
        1: (1, 2, 1, 2, 0, [1, 3], 3, 0, True, -1, -1, 1, 4),
        2: (0, 2, 0, 2, 1, [0, 2], 2, 1, True, -1, -1, 2, 4),
        3: (1, 2, 1, 2, 1, [1, 3], 3, 1, True, -1, -1, 3, 4),
    }, got


def test_unsorted_ranks_are_sorted_as_torch_sorts_them() -> None:
    got: dict[int, Any] = {}

    def program() -> None:
        g = dist.new_group([3, 1])
        if g != dist.GroupMember.NON_GROUP_MEMBER:
            got[dist.get_rank()] = (dist.get_rank(g), dist.get_process_group_ranks(g))

    s = _run(program)
    assert s.clean, s.text()
    assert got == {1: (0, [1, 3]), 3: (1, [1, 3])}, got


def rooted() -> None:
    """Roots and peers as torch takes them: ``src``/``dst``/``peer`` global ranks, ``group_src``/``group_dst`` ranks of
    the group."""
    r = dist.get_rank()
    _, dp, _, _ = _groups()  # dp: {0, 2} or {1, 3}
    last = dist.get_process_group_ranks(dp)[1]  # global rank 2 or 3, group rank 1
    b = torch.full((N,), float(r), device="cuda")
    dist.broadcast(b, src=last, group=dp)
    assert b.cpu()[0].item() == last, "broadcast src is a global rank"
    c = torch.full((N,), float(r), device="cuda")
    dist.broadcast(c, group=dp, group_src=0)
    assert c.cpu()[0].item() == last - 2, "broadcast group_src is a rank of the group"
    t = torch.full((N,), float(r + 1), device="cuda")
    dist.reduce(t, dst=last, group=dp)
    if r == last:
        assert t.cpu()[0].item() == 2 * last - 2 + 2, "reduce dst is a global rank"
    out = [torch.empty(N, device="cuda") for _ in range(2)] if r == last else None
    dist.gather(torch.full((N,), float(r), device="cuda"), out, dst=last, group=dp)
    if out is not None:
        assert [o.cpu()[0].item() for o in out] == [last - 2, last], "gather by group rank"
    objs: list[Any] = [None]
    dist.broadcast_object_list(objs if r != last else [f"from {r}"], src=last, group=dp)
    if r != last:
        assert objs == [f"from {last}"], objs
    peer = dist.get_process_group_ranks(dp)[1 - dist.get_rank(dp)]
    got = torch.empty(N, device="cuda")
    if r == last:
        dist.send(b, dst=peer, group=dp)
        works = dist.batch_isend_irecv([dist.P2POp(dist.irecv, got, group=dp, group_peer=0)])
    else:
        assert dist.recv(got, src=peer, group=dp) == peer
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, b, peer, group=dp)])
    for w in works:
        w.wait()
    assert got.cpu()[0].item() == last, "the peer's tensor"


def test_roots_and_peers_are_global_ranks_or_group_ranks_as_torch_takes_them() -> None:
    s = _run(rooted)
    assert s.clean, s.text()
    counts = s.result.op_counts
    # rank 2's point-to-point calls with global rank 0, its dp group's rank 0: on the group's pair stream
    assert (counts["rank2.pg3-p2p0-nccl"], counts["rank0.pg3-p2p1-nccl"]) == (1, 1), counts


def outside() -> None:
    """A rank's calls on the group it is not a member of."""
    r = dist.get_rank()
    _, _, tps, _ = _groups()
    other = tps[1 - r // 2]
    t = torch.ones(N, device="cuda")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert dist.all_reduce(t, group=other) is None
        assert dist.all_gather_into_tensor(torch.empty(2 * N, device="cuda"), t, group=other) is None
        assert dist.barrier(group=other) is None
        assert dist.broadcast(t, group=other, group_src=0) is None
        assert dist.irecv(t, group=other, group_src=0) is None
        assert dist.recv(t, src=0, group=other) == -1
        assert dist.all_gather_object([None, None], r, group=other) is None
    assert len(caught) == 7, [str(w.message) for w in caught]
    assert all(f"on global rank {r} which does not belong to the given group" in str(w.message) for w in caught)
    for call in (lambda: dist.broadcast(t, src=0, group=other),  # a global rank: torch's get_group_rank raises
                 lambda: dist.isend(t, 0, group=other),
                 lambda: dist.get_group_rank(other, 0),
                 lambda: dist.P2POp(dist.isend, t, 0, group=other)):
        with pytest.raises(ValueError, match=r"is not registered, please create group with torch\.distributed"):
            call()
    with pytest.raises(KeyError):
        dist.get_process_group_ranks(other)
    dist.destroy_process_group(other)  # (torch's: nothing to destroy)
    assert t.sum().item() == N, "a call outside the group ran"


def test_a_non_member_s_calls_do_as_torch_s() -> None:
    s = _run(outside)
    assert s.clean, s.text()


def test_ranks_that_make_a_group_of_different_ranks_are_told_so() -> None:
    def program() -> None:
        r = dist.get_rank()
        g = dist.new_group([0, 1] if r < 2 else [2, 3])  # (each pair makes its own group alone: torch forbids it)
        if g != dist.GroupMember.NON_GROUP_MEMBER:
            dist.all_reduce(torch.ones(N, device="cuda"), group=g)

    s = _run(program)
    errors = [str(e) for e in s.reports]
    assert errors, s.text()
    assert all("every rank must call new_group with the same ranks, in the same order" in e for e in errors), errors


def test_a_destroyed_subset_group_runs_nothing_more() -> None:
    def program() -> None:
        tp, _, _, _ = _groups()
        t = torch.ones(N, device="cuda")
        dist.all_reduce(t, group=tp)
        dist.destroy_process_group(tp)
        dist.all_reduce(t, group=tp)

    s = _run(program)
    assert any("was destroyed (destroy_process_group)" in str(r) for r in s.reports), s.text()
