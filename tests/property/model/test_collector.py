"""Python's cycle collector during a simulated run (``simdevice.runtime.runtime.collector_paused``).

Rule, with a test a mutation of it fails: no automatic collection runs during a run (an explicit ``gc.collect()``
of the program still does), and the collector is as it was once the run ends. So a device tensor dropped inside a
reference cycle keeps its block for the rest of the run, whatever the process allocated before: the same schedule
frees it at the same step (none) in a search and in its replay. With the collector running, where it lands
depends on the process's history.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from simdevice import SimDevice


@pytest.fixture
def eager_collector() -> Iterator[None]:
    """A collection at nearly every allocation: what a run would meet, sooner or later, without the pause."""
    before = gc.get_threshold()
    gc.set_threshold(1, 1, 1)
    try:
        yield
    finally:
        gc.set_threshold(*before)


def _cycle_then_alloc(dev: Any, explicit: bool) -> tuple[int, int]:
    x = torch.empty(1024, device=dev.device)
    first = x.data_ptr()
    loop: list[Any] = [x]
    loop.append(loop)  # x is held by a reference cycle only
    del x, loop
    if explicit:
        gc.collect()
    for _ in range(200):  # plenty of allocations: an unpaused collector would have run
        [object() for _ in range(10)]
    y = torch.empty(1024, device=dev.device)  # the caching allocator hands a freed block of this size on at once
    return first, y.data_ptr()


@pytest.mark.usefixtures("eager_collector")
def test_a_tensor_in_a_dropped_cycle_keeps_its_block_for_the_run() -> None:
    first, second = SimDevice().run(lambda dev: _cycle_then_alloc(dev, explicit=False)).result
    assert first != second  # not collected, not freed: a fresh block


@pytest.mark.usefixtures("eager_collector")
def test_an_explicit_collect_of_the_program_still_runs() -> None:
    first, second = SimDevice().run(lambda dev: _cycle_then_alloc(dev, explicit=True)).result
    assert first == second  # collected, freed, its block handed on


def test_the_collector_is_as_it_was_after_the_run() -> None:
    seen = SimDevice().run(lambda dev: gc.isenabled()).result
    assert (seen, gc.isenabled()) == (False, True)
    gc.disable()
    try:
        SimDevice().run(lambda dev: None)
        assert not gc.isenabled()  # a caller's choice is kept
    finally:
        gc.enable()
