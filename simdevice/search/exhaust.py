"""The bounded exhaustive mode: every schedule of at most K delays from a small set of stalls.

It shows a fixed variant clean within that bound (or names the first
schedule that fails), in one configuration or over a program's whole
configuration space.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator

from reference.schedule import Delay, Schedule
from simdevice.programs import Program
from simdevice.search.execute import Outcome, counts_as_failure, execute


def _configs(program: Program, config: dict[str, str] | None) -> list[dict[str, str]]:
    if config is not None:
        return [config]
    keys = sorted(program.config_space)
    combos = itertools.product(*(program.config_space[k] for k in keys))
    configs = [dict(zip(keys, combo, strict=True)) for combo in combos]
    if program.config_filter is not None:
        configs = [c for c in configs if program.config_filter(c)]
    return configs


def count_schedules(
    program: Program, max_delays: int, units: tuple[int, ...], config: dict[str, str] | None = None
) -> int:
    """How many schedules :func:`all_schedules` yields."""
    slots = len(program.actors) * (program.max_index + 1)
    per_config = sum(math.comb(slots, n) * len(units) ** n for n in range(max_delays + 1))
    return int(len(_configs(program, config)) * per_config)


def all_schedules(
    program: Program,
    variant: str,
    max_delays: int = 1,
    units: tuple[int, ...] = (1, 5, 20),
    config: dict[str, str] | None = None,
) -> Iterator[Schedule]:
    """Every schedule of at most ``max_delays`` delays with stalls from ``units``, in one configuration, or
    (``config=None``) over every configuration of the program's configuration space: the bounded exhaustive mode."""
    slots = [(a, k) for a in program.actors for k in range(program.max_index + 1)]
    for cfg in _configs(program, config):
        for n in range(max_delays + 1):
            for chosen in itertools.combinations(slots, n):
                for stalls in itertools.product(units, repeat=n):
                    delays = [Delay(a, k, u) for (a, k), u in zip(chosen, stalls, strict=True)]
                    yield program.canonical(Schedule(program.name, variant, cfg, delays))


def exhaust(
    program: Program,
    variant: str,
    max_delays: int = 1,
    units: tuple[int, ...] = (1, 5, 20),
    progress: Callable[[int], None] | None = None,
    config: dict[str, str] | None = None,
) -> tuple[int, Outcome | None]:
    """Run every bounded schedule; return how many ran and the first that failed (None: all passed).

    A failure is what ``check_variant`` counts (:func:`counts_as_failure`).
    """
    n = 0
    for s in all_schedules(program, variant, max_delays, units, config):
        n += 1
        if progress:
            progress(n)
        out = execute(s)
        if counts_as_failure(program, variant, out):
            return n, out
    return n, None


