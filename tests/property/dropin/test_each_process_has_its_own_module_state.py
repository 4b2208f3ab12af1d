"""Rule (execution: ``PROCESS_STATE``, :mod:`simdevice.runtime.process_state`): each simulated process has its own
module-level state in the modules that use torch: the globals a module's functions rebind (``global``), the class
attributes they assign through the class, the contents of the lists, dicts and sets among their default arguments
and, in an installed library, of those a module's functions change in place (``_STATE["rank"] = ...``,
``_SEEN.append(...)``; a program's own module keeps them shared, where a test collects its ranks' results:
``test_a_rank_reads_torchrun_s_variables.py``), and the dict a class's instances share as their ``__dict__`` (the
"Borg" pattern: accelerate's ``PartialState``, where rank 1 was told it was process 0). The run's processes share one
interpreter: before, one rank's ``global _initialized = True`` made the other skip its own initialization, and a
counter kept on a class or in a default argument counted on across the ranks (DeepSpeed's ZeRO-3 numbers its
parameters on ``Init.param_id`` and its modules in ``count=[0]``, and checks that the ranks' numbers agree: it
failed). The threads of one process share its state, and the run leaves the modules as it found them. Each of the
five kinds, unswapped, fails one test here, and so do containers compared with ``==`` (a dict of tensors: their
``==`` is elementwise).
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

import simdevice

LIBRARY = """
import torch
import torch.distributed as dist

_initialized = False


def init():
    global _initialized
    if _initialized:
        return "skipped"
    torch.ones(4, device="cuda")  # (a host step: the other rank may run here)
    _initialized = True
    return "made"


class Registry:
    next_id = 0


def register():
    torch.ones(1, device="cuda")
    i = Registry.next_id
    Registry.next_id += 1
    return i


def count(seen=[0]):
    torch.ones(1, device="cuda")
    seen[0] += 1
    return seen[0]


def remember(t, memo={}):
    torch.ones(1, device="cuda")
    memo[len(memo)] = t  # (tensors of several elements: compared by identity, their == is elementwise)
    return len(memo)


_STATE = {}
_SEEN = []


def note_rank():
    torch.ones(1, device="cuda")
    _STATE["rank"] = dist.get_rank()  # (changed in place: a program's module-level store)
    _SEEN.append(dist.get_rank())
    torch.ones(1, device="cuda")
    return _STATE["rank"], list(_SEEN)


class State:  # a "Borg": every instance's attributes are one dict of the class's (accelerate's PartialState)

    _shared_state = {}

    def __init__(self):
        self.__dict__ = self._shared_state
        if not self.__dict__:
            torch.ones(1, device="cuda")
            self.rank = dist.get_rank()
"""

SCHEDULES = (None, "rank0#0+3", "rank1#0+3", "rank0#2+2", "rank1#3+1")


@pytest.fixture
def library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    installed = tmp_path / "site-packages"  # (an installed library's: its in-place containers are a process's too)
    installed.mkdir()
    (installed / "perprocess_lib.py").write_text(textwrap.dedent(LIBRARY))
    monkeypatch.syspath_prepend(str(installed))
    sys.modules.pop("perprocess_lib", None)
    yield importlib.import_module("perprocess_lib")
    sys.modules.pop("perprocess_lib", None)


def _use(lib: Any) -> list[Any]:
    x = torch.ones(4, device="cuda")
    return [lib.init(), lib.register(), lib.register(), lib.count(), lib.count(), lib.remember(x),
            lib.remember(x * 2), lib.State().rank - dist.get_rank(), lib.note_rank()]


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_each_rank_initializes_and_counts_on_its_own(library: Any, schedule: str | None) -> None:
    s = simdevice.cuda(schedule)
    s.run(lambda: _use(library), world_size=2)
    assert not s.reports, s.text()
    assert s.result.result == [["made", 0, 1, 1, 2, 1, 2, 0, (rank, [rank])] for rank in (0, 1)]


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_the_run_leaves_the_modules_state_as_it_found_it(library: Any, schedule: str | None) -> None:
    s = simdevice.cuda(schedule)
    s.run(lambda: _use(library), world_size=2)
    assert (library._initialized, library.Registry.next_id, library.count.__defaults__[0]) == (False, 0, [0])
    assert library.remember.__defaults__[0] == {}
    assert library.State._shared_state == {}
    assert (library._STATE, library._SEEN) == ({}, [])
    again = simdevice.cuda(schedule)
    again.run(lambda: _use(library), world_size=2)
    assert again.result.result == [["made", 0, 1, 1, 2, 1, 2, 0, (rank, [rank])] for rank in (0, 1)]


def test_the_threads_of_one_process_share_its_state(library: Any) -> None:
    def rank() -> list[Any]:
        worker = threading.Thread(target=library.register)
        worker.start()
        worker.join()
        return [library.register(), library.Registry.next_id]

    s = simdevice.cuda()
    s.run(rank, world_size=2)
    assert not s.reports, s.text()
    assert s.result.result == [[1, 2]] * 2


@contextlib.contextmanager
def _module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, text: str) -> Iterator[Any]:
    """A library module of ``text``, imported afresh from ``tmp_path``, and forgotten at the end."""
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(name, None)
    try:
        yield importlib.import_module(name)
    finally:
        sys.modules.pop(name, None)


GLOBAL_ONLY = """
import torch

_group = None


def init():
    global _group
    if _group is not None:
        return "skipped"
    torch.ones(4, device="cuda")  # (a host step: the other rank may run here)
    _group = "made"
    return _group
"""


def test_a_module_whose_only_state_is_a_global_keeps_one_per_process(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A module whose functions rebind a global and keep nothing else per process (Megatron's ``parallel_state``
    shape: ``_TENSOR_MODEL_PARALLEL_GROUP = None`` set in ``initialize_model_parallel``) is tracked too. Mutation:
    a module with rebound globals alone taken for one without state (a ``not`` dropped in ``_track``'s test):
    rank 1 skipped its initialization."""
    with _module(tmp_path, monkeypatch, "global_only_lib", GLOBAL_ONLY) as lib:
        for schedule in SCHEDULES:
            s = simdevice.cuda(schedule)
            s.run(lib.init, world_size=2)
            assert not s.reports, s.text()
            assert s.result.result == ["made", "made"], schedule
            assert lib._group is None


NESTED = """
import torch
import torch.distributed as dist


class Config:
    pass


def setup():
    def mark():
        global _ready  # (rebound in a nested function: a code object among the outer one's constants)
        _ready = True

    if globals().get("_ready"):
        return "skipped"
    torch.ones(4, device="cuda")
    mark()
    return "made"


def configure():
    if hasattr(Config, "rank"):  # (an attribute the class did not have as it was made)
        return "seen"
    torch.ones(1, device="cuda")
    Config.rank = dist.get_rank()
    return Config.rank
"""


def test_a_global_a_nested_function_rebinds_and_a_class_attribute_made_in_a_run_are_each_process_s(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The globals a function nested in a module's function rebinds are tracked as its own, and a class attribute
    one process assigns (``Cls.attr = value``) where the class had none is absent in another process and after
    the run. Mutations: nested code objects not scanned (rank 1 skipped its setup); a plain ``Cls.attr = value``
    not tracked, or an attribute absent in the next process left in place (rank 1 saw rank 0's)."""
    with _module(tmp_path, monkeypatch, "nested_lib", NESTED) as lib:
        for schedule in SCHEDULES:
            s = simdevice.cuda(schedule)
            s.run(lambda: [lib.setup(), lib.configure()], world_size=2)
            assert not s.reports, s.text()
            assert s.result.result == [["made", 0], ["made", 1]], schedule
            assert not hasattr(lib, "_ready")
            assert not hasattr(lib.Config, "rank")


def test_a_module_imported_in_a_run_leaves_the_state_others_tracked_as_it_was_made(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A module seen once is not taken again for a new one where the run imports another (each import asks which
    modules keep state): the state a process gave it is not what the next process starts from. Mutation: a module
    seen before scanned again as made (a rank started from the other's ``_group`` and skipped its initialization)."""
    for rank in (0, 1):
        (tmp_path / f"imported_late_{rank}.py").write_text("import torch\n\nVALUE = 1\n")
    late = ("imported_late_0", "imported_late_1")
    for name in late:
        sys.modules.pop(name, None)
    with _module(tmp_path, monkeypatch, "global_only_lib", GLOBAL_ONLY) as lib:

        def rank() -> list[Any]:
            first = lib.init()
            importlib.import_module(f"imported_late_{dist.get_rank()}")
            torch.ones(1, device="cuda")
            return [first, lib.init()]

        for schedule in (*SCHEDULES, "rank1#0+50"):  # (the last: rank 0 imports before rank 1 begins)
            s = simdevice.cuda(schedule)
            s.run(rank, world_size=2)
            assert not s.reports, s.text()
            assert s.result.result == [["made", "skipped"], ["made", "skipped"]], schedule
    for name in late:
        sys.modules.pop(name, None)
