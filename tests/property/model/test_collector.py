"""Python's cycle collector during a simulated run (``simdevice.runtime.runtime.collector_paused``).

Rule, with a test a mutation of it fails: no automatic collection runs during a run (an explicit ``gc.collect()``
of the program still does), and the collector is as it was once the run ends. So a device tensor dropped inside a
reference cycle keeps its block for the rest of the run, whatever the process allocated before: the same schedule
frees it at the same step (none) in a search and in its replay. With the collector running, where it lands
depends on the process's history.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from simdevice import SimDevice


@pytest.fixture
def eager_collector() -> Iterator[None]:
    """A collection at nearly every allocation: what a run would meet, sooner or later, without the pause."""
    before = gc.get_threshold()
    gc.set_threshold(1, 1, 1)
    try:
        yield
    finally:
        gc.set_threshold(*before)


def _cycle_then_alloc(dev: Any, explicit: bool) -> tuple[int, int]:
    x = torch.empty(1024, device=dev.device)
    first = x.data_ptr()
    loop: list[Any] = [x]
    loop.append(loop)  # x is held by a reference cycle only
    del x, loop
    if explicit:
        gc.collect()
    for _ in range(200):  # plenty of allocations: an unpaused collector would have run
        [object() for _ in range(10)]
    y = torch.empty(1024, device=dev.device)  # the caching allocator hands a freed block of this size on at once
    return first, y.data_ptr()


@pytest.mark.usefixtures("eager_collector")
def test_a_tensor_in_a_dropped_cycle_keeps_its_block_for_the_run() -> None:
    first, second = SimDevice().run(lambda dev: _cycle_then_alloc(dev, explicit=False)).result
    assert first != second  # not collected, not freed: a fresh block


@pytest.mark.usefixtures("eager_collector")
def test_an_explicit_collect_of_the_program_still_runs() -> None:
    first, second = SimDevice().run(lambda dev: _cycle_then_alloc(dev, explicit=True)).result
    assert first == second  # collected, freed, its block handed on


def test_the_collector_is_as_it_was_after_the_run() -> None:
    seen = SimDevice().run(lambda dev: gc.isenabled()).result
    assert (seen, gc.isenabled()) == (False, True)
    gc.disable()
    try:
        SimDevice().run(lambda dev: None)
        assert not gc.isenabled()  # a caller's choice is kept
    finally:
        gc.enable()


def _offload_and_reload(dev: Any) -> list[float]:
    side = dev.Stream(name="side")
    x = torch.arange(256, dtype=torch.float32, device=dev.device)
    pinned = torch.empty(256, pin_memory=True)
    side.wait_stream(dev.current_stream())
    with dev.stream(side):
        pinned.copy_(x, non_blocking=True)
    dev.current_stream().wait_stream(side)
    back = torch.empty_like(x)
    back.copy_(pinned, non_blocking=True)
    dev.memory_saver  # the memory saver over the allocator, as every run has  # noqa: B018
    return back.cpu().tolist()[:4]


def _gather(dev: Any) -> list[float]:
    out, inp = torch.zeros(4, device=dev.device), torch.ones(4, device=dev.device)
    dev.all_gather_into_tensor(out, inp).wait()
    return out.cpu().tolist()


def _one_rank_gathers(dev: Any) -> list[float]:
    result: list[float] = dev.spawn_ranks(_gather, 1)[0]
    return result


@pytest.mark.parametrize(("program", "result"), [(_offload_and_reload, [0.0, 1.0, 2.0, 3.0]),
                                                 (_one_rank_gathers, [1.0, 1.0, 1.0, 1.0])])
def test_a_run_dies_by_reference_counting_once_dropped(program: Any, result: list[float]) -> None:
    """No reference cycle holds a run's model (runtime, allocator, memory saver, segments and their blocks, the
    façade): dropped, it is freed at once, not left to the collector. (A cycle kept all of a run's shadows and
    accesses for the collector, which then spent a tenth of a search's time on them.)"""
    import weakref

    was = gc.isenabled()
    gc.disable()
    try:
        dev = SimDevice()
        run = dev.run(program)
        assert (run.result, run.reports) == (result, ())
        watched = [weakref.ref(x) for x in (dev, dev.runtime, dev.runtime.memsaver, dev.runtime.memsaver.allocator,
                                            dev.runtime.execution, dev.runtime.memory)]
        segments = dev.runtime.memsaver.allocator.segments(None)
        watched += [weakref.ref(s) for s in segments]
        del dev, segments
        assert [w() is None for w in watched] == [True] * len(watched)
    finally:
        if was:
            gc.enable()


@pytest.mark.usefixtures("eager_collector")
def test_execute_holds_the_collector_until_its_device_is_dropped() -> None:
    """``simdevice.search.execute``: no automatic collection from the run's start to its outcome (its oracle
    included), so the run's objects die by reference counting before the collector next looks."""
    from reference.schedule import Schedule
    from simdevice.search import execute

    inside = [False]
    during: list[int] = []

    def seen(phase: str, info: dict[str, Any]) -> None:
        if phase == "start" and inside[0]:
            during.append(info["generation"])

    import simdevice.programs.offload_reload as demo

    oracle = demo.PROGRAM.oracle

    def watched(*args: Any) -> Any:
        inside[0] = True  # the oracle runs after the run: the collector must still be held
        try:
            for _ in range(50):
                [object() for _ in range(10)]
            return oracle(*args)
        finally:
            inside[0] = False

    gc.callbacks.append(seen)
    object.__setattr__(demo.PROGRAM, "oracle", watched)
    try:
        out = execute(Schedule.parse("offload_reload/correct"))
    finally:
        object.__setattr__(demo.PROGRAM, "oracle", oracle)
        gc.callbacks.remove(seen)
    assert (out.clean, during) == (True, [])


FIRST_RUN = """
import weakref
import torch
from reference.schedule import Schedule
from simdevice import SimDevice

def program(dev):
    big = torch.ones(1 << 12, device=dev.device)
    a = torch.ones(4, device=dev.device)
    torch.cat([big, a])  # cat's meta kernel is Python that imports torch._dynamo the first time it runs
    alive = weakref.ref(a)
    del a
    return alive() is not None

assert "torch._dynamo" not in __import__("sys").modules
print([SimDevice(Schedule.parse("t/t")).run(program).result for _ in range(2)])
"""


def test_the_first_run_in_a_process_frees_what_the_program_drops_as_every_later_run_does() -> None:
    """The first meta kernel of ``cat`` in a process imports ``torch._dynamo``, whose import keeps a frame in a
    reference cycle: on the program's stack, it held the op's arguments, so the first run kept a dropped tensor (and
    its block) until a collection, where every later run freed it at the ``del``. Run in a process of its own, where
    that import has not happened yet."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    env = dict(os.environ, PYTHONPATH=str(root))
    p = subprocess.run([sys.executable, "-c", FIRST_RUN], cwd=root, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip().splitlines()[-1] == "[False, False]"
