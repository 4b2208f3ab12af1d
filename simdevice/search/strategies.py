"""Hypothesis strategies for schedules, shared by the tests and by ``simdevice check``.

Schedules are drawn bottom-up so that shrinking moves toward fewer delays,
earlier operations, smaller stalls and the first value of each
configuration key (``Program.canonical`` then leaves out the values equal to
the program's defaults, as ``search`` does with what it found). Users can
import these to fuzz their own programs registered in ``simdevice.programs``.
"""

from __future__ import annotations

from hypothesis import assume
from hypothesis import strategies as st

from reference.schedule import Delay, Schedule
from simdevice.programs import Program

#: the largest stall a drawn delay may have, in units (1 unit = 1 ms)
MAX_UNITS = 50


def delays(
    actors: tuple[str, ...], max_index: int, max_units: int = MAX_UNITS, max_delays: int = 3
) -> st.SearchStrategy[list[Delay]]:
    """Up to ``max_delays`` delays on distinct (actor, operation) pairs."""
    one = st.builds(
        Delay,
        actor=st.sampled_from(actors),
        index=st.integers(0, max_index),
        units=st.integers(1, max_units),
    )
    return st.lists(one, max_size=max_delays, unique_by=lambda d: (d.actor, d.index))


@st.composite
def _configs(draw: st.DrawFn, program: Program) -> dict[str, str]:
    cfg = {}
    for key, values in sorted(program.config_space.items()):
        cfg[key] = draw(st.sampled_from(values))
    if program.config_filter is not None:
        assume(program.config_filter(cfg))
    return cfg


def schedules(program: Program, variant: str, max_delays: int = 3) -> st.SearchStrategy[Schedule]:
    """Schedules of one program variant: a configuration from its space, and delays."""
    return st.builds(
        Schedule,
        program=st.just(program.name),
        variant=st.just(variant),
        config=_configs(program).map(lambda d: tuple(d.items())),
        delays=delays(program.actors, program.max_index, max_delays=max_delays),
    )
