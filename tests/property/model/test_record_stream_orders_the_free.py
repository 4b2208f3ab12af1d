"""Rule (sync.free_point): a block's free is ordered after the streams ``record_stream`` named, so a side stream's
read of a recorded tensor is no "read unordered before the free" note (the free waits for it)."""

from __future__ import annotations

from typing import Any

import torch

from reference.schedule import Schedule
from simdevice import SimDevice


def dropped_after_record_stream(dev: Any, record: bool) -> None:
    side = dev.Stream(name="side")
    out = torch.empty(4096, device=dev.device)
    a = torch.ones(4096, device=dev.device)
    side.wait_stream(dev.current_stream())
    with dev.stream(side):
        out.copy_(a)
    if record:
        a.record_stream(side)
    del a
    dev.synchronize()


def test_a_recorded_streams_read_is_ordered_before_the_free() -> None:
    without = SimDevice(Schedule.parse("t/t")).run(dropped_after_record_stream, False)
    assert [n for n in without.notes if "read unordered before the free" in n]  # the note this rule removes
    with_record = SimDevice(Schedule.parse("t/t")).run(dropped_after_record_stream, True)
    assert (with_record.reports, with_record.notes) == ((), ())
