"""A simulated CUDA device that runs offload protocols deterministically under any schedule.

Your own protocol: ``simdevice.explore(fn)`` searches a function's schedules
(plain torch.cuda code, or contract code ``fn(dev)``) and returns the shrunk
failure; ``@simdevice.fuzz`` makes a test of it (pytest, Hypothesis settings,
``@simdevice.example`` pins); ``with simdevice.cuda():`` runs torch.cuda code
on the simulated device. ``SimDevice(schedule).run(program)`` runs contract
code under one schedule. See README.md for the command line (``simdevice
check``, ``simdevice replay``, ``simdevice list``).

Layout: ``simdevice.runtime`` is the model (execution, sync, memory,
allocator, collectives, reports); ``simdevice.api`` (``SimDevice``) and
``simdevice.dispatch`` (tensors) are the façade over it; ``simdevice.programs``
holds the programs the tool knows and their harnesses; ``simdevice.search``
runs, judges and searches schedules.
"""

from typing import TYPE_CHECKING

from reference.lazy import lazy_names

if TYPE_CHECKING:
    from reference.contract import Run
    from reference.schedule import Delay, Schedule, ScheduleError
    from simdevice.api import SimDevice
    from simdevice.dispatch import SimTensor, peek
    from simdevice.dropin import DropIn, cuda
    from simdevice.fuzzing import FuzzFailure, example, fuzz
    from simdevice.runtime import UNIT_NS, Options, SimConfig
    from simdevice.runtime.memsaver import LibraryFixes
    from simdevice.runtime.reports import Access, Deadlock, HostError, IllegalAccess, Race, StaleRead, StepLimit
    from simdevice.search.explore import Exploration, explore

#: each public name and the module it comes from: imported on first use (PEP 562), so that the command line can
#: set up its handling of Ctrl-C before torch is imported
_FROM = {
    "Run": "reference.contract", "Delay": "reference.schedule", "Schedule": "reference.schedule",
    "ScheduleError": "reference.schedule", "SimDevice": "simdevice.api", "SimTensor": "simdevice.dispatch",
    "peek": "simdevice.dispatch", "DropIn": "simdevice.dropin", "cuda": "simdevice.dropin",
    "FuzzFailure": "simdevice.fuzzing", "example": "simdevice.fuzzing", "fuzz": "simdevice.fuzzing",
    "UNIT_NS": "simdevice.runtime", "Options": "simdevice.runtime", "SimConfig": "simdevice.runtime",
    "LibraryFixes": "simdevice.runtime.memsaver", "Access": "simdevice.runtime.reports",
    "Deadlock": "simdevice.runtime.reports", "HostError": "simdevice.runtime.reports",
    "IllegalAccess": "simdevice.runtime.reports", "Race": "simdevice.runtime.reports",
    "StaleRead": "simdevice.runtime.reports", "StepLimit": "simdevice.runtime.reports",
    "Exploration": "simdevice.search.explore", "explore": "simdevice.search.explore",
}

__getattr__, __dir__ = lazy_names(__name__, globals(), _FROM)


__all__ = [
    "UNIT_NS",
    "Access",
    "Deadlock",
    "Delay",
    "DropIn",
    "Exploration",
    "FuzzFailure",
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
    "StepLimit",
    "cuda",
    "example",
    "explore",
    "fuzz",
    "peek",
]
