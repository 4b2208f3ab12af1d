"""Rule (``Execution.program_threads_checked``): a thread a contract program starts during a run is no actor of the run
(only the drop-in runs the program's threads as actors), so its host accesses are not ordered against the streams; an
op of it on pinned memory the run owns is refused with the reason, where it would otherwise go unchecked. An op of it
on a plain host tensor runs. Mutation: the thread's body not wrapped (``thread.run = checked`` removed): the pinned
write runs unchecked and nothing says so."""

from __future__ import annotations

import threading
from typing import Any

import torch

from simdevice import SimDevice


def _in_a_thread(work: Any) -> BaseException | None:
    errors: list[BaseException] = []

    def body() -> None:
        try:
            work()
        except BaseException as e:  # (what the thread raised, for the test to read)
            errors.append(e)

    t = threading.Thread(target=body, name="helper")
    t.start()
    t.join()
    return errors[0] if errors else None


def test_a_thread_s_op_on_pinned_memory_is_refused_and_on_host_memory_runs() -> None:
    got: dict[str, Any] = {}

    def program(dev: Any) -> None:
        pinned = torch.ones(16, pin_memory=True)
        host = torch.ones(16)
        got["pinned"] = _in_a_thread(lambda: pinned.mul_(2))
        got["host"] = _in_a_thread(lambda: host.mul_(2))
        got["host value"] = host[0].item()

    run = SimDevice().run(program)
    assert run.reports == (), run.reports
    assert isinstance(got["pinned"], RuntimeError)
    assert "a thread the program started (helper) that the simulator does not run" in str(got["pinned"])
    assert got["host"] is None
    assert got["host value"] == 2.0
