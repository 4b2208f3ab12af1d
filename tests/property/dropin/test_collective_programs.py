"""The collectives of ``tests/collective_programs.py`` on a world of one rank, as ``tests/gpu/test_dropin_gpu.py`` runs
them on a GPU: each output read after its work's ``wait()`` is clean under the stall that exposes a read without
it, and the read without it is found there (a race, and the wrong values the GPU shows)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

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
