"""Time the program waits for is not a deadlock; a bound on steps is not a deadlock either.

Rules, each with a test a mutation of it fails:

- a stall (a host or a stream delay) or an operation in flight postpones the stall horizon to when it ends:
  polling until then is waiting, however long the stall (``Execution.waiting_until``);
- a deadlock is polling: past the horizon it takes more than ``POLLS`` host steps without progress, so one long
  sleep is none (a poll loop that sleeps between polls still is);
- a run past ``SimConfig.max_host_steps`` ends with a :class:`StepLimit` report, not a deadlock, unless it is
  stuck polling then: more than ``POLLS`` steps without progress, nothing due, every live actor blocked or
  polling. A busy poll (no sleep) reaches the bound before the horizon, and is the deadlock the horizon would find
  (``Execution._only_polling``);
- a negative (or NaN) sleep is the program's error;
- a schedule may name stalls up to ``MAX_UNITS`` and indices up to ``MAX_INDEX``, no more.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from reference.schedule import MAX_INDEX, MAX_UNITS, Delay, Schedule, ScheduleError
from simdevice import SimDevice
from simdevice.runtime import SimConfig
from simdevice.runtime.config import UNIT_NS
from simdevice.runtime.reports import Deadlock, HostError, StepLimit

N = 256
#: a short horizon, so that a stall past it costs few simulated steps
SHORT = SimConfig(stall_horizon_ns=UNIT_NS)


def polled(dev: Any, n: int = N) -> torch.Tensor:
    """A D2H on a side stream, polled with ``event.query()`` until it is done (host steps, no progress)."""
    x = torch.ones(n, device=dev.device)
    pinned = torch.empty(n, pin_memory=True)
    side = dev.Stream(name="side")
    side.wait_stream(dev.current_stream())
    done = dev.Event()
    with dev.stream(side):
        pinned.copy_(x, non_blocking=True)
        done.record()
    while not done.query():
        pass
    return pinned.clone()


def run(program: Any, delays: tuple[Delay, ...] = (), config: SimConfig = SHORT, *args: Any) -> Any:
    return SimDevice(Schedule("test", "t", (), delays), config).run(program, *args)


def test_polling_through_a_stream_stall_longer_than_the_horizon_is_not_a_deadlock() -> None:
    r = run(polled, (Delay("side", 0, 5),))  # 5 units against a 1-unit horizon
    assert r.reports == ()
    assert torch.equal(r.result, torch.ones(N))


def test_polling_through_an_operation_longer_than_the_horizon_is_not_a_deadlock() -> None:
    n = 64 * 1024  # a 256 KiB D2H: about 5 units at the default bandwidth
    r = run(polled, (), SHORT, n)
    assert r.reports == ()
    assert torch.equal(r.result, torch.ones(n))


def test_a_host_stall_longer_than_the_horizon_is_not_a_deadlock() -> None:
    r = run(polled, (Delay("host", 1, 5),))
    assert r.reports == ()


def slept(dev: Any) -> torch.Tensor:
    dev.sleep(5)
    x = torch.ones(N, device=dev.device)
    return x.cpu()


def test_a_sleep_longer_than_the_horizon_is_not_a_deadlock() -> None:
    r = run(slept)
    assert r.reports == ()


def test_polling_with_nothing_due_is_still_a_deadlock_past_the_horizon() -> None:
    def forever(dev: Any) -> None:
        flag = dev.Value("i", 0)
        while flag.value == 0:  # nobody will ever set it
            pass

    r = run(forever)
    assert [type(x) for x in r.reports] == [Deadlock]


def test_the_largest_stall_the_grammar_allows_is_clean_where_the_program_is() -> None:
    r = run(polled, (Delay("host", 0, MAX_UNITS),), SimConfig())
    assert r.reports == ()


def test_a_run_past_its_step_bound_is_a_step_limit_not_a_deadlock() -> None:
    def long(dev: Any) -> None:
        x = torch.ones(N, device=dev.device)
        for _ in range(100):
            x.add_(1)

    r = run(long, config=SimConfig(max_host_steps=50))
    assert [type(x) for x in r.reports] == [StepLimit]
    assert "made 50 host steps without ending" in str(r.reports[0])
    assert run(long, config=SimConfig(max_host_steps=500)).reports == ()


def busy_poll(dev: Any) -> None:
    flag = dev.Value("i", 0)
    while flag.value == 0:  # nobody will ever set it, and nothing sleeps between the polls
        pass


def test_a_busy_poll_with_nothing_due_at_the_step_bound_is_a_deadlock() -> None:
    r = run(busy_poll, config=SimConfig(max_host_steps=500))  # the default horizon: 200,000 steps away
    assert [type(x) for x in r.reports] == [Deadlock]
    assert "only polling for " in str(r.reports[0])
    assert "host waits for nothing it can see change (polling; last step: " in str(r.reports[0])


def test_a_poll_at_the_step_bound_with_an_operation_in_flight_is_a_step_limit() -> None:
    n = 64 * 1024  # a 256 KiB D2H: about 5 units, 1,000 host steps of polling
    r = run(polled, (), SimConfig(max_host_steps=500), n)
    assert [type(x) for x in r.reports] == [StepLimit]


def test_a_poll_at_the_step_bound_while_another_actor_computes_is_a_step_limit() -> None:
    def worker(dev: Any, flag: Any) -> None:
        for _ in range(1000):
            dev.synchronize()  # host steps that are no polls (and no progress: nothing is in flight)
        flag.value = 1

    def program(dev: Any) -> None:
        flag = dev.Value("i", 0)
        p = dev.Process(worker, (flag,), name="worker0")
        p.start()
        while flag.value == 0:
            pass
        p.join()

    r = run(program, config=SimConfig(max_host_steps=500))
    assert [type(x) for x in r.reports] == [StepLimit]
    assert run(program, config=SimConfig(max_host_steps=10_000)).reports == ()


@pytest.mark.parametrize("units", [-1000, float("nan")])
def test_a_negative_sleep_is_the_programs_error(units: float) -> None:
    def back(dev: Any) -> None:
        dev.sleep(units)

    r = run(back)
    assert [type(x) for x in r.reports] == [HostError]
    assert "a sleep must be >= 0 units" in str(r.reports[0])


@pytest.mark.parametrize("text", [f"t/t::host#0+{MAX_UNITS + 1}", f"t/t::host#{MAX_INDEX + 1}+1",
                                  "t/t::host#0+1" + "0" * 310])
def test_a_schedule_beyond_the_bounds_is_refused_in_one_line(text: str) -> None:
    with pytest.raises(ScheduleError) as e:
        Schedule.parse(text)
    assert "\n" not in str(e.value)
    assert len(str(e.value)) < 200
