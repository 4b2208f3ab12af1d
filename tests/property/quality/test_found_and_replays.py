"""Every known bug variant of every registered program is found, and what was found replays.

One test, at one strength, over the whole registry: ``check_variant`` (what
``simdevice check`` runs, within its default budget) must find a failing
schedule; the printed line, parsed back, must replay to the same report lines
and the same wrong values. And every counterexample a program pins for the GPU
must corrupt on the simulator too.
"""

from __future__ import annotations

import pytest

from reference.schedule import Schedule
from simdevice.programs import programs
from simdevice.search import Outcome, check_variant, execute

BUG_VARIANTS = [(p.name, v) for p in programs() for v in p.buggy]
PINNED = [(p.name, text) for p in programs() for texts in p.pinned.values() for text in texts]


def lines(out: Outcome) -> list[str]:
    return [*out.problems, *(str(r) for r in out.run.reports)]


@pytest.mark.parametrize(("program", "variant"), BUG_VARIANTS, ids=[f"{p}/{v}" for p, v in BUG_VARIANTS])
def test_bug_found_and_the_printed_schedule_replays(program: str, variant: str) -> None:
    (prog,) = programs([program])
    finding = check_variant(prog, variant, max_examples=150)
    assert finding.found, finding
    assert finding.schedule is not None
    first = execute(Schedule.parse(finding.schedule))
    again = execute(Schedule.parse(str(first.schedule)))
    assert first.corrupted or first.races, first.text()
    assert lines(again) == lines(first)
    assert again.verdict() == first.verdict() == finding.summary


@pytest.mark.parametrize(("program", "text"), PINNED, ids=[t for _, t in PINNED])
def test_pinned_counterexamples_corrupt_on_the_simulator(program: str, text: str) -> None:
    out = execute(Schedule.parse(text))
    assert out.corrupted, out.text()
