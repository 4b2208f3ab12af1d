"""Find and shrink failing schedules with Hypothesis: the search behind ``simdevice check`` and the tests.

:func:`search` asks Hypothesis for a schedule under which a condition holds
(default: the variant corrupts); :func:`check_variant` runs it for one
variant and records what was found, with the race detector's verdict on the
default schedule beside it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import attrs
from hypothesis import HealthCheck, Phase, find, settings
from hypothesis.errors import NoSuchExample

from reference.schedule import Schedule
from simdevice.programs import Program
from simdevice.search.execute import counts_as_failure, execute
from simdevice.search.strategies import schedules


@attrs.frozen
class Finding:
    """What ``simdevice check`` found for one variant."""

    program: str
    variant: str
    #: "clean" or "bug"
    expect: str
    #: whether a failing schedule was found
    found: bool
    examples: int
    #: the shrunk failing schedule, or None
    schedule: str | None
    #: what the failing schedule shows
    summary: str
    #: whether the race detector flags the default schedule
    race_at_default: bool
    seconds: float

    @property
    def ok(self) -> bool:
        return self.found == (self.expect == "bug")

    def as_dict(self) -> dict[str, Any]:
        d = attrs.asdict(self)
        d["ok"] = self.ok
        return d


def search_settings(max_examples: int = 150, shrink: bool = True, derandomize: bool = True) -> settings:
    """The Hypothesis settings of a schedule search: no database, no deadline, no health checks."""
    return settings(
        max_examples=max_examples,
        database=None,
        derandomize=derandomize,
        deadline=None,
        phases=(Phase.generate, Phase.shrink) if shrink else (Phase.generate,),
        suppress_health_check=list(HealthCheck),
    )


@attrs.frozen
class Search:
    """What one Hypothesis search for a failing schedule found."""

    #: the failing schedule (shrunk, if the search shrank), or None
    schedule: Schedule | None
    #: schedules run, shrinking included
    examples: int
    seconds: float


def search(
    program: Program,
    variant: str,
    fails: Callable[[Schedule], bool] | None = None,
    max_examples: int = 150,
    shrink: bool = True,
    seed: int | None = None,
    budget_s: float | None = None,
    progress: Callable[[int], None] | None = None,
) -> Search:
    """Ask Hypothesis for a schedule of ``variant`` under which ``fails`` holds (default: corruption).

    ``seed=None`` searches derandomized (the same answer every time); a seed draws another search, which is
    what time-to-find medians are made of. Past ``budget_s`` seconds every further schedule counts as passing.
    """
    test = fails or (lambda s: execute(s).corrupted)
    start = time.monotonic()
    count = [0]

    def counted(s: Schedule) -> bool:
        if budget_s is not None and time.monotonic() - start > budget_s:
            return False
        count[0] += 1
        if progress:
            progress(count[0])
        return test(s)

    found: Schedule | None
    try:
        found = find(
            schedules(program, variant),
            counted,
            settings=search_settings(max_examples, shrink, derandomize=seed is None),
            random=random.Random(seed) if seed is not None else None,
        )
    except NoSuchExample:
        found = None
    # the shortest line that replays it: configuration values equal to the defaults left out
    return Search(program.canonical(found) if found is not None else None, count[0], time.monotonic() - start)


def check_variant(
    program: Program,
    variant: str,
    max_examples: int = 200,
    budget_s: float | None = None,
    progress: Callable[[int], None] | None = None,
) -> Finding:
    expect = "clean" if variant in program.clean else "bug"
    start = time.monotonic()

    def fails(s: Schedule) -> bool:
        return counts_as_failure(program, variant, execute(s))

    result = search(program, variant, fails, max_examples, budget_s=budget_s, progress=progress)
    found = result.schedule
    default = execute(Schedule(program.name, variant))
    race = bool(default.races)
    if found is None and expect == "bug" and race:
        found = default.schedule  # the race detector flags it whatever the timing
    summary = execute(found).verdict() if found is not None else "clean"
    return Finding(
        program=program.name,
        variant=variant,
        expect=expect,
        found=found is not None,
        examples=result.examples,
        schedule=str(found) if found is not None else None,
        summary=summary,
        race_at_default=race,
        seconds=round(time.monotonic() - start, 2),
    )


