"""``time.sleep`` in a program is virtual host time the device spends too: an allocation after the sleep (no step of
its own) finds the streams where they are when the host wakes. It found them where they were at the host's last
step: a block freed with ``record_stream(side)`` whose side stream finished during the sleep was still held back, so
the allocation took fresh memory where a GPU's caching allocator, which queries the recorded events at each
``malloc``, hands the block out again (an H100, torch 2.11: after a 0.5 s sleep the next allocation of that size had
the dropped tensor's address; without the sleep, a new one: as here)."""

from __future__ import annotations

import time

import pytest
import torch

import simdevice

N = 1 << 20


def _reuses_after(seconds: float) -> bool:
    """Whether the allocation after the sleep gets the block the side stream read."""
    side = torch.cuda.Stream()
    x = torch.ones(N, device="cuda")
    first = x.data_ptr()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y = x * 2
    x.record_stream(side)
    del x
    time.sleep(seconds)
    z = torch.empty(N, device="cuda")
    out = z.data_ptr() == first
    torch.cuda.synchronize()
    del y, z
    return out


@pytest.mark.parametrize(("seconds", "reused"), [(0.0, False), (0.5, True)])
def test_a_block_held_for_a_stream_that_finished_during_the_sleep_is_handed_out_again(seconds: float,
                                                                                     reused: bool) -> None:
    run = simdevice.cuda().run(lambda: _reuses_after(seconds))
    assert not run.reports, run.reports
    assert run.result == reused


def test_the_sleep_takes_no_step_and_the_next_step_comes_when_it_did() -> None:
    """The sleep lets the device and the other actors go on; the host's own steps, and when they come, are as
    before: none for the sleep, the next one a sleep's length after its last."""

    def program() -> None:
        x = torch.ones(N, device="cuda")
        time.sleep(0.001)
        x.add_(1.0)

    run = simdevice.cuda().run(program)
    steps = [(t, what) for t, who, what in run.trace if who == "host"]
    assert [what for _, what in steps] == ["ones", "add_"]
    assert steps[1][0] - steps[0][0] >= 1_000_000
