"""Rule (Dispatcher._data_dependent, InFlight.before_write): a data-dependent op's output (``nonzero``) landing in a
reused block leaves an operation already in flight reading that block with the bytes it read at its start: the
start-time read rule holds for every write that lands, this one included (the race is reported all the same)."""

from __future__ import annotations

from typing import Any

import torch

from reference.schedule import Schedule
from simdevice import Race, SimDevice


def side_reads_while_nonzero_lands(dev: Any) -> torch.Tensor:
    n = 1 << 17
    side = dev.Stream(name="side")
    out = torch.empty(n, device=dev.device)
    a = torch.ones(n, device=dev.device)
    mask = torch.ones(n // 2, device=dev.device, dtype=torch.bool)  # nonzero: n/2 int64 rows, a's bytes
    side.wait_stream(dev.current_stream())
    with dev.stream(side):
        out.copy_(a)  # a long read of a, started before nonzero's output lands
    del a  # no record_stream: the compute stream takes the block back at once
    idx = torch.nonzero(mask)
    dev.synchronize()
    del idx
    return out.cpu()


def test_an_in_flight_read_keeps_its_start_time_bytes_under_a_data_dependent_write() -> None:
    r = SimDevice(Schedule.parse("t/t")).run(side_reads_while_nonzero_lands)
    assert any(isinstance(x, Race) and x.current.op == "nonzero" for x in r.reports)
    assert torch.equal(r.result, torch.ones(1 << 17))
