"""``@simdevice.fuzz``: a test that searches the schedules of the function it decorates.

::

    @simdevice.example("d2h_stream#0+1")       # pinned: runs first, like Hypothesis's @example
    @simdevice.fuzz(n=st.integers(1, 4096))   # configuration from your own strategies (optional)
    def test_reload(n: int = 4096) -> None:   # plain torch.cuda code (or contract code: test_x(dev, ...))
        ...                                    # an assert is the value oracle

The decorated function is a Hypothesis test (``@given`` a schedule): pytest runs it, Hypothesis's settings and
profiles apply (``max_examples``, ``derandomize``; the example database only where the user chose one: a
profile's own, or ``--simdevice-db DIR``), pytest-xdist spreads such tests over workers and HypoFuzz fuzzes them.
A failure raises :class:`FuzzFailure`: the schedule line, the first reports and the replay command; when the
search finds nothing, a race at the default schedule is the failure (it is there whatever the timing), as
``simdevice.explore`` and ``simdevice check`` count it. ``simdevice replay`` and ``simdevice check`` take the
test's name as a target (``tests/test_x.py::test_reload``).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import example as hypothesis_example
from hypothesis import strategies as st
from hypothesis.database import ExampleDatabase

from simdevice.search import engine
from simdevice.search.execute import Outcome, replay_line
from simdevice.search.explore import pin
from simdevice.search.strategies import schedules_of
from simdevice.search.targets import TargetError, from_function, kept_patched

#: reports shown in a failure's message (the rest: ``simdevice replay`` of its line)
SHOWN = 6


class FuzzFailure(AssertionError):  # noqa: N818 (a test failure, as AssertionError is)
    """A schedule under which the fuzzed function fails: its line, what went wrong, how to replay it."""

    def __init__(self, outcome: Outcome, why: str = "") -> None:
        self.outcome = outcome
        self.schedule = str(outcome.schedule)
        self.why = why
        #: where the failing run's trace was written (``--simdevice-trace DIR``), if it was
        self.trace_path: Path | None = None
        super().__init__(self.block())

    def block(self) -> str:
        """The short report: verdict and schedule, the first reports, the replay command."""
        out = self.outcome
        lines = [f'schedule "{out.schedule}" on {out.backend}: {out.verdict()}{self.why}']
        lines += [f"  {p}" for p in out.problems]
        reports = [_first_lines(str(r)) for r in out.run.reports]
        lines += [f"  {r}" for r in reports[:SHOWN]]
        if len(reports) > SHOWN:
            lines.append(f"  ... and {len(reports) - SHOWN} more (simdevice replay shows them all)")
        lines += [f"  note: {n}" for n in out.run.notes]
        lines.append(replay_line(out.schedule, out.replay_options(), out.run.gpu))
        if self.trace_path is not None:
            lines.append(f"  trace: {self.trace_path}")
        return "\n".join(lines)

    def write_trace(self, directory: str | os.PathLike[str]) -> Path:
        """Write the failing run's trace into ``directory`` (one text file per failure, and beside it the same run
        as a Perfetto trace, ``.perfetto.json``); the text file's path."""
        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in self.schedule)[:150]
        path = folder / f"{stem}.trace.txt"
        path.write_text(f"# {self.schedule}\n# {self.outcome.verdict()}\n" + self.outcome.trace_text())
        if self.outcome.backend == "sim":
            from simdevice.timeline import write_perfetto

            write_perfetto(self.outcome, folder / f"{stem}.perfetto.json")
        self.trace_path = path
        self.args = (self.block(),)
        return path


def _first_lines(text: str, most: int = 3) -> str:
    """A report cut to its first lines (pytest's assertion rewriting makes long messages)."""
    lines = text.splitlines()
    return "\n    ".join(lines[:most]) + (" ..." if len(lines) > most else "")


#: the database the plugin's ``--simdevice-db DIR`` chose (None: none, unless the user's profile has one)
_OPTIONS: dict[str, Any] = {"db": None}


def use_database(db: ExampleDatabase | None) -> None:
    """The example database ``@fuzz`` tests use from now on, unless their own settings say otherwise."""
    _OPTIONS["db"] = db


def _chosen_database(base: settings | None = None) -> ExampleDatabase | None:
    """``--simdevice-db``'s, else that of ``base`` (the test's own settings; default: the loaded profile's) if the
    user gave it one, else none: nothing is written where the user did not ask (Hypothesis's built-in default is a
    folder in the current directory)."""
    if _OPTIONS["db"] is not None:
        return _OPTIONS["db"]  # type: ignore[no-any-return]
    current = (base if base is not None else settings()).database
    builtin = settings.get_profile("default")
    return current if builtin is None or current != builtin.database else None


def example(schedule: str) -> Callable[[Any], Any]:
    """Pin a schedule (a whole line, or delays alone such as ``"d2h_stream#0+1"``) for a ``@fuzz`` test: it runs
    first, as Hypothesis's ``@example`` does. Put it above or below ``@fuzz``."""

    def accept(test: Any) -> Any:
        pins = getattr(test, "__simdevice_examples__", None)
        if pins is None:
            pins = []
            test.__simdevice_examples__ = pins
        pins.append(schedule)
        return test

    return accept


def fuzz(
    fn: Callable[..., Any] | None = None,
    *,
    max_examples: int | None = None,
    max_delays: int = 3,
    config: st.SearchStrategy[dict[str, Any]] | None = None,
    world_size: int | None = None,
    values: bool = True,
    **strategies: st.SearchStrategy[Any],
) -> Any:
    """Make ``fn`` (plain torch.cuda code, or contract code ``fn(dev, ...)``) a test that searches its schedules.

    ``config`` (a strategy of keyword-argument dicts) or keyword strategies draw its parameters, shrinking with
    the schedule; without them it runs with its defaults. ``max_examples`` overrides the Hypothesis profile's.
    ``values=False``: race-only runs (``--no-values``), for configurations too large to compute; the function's own
    checks of values it reads back see placeholders there.
    """
    if config is not None and strategies:
        raise TypeError("fuzz takes config=... or keyword strategies, not both")
    if strategies:
        config = st.fixed_dictionaries(strategies)

    def decorate(f: Callable[..., Any]) -> Any:
        return _fuzz_test(f, max_examples, max_delays, config, world_size, values, tuple(strategies))

    return decorate(fn) if fn is not None else decorate


def _fuzz_test(
    f: Callable[..., Any],
    max_examples: int | None,
    max_delays: int,
    config: st.SearchStrategy[dict[str, Any]] | None,
    world_size: int | None,
    values: bool = True,
    keys: tuple[str, ...] = (),
) -> Any:
    """The test ``fuzz`` makes of ``f`` (``keys``: the parameters its keyword strategies draw)."""
    try:
        target = from_function(f, world_size=world_size, values=values)
    except TargetError as e:  # the test fails with the one line; the module's other tests still run
        return _failing_test(f, str(e))
    if max_examples is not None and max_examples < 1:
        return _failing_test(f, f"max_examples must be >= 1, got {max_examples}")
    if max_delays < 0:
        return _failing_test(f, f"max_delays must be >= 0, got {max_delays}")
    unknown = sorted(set(keys) - set(target.params))
    if unknown:
        return _failing_test(f, f"a strategy for {unknown[0]!r}, which {target.name} has no parameter of (its "
                                f"parameters with defaults: {', '.join(target.params) or 'none'})")

    def run_schedule(schedule: Any) -> None:
        # its shortest line (values equal to the defaults left out), as check prints it
        out = target.run(target.canonical(schedule))
        if target.failed(out):
            raise FuzzFailure(out)

    run_schedule.__name__ = run_schedule.__qualname__ = getattr(f, "__name__", "fuzzed")
    run_schedule.__module__ = getattr(f, "__module__", __name__)
    strategy = schedules_of(target, config, max_delays)
    inner = given(schedule=strategy)(run_schedule)

    def test(**fixed: Any) -> None:
        """``fixed``: parameters held at these values (a ``@pytest.mark.parametrize`` case's, through the plugin)."""
        pins = list(getattr(test, "__simdevice_examples__", [])) + list(getattr(f, "__simdevice_examples__", []))
        # a Hypothesis test of its own for this call: pins and settings put on ``inner`` stayed there, and a second
        # call (a rerun, pytest-repeat) raised Hypothesis's "already been decorated with a settings object"
        searched: Any = given(schedule=_held(target, strategy, config, max_delays, fixed))(run_schedule)
        for text in pins:
            try:
                pinned = pin(target, text)
            except ValueError as e:  # (TargetError and ScheduleError among them): the one line
                refused = str(e)
            else:
                searched = hypothesis_example(schedule=pinned)(searched)
                continue
            # failed outside the handler: pytest's report of an exception raised in one shows the first as well
            # ("During handling of the above exception, another exception occurred")
            _fail(f"@simdevice.example({text!r}): {refused}")
        extra: dict[str, Any] = {"max_examples": max_examples} if max_examples is not None else {}
        searched = settings(_settings(_applied(test, f)), **extra)(searched)
        with engine.storage(), kept_patched(target):
            searched()
            default = target.run(target.schedule(dict(fixed)))
        if default.races:
            raise FuzzFailure(default, " (a race at the default schedule: there whatever the timing)")

    _named_as(test, f)
    # what the command line and HypoFuzz need: the function it stands for, and the Hypothesis test inside
    test.__simdevice_target__ = f  # type: ignore[attr-defined]
    test.__simdevice_world_size__ = world_size  # type: ignore[attr-defined]
    test.__simdevice_values__ = values  # type: ignore[attr-defined]
    test.__simdevice_config__ = config  # type: ignore[attr-defined]
    test.hypothesis = inner.hypothesis  # type: ignore[attr-defined]
    test.is_hypothesis_test = True  # type: ignore[attr-defined]
    test._hypothesis_internal_use_settings = _settings()  # type: ignore[attr-defined]
    return test


def _held(target: Any, strategy: st.SearchStrategy[Any], config: st.SearchStrategy[dict[str, Any]] | None,
          max_delays: int, fixed: dict[str, Any]) -> st.SearchStrategy[Any]:
    """The schedules of a fuzz test with the parameters in ``fixed`` held at their values (the others drawn as
    ``config`` draws them, or at their defaults): ``strategy`` where nothing is held."""
    if not fixed:
        return strategy
    unknown = sorted(set(fixed) - set(target.params))
    if unknown:
        _fail(f"@simdevice.fuzz: a parametrized {unknown[0]!r}, which {target.name} has no parameter of (its "
              f"parameters with defaults: {', '.join(target.params) or 'none'})")
    held = st.just(dict(fixed))
    both = held if config is None else st.tuples(config, held).map(lambda drawn: {**drawn[0], **drawn[1]})
    return schedules_of(target, both, max_delays)


def _fail(message: str) -> None:
    """Fail the running test with ``message`` alone (pytest's failure without a traceback; else an AssertionError)."""
    try:
        import pytest
    except ImportError:  # pragma: no cover - the plugin's tests run under pytest
        raise AssertionError(message) from None
    pytest.fail(message, pytrace=False)


def _named_as(test: Callable[..., Any], f: Any) -> None:
    """``test`` takes ``f``'s name, qualified name, module and docstring (a stand-in's where ``f`` has none: a
    non-function given to ``fuzz``), and its place: pytest finds a test's file and line through ``__wrapped__``
    (every fuzz test was at this module's line, in ``-rs``'s skip lines, ``item.location`` and an IDE's list); its
    own signature, empty, says pytest passes it nothing (its parameters are ``f``'s configuration)."""
    for name, default in (("__name__", "test"), ("__qualname__", "test"), ("__module__", __name__)):
        value = getattr(f, name, None)
        setattr(test, name, value if isinstance(value, str) else default)
    test.__doc__ = getattr(f, "__doc__", None) if callable(f) else None
    if inspect.isfunction(f):
        test.__wrapped__ = f  # type: ignore[attr-defined]
    test.__signature__ = inspect.Signature()  # type: ignore[attr-defined]


def _failing_test(f: Callable[..., Any], message: str) -> Any:
    """A test of ``f`` that fails with ``message``: what ``@simdevice.fuzz`` gives for a function it cannot run (at
    collection the error would stop the module's other tests too). It takes whatever pytest passes it (a method's
    instance, where it was defined in a test class) and fails all the same."""

    def test(*args: Any, **kwargs: Any) -> None:
        _fail(f"@simdevice.fuzz: {message}")

    _named_as(test, f)
    test.__simdevice_unrunnable__ = message  # type: ignore[attr-defined]  # (a target of it: refused, saying why)
    return test


def _applied(*tests: Any) -> settings | None:
    """The settings a ``@settings(...)`` decorator put on one of ``tests`` (above ``@fuzz``: on the test it made;
    below it: on the function), if any."""
    for t in tests:
        if getattr(t, "_hypothesis_internal_settings_applied", False):
            return t._hypothesis_internal_use_settings  # type: ignore[no-any-return]
    return None


def _settings(own: settings | None = None) -> settings:
    """The test's own ``@settings`` (``own``), else the loaded profile's, with the database chosen as above, no
    deadline, no health checks, and no explain phase (its notes are about the simulator's lines, not the
    program's)."""
    base = own if own is not None else settings()
    quiet = [h for h in HealthCheck if h is not HealthCheck.nested_given]  # HypoFuzz skips tests that suppress it
    return settings(base, database=_chosen_database(base), deadline=None, suppress_health_check=quiet,
                    phases=[p for p in base.phases if p is not Phase.explain])
