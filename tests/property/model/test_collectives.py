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
from simdevice.runtime.config import SimConfig
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


@pytest.mark.parametrize("actors", ["greenlet", "thread"])
def test_ranks_that_disagree_on_the_collectives_deadlock_instead_of_hanging(actors: str) -> None:
    # on threads, the abort must wake every other actor's thread (each parked on its semaphore) for the run to end:
    # run it on a daemon thread of its own, so that a run that hangs fails the test instead of hanging it
    import threading

    box: list[Any] = []
    runner = threading.Thread(target=lambda: box.append(SimDevice(config=SimConfig(actors=actors)).run(
        lambda dev: dev.spawn_ranks(_uneven_rank, 2))), daemon=True)
    runner.start()
    runner.join(timeout=60)
    assert box, "the run did not end"
    [run] = box
    [report] = run.reports
    assert isinstance(report, Deadlock)
    assert "every rank's send of collective 1 (2 ranks)" in str(report)




def _gather_then_copy(dev: Any, n: int) -> Any:
    """Gather into ``out`` without waiting its handle, then copy ``out`` on another stream one host step later."""
    inp = torch.empty(n, device=dev.device)
    inp.copy_(torch.full((n,), float(dev.rank + 1)))
    out = torch.zeros(n * dev.world_size, device=dev.device)
    side = dev.Stream(name="side")
    dev.all_gather_into_tensor(out, inp)
    side.wait_stream(dev.current_stream())  # after the input's producer, not after the gather
    with dev.stream(side):
        got = torch.empty_like(out)
        got.copy_(out)
    dev.synchronize()
    return got.cpu()


def _one_rank(run: Any) -> tuple[set[str], bool, list[tuple[int, str]]]:
    nccl = [(t, what) for t, actor, what in run.trace if actor == "rank0.nccl" and what.startswith("start")]
    right = torch.equal(run.result[0], torch.ones(4096)) if run.result else False
    return {r.kind for r in run.reports}, right, nccl


def test_a_world_of_one_gathers_by_one_copy_that_a_copy_behind_it_trails() -> None:
    """NCCL's one-rank path is one ``cudaMemcpyAsync`` (no kernel, no ring): the receive starts with the send,
    and a copy issued after it that never overtakes it reads the gathered bytes. The race is reported all the
    same (nothing orders the two); with two ranks the receive starts after the send's launch and the same copy
    reads what was there before."""
    from simdevice.runtime import memory

    run = SimDevice().run(lambda dev: dev.spawn_ranks(_gather_then_copy, 1, (4096,)))
    kinds, right, nccl = _one_rank(run)
    assert "race" in kinds
    assert "stale-read" not in kinds
    assert right
    [(send, _), (recv, _)] = nccl
    assert send == recv
    two = SimDevice().run(lambda dev: dev.spawn_ranks(_gather_then_copy, 2, (4096,)))
    assert "stale-read" in {r.kind for r in two.reports}

    def never(*_: Any) -> bool:
        return False

    with pytest.MonkeyPatch.context() as mp:  # the trailing rule off: the copy reads what had landed
        mp.setattr(memory, "trails", never)
        kinds, right, _ = _one_rank(SimDevice().run(lambda dev: dev.spawn_ranks(_gather_then_copy, 1, (4096,))))
    assert "stale-read" in kinds
    assert not right


def _gather_then_part(dev: Any, n: int, part: str, overwrite: bool) -> Any:
    """A one-rank gather of ``3n`` floats; on a side stream, one host step later, a copy of one third of the output
    (``first`` or ``last``), then (``overwrite``) a fill of the first third, while the gather may still run."""
    inp = torch.empty(3 * n, device=dev.device)
    inp.copy_(torch.arange(3 * n, dtype=torch.float32))
    out = torch.zeros(3 * n, device=dev.device)
    side = dev.Stream(name="side")
    dev.synchronize()  # the gather starts when it is issued; the copy, two host steps later
    dev.all_gather_into_tensor(out, inp)
    side.wait_stream(dev.current_stream())
    with dev.stream(side):
        got = torch.empty(n, device=dev.device)
        got.copy_(out[:n] if part == "first" else out[2 * n:])
        if overwrite:
            out[:n].fill_(7.0)
    dev.synchronize()
    return got.cpu(), out.cpu()


def _timed(run: Any) -> dict[str, tuple[int, int]]:
    starts: dict[str, int] = {}
    spans = {}
    for t, actor, what in run.trace:
        if actor in ("rank0.nccl", "rank0.side") and what.startswith(("start", "done")):
            kind, name = what.split(" ", 1)
            if kind == "start":
                starts[name] = t
            else:
                spans[name] = (starts[name], t)
    return spans


def test_a_copy_that_trails_a_one_rank_gather_over_a_part_and_completes_first_reads_that_part() -> None:
    """NCCL's one-rank copy writes its bytes in order; a copy of its first third that starts after it and reads no
    byte before it is written gets the gathered bytes, though it completes before the gather does: that part
    lands at its completion. Of the last third, which the gather writes last, it would read the old bytes first:
    a stale read, and what was there. A fill after the first copy, while the gather still runs, is what the first
    third holds at the end (the gather wrote those bytes before)."""
    n = 4096
    want = torch.arange(3 * n, dtype=torch.float32)
    run = SimDevice().run(lambda dev: dev.spawn_ranks(_gather_then_part, 1, (n, "first", False)))
    spans = _timed(run)
    (recv_start, recv_end), (copy_start, copy_end) = spans["all_gather (receive)"], spans["copy_ #0"]
    assert recv_start < copy_start  # it starts after the gather
    assert copy_end < recv_end  # and completes first
    got, out = run.result[0]
    kinds = {r.kind for r in run.reports}
    assert "race" in kinds  # nothing orders the two
    assert "stale-read" not in kinds
    assert torch.equal(got, want[:n])
    assert torch.equal(out, want)

    last = SimDevice().run(lambda dev: dev.spawn_ranks(_gather_then_part, 1, (n, "last", False)))
    got, _ = last.result[0]
    assert "stale-read" in {r.kind for r in last.reports}
    assert torch.equal(got, torch.zeros(n))

    filled = SimDevice().run(lambda dev: dev.spawn_ranks(_gather_then_part, 1, (n, "first", True)))
    spans = _timed(filled)
    assert spans["fill_ #1"][1] < spans["all_gather (receive)"][1]  # the fill lands while the gather runs
    assert "stale-read" not in {r.kind for r in filled.reports}  # the end's reads see the fill where it landed
    got, out = filled.result[0]
    assert torch.equal(got, want[:n])
    assert torch.equal(out[:n], torch.full((n,), 7.0))
    assert torch.equal(out[n:], want[n:])
