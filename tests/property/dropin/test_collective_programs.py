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
