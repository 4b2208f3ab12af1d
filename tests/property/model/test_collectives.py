"""Collectives across ranks in one simulation: the all-gather rendezvous and what its handle orders.

Values reach every rank; a collective completes only once every rank issued
it; ranks that disagree on the collectives deadlock (reported, never a hang);
a reader that does not wait the handle races and reads stale data.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from reference.schedule import Schedule
from simdevice import SimDevice
from simdevice.runtime.reports import Deadlock


def _gather_rank(dev: Any, n: int, wait: bool) -> Any:
    inp = torch.empty(n, device=dev.device)
    inp.copy_(torch.full((n,), float(dev.rank + 1)))
    out = torch.zeros(n * dev.world_size, device=dev.device)
    work = dev.all_gather_into_tensor(out, inp)
    if wait:
        work.wait()
    got = out.cpu()
    return got, dev.now_units


@pytest.mark.parametrize("world", [1, 2, 3])
def test_all_gather_across_ranks_gives_every_rank_every_shard(world: int) -> None:
    run = SimDevice().run(lambda dev: dev.spawn_ranks(_gather_rank, world, (4, True)))
    want = torch.arange(1, world + 1).float().repeat_interleave(4)
    assert run.reports == ()
    assert [torch.equal(got, want) for got, _ in run.result] == [True] * world


def test_all_gather_completes_only_once_every_rank_issued_it() -> None:
    # rank1's host stalls 20 units before its gather: rank0's wait must hold its reader until then
    run = SimDevice(Schedule.parse("x/y::rank1#2+20")).run(lambda dev: dev.spawn_ranks(_gather_rank, 2, (4, True)))
    assert run.reports == ()
    (got0, t0), _ = run.result
    assert torch.equal(got0, torch.tensor([1.0] * 4 + [2.0] * 4))
    assert t0 >= 20


def test_a_reader_that_does_not_wait_the_handle_races_and_reads_stale() -> None:
    run = SimDevice(Schedule.parse("x/y::rank1#2+20")).run(lambda dev: dev.spawn_ranks(_gather_rank, 2, (4, False)))
    kinds = sorted({r.kind for r in run.reports})
    assert kinds == ["race", "stale-read"]
    assert torch.equal(run.result[0][0], torch.zeros(8))


def _uneven_rank(dev: Any) -> None:
    out, inp = torch.zeros(2, device=dev.device), torch.zeros(1, device=dev.device)
    for _ in range(1 + dev.rank):  # rank1 issues a second gather that rank0 never joins
        dev.all_gather_into_tensor(out, inp).wait()
    dev.synchronize()


def test_ranks_that_disagree_on_the_collectives_deadlock_instead_of_hanging() -> None:
    run = SimDevice().run(lambda dev: dev.spawn_ranks(_uneven_rank, 2))
    [report] = run.reports
    assert isinstance(report, Deadlock)
    assert "every rank's send of collective 1 (2 ranks)" in str(report)


