"""The CPU generator during a simulated run (``simdevice.runtime.runtime.cpu_generator_kept``).

Rule, with a test a mutation of it fails: a run draws its host random numbers from the CPU generator as it stood
when the run began, and leaves it so. Every run of a search, and a replay in a new process, draws the same numbers,
so a schedule's verdict does not depend on the runs before it; a seed the program sets before a search holds for
each of its runs.

Rule (``simdevice.runtime.execution.Execution.own_generator``): each actor (rank, process) draws from a CPU generator
of its own, which starts as the run found it, as each process of a real world starts from the same default seed:
ranks seeded alike draw alike, whichever turns their draws take.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

import simdevice
from simdevice import SimDevice
from simdevice.runtime.config import SimConfig


def _draws(dev: Any) -> list[float]:
    w = torch.randn(4)  # on the host, as a module's initial weights are
    x = w.to(dev.device)
    return x.cpu().tolist()


def test_each_run_draws_the_same_host_numbers() -> None:
    """Mutation caught: the run without ``cpu_generator_kept`` (the second run went on from the first's draws)."""
    first = SimDevice().run(_draws).result
    second = SimDevice().run(_draws).result
    assert first == second


def test_the_caller_s_generator_is_as_it_was_after_the_run() -> None:
    torch.manual_seed(7)
    expected = torch.randn(3)
    torch.manual_seed(7)
    SimDevice().run(_draws)
    assert torch.equal(torch.randn(3), expected)


def test_a_seed_set_before_a_search_holds_for_each_of_its_runs() -> None:
    """A program whose check holds for the numbers the seed gives only: with the generator going on from run to
    run, the search's later runs drew other numbers and failed."""
    torch.manual_seed(0)
    expected = torch.randn(4).tolist()
    torch.manual_seed(0)

    def program() -> None:
        x = torch.randn(4).cuda()
        assert x.cpu().tolist() == expected

    found = simdevice.explore(program, max_examples=10)
    assert found.failure is None


def _seeded_ranks(seed: bool) -> None:
    if seed:
        torch.manual_seed(0)
    first = torch.randn(4)
    torch.ones(4, device="cuda").add_(1.0)  # host steps between the draws: the other rank takes its turn
    second = torch.randn(4)
    got: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(got, (first.tolist(), second.tolist()))
    assert all(g == got[0] for g in got), f"the ranks drew different numbers: {got}"


@pytest.mark.parametrize("actors", ["greenlet", "thread"])
@pytest.mark.parametrize("seed", [True, False], ids=["seeded", "unseeded"])
def test_ranks_seeded_alike_draw_alike_whatever_their_turns(actors: str, seed: bool) -> None:
    """Mutation caught: one generator for every actor (rank1's seed reset the generator between rank0's two draws,
    and rank0's second draw moved rank1's numbers: a data-parallel program's ranks built different weights)."""
    run = simdevice.cuda(config=SimConfig(actors=actors))
    run.run(lambda: _seeded_ranks(seed), world_size=2)
    run.assert_clean()


def test_a_rank_s_draws_leave_the_caller_s_generator_as_it_was() -> None:
    torch.manual_seed(7)
    expected = torch.randn(3)
    torch.manual_seed(7)
    simdevice.cuda().run(lambda: _seeded_ranks(True), world_size=2)
    assert torch.equal(torch.randn(3), expected)
