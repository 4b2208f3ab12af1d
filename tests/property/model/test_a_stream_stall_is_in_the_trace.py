"""Rule (Execution._advance): a stream's scheduled stall is in the run's trace, on that stream, at the moment it
begins ("stall U units before #k"), and the operation it delays starts U units later (the timeline's stall
slices are read from these lines, as a host's stall is)."""

from __future__ import annotations

from typing import Any

import torch

from reference.schedule import Schedule
from simdevice import SimDevice
from simdevice.runtime.config import UNIT_NS

UNITS = 5


def side_add(dev: Any) -> None:
    x = torch.ones(256, device=dev.device)
    side = dev.Stream(name="side")
    side.wait_stream(dev.current_stream())
    with dev.stream(side):
        x.add_(1)
    dev.synchronize()


def test_a_stream_stall_is_traced_before_the_operation_it_delays() -> None:
    run = SimDevice(Schedule.parse(f"t/t::side#0+{UNITS}")).run(side_add)
    assert run.reports == ()
    side = [(t, what) for t, who, what in run.trace if who == "side" and "#0" in what]
    assert [what for _, what in side][:2] == [f"stall {UNITS} units before #0", "start add_ #0"]
    assert side[1][0] - side[0][0] == UNITS * UNIT_NS
