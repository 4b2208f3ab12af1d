"""Imports in a run: a module one actor is importing is waited for by another that imports it meanwhile.

A run's actors (the ranks, the threads a program starts) share one interpreter, and a greenlet run's share one
machine thread. Python's import lock is per module and per thread: a second thread importing a module the first is
still executing waits for the first to finish (``_ModuleLock``). Where the first actor stops inside a module's
top-level code (a device call there is a host step, where another actor may run) and the second imports the same
module, the lock is the same machine thread's, so it is taken again at once and the second gets the module half
made (``ImportError: cannot import name ... from partially initialized module``: DeepSpeed's ZeRO imports its
optimizers inside ``step``, on every rank); on threads taking turns, the second would wait on the real lock for good.

In a run, the program's import of a module another actor is importing (Python's ``_find_and_load``, and
``_lock_unlock_module``, which an ``import`` of a module still being made calls to wait for it) waits in the run
for that import to end, and is ordered after it, as a thread waits on its lock; meanwhile the other actors run. An
import that would wait on a cycle of imports goes on with the module half made, as Python's own deadlock detection
lets it. An import of a module no other actor is importing is Python's own (no host step, nothing counted). A module
first imported in a run leaves its state as made with :mod:`simdevice.runtime.process_state`: what another process
that imports it starts from.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

from simdevice.dropin.patches import Patches
from simdevice.runtime import execution, sync
from simdevice.runtime.runtime import SharedCell

#: the import system's own module (``importlib._bootstrap``), whose functions the interpreter looks up at each import
_BOOTSTRAP: Any = sys.modules["_frozen_importlib"]
#: its functions, as imported
_FIND_AND_LOAD = _BOOTSTRAP._find_and_load
_LOCK_UNLOCK = _BOOTSTRAP._lock_unlock_module


class _Import:
    """One module's import in a run: the actor importing it, and the clock its waiters are ordered after."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor
        self.cell = SharedCell(True)


class _Imports:
    """A run's imports under way (:func:`_table`)."""

    def __init__(self) -> None:
        self.under_way: dict[str, _Import] = {}
        #: each actor waiting for another's import: the module's name
        self.waiting: dict[Any, str] = {}

    def cycle(self, actor: Any, name: str) -> bool:
        """Whether ``actor`` waiting for ``name`` would close a cycle of actors waiting for each other's imports."""
        seen = set()
        while name in self.under_way:
            holder = self.under_way[name].actor
            if holder is actor:
                return True
            if holder in seen or holder not in self.waiting:
                return False
            seen.add(holder)
            name = self.waiting[holder]
        return False


def _runtime() -> Any:
    """The runtime of the run the caller is an actor of, or None."""
    from simdevice.dropin import facade  # (facade imports this module's installer)

    if not facade.in_actor():
        return None
    return facade.session_device().runtime


#: each run's imports under way, by its runtime
_TABLES: weakref.WeakKeyDictionary[Any, _Imports] = weakref.WeakKeyDictionary()


def _table(rt: Any) -> _Imports:
    table = _TABLES.get(rt)
    if table is None:
        table = _TABLES[rt] = _Imports()
    return table


def _wait_for_another(rt: Any, table: _Imports, name: str) -> Any:
    """The current actor, after waiting for another actor's import of ``name`` (if one is under way). It counts as
    waiting from before its host step, where another actor may run and close a cycle with it: that one goes on."""
    a = rt.current()
    held = table.under_way.get(name)
    if held is None or held.actor is a or table.cycle(a, name):
        return a
    table.waiting[a] = name
    try:
        a = rt.host_step(f"import {name}")
        rt.execution.block(a, f"{held.actor.name}'s import of {name}", lambda: not held.cell.value)
    finally:
        del table.waiting[a]
    sync.observe(a, held.cell)
    return a


#: the session's patches, while they are in place (:func:`install`)
_ACTIVE: list[Patches] = []
#: torch's packages imported with the session's patches lifted (:func:`_imported_as_outside`)
AS_OUTSIDE = ("torch._dynamo",)


def _imported_as_outside(name: str, import_: Any) -> Any:
    """``name``'s first import during a session, made with torch as it is outside the session (the patches lifted for
    its duration), as if it had been imported before: ``torch._dynamo``, which an op's meta kernel (a Python
    reference behind ``torch._disable_dynamo``) or the program's ``torch.compile`` may import first in a run, keeps
    at import what it finds of torch (``all_tensor_attrs``: ``torch.Tensor``'s attributes), and kept the session's
    (a property where ``Tensor.grad`` is torch's descriptor) after the session: a GPU run in the same process (``replay
    --gpu``) raised ``AttributeError`` in torch at its first device op."""
    with _ACTIVE[-1].lifted():  # (this hook among them: the import's own imports are Python's)
        return _FIND_AND_LOAD(name, import_)


def _find_and_load(name: str, import_: Any) -> Any:
    """Python's ``_find_and_load``: in a run, after any other actor's import of ``name``, and marked as this
    actor's while it runs. A first import of one of :data:`AS_OUTSIDE`: :func:`_imported_as_outside`."""
    if _ACTIVE and name in AS_OUTSIDE and name not in sys.modules:
        return _imported_as_outside(name, import_)
    rt = _runtime()
    if rt is None:
        return _FIND_AND_LOAD(name, import_)
    table = _table(rt)
    a = _wait_for_another(rt, table, name)
    if name in table.under_way:  # (its own import again, or one in a cycle: Python's, as it is)
        return _FIND_AND_LOAD(name, import_)
    mine = table.under_way[name] = _Import(a)
    fresh = name not in sys.modules
    try:
        module = _FIND_AND_LOAD(name, import_)
        if fresh:  # (its state as made: what another process that imports it starts from)
            execution.PROCESS_STATE.made(module)
        return module
    finally:
        del table.under_way[name]
        mine.cell.value = False
        sync.publish(mine.cell, a)


def _lock_unlock_module(name: str) -> None:
    """Python's wait for a module another thread is still making (an ``import`` of one in ``sys.modules`` half made):
    in a run, for the actor making it."""
    rt = _runtime()
    if rt is not None:
        _wait_for_another(rt, _table(rt), name)
    _LOCK_UNLOCK(name)


def install(p: Patches) -> None:
    p.set(_BOOTSTRAP, "_find_and_load", _find_and_load)
    p.set(_BOOTSTRAP, "_lock_unlock_module", _lock_unlock_module)
    _ACTIVE.append(p)
    p.on_restore(lambda: _ACTIVE.remove(p))


def patched_owners() -> list[Any]:
    return [_BOOTSTRAP]
