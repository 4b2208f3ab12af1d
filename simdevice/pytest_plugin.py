"""The pytest plugin (entry point ``pytest11``): ``@simdevice.fuzz`` tests as first-class pytest tests.

- a failing ``@simdevice.fuzz`` test reports a short block (the schedule line, the first reports, the replay
  command, where its trace went) instead of a traceback through the simulator;
- ``--simdevice-trace DIR`` writes each failure's trace to DIR (text, and a Perfetto trace beside it);
  ``--simdevice-db DIR`` keeps the Hypothesis example database of ``@simdevice.fuzz`` tests in DIR (default: none,
  unless your Hypothesis profile has one);
- the marker ``simdevice`` is put on every ``@simdevice.fuzz`` test (``pytest -m simdevice`` selects them), and
  its example database key is its node id, as HypoFuzz keys it: what a campaign saved, pytest replays first;
- the fixture ``simdevice`` explores a function from inside an ordinary test:
  ``simdevice.explore(fn)`` fails the test with the same block when a schedule fails;
- Hypothesis's own files (its constants cache, and its default example database) go under
  ``~/.cache/simdevice/hypothesis`` rather than a new ``.hypothesis/`` in the current directory, unless that
  folder exists already or ``HYPOTHESIS_STORAGE_DIRECTORY`` is set: nothing is written where you did not ask.

Hypothesis's settings and profiles apply to ``@simdevice.fuzz`` tests as to any ``@given`` test; pytest-xdist
(``-n N``) spreads them over workers, and HypoFuzz fuzzes them (docs/campaigns.md).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from simdevice.fuzzing import FuzzFailure, use_database
from simdevice.search import engine

_TRACE_DIR: list[Path] = []


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("simdevice", "simdevice: schedule fuzzing on a simulated CUDA device")
    group.addoption("--simdevice-trace", metavar="DIR", default=None,
                    help="write the trace of each failing schedule to DIR (text, and a Perfetto .perfetto.json)")
    group.addoption("--simdevice-db", metavar="DIR", default=None,
                    help="keep the Hypothesis example database of @simdevice.fuzz tests in DIR (default: none, "
                         "unless your Hypothesis profile sets one)")


def _can_make(path: str) -> bool:
    """Whether the folder ``path`` exists or can be made: its nearest existing ancestor is a folder this process
    may write in."""
    here = Path(path).absolute()
    while not here.exists():
        here = here.parent
    return here.is_dir() and (here == Path(path).absolute() or os.access(here, os.W_OK))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "simdevice: a @simdevice.fuzz test (schedule fuzzing on the simulator)")
    db = config.getoption("--simdevice-db")
    trace = config.getoption("--simdevice-trace")
    for option, path in (("--simdevice-db", db), ("--simdevice-trace", trace)):
        if path is not None and (not path or (os.path.exists(path) and not os.path.isdir(path))):
            raise pytest.UsageError(f"{option} {path!r}: not a directory (it names a folder, made when first written)")
        if path and not _can_make(path):
            raise pytest.UsageError(f"{option} {path!r}: cannot be made (a file on its way, or a folder that cannot "
                                    "be written)")
    if db is not None:
        use_database(engine.database(db))
    _TRACE_DIR[:] = [Path(trace)] if trace else []
    existing = [Path(str(config.rootpath)) / ".hypothesis", Path.cwd() / ".hypothesis"]
    if not os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY") and not any(p.exists() for p in existing):
        from hypothesis import configuration

        configuration.set_hypothesis_home_dir(engine.cache_dir() / "hypothesis")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        test = getattr(item, "obj", None)
        if getattr(test, "__simdevice_target__", None) is not None:
            item.add_marker(pytest.mark.simdevice)
            # the example database key HypoFuzz gives the test (its node id): what a campaign saved, pytest replays
            test.hypothesis.inner_test._hypothesis_internal_add_digest = item.nodeid.encode()  # type: ignore[union-attr]


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A ``@pytest.mark.parametrize`` on a fuzz test names parameters of its function, which the test itself does not
    take (pytest passes it nothing): they are made known here, so that pytest's check of the marker passes, and
    :func:`pytest_pyfunc_call` hands each case's values to the test, which holds them fixed in its configuration. A
    fuzz test that cannot run (``__simdevice_unrunnable__``: a parameter without a default, say) gets them too, so
    that each case fails with its one line, not the module at collection with pytest's "function uses no
    argument"."""
    function = metafunc.function
    if getattr(function, "__simdevice_target__", None) is None and not hasattr(function, "__simdevice_unrunnable__"):
        return
    for marker in metafunc.definition.iter_markers(name="parametrize"):
        names = marker.args[0] if marker.args else marker.kwargs.get("argnames", ())
        if isinstance(names, str):
            names = [n.strip() for n in names.split(",") if n.strip()]
        metafunc.fixturenames.extend(n for n in names if n not in metafunc.fixturenames)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """A parametrized fuzz test's case: its values go to the test as the configuration it holds fixed."""
    test = pyfuncitem.obj
    callspec = getattr(pyfuncitem, "callspec", None)
    if getattr(test, "__simdevice_target__", None) is None or callspec is None or not callspec.params:
        return None
    test(**callspec.params)
    return True


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    outcome = yield
    report = outcome.get_result()
    if call.excinfo is None or not isinstance(call.excinfo.value, FuzzFailure):
        return
    failure = call.excinfo.value
    unwritten = ""
    if _TRACE_DIR:
        try:
            failure.write_trace(_TRACE_DIR[0])
        except OSError as e:  # a folder this process may not write after all (root's access() says yes to /proc)
            # the failure is still the report: an INTERNALERROR here lost it and ended the session
            unwritten = f"\n  trace: not written ({str(_TRACE_DIR[0])!r}: {e.strerror or e})"
    report.longrepr = f"simdevice: {item.nodeid} fails under a schedule\n{failure.block()}{unwritten}"


class Explorer:
    """The ``simdevice`` fixture: explore a function from inside a test, failing it with the short block."""

    def explore(self, fn: Any, **kwargs: Any) -> Any:
        from simdevice.search.explore import explore

        found = explore(fn, **kwargs)
        if found.failure is not None:
            raise FuzzFailure(found.failure)
        return found

    def cuda(self, *args: Any, **kwargs: Any) -> Any:
        from simdevice.dropin import cuda

        return cuda(*args, **kwargs)


@pytest.fixture
def simdevice() -> Explorer:
    """Explore functions (``simdevice.explore(fn, max_examples=...)``) or open a torch.cuda session
    (``simdevice.cuda()``) from a test; a failing schedule fails the test with its replay line."""
    return Explorer()
