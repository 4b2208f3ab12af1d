"""The CPU generator during a simulated run (``simdevice.runtime.runtime.cpu_generator_kept``).

Rule, with a test a mutation of it fails: a run draws its host random numbers from the CPU generator as it stood
when the run began, and leaves it so. Every run of a search, and a replay in a new process, draws the same numbers,
so a schedule's verdict does not depend on the runs before it; a seed the program sets before a search holds for
each of its runs.
"""

from __future__ import annotations

from typing import Any

import torch

import simdevice
from simdevice import SimDevice


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
