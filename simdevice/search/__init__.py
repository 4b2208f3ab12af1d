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
"""

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
