"""Rule (Dispatcher._host_op, InFlight.before_write): a host write to pinned memory that an H2D copy in flight is
reading leaves the copy with the bytes it read at its start (the start-time read rule); the race is reported."""

from __future__ import annotations

from typing import Any

import torch

from reference.schedule import Schedule
from simdevice import Race, SimDevice


def host_overwrites_the_source_of_a_copy_in_flight(dev: Any) -> torch.Tensor:
    n = 1 << 17
    pinned = torch.ones(n, pin_memory=True)
    x = torch.empty(n, device=dev.device)
    x.copy_(pinned, non_blocking=True)  # a long H2D read of pinned
    pinned.fill_(2.0)  # no wait for the copy: the host writes while it is in flight
    dev.synchronize()
    return x.cpu()


def test_the_copy_in_flight_keeps_what_it_read_at_its_start() -> None:
    r = SimDevice(Schedule.parse("t/t")).run(host_overwrites_the_source_of_a_copy_in_flight)
    assert [x.current.op for x in r.reports if isinstance(x, Race)] == ["fill_"]
    assert torch.equal(r.result, torch.ones(1 << 17))
