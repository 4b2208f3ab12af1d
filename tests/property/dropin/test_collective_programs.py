"""The collectives of ``tests/collective_programs.py`` on a world of one rank, as ``tests/gpu/test_dropin_gpu.py`` runs
them on a GPU: each output read after its work's ``wait()`` is clean under the stall that exposes a read without
it, and the read without it is found there (a race, and the wrong values the GPU shows)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import simdevice
from reference.schedule import Schedule
from simdevice.search.targets import resolve

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))

from collective_programs import CALLS  # noqa: E402


@pytest.fixture(autouse=True)
def _at_the_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


@pytest.mark.parametrize("call", CALLS)
def test_a_read_without_the_wait_is_found_and_with_it_clean(call: str) -> None:
    for wait in (True, False):
        s = Schedule.parse(f"tests/collective_programs.py::exchange:call={call},wait={int(wait)}:rank0.nccl#0+20")
        out = resolve(s.program, 1).run(s)
        assert out.corrupted != wait, (wait, out.verdict())
        assert ("race" in [r.kind for r in out.run.reports]) != wait


@pytest.mark.parametrize("world", [1, 2])
def test_a_script_written_for_torchrun_runs_on_ranks(world: int) -> None:
    for wait in (True, False):
        s = Schedule.parse(f"tests/collective_programs.py::torchrun_style:wait={int(wait)}:rank0.nccl#0+20")
        out = resolve(s.program, world).run(s)
        assert out.corrupted != wait, (wait, out.verdict())


@pytest.mark.parametrize("nprocs", [1, 2])
def test_a_script_written_for_mp_spawn_runs_its_ranks(nprocs: int) -> None:
    for wait in (True, False):
        s = Schedule.parse(f"tests/collective_programs.py::spawned:nprocs={nprocs},wait={int(wait)}:rank0.nccl#0+20")
        out = resolve(s.program).run(s)
        assert out.corrupted != wait, (wait, out.verdict())
        assert ("race" in [r.kind for r in out.run.reports]) != wait


@pytest.mark.parametrize("line", ["future_value:via=then:rank0.s1#0+20", "future_value:via=wait:rank0.side#0+20"])
def test_a_future_s_value_dropped_under_its_stream_s_read_is_held_for_it(line: str) -> None:
    """The GPU's line (``tests/gpu/test_dropin_gpu.py``): the future holds its value for the stream that reads it,
    so the next allocation takes another block and the stalled read is right. Mutation: either record in
    ``SimWorkFuture._held_by_current`` left out: a race, and the zeros read."""
    s = Schedule.parse(f"tests/collective_programs.py::{line}")
    out = resolve(s.program, 1).run(s)
    assert not out.corrupted, out.verdict()
    assert out.run.reports == (), out.run.reports


def test_a_side_stream_s_read_after_the_work_s_own_wait_holds_nothing() -> None:
    """``work.wait()`` only orders the side stream after the all-reduce: the dropped tensor's block is the next
    allocation's, zeroed under the stalled read (a race, and the wrong sum, as on the GPU)."""
    s = Schedule.parse("tests/collective_programs.py::future_value:via=work:rank0.side#0+20")
    out = resolve(s.program, 1).run(s)
    assert out.corrupted, out.verdict()
    assert "race" in [r.kind for r in out.run.reports], out.run.reports


def test_a_future_s_wait_and_then_are_a_host_step_each() -> None:
    """As the GPU run counts them (``reference.cuda_plain.CountingFuture``), so that a schedule's host delays land at
    the same calls on both: ``then()`` is one step (its callback's ops their own), the future it made waits in one
    step, ``wait()`` in one. Mutation: ``then``'s event recorded as a step of its own (``event.record``): one more."""
    steps = {}
    for via in ("then", "wait"):
        s = Schedule.parse(f"tests/collective_programs.py::future_value:via={via}")
        out = resolve(s.program, 1).run(s)
        steps[via] = [what for _, actor, what in out.run.trace if actor == "rank0"]
    assert steps["then"][2:7] == ["all_reduce", "work.wait", "copy_", "zeros", "future.wait"], steps["then"]
    assert steps["wait"][2:6] == ["all_reduce", "work.wait", "mul", "zeros"], steps["wait"]


@pytest.mark.parametrize(("via", "waits"), [("wait_all", True), ("each", True), ("collected", False)])
def test_a_collected_future_s_wait_orders_nothing_and_each_future_s_wait_orders_its_reader(via: str,
                                                                                         waits: bool) -> None:
    """``torch.futures.collect_all`` of a work's future gives a future of no device, done: its ``wait()`` makes no
    stream wait, so the default stream's read of the gather's output races it; ``wait_all`` (and each collected
    future's ``wait()``) makes the default stream wait for the gather. The GPU's line (``tests/gpu``). Before, either
    call raised ``TypeError`` (torch's C++ took no simulated future): a finding on a correct program. Mutations: the
    collected future's ``wait()`` ordering the reader (the race gone), ``wait_all`` skipping the futures' waits."""
    s = Schedule.parse(f"tests/collective_programs.py::collected_futures:via={via}:rank0.nccl#0+20")
    out = resolve(s.program, 1).run(s)
    assert out.corrupted != waits, out.verdict()
    assert ("race" in [r.kind for r in out.run.reports]) != waits, out.run.reports


def test_collect_all_is_a_host_step_and_a_collected_future_s_wait_one_more() -> None:
    """As the GPU run counts them (``reference.cuda_plain.collect_all``): ``wait_all`` of one future is three steps,
    ``collect_all``, its future's ``wait()``, the future's own ``wait()``; torch's callback streams (one a future)
    get no note."""
    s = Schedule.parse("tests/collective_programs.py::collected_futures:via=wait_all")
    out = resolve(s.program, 1).run(s)
    steps = [what for _, actor, what in out.run.trace if actor == "rank0"]
    assert steps[steps.index("all_gather_into_tensor") + 1:][:3] == ["futures.collect_all", "future.wait",
                                                                    "work.wait"], steps
    assert not any("got no operation" in n for n in out.run.notes), out.run.notes


def _torch_futures() -> list[int]:
    a, b = torch.futures.Future(), torch.futures.Future()
    a.set_result(1)
    b.set_result(2)
    return torch.futures.wait_all([a, b])


def _mixed() -> None:
    import torch.distributed as dist

    plain = torch.futures.Future()
    plain.set_result(0)
    work = dist.all_reduce(torch.ones(4, device="cuda"), async_op=True)
    torch.futures.wait_all([plain, work.get_future()])


def test_torch_s_own_futures_are_collected_by_torch_and_mixed_with_a_work_s_give_no_verdict() -> None:
    s = simdevice.cuda()
    s.run(_torch_futures)
    assert s.clean, s.text()
    assert s.result is not None
    assert s.result.result == [1, 2]
    s = simdevice.cuda()
    s.run(_mixed, world_size=1)
    errors = [str(r) for r in s.reports]
    assert any("collect_all of a collective's futures together with other futures is not simulated" in e
               for e in errors), errors
