"""Rule (memory.pieces): a dimension of size 1 places no copy of the innermost run, whatever its stride, so it
changes neither a strided view's pieces nor whether it has too many to check one by one (``MAX_PIECES``): a write
to a view with a gap is checked at its pieces, and a stream writing the gap does not race with it."""

from __future__ import annotations

from typing import Any

import torch

from simdevice import SimDevice
from simdevice.runtime.memory import MAX_PIECES, pieces

ROWS = 64  # the view's pieces: one per row (at most MAX_PIECES)
COLS = 2 * MAX_PIECES // ROWS  # runs of 3 elements per row, contiguous: more than MAX_PIECES if each were a piece
SHAPE, STRIDE = (ROWS, COLS, 1, 3), (6 * COLS, 3, 2, 1)  # the left half of each row; the size-1 dim's stride, 2


def test_a_size_one_dimension_changes_no_piece() -> None:
    without = pieces((ROWS, COLS, 3), (6 * COLS, 3, 1), 4, 0)
    assert without is not None
    assert len(without) == ROWS
    assert pieces(SHAPE, STRIDE, 4, 0) == without


def halves_on_two_streams(dev: Any) -> None:
    base = torch.zeros(ROWS, 6 * COLS, device=dev.device)
    left = base.as_strided(SHAPE, STRIDE)
    a, b = dev.Stream(name="a"), dev.Stream(name="b")
    a.wait_stream(dev.current_stream())
    b.wait_stream(dev.current_stream())
    with dev.stream(a):
        left.fill_(1)
    with dev.stream(b):
        base[:, 3 * COLS:].fill_(2)  # the right halves: no byte of ``left``
    dev.synchronize()


def test_writes_to_the_view_and_its_gaps_do_not_race() -> None:
    run = SimDevice().run(halves_on_two_streams)
    assert run.reports == ()
