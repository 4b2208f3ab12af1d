"""Run, judge and search schedules of targets: a user's function or a built-in program's variant.

- :mod:`simdevice.search.targets`: what can be run under a schedule (:class:`FunctionTarget`,
  :class:`ProgramTarget`);
- :mod:`simdevice.search.execute`: :func:`execute` one built-in schedule on the simulator or on CUDA, its
  :class:`Outcome`, and what a search counts as a failure;
- :mod:`simdevice.search.strategies`: Hypothesis strategies for schedules (delays where operations exist);
- :mod:`simdevice.search.engine`: the Hypothesis settings of a search, and where Hypothesis may write;
- :mod:`simdevice.search.explore`: :func:`explore` and :func:`search_target`, the one search;
- :mod:`simdevice.search.find`: :func:`search` and :func:`check_variant` for the built-in programs;
- :mod:`simdevice.search.exhaust`: every schedule of at most K delays.

The names below are imported on first use (PEP 562): a replay runs one schedule and never searches, so it does
not pay for importing Hypothesis (about 0.4 s of the command's start).
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

from reference.lazy import lazy_names

if TYPE_CHECKING:
    from simdevice.programs import load_all, programs
    from simdevice.search.engine import search_settings
    from simdevice.search.execute import Outcome, counts_as_failure, device_for, execute, gpu_config
    from simdevice.search.exhaust import (
        all_schedules,
        count_schedules,
        count_target_schedules,
        exhaust,
        exhaust_target,
        target_schedules,
    )
    from simdevice.search.explore import Exploration, Search, explore, search_target
    from simdevice.search.find import Finding, check_variant, search
    from simdevice.search.strategies import configs, delays_at, schedules, schedules_of
    from simdevice.search.targets import FunctionTarget, ProgramTarget, Target, TargetError, resolve, target_of

#: each public name and the module it comes from
_FROM = {
    "load_all": "simdevice.programs", "programs": "simdevice.programs",
    "search_settings": "simdevice.search.engine",
    **dict.fromkeys(("Outcome", "counts_as_failure", "device_for", "execute", "gpu_config"),
                    "simdevice.search.execute"),
    **dict.fromkeys(("all_schedules", "count_schedules", "count_target_schedules", "exhaust", "exhaust_target",
                     "target_schedules"), "simdevice.search.exhaust"),
    **dict.fromkeys(("Exploration", "Search", "explore", "search_target"), "simdevice.search.explore"),
    **dict.fromkeys(("Finding", "check_variant", "search"), "simdevice.search.find"),
    **dict.fromkeys(("configs", "delays_at", "schedules", "schedules_of"), "simdevice.search.strategies"),
    **dict.fromkeys(("FunctionTarget", "ProgramTarget", "Target", "TargetError", "resolve", "target_of"),
                    "simdevice.search.targets"),
}
#: its modules, as attributes without importing them first (as when this package imported them all)
_MODULES = ("engine", "execute", "exhaust", "explore", "find", "strategies", "targets")
__getattr__, __dir__ = lazy_names(__name__, globals(), _FROM, _MODULES)


def _function(name: str) -> property:
    """``execute``, ``exhaust`` and ``explore`` name a function and the module that defines it. Importing the module
    sets the package's attribute to it (the import system does, after the module ran); this keeps the name the
    function's, as when this package imported them all."""

    def get(package: types.ModuleType) -> Any:
        return getattr(importlib.import_module(_FROM[name]), name)

    def keep(package: types.ModuleType, value: Any) -> None:
        if not isinstance(value, types.ModuleType):
            raise AttributeError(f"simdevice.search.{name} is the function of simdevice.search.{name}")

    return property(get, keep)


class _Package(types.ModuleType):
    execute = _function("execute")
    exhaust = _function("exhaust")
    explore = _function("explore")


sys.modules[__name__].__class__ = _Package

__all__ = [
    "Exploration",
    "Finding",
    "FunctionTarget",
    "Outcome",
    "ProgramTarget",
    "Search",
    "Target",
    "TargetError",
    "all_schedules",
    "check_variant",
    "configs",
    "count_schedules",
    "count_target_schedules",
    "counts_as_failure",
    "delays_at",
    "device_for",
    "execute",
    "exhaust",
    "exhaust_target",
    "explore",
    "gpu_config",
    "load_all",
    "programs",
    "resolve",
    "schedules",
    "schedules_of",
    "search",
    "search_settings",
    "search_target",
    "target_of",
    "target_schedules",
]
