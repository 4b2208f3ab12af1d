"""Rule (Runtime.value_set): a process that sets a shared ``Value`` to a new value makes progress, so a peer
polling that value while it keeps changing (a heartbeat, a step counter it waits to reach) is no deadlock, however
long past the stall horizon the polling goes on; a set that leaves the value as it was is no progress (polling a
value nobody changes past the horizon is still one)."""

from __future__ import annotations

from typing import Any

from simdevice import SimDevice
from simdevice.runtime import SimConfig
from simdevice.runtime.execution import POLLS
from simdevice.runtime.reports import Deadlock

STEP = SimConfig().host_step_ns
CONFIG = SimConfig(stall_horizon_ns=2 * (POLLS + 1) * STEP)
#: the worker's sets: ten stall horizons of host steps
BEATS = 10 * CONFIG.stall_horizon_ns // STEP


def counter(dev: Any, value: Any, step: int) -> None:
    for i in range(BEATS):
        value.value = i * step  # step 0: the same value every time


def waits_for_the_last_beat(dev: Any, step: int) -> int:
    value = dev.Value("i", -1)
    p = dev.Process(counter, (value, step))
    p.start()
    polls = 0
    while value.value != (BEATS - 1) * step:
        polls += 1
    p.join()
    return polls


def test_polling_a_value_that_keeps_changing_is_no_deadlock() -> None:
    run = SimDevice(config=CONFIG).run(waits_for_the_last_beat, 1)
    assert run.reports == (), [str(r) for r in run.reports]
    first, last = run.trace[0][0], run.trace[-1][0]
    assert last - first > 5 * CONFIG.stall_horizon_ns  # (the premise: it polled for many horizons)
    assert run.result > POLLS


def test_polling_a_value_set_again_to_what_it_was_is_a_deadlock_past_the_horizon() -> None:
    # step 0 sets 0 every time, and the poller waits for 0: set once (from -1), then never changed
    def never_reached(dev: Any) -> None:
        value = dev.Value("i", -1)
        p = dev.Process(counter, (value, 0))
        p.start()
        while value.value != 1:  # never: the counter only ever sets 0
            pass
        p.join()

    run = SimDevice(config=CONFIG).run(never_reached)
    assert [type(r) for r in run.reports] == [Deadlock], [str(r) for r in run.reports]
