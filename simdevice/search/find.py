"""The built-in programs' searches: :func:`search` and :func:`check_variant` (what ``simdevice check`` runs).

Both go through the same public path as a user's function: a :class:`~simdevice.search.targets.ProgramTarget`
searched by :func:`~simdevice.search.explore.search_target` (delays drawn where the probe saw operations).
:func:`check_variant` records what was found, with the race detector's verdict on the default schedule beside it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import attrs
from hypothesis.database import ExampleDatabase

from simdevice.programs import Program
from simdevice.search.engine import search_settings
from simdevice.search.execute import Outcome
from simdevice.search.explore import Search, explore, search_target
from simdevice.search.strategies import configs
from simdevice.search.targets import ProgramTarget

__all__ = ["Finding", "Search", "check_variant", "search", "search_settings"]

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


def search(
    program: Program,
    variant: str,
    fails: Callable[[Outcome], bool] | None = None,
    max_examples: int = 150,
    shrink: bool = True,
    seed: int | None = None,
    budget_s: float | None = None,
    progress: Callable[[int], None] | None = None,
) -> Search:
    """Ask Hypothesis for a schedule of ``variant`` under which ``fails`` holds (a predicate of the run; default:
    what ``check`` counts as a failure), over the program's configuration space.

    ``seed=None`` searches derandomized (the same answer every time); a seed draws another search, which is
    what time-to-find medians are made of. Past ``budget_s`` seconds the search ends (see :func:`search_target`).
    """
    target = ProgramTarget(program, variant)
    return search_target(target, fails, max_examples=max_examples, config=configs(program), shrink=shrink, seed=seed,
                         budget_s=budget_s, progress=progress)


def check_variant(
    program: Program,
    variant: str,
    max_examples: int = 200,
    budget_s: float | None = None,
    progress: Callable[[int], None] | None = None,
    db: ExampleDatabase | None = None,
) -> Finding:
    expect = "clean" if variant in program.clean else "bug"
    start = time.monotonic()
    target = ProgramTarget(program, variant)
    result = explore(target, max_examples=max_examples, config=configs(program), budget_s=budget_s, progress=progress,
                     db=db)
    default = target.run(target.schedule())  # (its search's run of the default configuration, where it made one)
    found = result.failure
    return Finding(
        program=program.name,
        variant=variant,
        expect=expect,
        found=found is not None,
        examples=result.searched,
        schedule=str(found.schedule) if found is not None else None,
        summary=found.verdict() if found is not None else "clean",
        race_at_default=bool(default.races),
        seconds=round(time.monotonic() - start, 2),
    )
