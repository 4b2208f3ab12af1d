"""A simulated CUDA device that runs offload protocols deterministically under any schedule.

``SimDevice(schedule).run(program)`` runs a program written against the
device contract (``reference.device``) in virtual time and returns its
result and reports. See README.md for the command line (``simdevice check``,
``simdevice replay``).
"""

from reference.device import Run
from reference.schedule import Delay, Schedule, ScheduleError
from simdevice.config import UNIT_NS, SimConfig
from simdevice.device import SimDevice
from simdevice.report import Access, Deadlock, HostError, IllegalAccess, Race, StaleRead
from simdevice.tensor import SimTensor, peek

__all__ = [
    "UNIT_NS",
    "Access",
    "Deadlock",
    "Delay",
    "HostError",
    "IllegalAccess",
    "Race",
    "Run",
    "Schedule",
    "ScheduleError",
    "SimConfig",
    "SimDevice",
    "SimTensor",
    "StaleRead",
    "peek",
]
