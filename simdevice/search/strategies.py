"""Hypothesis strategies for schedules, shared by the search, the decorator, the tests and ``simdevice check``.

A schedule is drawn as a configuration first, then delays at operations that exist: the target's probe run in
that configuration says which actors it has and how many operations each makes, so a delay never names an
operation that does not come. Drawn bottom-up, so that shrinking moves toward fewer delays, earlier operations,
smaller stalls and the simplest configuration (a target's ``canonical`` then leaves out the values equal to the
defaults).
"""

from __future__ import annotations

import functools
import random
from typing import Any

from hypothesis import assume
from hypothesis import strategies as st

from reference.schedule import Delay, Schedule
from simdevice.programs import Program
from simdevice.search.targets import ProgramTarget, Target

#: the largest stall a drawn delay may have, in units (1 unit = 1 ms)
MAX_UNITS = 50


def delays_at(
    counts: dict[str, int], max_delays: int = 3, max_units: int = MAX_UNITS
) -> st.SearchStrategy[list[Delay]]:
    """Up to ``max_delays`` delays on distinct (actor, operation) pairs, only at operations that exist."""
    return _delays_at(tuple(sorted((a, n) for a, n in counts.items() if n > 0)), max_delays, max_units)


@functools.lru_cache(maxsize=1024)
def _delays_at(counts: tuple[tuple[str, int], ...], max_delays: int, max_units: int) -> st.SearchStrategy[list[Delay]]:
    """:func:`delays_at`, made once per operation counts: a search draws the same counts over and over (one
    configuration's probe), and Hypothesis checks every new strategy it meets (a tenth of ``check`` went to
    validating strategies made afresh for each schedule)."""
    if not counts or max_delays == 0:
        return st.just([])
    actor = st.sampled_from([a for a, _ in counts])
    index = {a: st.integers(0, n - 1) for a, n in counts}
    units = st.integers(1, max_units)

    # an actor, then an operation of its and a stall: the choices ``flatmap`` over the actor made, in the same
    # order (the same examples and shrinks), at a third of the cost Hypothesis's ``flatmap`` adds to each draw
    @st.composite
    def one(draw: st.DrawFn) -> Delay:
        a = draw(actor)
        return Delay(a, draw(index[a]), draw(units))

    return st.lists(one(), max_size=max_delays, unique_by=lambda d: (d.actor, d.index))


def schedules_of(
    target: Target, config: st.SearchStrategy[dict[str, Any]] | None = None, max_delays: int = 3
) -> st.SearchStrategy[Schedule]:
    """Schedules of a target: a configuration drawn first (the defaults if ``config`` is None), then delays where
    its probe saw operations."""

    @st.composite
    def draw(data: st.DrawFn) -> Schedule:
        cfg = data(config) if config is not None else {}
        # the probe runs the program inside Hypothesis's draw: what the program does with Python's global ``random``
        # (its own ``random.seed``, a DataLoader worker's), and the run's own seeding of it, is put back, as
        # Hypothesis asks of a strategy (else it warns, "Do not use the `random` module inside strategies", in the
        # middle of the program's output)
        state = random.getstate()
        try:
            counts = target.probe(cfg)
        finally:
            random.setstate(state)
        return target.schedule(cfg, data(delays_at(counts, max_delays)))

    return draw()


def configs(program: Program) -> st.SearchStrategy[dict[str, str]]:
    """Configurations from a program's space (each key's first value is where shrinking goes), filtered."""

    @st.composite
    def draw(data: st.DrawFn) -> dict[str, str]:
        cfg = {key: data(st.sampled_from(values)) for key, values in sorted(program.config_space.items())}
        if program.config_filter is not None:
            assume(program.config_filter(cfg))
        return cfg

    return draw()


def schedules(program: Program, variant: str, max_delays: int = 3) -> st.SearchStrategy[Schedule]:
    """Schedules of one built-in program variant: a configuration from its space, and delays where they apply."""
    return schedules_of(ProgramTarget(program, variant), configs(program), max_delays)
