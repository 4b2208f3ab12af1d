"""What the simulator says of a ``tests/hazards.py`` program that tests/gpu measures on a GPU: the same verdicts,
checked on the CPU."""

from __future__ import annotations

from reference.schedule import Schedule
from simdevice.search.targets import resolve


def races_only_unwaited(program: str, stall: str) -> None:
    """``tests/hazards.py::program`` (a function with a ``wait`` parameter) under the schedule ``stall``: clean as
    written; unwaited (``wait=0``), its values wrong and a race reported."""
    line = f"tests/hazards.py::{program}"
    target = resolve(line)
    assert not target.run(Schedule.parse(f"{line}::{stall}")).corrupted
    out = target.run(Schedule.parse(f"{line}:wait=0:{stall}"))
    assert out.corrupted, out.text()
    assert "race" in {r.kind for r in out.run.reports}, out.text()
