"""Offload mechanisms as readable, executable specs, written once against the device contract.

``reference.contract`` is the contract (``Device`` and its handles, names mirroring ``torch.cuda``);
``reference.cuda`` runs it on a GPU; ``reference.schedule`` is the schedule both machines realize; one module
per mechanism holds its protocol, invariant, known bugs and fix flags.
"""

from reference.contract import Device, Event, MemorySaver, Run, SharedQueue, SharedValue, Stream, Work, op_kind
from reference.schedule import Delay, Schedule, ScheduleError

__all__ = [
    "Delay",
    "Device",
    "Event",
    "MemorySaver",
    "Run",
    "Schedule",
    "ScheduleError",
    "SharedQueue",
    "SharedValue",
    "Stream",
    "Work",
    "op_kind",
]
