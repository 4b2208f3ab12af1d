"""Rule (dispatch._record_stream): ``t.record_stream(s)`` takes only a stream of the running session; a stream
another session made (a simulated stream, but not of this run) is refused with a TypeError, not recorded."""

from __future__ import annotations

import pytest
import torch

import simdevice


def test_a_stream_of_an_earlier_session_is_refused() -> None:
    with simdevice.cuda() as first:
        old = torch.cuda.Stream()
    first.assert_clean()
    with simdevice.cuda() as sim:
        t = torch.ones(4, device="cuda")
        with pytest.raises(TypeError, match="not a stream of this simulated device"):
            t.record_stream(old)
        t.record_stream(torch.cuda.Stream())  # one of this run's streams is taken
    sim.assert_clean()
