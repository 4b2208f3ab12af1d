"""A block freed with a stream recorded on it (``record_stream``) is held back until that stream passes the free;
the allocation that finds it past comes back to it, and its host has then seen the stream's use done. Each rank (and
process) has its own caching allocator on a GPU, so only its own allocations give its blocks back. The simulator's
one allocator gave a rank's held block back at whichever rank allocated next: rank 0's allocation released rank 1's
block, rank 0's host saw the recorded stream done, and rank 1 then took the block with no edge from that stream's
read to its own write, a race no GPU has (a gradient bucket's copy on a comm stream, the gradient freed after
``record_stream``, reported racing with the next backward op on rank 1 alone)."""

from __future__ import annotations

import pytest
import torch

import simdevice
from simdevice import Race

N = 16


def _bucket(record: bool, n: int = 3) -> None:
    """Each gradient copied into its slot of a flat bucket on ``comm``, then dropped; the compute stream allocates
    next (the next backward op's output)."""
    grads = [torch.full((N,), float(i), device="cuda") for i in range(n)]
    comm = torch.cuda.Stream()
    bucket = torch.empty(N * n, device="cuda")
    for i in range(n):
        g = grads[i]
        comm.wait_stream(torch.cuda.current_stream())  # wait: the copy reads what the compute stream made
        with torch.cuda.stream(comm):
            bucket[N * i:N * (i + 1)].copy_(g)
        if record:
            g.record_stream(comm)  # keep: the block must not be handed out before comm's copy is done
        grads[i] = None
        del g
        torch.full((N,), 99.0, device="cuda")
    torch.cuda.current_stream().wait_stream(comm)
    assert torch.equal(bucket.cpu(), torch.arange(n).repeat_interleave(N).float()), "the bucket differs"


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_each_rank_s_recorded_block_comes_back_to_that_rank_clean(world_size: int) -> None:
    r = simdevice.cuda()
    r.run(_bucket, True, world_size=world_size)
    r.assert_clean()


@pytest.mark.parametrize("world_size", [1, 2])
def test_without_record_stream_every_rank_races(world_size: int) -> None:
    r = simdevice.cuda()
    r.run(_bucket, False, world_size=world_size)
    races = [x for x in r.reports if isinstance(x, Race)]
    ranks = {x.current.actor.split(".")[0] for x in races} if world_size > 1 else {"host"}
    assert races, r.text()
    assert ranks == ({f"rank{i}" for i in range(world_size)} if world_size > 1 else {"host"}), r.text()
