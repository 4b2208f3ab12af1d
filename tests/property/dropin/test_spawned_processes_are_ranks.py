"""``torch.multiprocessing.spawn(fn, args, nprocs)`` (and ``start_processes``) in a run starts ``fn(i, *args)`` on
rank ``i`` of a world of ``nprocs`` ranks, as a multi-GPU script's ``main`` starts its training processes: the same
ranks ``--world-size N`` makes (``rank0..``, torch.distributed's default group theirs, so the program's
``init_process_group`` and ``set_device(rank)`` run), the caller waiting for them. It was refused (no verdict), so
a script written for ``mp.spawn`` could be checked only by rewriting its entry point.

Rules, each with a test a mutation of it fails:

- the ranks are the world's: the same schedule gives the same reports and counts as the function run on ranks;
- each rank gets its index first, then ``args`` pickled as a spawned child receives them: a change a rank makes to
  a list it was given does not reach the caller; a host tensor is shared memory (a rank's write reaches it); a
  device tensor arrives through CUDA IPC (the rank's stream waits for the caller's write);
- a ``spawn`` the program imported by name starts ranks too (it calls ``start_processes`` by its module's name);
- ``join=False`` returns a context whose ``join`` waits for the ranks (or, with a timeout, says whether they are
  done): the caller goes on meanwhile, and what it reads of the ranks' work before joining them is not there yet;
- what a rank raises is the run's host error; a spawn from a rank is not simulated: ``NotImplementedError``, no
  verdict.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.multiprocessing import spawn as spawn_bound_at_import

import simdevice
from simdevice import HostError, Race

N = 1024


def _train(rank: int, world_size: int, wait: bool) -> None:
    """A training process as a script's ``mp.spawn`` starts it: its own group set-up, an async all-reduce."""
    os.environ.setdefault("MASTER_ADDR", "localhost")
    os.environ.setdefault("MASTER_PORT", "29500")
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    torch.cuda.set_device(rank)
    g = torch.full((N,), float(rank + 1), device="cuda")
    work = dist.all_reduce(g, async_op=True)
    if wait:
        work.wait()
    total = g.sum().item()
    work.wait()
    assert total == N * 3, f"rank {rank} read the bucket before the all-reduce landed: {total}"
    dist.destroy_process_group()


def _outcome(fn: Any, schedule: str | None, world_size: int | None = None) -> tuple[list[str], dict[str, int]]:
    s = simdevice.cuda(schedule)
    s.run(fn, world_size=world_size)
    assert s.result is not None
    return [str(r) for r in s.reports], dict(s.result.op_counts)


def test_spawned_ranks_run_as_the_world_s_ranks() -> None:
    for wait in (True, False):
        for schedule in (None, "rank1.nccl#0+20", "rank0.default#1+3"):
            spawned = _outcome(lambda wait=wait: mp.spawn(_train, args=(2, wait), nprocs=2), schedule)
            ranks = _outcome(lambda wait=wait: _train(dist.get_rank(), 2, wait), schedule, world_size=2)
            assert spawned == ranks, (wait, schedule)
            assert any("rank1.nccl" in k for k in spawned[1]), spawned[1]
            if wait:
                assert not spawned[0], spawned[0]
    s = simdevice.cuda("rank1.nccl#0+20")
    s.run(lambda: mp.spawn(_train, args=(2, False), nprocs=2))
    assert any(isinstance(r, Race) for r in s.reports), s.text()


def _fill_given(rank: int, names: list[str], host: torch.Tensor, device: torch.Tensor, seen: list[float]) -> None:
    names.append(f"rank{rank}")
    host[rank].fill_(rank + 1.0)
    seen[rank] = float(device.sum().item())


def test_each_rank_gets_its_index_then_the_arguments_as_a_spawned_child_does() -> None:
    got: dict[str, Any] = {}

    def program() -> None:
        names: list[str] = []
        host = torch.zeros(2, 4)
        seen = torch.zeros(2).share_memory_()
        device = torch.empty(N, device="cuda")
        torch.cuda._sleep(10**6)  # (the write the ranks must wait for, late on the caller's stream)
        device.fill_(2.0)
        start = torch.multiprocessing.start_processes
        start(_fill_given, args=(names, host, device, seen), nprocs=2)  # type: ignore[arg-type]
        got.update(names=names, host=host.clone(), seen=seen.clone())

    s = simdevice.cuda()
    s.run(program)
    s.assert_clean()
    assert got["names"] == [], "a rank's change to a list it was given reached the caller"
    assert torch.equal(got["host"], torch.tensor([[1.0] * 4, [2.0] * 4])), got["host"]


def _seen_by_ranks(rank: int, device: torch.Tensor, seen: torch.Tensor) -> None:
    seen[rank] = device.sum()


def test_a_device_tensor_given_to_the_ranks_arrives_after_the_caller_s_write() -> None:
    got: list[torch.Tensor] = []

    def program() -> None:
        seen = torch.zeros(2).share_memory_()
        device = torch.empty(N, device="cuda")
        torch.cuda._sleep(10**6)
        device.fill_(2.0)
        mp.spawn(_seen_by_ranks, args=(device, seen), nprocs=2)
        got.append(seen.clone())

    s = simdevice.cuda()
    s.run(program)
    s.assert_clean()
    assert torch.equal(got[0], torch.full((2,), 2.0 * N)), got[0]


def _rank_named(rank: int, out: torch.Tensor) -> None:
    out[rank] = dist.get_rank() * 10 + dist.get_world_size()


def test_a_spawn_imported_by_name_starts_ranks_too() -> None:
    got: list[torch.Tensor] = []

    def program() -> None:
        out = torch.zeros(3).share_memory_()
        spawn_bound_at_import(_rank_named, args=(out,), nprocs=3)
        got.append(out.clone())

    s = simdevice.cuda()
    s.run(program)
    s.assert_clean()
    assert got[0].tolist() == [3.0, 13.0, 23.0], got


def _fails_on_one(rank: int) -> None:
    torch.ones(4, device="cuda").sum()
    if rank == 1:
        raise ValueError("rank one's own failure")


def _spawn_again(rank: int) -> None:
    mp.spawn(_fails_on_one, nprocs=2)


def test_what_is_not_simulated_gives_no_verdict_and_a_rank_s_error_is_the_run_s() -> None:
    s = simdevice.cuda()
    s.run(lambda: mp.spawn(_fails_on_one, nprocs=2))
    (err,) = [str(r) for r in s.reports]
    assert "rank1 raised ValueError: rank one's own failure" in err, err
    s = simdevice.cuda()
    s.run(lambda: mp.spawn(_spawn_again, nprocs=2))
    (err,) = [str(r) for r in s.reports]
    assert "NotImplementedError" in err, err
    assert "one world per run" in err, err


def _joined_later(wait: bool) -> None:
    """``join=False`` (Lightning's launcher's way): the caller polls the context's ``join`` until the ranks exit,
    then reads what they wrote; or reads it at once, as the ranks run."""
    out = torch.zeros(2).share_memory_()
    context = mp.spawn(_rank_named_slowly, args=(out,), nprocs=2, join=False)
    assert len(context.pids()) == 2
    if wait:
        while not context.join(timeout=0.001):
            pass
    assert out.tolist() == [2.0, 12.0], out.tolist()
    context.join()


def _rank_named_slowly(rank: int, out: torch.Tensor) -> None:
    torch.ones(4, device="cuda").sum().item()  # (a host step: the caller goes on meanwhile)
    out[rank] = dist.get_rank() * 10 + dist.get_world_size()


def test_a_spawn_not_joined_goes_on_and_its_context_joins_the_ranks() -> None:
    s = simdevice.cuda()
    s.run(lambda: _joined_later(True))
    s.assert_clean()
    assert s.result is not None
    assert not s.result.gpu, "a spawn with join=False offered a GPU replay (reference.cuda_plain refuses it)"
    s = simdevice.cuda()
    s.run(lambda: _joined_later(False))
    assert any(isinstance(r, HostError) for r in s.reports), s.text()
