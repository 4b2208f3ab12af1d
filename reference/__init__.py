"""Offload mechanisms as readable, executable specs, written once against the device contract.

``reference.contract`` is the contract (``Device`` and its handles, names mirroring ``torch.cuda``);
``reference.cuda`` runs it on a GPU; ``reference.schedule`` is the schedule both machines realize; one module
per mechanism holds its protocol, invariant, known bugs and fix flags.
"""

from typing import TYPE_CHECKING, Any

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


def __getattr__(name: str) -> Any:
    if name not in _FROM:
        raise AttributeError(f"module 'reference' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_FROM[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


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
