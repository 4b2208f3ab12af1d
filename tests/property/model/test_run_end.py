"""What a run says about what it never did, and what it refuses to mix.

Rules, each with a test a mutation of it fails:

- a run whose hosts all finished with work left on a stream that nothing can release (a collective one rank never
  joined, nothing waiting on it) ends in a deadlock naming that stream, not "clean" (``Execution._dispatch``);
- a delay or choice for an actor, stream or allocator the run never made is reported as never applied, like one
  whose operation never came (``Runtime.unfired``);
- a tensor of another run is the program's error, named as such (``Dispatcher.dispatch``); handles of another
  run are refused too (``SimDevice.stream_of``, ``event_of``).
"""

from __future__ import annotations

from typing import Any

import torch

from reference.schedule import Schedule
from simdevice import SimDevice
from simdevice.runtime.reports import Deadlock, HostError


def _one_rank_gathers(dev: Any) -> None:
    out, inp = torch.zeros(2, device=dev.device), torch.zeros(1, device=dev.device)
    if dev.rank == 1:
        dev.all_gather_into_tensor(out, inp)  # rank0 never joins, and rank1 never waits for it


def test_stream_work_left_at_the_end_of_a_run_is_a_deadlock() -> None:
    run = SimDevice().run(lambda dev: dev.spawn_ranks(_one_rank_gathers, 2))
    [report] = run.reports
    assert isinstance(report, Deadlock)
    assert "the run ended with stream work that can never run" in str(report)
    assert "stream rank1." in str(report)  # the stream the gather is stuck on


def test_a_run_whose_streams_drain_ends_clean() -> None:
    def both(dev: Any) -> None:
        out, inp = torch.zeros(2, device=dev.device), torch.zeros(1, device=dev.device)
        dev.all_gather_into_tensor(out, inp)  # no wait: the gather still completes, once both ranks issued it

    assert SimDevice().run(lambda dev: dev.spawn_ranks(both, 2)).reports == ()


def test_a_delay_for_an_actor_the_run_never_made_is_reported_as_never_applied() -> None:
    def plain(dev: Any) -> None:
        torch.ones(4, device=dev.device).add_(1)

    run = SimDevice(Schedule.parse("x/y::worker2#0+1,host#0+1,nosuch#3~1")).run(plain)
    assert run.reports == ()
    assert run.unfired == ("nosuch#3~1", "worker2#0+1")


def test_a_tensor_of_another_run_is_the_programs_error() -> None:
    kept: dict[str, Any] = {}

    def first(dev: Any) -> None:
        kept["t"] = torch.ones(4, device=dev.device)

    SimDevice().run(first)
    run = SimDevice().run(lambda dev: kept["t"] + 1)
    [report] = run.reports
    assert isinstance(report, HostError)
    assert "a tensor of another simulated run" in report.error


def test_handles_of_another_run_are_refused() -> None:
    kept: dict[str, Any] = {}

    def first(dev: Any) -> None:
        kept["s"], kept["e"] = dev.Stream(name="theirs"), dev.Event()

    SimDevice().run(first)

    def second(dev: Any) -> None:
        mine = dev.Stream(name="mine")
        for use in (lambda: mine.wait_stream(kept["s"]), lambda: mine.wait_event(kept["e"])):
            try:
                use()
            except RuntimeError as e:  # refused as no verdict (the prefix), naming why
                assert str(e).startswith("simdevice: expected ")  # noqa: PT017
                assert "of this SimDevice" in str(e)  # noqa: PT017
                assert "made by an earlier run" in str(e)  # noqa: PT017
            else:
                raise AssertionError("a handle of another run was accepted")

    assert SimDevice().run(second).reports == ()
