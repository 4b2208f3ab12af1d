"""What the command imports before it answers: only what the command uses (issue 18: a replay in 1.5 s).

A replay runs one schedule and never searches: it imports neither Hypothesis (about 0.4 s of its start on a
2-core machine, pytest and trio with it) nor the search; ``--fix`` (the default) checks its suggestion with a
search and imports them then. ``simdevice --help`` imports no torch. Each case runs the command's real entry
point in a fresh interpreter (this one has imported everything) and reads the names in ``sys.modules`` when the
process ends, from an ``atexit`` handler (which also checks that the command's quick exit, ``os._exit`` after
the ``atexit`` handlers, still runs them). Names, not times: the project asserts no timing.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
DEMO = "offload_reload/racy::d2h#0+1"

#: the modules a replay that asks for no fix must not import: the search and what it brings
SEARCH = ("hypothesis", "simdevice.search.engine", "simdevice.search.explore", "simdevice.search.strategies",
          "simdevice.search.find", "pytest", "trio")
#: drawing and tables: only --png, --perfetto and check's table on a terminal need them
EXTRAS = ("matplotlib", "perfetto", "rich", "simdevice.timeline")

_SCRIPT = """
import atexit, gc, json, sys

def dump(path):
    with open(path, "w") as f:
        json.dump({"modules": sorted(sys.modules), "collector": gc.isenabled(), "frozen": gc.get_freeze_count()}, f)

atexit.register(dump, sys.argv[1])
sys.argv = ["simdevice", *sys.argv[2:]]
from simdevice.command import entry

entry()
"""


def ended(args: list[str], tmp_path: Path) -> tuple[int, dict[str, Any]]:
    """``simdevice ARGS`` in a fresh interpreter: its exit code, and at its end the modules it had imported, whether
    the garbage collector was on and how many objects it had frozen."""
    out = tmp_path / "end.json"
    p = subprocess.run([sys.executable, "-c", _SCRIPT, str(out), *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert out.exists(), p.stderr  # the atexit handler ran
    return p.returncode, json.loads(out.read_text())


def imported(args: list[str], tmp_path: Path) -> tuple[int, set[str]]:
    """``simdevice ARGS`` in a fresh interpreter: its exit code and the modules it had imported at its end."""
    code, end = ended(args, tmp_path)
    return code, set(end["modules"])


def present(modules: set[str], names: tuple[str, ...]) -> list[str]:
    """Those of ``names`` (or their submodules) among ``modules``."""
    return sorted(n for n in names if any(m == n or m.startswith(f"{n}.") for m in modules))


#: the other programs' harnesses and protocols: a replay of offload_reload loads only its own
OTHER_PROGRAMS = tuple(f"{package}.{name}" for package in ("simdevice.programs", "reference")
                       for name in ("activation_offload", "memsaver_guard", "param_readiness", "zcc"))


def test_a_replay_without_fix_imports_no_search(tmp_path: Path) -> None:
    code, modules = imported(["replay", DEMO, "--no-fix"], tmp_path)
    assert code == 1  # the demonstration's race, found
    assert present(modules, SEARCH + EXTRAS + OTHER_PROGRAMS) == []
    assert {"torch", "simdevice.programs.offload_reload", "reference.offload_reload"} <= modules


def test_the_programs_are_listed_in_one_order_whichever_was_resolved_first() -> None:
    """``resolve`` imports only the program a schedule names; ``programs()`` (check's table, ``list``) still lists
    them all in the registry's order: the demonstration first, then by name."""
    script = ("import sys; from reference.schedule import Schedule; from simdevice.programs import programs, resolve; "
              "[resolve(Schedule.parse(a)) for a in sys.argv[1:]]; print(' '.join(p.name for p in programs()))")
    orders = {subprocess.run([sys.executable, "-c", script, *first], cwd=ROOT, capture_output=True, text=True,
                             check=True, timeout=300).stdout.strip()
              for first in ([], ["zcc/FIXED"], ["param_readiness/FIXED", "activation_offload/FIXED"])}
    assert orders == {"offload_reload activation_offload memsaver_guard param_readiness zcc"}


def test_a_replay_with_edges_imports_no_search(tmp_path: Path) -> None:
    edge = "d2h@reference/offload_reload.py:55->default@reference/offload_reload.py:63"
    code, modules = imported(["replay", DEMO, "--edge", edge], tmp_path)
    assert code == 0  # the fix's edge makes it clean
    assert present(modules, SEARCH + EXTRAS) == []


def test_the_fix_check_searches_and_imports_hypothesis(tmp_path: Path) -> None:
    """The other side: the suggested fix is checked by a search. Also what shows that the two tests above can see
    Hypothesis when it is there."""
    code, modules = imported(["replay", DEMO], tmp_path)
    assert code == 1
    assert present(modules, ("hypothesis", "simdevice.search.explore")) == ["hypothesis", "simdevice.search.explore"]


def test_list_imports_no_search(tmp_path: Path) -> None:
    code, modules = imported(["list"], tmp_path)
    assert code == 0
    assert present(modules, SEARCH + EXTRAS) == []
    assert present(modules, OTHER_PROGRAMS) == sorted(OTHER_PROGRAMS)  # list shows every program


def test_help_imports_no_torch(tmp_path: Path) -> None:
    code, modules = imported(["--help"], tmp_path)
    assert code == 0
    assert present(modules, ("torch", "numpy", "importlib.metadata", *SEARCH)) == []


def test_version_is_looked_up_when_asked(run_cli: Callable[[list[str], Path], subprocess.CompletedProcess[str]],
                                         tmp_path: Path) -> None:
    from importlib.metadata import version

    out = run_cli(["--version"], tmp_path)
    assert (out.returncode, out.stdout, out.stderr) == (0, f"simdevice {version('simdevice')}\n", "")


def test_the_collector_leaves_torchs_objects_alone_and_is_on_for_the_run(tmp_path: Path) -> None:
    """The command turns the collector off for torch's import, freezes what the import made (no collection scans it
    again) and turns it on for the run."""
    code, end = ended(["replay", DEMO, "--no-fix"], tmp_path)
    assert code == 1
    assert end["collector"] is True
    assert end["frozen"] > 100_000  # what importing torch made: about 250,000 objects with torch 2.13


@pytest.mark.parametrize("name", ["execute", "exhaust", "explore"])
def test_a_package_name_stays_the_function_when_its_module_is_imported(name: str) -> None:
    """``simdevice.search.execute`` is a function and a module. The import system sets the package's attribute to
    the module when the module is first imported (lazily now); the name must stay the function's, as when the
    package imported them all."""
    import simdevice.search

    module = importlib.import_module(f"simdevice.search.{name}")
    function = getattr(module, name)
    assert callable(function)
    assert getattr(simdevice.search, name) is function
    namespace: dict[str, object] = {}
    exec(f"from simdevice.search import {name}", namespace)
    assert namespace[name] is function


def test_every_public_name_of_the_search_package_imports() -> None:
    import simdevice.search

    for name in simdevice.search.__all__:
        assert getattr(simdevice.search, name) is not None
    assert simdevice.search.engine is importlib.import_module("simdevice.search.engine")
    with pytest.raises(AttributeError):
        simdevice.search.nothing_of_that_name  # noqa: B018
