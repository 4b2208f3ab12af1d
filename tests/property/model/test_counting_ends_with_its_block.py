"""Rule (runtime.counted): only the runs made inside a ``counted()`` block record their accesses' occurrences; when
the block ends, counting ends: a run made after it records nothing there, and :func:`inserted_edges` no longer
holds the no-op ``COUNTING`` edge (so the run cache serves such runs again)."""

from __future__ import annotations

from typing import Any

import torch

from reference.schedule import Schedule
from simdevice import SimDevice
from simdevice.runtime.runtime import COUNTING, counted, inserted_edges


def two_streams(dev: Any) -> None:
    x = torch.ones(64, device=dev.device)
    side = dev.Stream(name="side")
    side.wait_stream(dev.current_stream())
    with dev.stream(side):
        x.mul_(2)
    dev.synchronize()


def test_a_run_after_the_block_is_not_counted() -> None:
    with counted() as inside:
        assert COUNTING in inserted_edges()
        SimDevice(Schedule.parse("t/t")).run(two_streams)
    assert inside.by_seq  # the run inside recorded its accesses
    with counted() as done:
        pass
    assert inserted_edges() == ()
    SimDevice(Schedule.parse("t/t")).run(two_streams)
    assert done.by_seq == {}
