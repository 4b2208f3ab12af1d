"""Rule (MemorySaver._pause, InFlight.before_write): a pause's poison of a region's bytes leaves an operation in
flight that reads them with the bytes it read at its start (the start-time read rule covers the poison too)."""

from __future__ import annotations

from typing import Any

import torch

from simdevice import SimDevice


def pause_while_a_copy_reads_the_region(dev: Any) -> torch.Tensor:
    n = 1 << 17
    ms = dev.memory_saver
    out = torch.empty(n, device=dev.device)
    with ms.region("train"):
        w = torch.ones(n, device=dev.device)
    dev.synchronize()
    out.copy_(w)  # a long read of w, in flight when the pause poisons w's segment
    ms.pause("train")
    dev.synchronize()
    return out.cpu()


def test_an_in_flight_read_of_a_paused_region_keeps_its_start_time_bytes() -> None:
    r = SimDevice().run(pause_while_a_copy_reads_the_region)
    assert torch.equal(r.result, torch.ones(1 << 17))
