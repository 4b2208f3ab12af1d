"""Run, judge and search schedules: one run (``execute``), Hypothesis (``find``), the bounded exhaustive mode.

- :mod:`simdevice.search.execute`: :func:`execute` one schedule on the simulator or on CUDA, its
  :class:`Outcome`, and what a search counts as a failure;
- :mod:`simdevice.search.strategies`: Hypothesis strategies for schedules;
- :mod:`simdevice.search.find`: :func:`search` and :func:`check_variant` (what ``simdevice check`` runs);
- :mod:`simdevice.search.exhaust`: every schedule of at most K delays.
"""

from simdevice.programs import load_all, programs
from simdevice.search.execute import Outcome, counts_as_failure, device_for, execute, gpu_config
from simdevice.search.exhaust import all_schedules, count_schedules, exhaust
from simdevice.search.find import Finding, Search, check_variant, search, search_settings
from simdevice.search.strategies import delays, schedules

__all__ = [
    "Finding",
    "Outcome",
    "Search",
    "all_schedules",
    "check_variant",
    "count_schedules",
    "counts_as_failure",
    "delays",
    "device_for",
    "execute",
    "exhaust",
    "gpu_config",
    "load_all",
    "programs",
    "schedules",
    "search",
    "search_settings",
]
