"""Rule (``Storage.byte_pieces``): the byte range a report names for a strided view's access is the one it spans,
from its first element's byte to its last element's end (its pieces within that range are what is checked). A
column of a matrix written on one stream and read on another: the race names the column's span, not its first
element alone (a mutation that leaves the dimensions out of the span, ``extent = 1``, names 4 bytes)."""

from __future__ import annotations

from typing import Any

import torch

from simdevice import SimDevice

ROWS, COLS = 8, 16


def column_on_two_streams(dev: Any) -> None:
    m = torch.zeros(ROWS, COLS, device=dev.device)
    col = m[:, 3]  # a strided view: stride COLS elements
    a, b = dev.Stream(name="a"), dev.Stream(name="b")
    a.wait_stream(dev.current_stream())
    b.wait_stream(dev.current_stream())
    with dev.stream(a):
        col.fill_(1.0)
    with dev.stream(b):
        col.add_(1.0)  # no edge orders it after a's write
    dev.synchronize()


def test_a_race_on_a_column_names_the_bytes_the_column_spans() -> None:
    run = SimDevice().run(column_on_two_streams)
    races = [r for r in run.reports if r.kind == "race"]
    assert races, run.reports
    first, last_end = 3 * 4, ((ROWS - 1) * COLS + 3) * 4 + 4
    for r in races:
        assert (r.current.lo, r.current.hi) == (first, last_end), r
        assert (r.previous.lo, r.previous.hi) == (first, last_end), r
