"""Rule (imports: ``_find_and_load``, ``_lock_unlock_module``): an actor importing a module another actor is still
making waits for that import to end, as a thread waits on Python's module lock. The run's ranks share one
interpreter (a greenlet run, one machine thread): a rank that stopped inside a module's top-level code (a device call
there is a host step) let the next rank import the same module half made, ``ImportError: cannot import name ...
from partially initialized module`` (DeepSpeed's ZeRO imports its optimizers inside ``step``, on every rank); on
threads taking turns, the second rank waited on the real lock for good. A mutation that leaves Python's own import
fails the greenlet case (and hangs the threaded one).
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import simdevice
from simdevice.runtime import SimConfig

SCHEDULES = (None, "rank1#0+1", "rank0#0+1", "rank0#1+3", "rank1#1+3")


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in ("halfmade", "cycle_a", "cycle_b"):
        sys.modules.pop(name, None)


def _value() -> int:
    torch.ones(1, device="cuda")
    from halfmade import VALUE  # (each rank imports it lazily, as a library's function does)

    return int(VALUE)


@pytest.mark.parametrize("actors", ["greenlet", "thread"])
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_a_rank_importing_a_module_another_rank_is_making_gets_it_whole(
        modules: Path, actors: str, schedule: str | None) -> None:
    (modules / "halfmade.py").write_text(textwrap.dedent("""
        import torch

        torch.zeros(4, device="cuda")  # a host step inside the module's top-level code
        VALUE = 42
    """))
    sys.modules.pop("halfmade", None)  # (each run imports it afresh, as each process of a world does)
    s = simdevice.cuda(schedule, config=SimConfig(actors=actors))
    s.run(_value, world_size=2)
    assert not s.reports, s.text()
    assert s.result.result == [42, 42]


def _cycle() -> str:
    import torch.distributed as dist

    torch.ones(1, device="cuda")
    if dist.get_rank() == 0:
        import cycle_a

        return str(cycle_a.b_name())
    import cycle_b

    return str(cycle_b.a_name())


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_two_ranks_importing_a_cycle_from_its_two_ends_go_on_as_python_does(
        modules: Path, schedule: str | None) -> None:
    """Each module imports the other after a device call: rank0 makes one, rank1 the other. Python's deadlock
    detection lets the second waiter go on with the module half made; the run does not end in a deadlock."""
    for this, other in (("a", "b"), ("b", "a")):
        (modules / f"cycle_{this}.py").write_text(textwrap.dedent(f"""
            import torch

            torch.zeros(4, device="cuda")
            import cycle_{other}


            def {other}_name():
                return cycle_{other}.__name__
        """))
    sys.modules.pop("cycle_a", None)
    sys.modules.pop("cycle_b", None)
    s = simdevice.cuda(schedule)
    s.run(_cycle, world_size=2)
    assert not s.reports, s.text()
    assert s.result.result == ["cycle_b", "cycle_a"]
