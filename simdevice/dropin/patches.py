"""Replacing attributes of torch's modules and classes for a while, and putting back exactly what was there.

Nothing is patched at import. :class:`Patches` records, for every attribute it sets, whether the object's own
namespace held one and what; :meth:`Patches.restore` undoes them in reverse order, deleting what was absent
before. ``tests/property/dropin/test_patches.py`` compares the namespaces before and after a session, also one
that raised.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

_ABSENT = object()


class Patches:
    def __init__(self) -> None:
        self._saved: list[tuple[Any, str, Any]] = []
        self._after: list[Callable[[], None]] = []

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

    def restore(self) -> None:
        while self._saved:
            owner, name, old = self._saved.pop()
            if old is _ABSENT:
                delattr(owner, name)
            else:
                setattr(owner, name, old)
        while self._after:
            self._after.pop()()

    def __len__(self) -> int:
        return len(self._saved)


def namespaces(owners: list[Any]) -> list[dict[str, Any]]:
    """A copy of each owner's own namespace (what a session must leave as it found it)."""
    return [dict(vars(o)) for o in owners]
