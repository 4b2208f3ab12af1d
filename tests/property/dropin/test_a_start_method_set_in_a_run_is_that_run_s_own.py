"""Rule (processes._patch_start_method): ``set_start_method``, ``get_start_method`` and ``get_context()`` of the
default context (``multiprocessing``'s, ``torch.multiprocessing``'s) answer in a run for the running process's own
setting, which starts as the run found the real one and never reaches it; a child starts with its parent's method
set. Before, they were the real process-wide ones: a program that calls ``mp.set_start_method("spawn")`` once, as a
script's main does, ran clean in the first run of a search and raised "context has already been set" in every
later one, so a search reported that host error (a wrong verdict: each real run is a new process), and the run left
the real start method set after the session.

The program: a trainer hands a checkpoint writer its weights through a ``Queue`` (CUDA IPC) and may step again only
once the writer acknowledges its D2H copy; the writer must synchronize before it acknowledges."""

from __future__ import annotations

import multiprocessing
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

import simdevice
from simdevice import Race

N = 256


@pytest.fixture(autouse=True)
def _no_start_method_set() -> Any:
    """This process as a new one finds it: no start method set (put back as it was after the test)."""
    was = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method(None, force=True)
    yield
    multiprocessing.set_start_method(was, force=True)


def _writer(q: Any, ack: Any, sync: bool) -> None:
    pinned = torch.empty(N, pin_memory=True)
    w = q.get()
    pinned.copy_(w, non_blocking=True)
    if sync:
        torch.cuda.current_stream().synchronize()
    ack.set()
    torch.cuda.current_stream().synchronize()
    assert torch.equal(pinned, torch.ones(N)), "the checkpoint differs from the weights"


def _checkpoint(sync: bool) -> None:
    mp.set_start_method("spawn")  # as a script's main does, once per process
    q, ack = mp.Queue(), mp.Event()
    p = mp.Process(target=_writer, args=(q, ack, sync), name="writer")
    p.start()
    w = torch.ones(N, device="cuda")
    q.put(w)
    ack.wait()
    w.mul_(2.0)  # the next step
    p.join()
    assert p.exitcode == 0


def checkpoint_acknowledged_after_the_copy() -> None:
    _checkpoint(True)


def checkpoint_acknowledged_before_the_copy() -> None:
    _checkpoint(False)


def test_a_program_that_sets_its_start_method_runs_clean_in_every_run_of_a_search() -> None:
    found = simdevice.explore(checkpoint_acknowledged_after_the_copy, max_examples=20)
    assert found.failure is None, found.failure.text()
    assert multiprocessing.get_start_method(allow_none=True) is None  # (the run's setting stayed in the run)


def test_its_racy_variant_is_found_as_the_race_it_is() -> None:
    found = simdevice.explore(checkpoint_acknowledged_before_the_copy, max_examples=20)
    assert found.failure is not None
    run = found.failure.run
    assert not any("already been set" in str(r) for r in run.reports), found.failure.text()
    assert any(isinstance(r, Race) and "copy_ (D2H) on stream writer.default" in str(r) and "mul_" in str(r)
               for r in run.reports), found.failure.text()


def _reports_its_method(q: Any) -> None:
    q.put(mp.get_start_method(allow_none=True))


def test_in_a_run_the_start_method_is_set_once_as_the_standard_library_sets_it() -> None:
    seen: dict[str, Any] = {}

    def program() -> None:
        seen["before"] = mp.get_start_method(allow_none=True)
        mp.set_start_method("spawn")
        try:
            multiprocessing.set_start_method("fork")
        except RuntimeError as e:
            seen["again"] = str(e)
        seen["set"] = multiprocessing.get_start_method()
        mp.set_start_method("forkserver", force=True)
        seen["forced"] = type(mp.get_context()).__name__
        q = mp.Queue()
        p = mp.Process(target=_reports_its_method, args=(q,))
        p.start()
        seen["child"] = q.get()
        p.join()

    s = simdevice.cuda()
    s.run(program)
    s.assert_clean()
    assert seen == {"before": None, "again": "context has already been set", "set": "spawn",
                    "forced": "ForkServerContext", "child": "forkserver"}
    assert multiprocessing.get_start_method(allow_none=True) is None


def test_starting_a_process_of_the_default_context_fixes_its_method() -> None:
    seen: list[str] = []

    def program() -> None:
        q = mp.Queue()
        p = mp.Process(target=_reports_its_method, args=(q,))
        p.start()
        q.get()
        p.join()
        try:
            mp.set_start_method("spawn")
        except RuntimeError as e:
            seen.append(str(e))

    s = simdevice.cuda()
    s.run(program)
    assert seen == ["context has already been set"]
    assert multiprocessing.get_start_method(allow_none=True) is None
