"""Rule (``Memory._race``): a race between two operations is reported once, however many of the shadow memory's
cells the two share. A tensor written whole on one stream, then part of it read there (its bytes split into two
cells, each last written by the first write), then read whole on another stream with no edge: one race, not two
(a mutation that dropped the check of the pairs already reported found it once per cell)."""

from __future__ import annotations

from typing import Any

import torch

from simdevice import SimDevice


def split_then_read_elsewhere(dev: Any) -> None:
    x = torch.zeros(64, device=dev.device)
    a, b = dev.Stream(name="a"), dev.Stream(name="b")
    a.wait_stream(dev.current_stream())
    b.wait_stream(dev.current_stream())
    with dev.stream(a):
        x.fill_(1.0)
        x[:16].sum()  # (a read of part of it: the shadow's cells split at byte 64)
    with dev.stream(b):
        x.sum()  # no edge orders it after a's fill
    dev.synchronize()


def test_one_race_for_one_pair_of_operations() -> None:
    run = SimDevice().run(split_then_read_elsewhere)
    races = [r for r in run.reports if r.kind == "race"]
    assert len(races) == 1, run.reports
    assert races[0].previous.op == "fill_", races[0]
    assert races[0].current.op == "sum", races[0]
