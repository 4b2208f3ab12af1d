"""Rule (dropin.distributed._check_group): a collective takes the whole world as its group however the program
names it (no group, ``dist.group.WORLD``, or what ``dist.new_group()`` of every rank returned, as DDP/FSDP code
passes it: a group of its own, of every rank, ``test_a_new_group_is_a_communicator_and_a_stream_of_its_own.py``), and
refuses a group object the run did not make with NotImplementedError rather than running it as if it were the world
(groups ``new_group`` makes of some ranks: ``test_subset_process_groups_run_as_nccl_runs_them.py``)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

import simdevice


def _reduce_over(group_of: str) -> list[float]:
    group: Any = {"new_group": lambda: dist.new_group(), "new_group of every rank":
                  lambda: dist.new_group(list(range(dist.get_world_size()))), "none": lambda: None}[group_of]()
    t = torch.full((4,), float(dist.get_rank() + 1), device="cuda")
    dist.all_reduce(t, group=group)
    work = dist.all_reduce(t, group=group, async_op=True)
    assert work is not None
    work.wait()
    dist.barrier(group=group)
    return t.cpu().tolist()


def test_the_group_new_group_returns_is_the_world_to_every_collective() -> None:
    for group_of in ("none", "new_group", "new_group of every rank"):
        got: dict[int, list[float]] = {}

        def program(group_of: str = group_of, got: dict[int, list[float]] = got) -> None:
            got[dist.get_rank()] = _reduce_over(group_of)

        s = simdevice.cuda()
        s.run(program, world_size=2)
        assert s.clean, f"group from {group_of}: {s.text()}"
        # 1 + 2 = 3 after the first all_reduce, 3 + 3 = 6 after the second
        assert got == {0: [6.0] * 4, 1: [6.0] * 4}, f"group from {group_of}: {got}"


class _SomeOtherGroup:
    """A process group that is not the simulated world (as one made by hand outside the session would be)."""


def test_a_group_other_than_the_world_is_refused() -> None:
    def program() -> None:
        t = torch.ones(4, device="cuda")
        dist.all_reduce(t, group=_SomeOtherGroup())

    s = simdevice.cuda()
    s.run(program, world_size=2)
    errors = [str(r) for r in s.reports]
    assert errors, "a collective over a group other than the world ran as if it were the world"
    assert all("NotImplementedError: only the process groups torch.distributed made in the run are simulated" in e
               for e in errors), errors


def test_distributed_c10d_s_names_are_the_simulated_ones() -> None:
    """``torch.distributed`` re-exports ``distributed_c10d``'s functions: code that calls them through that module
    (or imports them from it), and ``_get_default_group()`` (FSDP's and DeviceMesh's way to the default group), get
    the simulated world. Before, ``_get_default_group()`` raised that no process group was initialized, a host error
    blamed on the program, and ``distributed_c10d.all_reduce`` reached the real process group."""
    from torch.distributed import distributed_c10d as c10d

    got: dict[int, list[float]] = {}

    def program() -> None:
        pg = c10d._get_default_group()
        assert pg.size() == dist.get_world_size()
        t = torch.full((4,), float(dist.get_rank() + 1), device="cuda")
        c10d.all_reduce(t, group=pg)
        got[dist.get_rank()] = t.cpu().tolist()

    s = simdevice.cuda()
    s.run(program, world_size=2)
    assert s.clean, s.text()
    assert got == {0: [3.0] * 4, 1: [3.0] * 4}


def test_what_distributed_c10d_offers_and_is_not_simulated_is_refused() -> None:
    from torch.distributed import distributed_c10d as c10d

    def program() -> None:
        torch.ones(4, device="cuda")
        c10d.monitored_barrier()

    s = simdevice.cuda()
    s.run(program, world_size=2)
    errors = [str(r) for r in s.reports]
    assert errors, "distributed_c10d.monitored_barrier ran"
    assert all("NotImplementedError: torch.distributed.monitored_barrier is not simulated" in e for e in errors), errors
