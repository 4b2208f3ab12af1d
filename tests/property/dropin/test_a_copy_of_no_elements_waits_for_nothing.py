"""A copy across host and device of no elements makes the host wait for nothing: ATen's ``copy_`` returns before it
copies where the copy has no elements, so a blocking one neither waits for its stream nor synchronizes (an H100
flagged neither under ``set_sync_debug_mode``: ``tests/hazards.py``'s ``SYNC_DEBUG_CASES``). The simulator made the
host wait for the stream, which hid a race a GPU shows after such a call: a lazy module moved to the device before
its first forward (``LazyLinear(4).cuda()``) copies its empty placeholders so, and the program read a pinned copy
after it as though it had synchronized."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import simdevice
from simdevice import Race

MOVES: dict[str, Callable[[torch.Tensor], Any]] = {
    "an empty host tensor to the device": lambda x: torch.empty(0).cuda(),
    "an empty device tensor to the host": lambda x: x[:0].cpu(),
    "a lazy module": lambda x: torch.nn.LazyLinear(4).cuda(),
}


def _read_after(move: Callable[[torch.Tensor], Any], elements: bool = False) -> Any:
    def program() -> None:
        x = torch.arange(4096, dtype=torch.float32, device="cuda")
        host = torch.empty(4096, pin_memory=True)
        host.copy_(x, non_blocking=True)
        if elements:
            x[:1].cpu()  # one element: a blocking copy, the host waits for the stream
        else:
            move(x)
        assert float(host[-1]) == 4095.0

    run = simdevice.cuda()
    run.run(program)
    return run.result


@pytest.mark.parametrize("name", sorted(MOVES))
def test_a_copy_of_nothing_does_not_order_the_host_after_the_stream(name: str) -> None:
    assert any(isinstance(r, Race) for r in _read_after(MOVES[name]).reports)


def test_a_copy_of_one_element_still_does() -> None:
    assert not _read_after(lambda x: None, elements=True).reports
