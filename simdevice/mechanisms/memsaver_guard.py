"""The memory-saver guard around weight sync (``reference.memsaver_guard``) as the program ``memsaver_guard``.

The oracle checks what a user would see: the weights the engine received, the
handshakes, no transfer after a failed connection, the guard exited on every
path and never entered with offloading off. The allocator facts (allocations
served from paused segments, handles released) are checked by the property
tests on ``SimDevice.memory_saver``.

Hypothesis draws the configuration (offloading, reconnecting, a failing
connection, cycles, dropping gradients, sizes, the allocator's reuse choice)
and delays on the host, the compute stream and the communication stream.
"""

from __future__ import annotations

from typing import Any

from reference.memsaver_guard import VARIANTS, MemsaverConfig, SyncRecord, oracle, run_lifecycle
from simdevice.memsaver import LibraryFixes, SimMemorySaver
from simdevice.programs import Program, int_config, register


def memsaver_body(dev: Any, variant: str, cfg: MemsaverConfig) -> SyncRecord:
    fixes = VARIANTS[variant]
    if isinstance(dev.memory_saver, SimMemorySaver):
        # the free-while-paused bug is in the library: the simulated one takes the variant's flag, a GPU run
        # gets whatever torch_memory_saver is installed
        dev.memory_saver.fixes = LibraryFixes(release_paused_once=fixes.release_paused_once)
    return run_lifecycle(dev, fixes, cfg)


def memsaver_oracle(cfg: MemsaverConfig, record: SyncRecord) -> list[str]:
    return oracle(cfg, record)


PROGRAM = register(
    Program(
        name="memsaver_guard",
        doc="a sleeping trainer (memory-saver region paused) reconnects to the rollout engines and sends its "
        "weights; allocations must go around the paused pool with disable()",
        clean=("FIXED",),
        buggy={
            "memsaver-connect-unguarded": "only the transfer runs inside disable(): the connection's handshake "
            "tensor is served from a cached block of a paused segment",
            "memsaver-free-while-paused-twice": "freeing a paused segment releases its physical handle again "
            "(the pause already released it): the process aborts",
        },
        actors=("host", "default", "nccl"),
        config=lambda values: int_config(MemsaverConfig, values),
        body=memsaver_body,
        oracle=memsaver_oracle,
        max_index=12,
        config_space={
            "offload": ("1", "0"),
            "reconnect": ("1", "0"),
            "fail": ("0", "1"),
            "cycles": ("2", "1", "3"),
            "drop": ("1", "0"),
            "kib": ("4", "2", "16"),
            "conn_kib": ("2", "1", "8"),
            "act_kib": ("32", "16"),
            "pick": ("0", "1", "2"),
        },
        size_keys=("kib", "act_kib", "conn_kib", "bucket_kib"),
    )
)
