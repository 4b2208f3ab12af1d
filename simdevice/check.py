"""Run schedules and judge them; find and shrink failing schedules with Hypothesis.

:func:`execute` runs one schedule on the simulator (or on CUDA) and returns an
:class:`Outcome`. :func:`check_variant` asks Hypothesis for a schedule under
which a variant fails: for a clean variant any report or wrong value is a
failure; for a bug variant the search is for corruption (a stale read, a
deadlock, an illegal access, a host error or wrong values: what a GPU would
show), and the race detector's verdict on the default schedule is recorded
beside it.
"""

from __future__ import annotations

import itertools
import math
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import attrs
from hypothesis import HealthCheck, Phase, find, settings
from hypothesis.errors import NoSuchExample

from reference.device import Run
from reference.schedule import Delay, Schedule
from simdevice.config import SimConfig
from simdevice.device import SimDevice
from simdevice.programs import REGISTRY, Program, resolve
from simdevice.report import Race, summarize
from simdevice.strategies import schedules


@attrs.frozen
class Outcome:
    schedule: Schedule
    run: Run
    #: what the value oracle found wrong
    problems: tuple[str, ...]
    backend: str = "sim"

    @property
    def races(self) -> tuple[Race, ...]:
        return tuple(r for r in self.run.reports if isinstance(r, Race))

    @property
    def corruption(self) -> tuple[Any, ...]:
        return tuple(r for r in self.run.reports if not isinstance(r, Race))

    @property
    def corrupted(self) -> bool:
        """Wrong values or a report a GPU would show (anything but a race)."""
        return bool(self.problems or self.corruption)

    @property
    def clean(self) -> bool:
        return not self.problems and not self.run.reports

    def assert_clean(self) -> None:
        """Fail with the whole explanation and the replay line unless the run is clean."""
        if not self.clean:
            raise AssertionError(self.text())

    def verdict(self) -> str:
        parts = []
        if self.problems:
            parts.append("wrong values")
        if self.run.reports:
            parts.append(summarize(self.run.reports))
        return "; ".join(parts) if parts else "clean"

    def text(self) -> str:
        lines = [f'schedule "{self.schedule}" on {self.backend}: {self.verdict()}']
        lines += [f"  {p}" for p in self.problems]
        lines += [f"  {r}" for r in self.run.reports]
        if self.run.unfired:
            lines.append(f"  note: delays never applied (their operation never came): {', '.join(self.run.unfired)}")
        lines.append(f'  replay: simdevice replay "{self.schedule}" [--gpu]')
        return "\n".join(lines)


def gpu_config(program: Program, config: Any, byte_scale: int) -> Any:
    """The configuration a GPU run uses: sizes scaled as the simulator's cost model scales them."""
    scaled = {k: getattr(config, k) * byte_scale for k in program.size_keys}
    return attrs.evolve(config, **scaled)


def execute(schedule: Schedule, backend: str = "sim", sim_config: SimConfig | None = None) -> Outcome:
    """Run one schedule; ScheduleError if it names no known program, variant or actor."""
    load_all()
    program, config = resolve(schedule)
    if backend == "sim":
        dev: Any = SimDevice(schedule, sim_config)
    else:
        from reference.device import CudaDevice

        dev = CudaDevice(schedule)
        config = gpu_config(program, config, (sim_config or SimConfig()).byte_scale)
    run = dev.run(program.body, schedule.variant, config)
    problems: tuple[str, ...] = ()
    if run.result is not None or not run.reports:
        problems = tuple(program.oracle(config, run.result)) if run.result is not None else ("no result",)
    return Outcome(schedule, run, problems, backend)


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
    return Search(found, count[0], time.monotonic() - start)


def counts_as_failure(program: Program, variant: str, out: Outcome) -> bool:
    """What a search counts as found: corruption for a bug variant (what a GPU would show), any report or wrong
    value for a clean one."""
    return out.corrupted if variant not in program.clean else not out.clean


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
                    yield Schedule(program.name, variant, cfg, delays)


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


_LOADED: list[bool] = []


def load_all() -> None:
    """Import every program module so that it registers itself (once)."""
    if _LOADED:
        return
    _LOADED.append(True)
    import importlib
    import pkgutil

    import simdevice.mechanisms

    for m in pkgutil.iter_modules(simdevice.mechanisms.__path__):
        importlib.import_module(f"simdevice.mechanisms.{m.name}")


def programs(names: list[str] | None = None) -> list[Program]:
    load_all()
    if not names:
        return list(REGISTRY.values())
    return [REGISTRY[n] for n in names]
