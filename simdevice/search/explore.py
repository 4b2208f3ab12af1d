"""``simdevice.explore(fn)``: search schedules of one function for a failure, shrink it, return it.

The search draws a configuration (from the user's own Hypothesis strategy, if any), probes the function in it
to learn its actors and how many operations each makes, and draws up to ``max_delays`` delays at operations
that exist. A failure is what a GPU would show: a stale read, a deadlock, an illegal access, a host error (a
failing ``assert`` among them); when none turns up, a race at the default schedule is reported as found
(it is there whatever the timing). Hypothesis shrinks toward fewer and smaller delays and the strategy's
simplest configuration; the result's line replays with ``simdevice replay``.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable
from typing import Any

import attrs
from hypothesis import find
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample

from reference.schedule import Delay, Schedule
from simdevice.dropin.session import held
from simdevice.search.execute import Outcome
from simdevice.search.find import search_settings
from simdevice.search.targets import FunctionTarget, from_function, resolve

#: the largest stall a drawn delay may have, in units (1 unit = 1 ms)
MAX_UNITS = 50


@attrs.frozen
class Exploration:
    """What a search of one function's schedules found."""

    target: str
    #: the shrunk failing run (None: every schedule tried was clean)
    failure: Outcome | None
    #: schedules run, shrinking included (probes not counted)
    examples: int
    seconds: float

    @property
    def schedule(self) -> str | None:
        """The line that replays the failure (``simdevice replay "..."``)."""
        return str(self.failure.schedule) if self.failure is not None else None

    def text(self) -> str:
        if self.failure is None:
            return f"{self.target}: clean over {self.examples} schedules"
        return self.failure.text()


def delays_at(counts: dict[str, int], max_delays: int, max_units: int = MAX_UNITS) -> st.SearchStrategy[list[Delay]]:
    """Up to ``max_delays`` delays on distinct (actor, operation) pairs, only at operations that exist."""
    actors = sorted(a for a, n in counts.items() if n > 0)
    if not actors or max_delays == 0:
        return st.just([])
    one = st.sampled_from(actors).flatmap(
        lambda a: st.builds(Delay, st.just(a), st.integers(0, counts[a] - 1), st.integers(1, max_units))
    )
    return st.lists(one, max_size=max_delays, unique_by=lambda d: (d.actor, d.index))


def schedules_of(
    target: FunctionTarget, config: st.SearchStrategy[dict[str, Any]] | None = None, max_delays: int = 3
) -> st.SearchStrategy[Schedule]:
    """Schedules of a function target: a configuration drawn first, then delays where its probe saw operations."""

    @st.composite
    def draw(data: st.DrawFn) -> Schedule:
        cfg = data(config) if config is not None else {}
        counts = target.probe(cfg)
        return target.schedule(cfg, data(delays_at(counts, max_delays)))

    return draw()


def failed(out: Outcome) -> bool:
    """What a search counts as found: what a GPU would show (anything but a race alone)."""
    return out.corrupted


def explore(
    fn: Callable[..., Any] | str | FunctionTarget,
    *,
    max_examples: int = 100,
    max_delays: int = 3,
    config: st.SearchStrategy[dict[str, Any]] | None = None,
    world_size: int | None = None,
    seed: int | None = None,
    budget_s: float | None = None,
    progress: Callable[[int], None] | None = None,
) -> Exploration:
    """Search ``fn``'s schedules (``fn``: a function, a ``file.py::fn`` / ``module::fn`` target, or a target)."""
    if isinstance(fn, FunctionTarget):
        target = fn
    elif isinstance(fn, str):
        target = resolve(fn, world_size)
    else:
        target = from_function(fn, world_size=world_size)
    start = time.monotonic()
    count = [0]
    last: dict[str, Outcome] = {}

    def fails(s: Schedule) -> bool:
        if budget_s is not None and time.monotonic() - start > budget_s:
            return False
        count[0] += 1
        if progress is not None:
            progress(count[0])
        out = target.run(s)
        if failed(out):
            last[str(s)] = out
            return True
        return False

    found: Outcome | None = None
    # plain code: torch stays patched across the search's runs, each run only swaps the device
    with held() if target.style == "plain" else contextlib.nullcontext():
        try:
            s = find(schedules_of(target, config, max_delays), fails,
                     settings=search_settings(max_examples, derandomize=seed is None),
                     random=random.Random(seed) if seed is not None else None)
            found = last.get(str(s)) or target.run(s)
            short = target.canonical(found.schedule)
            if short != found.schedule:
                found = attrs.evolve(found, schedule=short)
        except NoSuchExample:
            default = target.run(target.schedule())
            count[0] += 1
            if default.races or default.corrupted:
                found = default  # a race is there whatever the timing
    return Exploration(target.name, found, count[0], round(time.monotonic() - start, 2))
