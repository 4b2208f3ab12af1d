"""A package's public names imported on first use (PEP 562): importing the package imports none of its modules, so
that what needs only one of them (the command line's parsing, a replay) does not pay for the rest (torch,
Hypothesis). Used by ``reference``, ``simdevice`` and ``simdevice.search``."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_names(package: str, namespace: dict[str, Any], sources: dict[str, str],
               modules: tuple[str, ...] = ()) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The package's ``__getattr__`` and ``__dir__``: a name of ``sources`` (name -> the module it comes from) is
    imported when first asked for and kept in ``namespace``; one of ``modules`` is the package's submodule of that
    name, imported when asked for."""

    def getattr_(name: str) -> Any:
        if name in sources:
            value = getattr(importlib.import_module(sources[name]), name)
            namespace[name] = value
            return value
        if name in modules:
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def dir_() -> list[str]:
        return sorted({*namespace["__all__"], *modules})

    return getattr_, dir_
