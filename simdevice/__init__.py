"""A simulated CUDA device that runs offload protocols deterministically under any schedule.

``SimDevice(schedule).run(program)`` runs a program written against the
device contract (``reference.contract``) in virtual time and returns its
result and reports. See README.md for the command line (``simdevice check``,
``simdevice replay``).

Layout: ``simdevice.runtime`` is the model (execution, sync, memory,
allocator, collectives, reports); ``simdevice.api`` (``SimDevice``) and
``simdevice.dispatch`` (tensors) are the façade over it; ``simdevice.programs``
holds the programs the tool knows and their harnesses; ``simdevice.search``
runs, judges and searches schedules.
"""

from reference.contract import Run
from reference.schedule import Delay, Schedule, ScheduleError
from simdevice.api import SimDevice
from simdevice.dispatch import SimTensor, peek
from simdevice.dropin import DropIn, cuda
from simdevice.runtime import UNIT_NS, Options, SimConfig
from simdevice.runtime.memsaver import LibraryFixes
from simdevice.runtime.reports import Access, Deadlock, HostError, IllegalAccess, Race, StaleRead
from simdevice.search.explore import Exploration, explore

__all__ = [
    "UNIT_NS",
    "Access",
    "Deadlock",
    "Delay",
    "DropIn",
    "Exploration",
    "HostError",
    "IllegalAccess",
    "LibraryFixes",
    "Options",
    "Race",
    "Run",
    "Schedule",
    "ScheduleError",
    "SimConfig",
    "SimDevice",
    "SimTensor",
    "StaleRead",
    "cuda",
    "explore",
    "peek",
]
