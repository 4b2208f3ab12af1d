"""Rule (Runtime._free_notes): the run's notes name at most ``most`` unordered frees, then one line counting the
rest; when there are exactly ``most`` nothing is left out, so there is no "... and 0 more" line."""

from __future__ import annotations

import inspect
from typing import Any

import torch

from reference.schedule import Schedule
from simdevice import SimDevice
from simdevice.runtime.runtime import Runtime

MOST = inspect.signature(Runtime._free_notes).parameters["most"].default


def freed_while_side_streams_read(dev: Any, n: int) -> None:
    """``n`` blocks, each read by a stream of its own, all freed by the host with no record_stream and no wait."""
    blocks = [torch.ones(4096, device=dev.device) for _ in range(n)]
    for k, a in enumerate(blocks):
        side = dev.Stream(name=f"side{k}")
        side.wait_stream(dev.current_stream())
        with dev.stream(side):
            a.sum()
    del a
    blocks.clear()
    dev.synchronize()


def _free_notes(n: int) -> list[str]:
    run = SimDevice(Schedule.parse("t/t")).run(freed_while_side_streams_read, n)
    assert run.reports == ()
    return [n for n in run.notes if "read unordered before the free" in n or "more such frees" in n]


def test_exactly_most_unordered_frees_are_all_named_and_none_is_counted_as_left_out() -> None:
    notes = _free_notes(MOST)
    assert len(notes) == MOST
    assert not any("more such frees" in n for n in notes), notes


def test_one_more_than_most_is_counted_in_one_line() -> None:
    notes = _free_notes(MOST + 1)
    assert len(notes) == MOST + 1
    assert notes[-1].endswith("... and 1 more such frees")
