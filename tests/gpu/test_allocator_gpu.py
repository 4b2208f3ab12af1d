"""The caching allocator's stream order on a real GPU: the record_stream hazard, and stream names as the simulator's.

``tests/hazards.py``'s ``freed_while_side_reads``: without ``record_stream`` a stalled side stream copies the bytes
the compute stream's next allocation wrote (its block is the dropped tensor's); with it, never. The allocator's CUDA
sizes as the drop-in models them (a 1.5 KiB block freed while a side stream reads it is the next 1 KiB allocation's;
a fresh process's statistics), and ``empty_cache`` waiting for the streams recorded on freed blocks before it
releases their segments. Each case prints ``RATE <case> ...``; record the lines in docs/confirmations.md. Run:
``python -m pytest -q -s tests/gpu/test_allocator_gpu.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest
import torch
from hazards import freed_while_side_reads

from reference.schedule import Schedule
from simdevice import SimDevice

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from reference.cuda import CudaDevice, calibrate_sleep_cycles_per_ms

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


# The drop-in's caching allocator has CUDA's sizes (tests/property/dropin/test_the_allocator_has_cuda_s_sizes.py)
# and empty_cache waits for the streams recorded on freed blocks (tests/property/model/test_device_memory.py):
# plain torch.cuda, a stream stalled with torch.cuda._sleep. ALLOCATOR_GPU_TRIALS sets these cases' trials.

MODEL_TRIALS = int(os.environ.get("ALLOCATOR_GPU_TRIALS", "5"))
STALL_MS = 100


def _cycles() -> int:
    return int(STALL_MS * calibrate_sleep_cycles_per_ms())


def _small_block_freed_while_read(record: bool, cycles: int) -> tuple[bool, bool]:
    """The simulator test's program, its side stream stalled and copying the block out: a 1.5 KiB tensor read on
    the side stream, dropped (recorded with it or not), then a 1 KiB tensor made and written on the current stream.
    Returns (the 1 KiB tensor took the dropped one's block, the side stream's copy read the 1 KiB tensor's zeros)."""
    side = torch.cuda.Stream()
    out = torch.empty(384, device="cuda")
    x = torch.ones(384, device="cuda")  # 1.5 KiB: a small block, as the 1 KiB one below
    torch.cuda.synchronize()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(cycles)
        out.copy_(x)
    if record:
        x.record_stream(side)
    dropped = x.data_ptr()
    del x
    y = torch.zeros(256, device="cuda")  # 1 KiB: takes x's block on a GPU, unless record_stream holds it
    reused = y.data_ptr() == dropped
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    return reused, not torch.equal(out.cpu(), torch.ones(384))


@pytest.mark.parametrize("record", [False, True])
def test_a_small_block_freed_while_another_stream_reads_it_is_taken_by_the_next_small_allocation(record: bool) -> None:
    """Without ``record_stream``: the next 1 KiB allocation takes the freed 1.5 KiB block (512-byte blocks, one
    small pool) and the stalled side stream copies its zeros; with it: never."""
    cycles = _cycles()
    _small_block_freed_while_read(record, cycles)  # warm-up: the segments made, not counted
    reused = corrupted = 0
    for _ in range(MODEL_TRIALS):
        torch.cuda.empty_cache()
        r, c = _small_block_freed_while_read(record, cycles)
        reused += r
        corrupted += c
    print(f"RATE {'record-stream' if record else 'no-record-stream'} 1.5 KiB block freed while a stalled side "
          f"stream reads it, then 1 KiB allocated: reused {reused}/{MODEL_TRIALS} corrupted {corrupted}/{MODEL_TRIALS}"
          f" (torch {torch.__version__}, {torch.cuda.get_device_name()})", flush=True)
    if record:
        assert (reused, corrupted) == (0, 0)
    else:
        assert reused == MODEL_TRIALS, "the 1 KiB allocation did not take the freed 1.5 KiB block"
        assert corrupted > 0


_STATISTICS = """
import json, torch
a = torch.empty(100, dtype=torch.uint8, device="cuda")
small = (torch.cuda.memory_allocated(), torch.cuda.memory_reserved())
b = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
large = (torch.cuda.memory_allocated(), torch.cuda.memory_reserved())
c = torch.empty(19 << 20, dtype=torch.uint8, device="cuda")
d = torch.empty(17 << 20, dtype=torch.uint8, device="cuda")
split = torch.cuda.memory_allocated() - large[0]
print(json.dumps([small, large, split]))
"""


def test_the_statistics_of_a_fresh_process_are_the_simulators() -> None:
    """The simulator test's statistics, in a fresh process (a fresh caching allocator, as each simulated run has):
    100 bytes take a 512-byte block of a 2 MiB segment; 3 MiB a 20 MiB segment; 19 MiB a segment of its own, unsplit
    (20 MiB); 17 MiB the rest of the 3 MiB one's segment, unsplit."""
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}  # CUDA's defaults
    got = subprocess.run([sys.executable, "-c", _STATISTICS], capture_output=True, text=True, env=env, check=True,
                         timeout=120).stdout.strip().splitlines()[-1]
    small, large, split = json.loads(got)
    print(f"RATE allocator statistics of a fresh process: small {small} large {large} split {split} "
          f"(torch {torch.__version__}, {torch.cuda.get_device_name()})", flush=True)
    assert tuple(small) == (512, 2 << 20)
    assert tuple(large) == (512 + (3 << 20), (2 << 20) + (20 << 20))
    assert split == (20 << 20) + (17 << 20)


def _recorded_then_emptied(cycles: int) -> tuple[bool, bool, float, int, int]:
    """The simulator test's program: a 64 MiB tensor (a segment of its own) the stalled side stream reads into
    pinned memory, recorded with it and dropped, then ``empty_cache()``. Returns (the host read the pinned buffer
    right at once, before empty_cache; right just after it; how long empty_cache blocked the host, in ms; the
    allocator's active bytes and reserved bytes after it, less those before the tensor was made)."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    active0 = torch.cuda.memory_stats()["active_bytes.all.current"]
    reserved0 = torch.cuda.memory_reserved()
    side = torch.cuda.Stream()
    x = torch.ones(64 << 20, dtype=torch.uint8, device="cuda")
    pinned = torch.zeros(8, dtype=torch.uint8, pin_memory=True)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(cycles)  # still reading when the host goes on
        pinned.copy_(x[:8], non_blocking=True)
    x.record_stream(side)
    del x  # held back for the side stream
    before = pinned.tolist() == [1] * 8
    start = time.perf_counter()
    torch.cuda.empty_cache()
    blocked_ms = (time.perf_counter() - start) * 1e3
    after = pinned.tolist() == [1] * 8
    active = torch.cuda.memory_stats()["active_bytes.all.current"] - active0
    reserved = torch.cuda.memory_reserved() - reserved0
    torch.cuda.synchronize()
    return before, after, blocked_ms, active, reserved


def test_empty_cache_waits_for_the_streams_recorded_on_freed_blocks_and_releases_their_segments() -> None:
    """``emptyCache`` first synchronizes the events of blocks freed while recorded streams still used them
    (``synchronize_and_free_events``: ``cudaEventSynchronize`` on the host), gives those blocks back and releases
    their segments: the host, right after ``empty_cache()``, reads the side stream's D2H landed (at once before it,
    stale), and the 64 MiB block and its segment are gone."""
    cycles = _cycles()
    _recorded_then_emptied(cycles)  # warm-up, not counted
    stale_before = right_after = released = 0
    blocked = []
    for _ in range(MODEL_TRIALS):
        before, after, blocked_ms, active, reserved = _recorded_then_emptied(cycles)
        stale_before += not before
        right_after += after
        released += (active, reserved) == (0, 0)
        blocked.append(blocked_ms)
    print(f"RATE empty_cache with a freed block recorded on a stalled side stream: stale before {stale_before}/"
          f"{MODEL_TRIALS} right after {right_after}/{MODEL_TRIALS} released {released}/{MODEL_TRIALS}, "
          f"empty_cache blocked the host {min(blocked):.0f}-{max(blocked):.0f} ms of a {STALL_MS} ms stall "
          f"(torch {torch.__version__}, {torch.cuda.get_device_name()})", flush=True)
    assert stale_before > 0, "the stall did not hold the side stream's read (the case shows nothing)"
    assert right_after == MODEL_TRIALS, "empty_cache returned before the recorded stream's use of the block"
    assert released == MODEL_TRIALS, "empty_cache kept the block held for the recorded stream, or its segment"


MiB = 1 << 20
_SEGMENT_SIZES = """
import json, sys
sys.path.insert(0, "tests/property/dropin")
from test_a_new_segment_is_sized_as_cuda_s_allocator_sizes_it import merged_neighbours, reserved_per_request
print(json.dumps([reserved_per_request(), merged_neighbours()]))
"""


def test_new_segments_are_sized_and_freed_neighbours_merged_as_simulated() -> None:
    """The simulator test's two programs, unchanged, in a fresh process: the segment each request of 10 MiB, 12 MiB
    + 1, 4 MiB, 1 MiB and 512 KiB makes (10 MiB itself is rounded to 2 MiB, not given 20 MiB), and two neighbouring
    blocks freed serving a request of both their sizes with no new segment."""
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}  # CUDA's defaults
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    got = subprocess.run([sys.executable, "-c", _SEGMENT_SIZES], capture_output=True, text=True, env=env, check=True,
                         timeout=120, cwd=root).stdout.strip().splitlines()[-1]
    grown, merged = json.loads(got)
    print(f"RATE allocator segments of a fresh process: grown {[g / MiB for g in grown]} MiB, merged neighbours "
          f"grew {merged} (torch {torch.__version__}, {torch.cuda.get_device_name()})", flush=True)
    assert grown == [10 * MiB, 14 * MiB, 20 * MiB, 2 * MiB, 0]
    assert merged == 0
