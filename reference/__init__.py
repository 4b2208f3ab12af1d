"""Offload mechanisms as readable, executable specs, written once against the device contract.

``reference.contract`` is the contract (``Device`` and its handles, names mirroring ``torch.cuda``);
``reference.cuda`` runs it on a GPU; ``reference.schedule`` is the schedule both machines realize; one module
per mechanism holds its protocol, invariant, known bugs and fix flags.
"""

from typing import TYPE_CHECKING

from reference.lazy import lazy_names

if TYPE_CHECKING:
    from reference.contract import Device, Event, MemorySaver, Run, SharedQueue, SharedValue, Stream, Work, op_kind
    from reference.schedule import Delay, Schedule, ScheduleError

#: each public name and the module it comes from: imported on first use (PEP 562), so that importing
#: ``reference.schedule`` (the command line's parsing, ``simdevice --help``) does not import torch
_FROM = {
    **dict.fromkeys(("Device", "Event", "MemorySaver", "Run", "SharedQueue", "SharedValue", "Stream", "Work",
                     "op_kind"), "reference.contract"),
    **dict.fromkeys(("Delay", "Schedule", "ScheduleError"), "reference.schedule"),
}

__getattr__, __dir__ = lazy_names(__name__, globals(), _FROM)


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
