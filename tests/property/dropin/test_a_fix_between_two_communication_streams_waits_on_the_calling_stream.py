"""Rule (explain._advice): where a collective (or point-to-point call) reads or writes what another one, on another
communication stream, has not finished with (a receive's buffer all-reduced before the receive's wait; a
reduce-scatter's shard all-gathered on another group before its wait), the suggested fix waits for the first call's
work on the stream the second call is made on, before that call: NCCL's stream waits for the calling stream when a
call is issued, and the program cannot make NCCL's own stream current. Before, the fix said to call ``wait()`` "with
`rank1.nccl` current", which no program can do. The program with that wait is clean."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

import simdevice
from simdevice.explain import suggest
from simdevice.search.explore import as_target

N = 256


def _received_then_reduced(wait: bool) -> None:
    """Rank 0 sends its activations to rank 1; each rank then all-reduces what it holds (rank 1: what it got)."""
    r = dist.get_rank()
    buf = torch.full((N,), 1.0, device="cuda") if r == 0 else torch.zeros(N, device="cuda")
    work = dist.isend(buf, 1) if r == 0 else dist.irecv(buf, 0)
    if wait:
        work.wait()  # wait: the all-reduce must not read the buffer before the receive landed (nor write the send's)
    dist.all_reduce(buf)
    work.wait()
    assert buf.sum().item() == 2 * N, "the all-reduce read the buffer before the receive landed"


def received_then_reduced_early() -> None:
    _received_then_reduced(False)


def received_then_reduced() -> None:
    _received_then_reduced(True)


def _two_groups(wait: bool) -> None:
    """A shard reduce-scattered on one group and all-gathered on another."""
    w = dist.get_world_size()
    rs_group, ag_group = dist.new_group(), dist.new_group()
    grads = torch.full((w * N,), float(dist.get_rank() + 1), device="cuda")
    shard, full = torch.empty(N, device="cuda"), torch.empty(w * N, device="cuda")
    rs = dist.reduce_scatter_tensor(shard, grads, group=rs_group, async_op=True)
    if wait:
        rs.wait()  # wait: the all-gather must not read the shard before it is reduced
    dist.all_gather_into_tensor(full, shard, group=ag_group)
    rs.wait()
    assert torch.equal(full.cpu(), torch.full((w * N,), 3.0)), "the all-gather read the shard before it was reduced"


def two_groups_early() -> None:
    _two_groups(False)


def two_groups() -> None:
    _two_groups(True)


@pytest.mark.parametrize(("racy", "work", "fixed"), [
    (received_then_reduced_early, "point-to-point call's", received_then_reduced),
    (two_groups_early, "collective's", two_groups),
])
def test_the_fix_waits_on_the_stream_the_second_call_is_made_on(racy: Any, work: str, fixed: Any) -> None:
    found = simdevice.explore(racy, max_examples=20, world_size=2).failure
    assert found is not None
    fix = suggest(as_target(racy, world_size=2), found, schedules=20)
    assert fix.checked, fix.lines()
    assert fix.advice, fix.lines()
    for advice in fix.advice:
        assert advice.startswith(f"wait for the {work} work on the stream the collective is called on ("), advice
        assert "nccl` current" not in advice, advice
        assert "before the call that issues `all_" in advice, advice
    s = simdevice.cuda()
    s.run(fixed, world_size=2)
    assert s.clean, s.text()
