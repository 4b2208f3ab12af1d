"""The device RNG (deterministic, seeded by the run, never by global state) and torch.distributed's default
process group on the simulator's ranks."""

from __future__ import annotations

import torch
import torch.distributed as dist

import simdevice
from simdevice import Race, StaleRead


def _draw(seed: int | None = None) -> list[float]:
    if seed is not None:
        torch.cuda.manual_seed(seed)
    a = torch.randn(8, device="cuda")
    b = torch.rand(8, device="cuda")
    c = torch.empty(8, device="cuda").uniform_()
    d = torch.nn.functional.dropout(torch.ones(64, device="cuda"), 0.5)
    return (a.cpu().tolist() + b.cpu().tolist() + c.cpu().tolist() + d.cpu().tolist())


def _session_draw(seed: int | None = None) -> list[float]:
    got: list[float] = []
    s = simdevice.cuda()
    s.run(lambda: got.extend(_draw(seed)))
    s.assert_clean()
    return got


def test_device_random_numbers_repeat_run_to_run_whatever_the_global_state() -> None:
    torch.manual_seed(1)
    first = _session_draw()
    torch.manual_seed(2)
    random_state = torch.rand(3)  # the global generator moved on
    second = _session_draw()
    assert first == second
    assert len(set(first[:24])) == 24  # they are random numbers, not a constant
    assert random_state.numel() == 3


def test_manual_seed_chooses_the_stream_of_numbers() -> None:
    assert _session_draw(7) == _session_draw(7)
    assert _session_draw(7) != _session_draw(8)


def _gather_and_reduce(wait: bool) -> None:
    r, w = dist.get_rank(), dist.get_world_size()
    full = torch.zeros(4 * w, device="cuda")
    work = dist.all_gather_into_tensor(full, torch.full((4,), float(r), device="cuda"), async_op=True)
    if wait:
        work.wait()
    seen = full.cpu().tolist()
    t = torch.ones(2, device="cuda")
    dist.all_reduce(t)
    dist.barrier()
    work.wait()
    assert t.cpu().tolist() == [float(w)] * 2
    assert seen == [float(q) for q in range(w) for _ in range(4)], f"rank {r} read the bucket early"


def test_collectives_meet_across_ranks_and_a_waited_gather_is_clean() -> None:
    s = simdevice.cuda()
    s.run(_gather_and_reduce, True, world_size=2)
    s.assert_clean()
    assert s.result is not None
    assert {"rank0.nccl", "rank1.nccl"} <= set(s.result.op_counts)


def test_reading_the_bucket_without_waiting_the_work_is_found() -> None:
    s = simdevice.cuda()
    s.run(_gather_and_reduce, False, world_size=2)
    assert any(isinstance(r, (Race, StaleRead)) for r in s.reports), s.text()


def test_a_tensor_a_collective_reads_is_kept_until_it_is_done_though_the_program_drops_it() -> None:
    """As ProcessGroupNCCL keeps it (the temporary shard below dies as the call returns; its block is then
    handed to the next allocation, which the compute stream overwrites while NCCL may still be sending it)."""

    def program() -> None:
        full = torch.zeros(4 * dist.get_world_size(), device="cuda")
        work = dist.all_gather_into_tensor(full, torch.full((4,), 5.0, device="cuda"), async_op=True)
        torch.full((4,), 9.0, device="cuda")  # the next allocation of that size
        work.wait()
        assert full.cpu().tolist() == [5.0] * 4 * dist.get_world_size()

    s = simdevice.cuda()
    s.run(program, world_size=2)
    s.assert_clean()


def test_rank_world_and_object_collectives() -> None:
    got: dict[int, list[object]] = {}

    def program() -> None:
        objs: list[object] = [None] * dist.get_world_size()
        dist.all_gather_object(objs, {"rank": dist.get_rank()})
        listed: list[object] = [f"from {dist.get_rank()}"]
        dist.broadcast_object_list(listed, src=1)
        got[dist.get_rank()] = [*objs, *listed]
        assert dist.new_group(list(range(dist.get_world_size()))).size() == dist.get_world_size()

    s = simdevice.cuda()
    s.run(program, world_size=3)
    s.assert_clean()
    assert got[2] == [{"rank": 0}, {"rank": 1}, {"rank": 2}, "from 1"]


def _two_streams() -> list[float]:
    torch.cuda.manual_seed(3)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        a = torch.randn(8, device="cuda")  # issued first: the first numbers, however late it runs
    b = torch.randn(8, device="cuda")
    torch.cuda.synchronize()
    return a.cpu().tolist() + b.cpu().tolist()


def test_a_random_op_that_runs_late_leaves_the_numbers_of_later_ones_as_they_were() -> None:
    """As on a GPU (a generator's offset is taken when the host issues the op), the numbers follow the order the host
    issues random ops in, not the order they run: a stall of the side stream changes nothing."""
    got = []
    for schedule in (None, "side#0+5"):
        s = simdevice.cuda(schedule)
        s.run(lambda: got.append(_two_streams()))
        s.assert_clean()
    assert got[0] == got[1]
    assert len(set(got[0])) == 16
