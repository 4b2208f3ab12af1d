"""``simdevice.explore(fn)``: search the schedules of one target for a failure, shrink it, return it.

A target is a function of the user's (plain torch.cuda code, or contract code ``fn(dev)``) or a built-in
program's variant; all of them go through :func:`search_target`. The search draws a configuration (from the
user's own Hypothesis strategy, if any), probes the target in it to learn its actors and how many operations
each makes, and draws up to ``max_delays`` delays at operations that exist. A failure is what the target counts
as one (for a function: what a GPU would show: a stale read, a deadlock, an illegal access, a host error, a
failing ``assert`` among them); when none turns up, :func:`explore` reports a race at the default schedule as
found (it is there whatever the timing). Hypothesis shrinks toward fewer and smaller delays and the strategy's
simplest configuration; the result's line replays with ``simdevice replay``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs
from hypothesis import find
from hypothesis import strategies as st
from hypothesis.database import ExampleDatabase
from hypothesis.errors import NoSuchExample

from reference.schedule import Schedule
from simdevice.search import engine
from simdevice.search.execute import Outcome, replay_command
from simdevice.search.strategies import schedules_of
from simdevice.search.targets import Target, from_function, kept_patched, resolve


@attrs.frozen
class Search:
    """What one Hypothesis search of a target's schedules found."""

    #: the failing schedule (shrunk, if the search shrank, and in its shortest form), or None
    schedule: Schedule | None
    #: the run of that schedule
    failure: Outcome | None
    #: schedules run, shrinking included (probes not counted)
    examples: int
    seconds: float


@attrs.frozen
class Exploration:
    """What a search of one target's schedules found."""

    target: str
    #: the shrunk failing run (None: every schedule tried was clean)
    failure: Outcome | None
    #: schedules run, shrinking included (probes not counted)
    examples: int
    seconds: float
    #: of those, the ones the search ran (the rest: the default schedule, run when the search found nothing)
    searched: int = 0
    #: where every schedule was clean, the default schedule's run's notes (what the clean verdict may not cover:
    #: a stream that got no operation, a free not ordered after another stream's use)
    notes: tuple[str, ...] = ()

    @property
    def schedule(self) -> str | None:
        """The failing schedule's line; :attr:`replay` is the command that replays it with the options the run was
        made under (``--world-size`` among them)."""
        return str(self.failure.schedule) if self.failure is not None else None

    @property
    def replay(self) -> str | None:
        """How to replay the failure: ``simdevice replay "SCHEDULE"`` and the options it needs (for a function
        defined inside another, which no command can import: the ``simdevice.explore`` call that replays it)."""
        if self.failure is None:
            return None
        return replay_command(self.failure.schedule, self.failure.replay_options())

    @property
    def trace(self) -> str:
        """The failing run's trace (empty when clean)."""
        return self.failure.trace_text() if self.failure is not None else ""

    def text(self) -> str:
        if self.failure is None:
            return f"{self.target}: clean over {self.examples} schedules"
        return self.failure.text()

    def __str__(self) -> str:
        return self.text()


#: the note of a clean search of a function that made no operation a schedule can delay (a clean verdict that says
#: nothing: tensors left on the host, say)
NO_DEVICE_WORK = ("its run made no CUDA operation (no stream work, no host step on device or pinned memory): no "
                  "schedule changes what it does (are its tensors on device=\"cuda\"?)")


def as_target(fn: Callable[..., Any] | str | Target, world_size: int | None = None) -> Target:
    """A target from a function, a ``file.py::fn`` / ``module::fn`` text, or a target."""
    if isinstance(fn, str):
        return resolve(fn, world_size)
    if callable(fn) and not hasattr(fn, "probe"):
        return from_function(fn, world_size=world_size)
    if not hasattr(fn, "probe"):
        raise TypeError(f"expected a function, a FILE.py::FUNCTION or MODULE::FUNCTION text, or a target; got "
                        f"{type(fn).__name__}")
    return fn  # type: ignore[return-value]


class _OutOfTime(BaseException):
    """A search past its budget with nothing found: out of Hypothesis at once (not an ``Exception``, which Hypothesis
    would take for a failure of the test and shrink)."""


def search_target(
    target: Target,
    fails: Callable[[Outcome], bool] | None = None,
    *,
    max_examples: int = 100,
    max_delays: int = 3,
    config: st.SearchStrategy[dict[str, Any]] | None = None,
    shrink: bool = True,
    seed: int | None = None,
    budget_s: float | None = None,
    progress: Callable[[int], None] | None = None,
    db: ExampleDatabase | None = None,
    examples: Sequence[Schedule] = (),
) -> Search:
    """Ask Hypothesis for a schedule of ``target`` under which ``fails`` holds (default: ``target.failed``).

    ``examples`` run first, as Hypothesis's ``@example`` does (the first failing one is the answer, unshrunk).
    ``seed=None`` searches derandomized (the same answer every time); a seed draws another search. Past
    ``budget_s`` seconds the search ends, or, where it found a failure, its shrinking soon does (every further
    schedule counts as passing). ``db``: an example database (none by default). A stop (Ctrl-C, SIGTERM) that
    comes after a failure was found is raised with the smallest failing schedule so far as its ``found`` (a
    :class:`Search`, its shrinking cut short): what was found is not lost.
    """
    test = fails or target.failed
    start = time.monotonic()
    count = [0]
    last: dict[str, Outcome] = {}
    latest: list[Schedule] = []  # the last failing schedule: Hypothesis's smallest so far

    def counted(s: Schedule) -> bool:
        if budget_s is not None and time.monotonic() - start > budget_s:
            if not last:
                raise _OutOfTime  # nothing found: the search ends now
            return False  # shrinking what was found: what is left of it counts as passing, and it ends soon
        count[0] += 1
        if progress is not None:
            progress(count[0])
        out = target.run(s)
        if test(out):
            last[str(s)] = out
            latest[:] = [s]
            return True
        return False

    with engine.storage(), kept_patched(target):
        for pinned in examples:
            if counted(pinned):
                return Search(pinned, last[str(pinned)], count[0], time.monotonic() - start)
        try:
            found = find(schedules_of(target, config, max_delays), counted,
                         settings=engine.search_settings(max_examples, shrink, seed is None, db),
                         random=random.Random(seed) if seed is not None else None)
        except (NoSuchExample, _OutOfTime):
            return Search(None, None, count[0], time.monotonic() - start)
        except KeyboardInterrupt as stop:  # a failure found so far goes with the stop (its shrinking cut short)
            if latest:
                short = target.canonical(latest[0])
                stop.found = Search(  # type: ignore[attr-defined]
                    short, attrs.evolve(last[str(latest[0])], schedule=short), count[0], time.monotonic() - start)
            raise
        failure = last.get(str(found)) or target.run(found)
    short = target.canonical(found)
    return Search(short, attrs.evolve(failure, schedule=short), count[0], time.monotonic() - start)


def explore(
    fn: Callable[..., Any] | str | Target,
    *,
    max_examples: int = 100,
    max_delays: int = 3,
    config: st.SearchStrategy[dict[str, Any]] | None = None,
    world_size: int | None = None,
    seed: int | None = None,
    budget_s: float | None = None,
    progress: Callable[[int], None] | None = None,
    db: ExampleDatabase | None = None,
    examples: Sequence[Schedule | str] = (),
    default_config: dict[str, Any] | None = None,
) -> Exploration:
    """Search ``fn``'s schedules (a function, a ``file.py::fn`` / ``module::fn`` target, or a target) for a
    failure and shrink it; when none turns up, a race at the default schedule counts as found.

    ``config``: a Hypothesis strategy for the function's keyword arguments (default: a ``simdevice.fuzz`` test's
    own strategies, else its defaults).
    ``examples``: schedule lines (or delays alone, ``"side#0+3"``) to run first, as pins.
    ``default_config``: the configuration of that default schedule (default: the function's defaults); where
    ``config`` holds one configuration fixed, that one (the defaults' race is no finding about it).
    """
    if max_examples < 1:  # (as @simdevice.fuzz and check say it, not as Hypothesis's own check deep in the search)
        raise ValueError(f"max_examples must be >= 1, got {max_examples}")
    if max_delays < 0:
        raise ValueError(f"max_delays must be >= 0, got {max_delays}")
    if budget_s is not None and not 0 < budget_s < float("inf"):  # (NaN too: a search that ended at once, clean)
        raise ValueError(f"budget_s must be > 0 seconds, got {budget_s}")
    if isinstance(examples, (str, Schedule)):  # (a str was taken a character at a time: "bad schedule target 'd'")
        raise TypeError(f"examples is a list of schedule lines, not one: examples=[{str(examples)!r}]")
    target = as_target(fn, world_size)
    if config is None:  # a simdevice.fuzz test's own strategies
        config = getattr(target, "strategy", None)
    pins = [pin(target, e) for e in examples]
    result = search_target(target, max_examples=max_examples, max_delays=max_delays, config=config, seed=seed,
                           budget_s=budget_s, progress=progress, db=db, examples=pins)
    found, count = result.failure, result.examples
    notes: tuple[str, ...] = ()
    if found is None:
        default = default_run(target, default_config)
        count += 1
        if default.races or default.corrupted:
            found = default
        else:
            notes = default.run.notes
            if not any(default.run.op_counts.values()):  # clean, as a program that never ran on the device is
                notes = (*notes, NO_DEVICE_WORK)
    return Exploration(target.name, found, count, round(result.seconds, 2), result.examples, notes)


def default_run(target: Target, config: dict[str, Any] | None = None) -> Outcome:
    """The run of the default schedule (in ``config``)."""
    with kept_patched(target):
        return target.run(target.schedule(config))


def race_at_default(target: Target, config: dict[str, Any] | None = None) -> Outcome | None:
    """The run of the default schedule (in ``config``) where it races or fails, else None: where no schedule a
    search ran made a race show, it is found all the same (a race is there whatever the timing)."""
    default = default_run(target, config)
    return default if default.races or default.corrupted else None


def pin(target: Target, text: Schedule | str) -> Schedule:
    """A pinned schedule for ``target``: a whole line (it must name the target), or its delays alone."""
    if isinstance(text, Schedule):
        return text
    from simdevice.api import as_schedule

    s = as_schedule(text)
    assert s is not None
    if s.program == "session":  # delays alone
        s = target.schedule({}, s.delays)
    own = target.schedule()
    if s.target != own.target:
        raise ValueError(f"example {text!r} names {s.target}, not {own.target}")
    validate = getattr(target, "validate", None)
    if validate is not None:  # a function's: its delays name actors it has (TargetError, as the command line says)
        validate(s)
    return s
