"""Replacing attributes of torch's modules and classes for a while, and putting back exactly what was there.

Nothing is patched at import. :class:`Patches` records, for every attribute it sets, whether the object's own
namespace held one and what; :meth:`Patches.restore` undoes them in reverse order, deleting what was absent
before. ``tests/property/dropin/test_patches.py`` compares the namespaces before and after a session, also one
that raised.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Callable, Iterable, Iterator
from typing import Any

_ABSENT = object()


class Patches:
    def __init__(self) -> None:
        self._saved: list[tuple[Any, str, Any]] = []
        self._after: list[Callable[[], None]] = []
        self._first: list[Callable[[], None]] = []

    def set(self, owner: Any, name: str, value: Any) -> None:
        """``owner.name = value`` until :meth:`restore` (``owner``: a module or a class)."""
        self._saved.append((owner, name, vars(owner).get(name, _ABSENT)))
        setattr(owner, name, value)

    def set_module(self, name: str, module: Any) -> None:
        """``sys.modules[name] = module`` until :meth:`restore` (an import of ``name`` meanwhile gets ``module``)."""
        old: Any = sys.modules.get(name, _ABSENT)
        sys.modules[name] = module

        def back() -> None:
            if old is _ABSENT:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old

        self.on_restore(back)

    def on_restore(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` once :meth:`restore` has put everything back (a cache of what was patched, forgotten)."""
        self._after.append(fn)

    def before_restore(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` once :meth:`restore` starts, the patches still in place."""
        self._first.append(fn)

    def restore(self) -> None:
        while self._first:
            self._first.pop()()
        while self._saved:
            owner, name, old = self._saved.pop()
            _put(owner, name, old)
        while self._after:
            self._after.pop()()

    def __len__(self) -> int:
        return len(self._saved)

    @contextlib.contextmanager
    def lifted(self) -> Iterator[None]:
        """For the block, each attribute set so far holds what it held before (or is absent again); after it, what
        it held at the block's start. (What :meth:`on_restore` undoes stays: ``sys.modules`` entries, rebound
        globals.)"""
        now = [(owner, name, vars(owner).get(name, _ABSENT)) for owner, name, _ in self._saved]
        for owner, name, old in reversed(self._saved):
            _put(owner, name, old)
        try:
            yield
        finally:
            for owner, name, value in now:
                _put(owner, name, value)

    def saved_callables(self) -> list[tuple[Any, str, Any]]:
        """``(module, name, original)`` of each module attribute set so far that held a function or class."""
        return [(owner, name, old) for owner, name, old in self._saved
                if isinstance(owner, types.ModuleType) and old is not _ABSENT and callable(old)]

    def replaced(self) -> dict[int, tuple[Any, Any]]:
        """The module attributes replaced so far that were functions or classes: ``{id(original): (original,
        replacement)}`` (the first replacement of each, where several modules held the same object)."""
        instead: dict[int, tuple[Any, Any]] = {}
        for owner, name, old in self.saved_callables():
            new = vars(owner).get(name, _ABSENT)
            if new is not old and new is not _ABSENT:
                instead.setdefault(id(old), (old, new))
        return instead

    def unbind(self, modules: Iterable[types.ModuleType]) -> int:
        """Each global of ``modules`` that holds a replacement made so far holds its original instead (modules first
        imported while the patches were in place: what they bound by name then, ``from torch.distributed.
        distributed_c10d import _get_default_group``, is what they bind outside). How many globals it changed."""
        return len(_swapped(modules, {id(new): (new, old) for old, new in self.replaced().values()}))

    def rebind(self, modules: Iterable[types.ModuleType]) -> int:
        """Each global of ``modules`` that holds a module attribute replaced so far (``from torch.cuda import
        Stream``, ``from threading import Event``, ``from time import sleep`` run before the patches) holds its
        replacement until :meth:`restore`, which puts the original back where the global still holds the
        replacement (a module that rebound it meanwhile keeps its own). Replaced functions and classes alone: a
        patched flag or constant (None, a number) is no name to follow. How many globals it rebound."""
        rebound = _swapped(modules, self.replaced())

        def back() -> None:
            for space, name, old, new in reversed(rebound):
                if space.get(name, _ABSENT) is new:
                    space[name] = old

        self.on_restore(back)
        return len(rebound)


def _swapped(modules: Iterable[types.ModuleType],
             table: dict[int, tuple[Any, Any]]) -> list[tuple[dict[str, Any], str, Any, Any]]:
    """Each global of ``modules`` holding a key of ``table`` (``{id(x): (x, y)}``) holds its ``y`` instead: each
    (namespace, name, x, y) changed."""
    changed = []
    for module in modules:
        space = vars(module)
        for name, value in list(space.items()):
            got = table.get(id(value))
            if got is not None and got[0] is value:
                space[name] = got[1]
                changed.append((space, name, value, got[1]))
    return changed


def _put(owner: Any, name: str, value: Any) -> None:
    """``owner.name = value``, or no ``name`` of its own where ``value`` is :data:`_ABSENT`."""
    if value is not _ABSENT:
        setattr(owner, name, value)
    elif name in vars(owner):
        delattr(owner, name)


def namespaces(owners: list[Any]) -> list[dict[str, Any]]:
    """A copy of each owner's own namespace (what a session must leave as it found it)."""
    return [dict(vars(o)) for o in owners]
