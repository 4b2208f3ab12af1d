"""Rule (Execution.new_actor): actors and streams share one namespace (reports, traces and schedules name both the
same way), so a process named like an existing stream is refused, as one named like an existing actor is: a host
error naming the clash, not a run with two things of one name."""

from __future__ import annotations

from typing import Any

from simdevice import SimDevice
from simdevice.runtime.reports import HostError


def _worker(dev: Any) -> None:
    dev.sleep(1)


def test_a_process_named_like_a_stream_is_refused() -> None:
    def program(dev: Any) -> None:
        dev.Stream(name="w")
        p = dev.Process(_worker, name="w")
        p.start()
        p.join()

    run = SimDevice().run(program)
    assert [type(r) for r in run.reports] == [HostError]
    assert "named 'w' already exists" in str(run.reports[0])


def test_a_process_named_like_a_process_is_refused() -> None:
    def program(dev: Any) -> None:
        first, second = dev.Process(_worker, name="w"), dev.Process(_worker, name="w")
        first.start()
        second.start()
        first.join()

    run = SimDevice().run(program)
    assert [type(r) for r in run.reports] == [HostError]
    assert "named 'w' already exists" in str(run.reports[0])  # the process's name, not its default stream's
