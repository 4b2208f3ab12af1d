"""Rule (Execution.host_step's deadlock check): a poll loop is a deadlock once it is *past* the stall horizon (more
than ``stall_horizon_ns`` since the last progress, after more than ``POLLS`` steps): polling that ends exactly at the
horizon is not one, and the first step after it is."""

from __future__ import annotations

from typing import Any

from simdevice import SimDevice
from simdevice.runtime import SimConfig
from simdevice.runtime.execution import POLLS
from simdevice.runtime.reports import Deadlock

STEP = SimConfig().host_step_ns
#: a whole number of host steps, more than POLLS of them
CONFIG = SimConfig(stall_horizon_ns=2 * (POLLS + 1) * STEP)


def polls(dev: Any, n: int) -> int:
    flag = dev.Value("i", 0)
    for _ in range(n):
        _ = flag.value  # a poll: nobody sets it, nothing progresses
    return n


def test_polling_that_ends_at_the_horizon_is_not_a_deadlock() -> None:
    n = CONFIG.stall_horizon_ns // STEP + 1  # steps at 0, STEP, ..., the horizon
    run = SimDevice(config=CONFIG).run(polls, n)
    first, last = run.trace[0][0], run.trace[-1][0]
    assert last - first == CONFIG.stall_horizon_ns  # (the premise: the last poll is at the horizon)
    assert run.reports == ()
    past = SimDevice(config=CONFIG).run(polls, n + 1)
    assert [type(r) for r in past.reports] == [Deadlock]
    assert past.reports[0].time_ns - first == CONFIG.stall_horizon_ns + STEP
