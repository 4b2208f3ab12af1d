"""The bounded exhaustive mode: every schedule of at most K delays from a small set of stalls.

It shows a target clean within that bound (or names the first schedule that fails), in one configuration or
over every configuration the target has (a built-in program's whole space; a function's defaults). Delays go
only where the target's probe saw operations, so every schedule is a distinct one.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from typing import Any

from reference.schedule import Delay, Schedule
from simdevice.programs import Program
from simdevice.search.execute import Outcome
from simdevice.search.targets import ProgramTarget, Target, kept_patched


def _slots(target: Target, config: dict[str, Any]) -> list[tuple[str, int]]:
    counts = target.probe(config)
    return [(a, k) for a in sorted(counts) for k in range(counts[a])]


def _configs(target: Target, config: dict[str, Any] | None) -> list[dict[str, Any]]:
    return [config] if config is not None else target.configs()


def count_target_schedules(
    target: Target, max_delays: int, units: tuple[int, ...], config: dict[str, Any] | None = None,
    stop_above: int | None = None,
) -> int:
    """How many schedules :func:`target_schedules` yields (each configuration probed once); with ``stop_above``,
    counting stops at the first configuration that takes the count past it (a count above it, not the total)."""
    total = 0
    for cfg in _configs(target, config):
        slots = len(_slots(target, cfg))
        total += sum(math.comb(slots, n) * len(units) ** n for n in range(max_delays + 1))
        if stop_above is not None and total > stop_above:
            break
    return total


def target_schedules(
    target: Target, max_delays: int = 1, units: tuple[int, ...] = (1, 5, 20), config: dict[str, Any] | None = None
) -> Iterator[Schedule]:
    """Every schedule of at most ``max_delays`` delays with stalls from ``units``, at operations that exist, in
    one configuration or (``config=None``) in every configuration of the target."""
    for cfg in _configs(target, config):
        slots = _slots(target, cfg)
        for n in range(max_delays + 1):
            for chosen in itertools.combinations(slots, n):
                for stalls in itertools.product(units, repeat=n):
                    delays = [Delay(a, k, u) for (a, k), u in zip(chosen, stalls, strict=True)]
                    yield target.canonical(target.schedule(cfg, delays))


def exhaust_target(
    target: Target,
    max_delays: int = 1,
    units: tuple[int, ...] = (1, 5, 20),
    progress: Callable[[int], None] | None = None,
    config: dict[str, Any] | None = None,
) -> tuple[int, Outcome | None]:
    """Run every bounded schedule; return how many ran and the first that failed (None: all passed). A failure
    is what the target counts as one (``target.failed``). Plain torch.cuda code: torch stays patched across the
    runs (``kept_patched``), as in a search."""
    n = 0
    with kept_patched(target):
        for s in target_schedules(target, max_delays, units, config):
            n += 1
            if progress:
                progress(n)
            out = target.run(s)
            if target.failed(out):
                return n, out
    return n, None


def count_schedules(
    program: Program, variant: str, max_delays: int, units: tuple[int, ...], config: dict[str, str] | None = None
) -> int:
    """:func:`count_target_schedules` of a built-in program's variant."""
    return count_target_schedules(ProgramTarget(program, variant), max_delays, units, config)


def all_schedules(
    program: Program,
    variant: str,
    max_delays: int = 1,
    units: tuple[int, ...] = (1, 5, 20),
    config: dict[str, str] | None = None,
) -> Iterator[Schedule]:
    """:func:`target_schedules` of a built-in program's variant."""
    return target_schedules(ProgramTarget(program, variant), max_delays, units, config)


def exhaust(
    program: Program,
    variant: str,
    max_delays: int = 1,
    units: tuple[int, ...] = (1, 5, 20),
    progress: Callable[[int], None] | None = None,
    config: dict[str, str] | None = None,
) -> tuple[int, Outcome | None]:
    """:func:`exhaust_target` of a built-in program's variant (a failure is what ``check`` counts)."""
    return exhaust_target(ProgramTarget(program, variant), max_delays, units, progress, config)
