"""Where the contract and ``CudaDevice`` used to live: ``reference.contract`` and ``reference.cuda`` now.

Kept so that ``from reference.device import CudaDevice`` (scripts, notes) goes on working.
"""

from reference.contract import (
    Device,
    Event,
    MemorySaver,
    OpKind,
    Process,
    Run,
    SharedQueue,
    SharedValue,
    Stream,
    Work,
    op_kind,
)
from reference.cuda import (
    CudaDevice,
    CudaEvent,
    CudaProcess,
    CudaQueue,
    CudaStream,
    CudaValue,
    CudaWork,
    ProcessWideMemorySaver,
    calibrate_sleep_cycles_per_ms,
    load_memory_saver,
)

__all__ = [
    "CudaDevice",
    "CudaEvent",
    "CudaProcess",
    "CudaQueue",
    "CudaStream",
    "CudaValue",
    "CudaWork",
    "Device",
    "Event",
    "MemorySaver",
    "OpKind",
    "Process",
    "ProcessWideMemorySaver",
    "Run",
    "SharedQueue",
    "SharedValue",
    "Stream",
    "Work",
    "calibrate_sleep_cycles_per_ms",
    "load_memory_saver",
    "op_kind",
]
