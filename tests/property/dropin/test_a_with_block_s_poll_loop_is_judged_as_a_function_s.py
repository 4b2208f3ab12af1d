"""Rule (``Execution.adopt``): a program written as a ``with simdevice.cuda()`` block runs on the caller's own thread,
which the run adopts as its actor, running from then on, as an actor the run starts is. The stall rules read that
state: a host that only polls with nothing due, at the step bound, is a deadlock (``Execution._only_polling``, where
every live actor is blocked or polling), as the same loop run as a function is, not a step limit. Mutation: the adopted
actor's state left as it was made: the with block's poll loop is a step limit."""

from __future__ import annotations

import torch

import simdevice
from simdevice.runtime import SimConfig
from simdevice.runtime.reports import Deadlock

BOUND = SimConfig(max_host_steps=500)


def poll_loop() -> None:
    s = torch.cuda.current_stream()
    for _ in range(10_000):  # (nothing in flight: no query can ever answer otherwise)
        s.query()


def test_a_poll_loop_in_a_with_block_is_the_deadlock_it_is_as_a_function() -> None:
    with simdevice.cuda(config=BOUND) as block:
        poll_loop()
    s = simdevice.cuda(config=BOUND)
    s.run(poll_loop)
    for result in (block.result, s.result):
        assert result is not None
        assert [type(r) for r in result.reports] == [Deadlock], result.reports
        assert "only polling for 500 host steps, with nothing due" in str(result.reports[0])
