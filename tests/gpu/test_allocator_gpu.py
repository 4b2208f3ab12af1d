"""The caching allocator's stream order on a real GPU: the record_stream hazard, and stream names as the simulator's.

``tests/hazards.py``'s ``freed_while_side_reads``: without ``record_stream`` a stalled side stream copies the bytes
the compute stream's next allocation wrote (its block is the dropped tensor's); with it, never. Each case prints
``RATE <case> corrupted K/N``; record the lines in docs/confirmations.md. Run:
``python -m pytest -q -s tests/gpu/test_allocator_gpu.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hazards import freed_while_side_reads

from reference.schedule import Schedule
from simdevice import SimDevice

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from reference.cuda import CudaDevice

TRIALS = 10
STALLED = "allocator/free-reuse::side#0+20"
N = 16 << 20  # 64 MiB: a copy long enough to outlast the host's next steps


def rate(record: bool, text: str) -> int:
    s = Schedule.parse(text)
    bad = 0
    cycles = None
    for _ in range(TRIALS):
        dev = CudaDevice(s, cycles_per_ms=cycles)
        cycles = dev.cycles_per_ms
        out = dev.run(freed_while_side_reads, record, N).result
        bad += not bool(torch.equal(out, torch.ones(N)))
    print(f"RATE {'record-stream' if record else 'no-record-stream'} {text} corrupted {bad}/{TRIALS} "
          f"(torch {torch.__version__}, {torch.cuda.get_device_name()})")
    return bad


def test_freed_without_record_stream_the_stalled_side_stream_reads_the_new_owners_bytes() -> None:
    assert rate(False, STALLED) >= 1


def test_with_record_stream_it_never_does() -> None:
    assert rate(True, STALLED) == 0


def test_cuda_counts_operations_as_the_simulator_does() -> None:
    s = Schedule.parse(STALLED)
    sim = SimDevice(s).run(freed_while_side_reads, False, 1024)
    gpu = CudaDevice(s).run(freed_while_side_reads, False, 1024)
    assert gpu.op_counts == {k: v for k, v in sim.op_counts.items() if v or k in gpu.op_counts}


def _names(dev: Any) -> list[str]:
    named = dev.Stream(name="s1")
    out = torch.zeros(2, device=dev.device)
    dev.all_gather_into_tensor(out, torch.ones(2, device=dev.device)).wait()
    return [named.name, dev.Stream().name, dev.Stream().name]


def test_unnamed_streams_are_named_alike_on_both_backends() -> None:
    sim = SimDevice().run(lambda dev: dev.spawn_ranks(_names, 1)).result
    gpu = CudaDevice().run(lambda dev: dev.spawn_ranks(_names, 1)).result
    assert sim == gpu == [["rank0.s1", "rank0.s2", "rank0.s3"]]
