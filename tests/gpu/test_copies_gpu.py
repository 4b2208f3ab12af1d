"""A copy between pinned memory and the device (non-blocking, or into another dtype), as the simulator models it
(``simdevice.dispatch._through_host_temporaries``), on a real GPU.

The device stream is stalled (``torch.cuda._sleep``) before each copy, so an asynchronous copy is still queued when
the host goes on:

- a D2H into contiguous pinned memory is asynchronous: the host reads the destination stale at once; into a
  strided pinned view (no single memcpy: ATen copies into a pageable temporary, then on the host) it is
  synchronous: the host reads it right;
- an H2D from contiguous pinned memory reads its source on the stream, after the stall: a host write right after
  the call reaches the device; from a strided pinned view the host reads the source at the call (into a
  temporary): the write right after does not reach it;
- an H2D from pinned memory into another dtype converts on the host at the call when blocking (a D2H still filling
  the source, which the stream waited for, is read too early), on the device when non-blocking (the source is read
  on the stream: a host write right after the call reaches the device).

Run: ``python -m pytest -q -s tests/gpu/test_copies_gpu.py`` on a CUDA machine. Each case prints ``RATE``;
``COPIES_GPU_TRIALS`` sets the trials (default 5).
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from reference.cuda import calibrate_sleep_cycles_per_ms  # noqa: E402

pytestmark = pytest.mark.gpu

TRIALS = int(os.environ.get("COPIES_GPU_TRIALS", "5"))
N = 1 << 20
STALL_MS = 100


def _pinned(layout: str, value: float) -> torch.Tensor:
    if layout == "strided":
        return torch.full((N, 2), value, pin_memory=True)[:, 0]
    return torch.full((N,), value, pin_memory=True)


@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_a_d2h_into_pinned_memory(layout: str) -> None:
    cycles = int(STALL_MS * calibrate_sleep_cycles_per_ms())
    stale = 0
    for _ in range(TRIALS):
        src = torch.ones(N, device="cuda")
        dst = _pinned(layout, 0.0)
        torch.cuda.synchronize()
        torch.cuda._sleep(cycles)
        dst.copy_(src, non_blocking=True)
        stale += float(dst.sum()) != N  # the host reads it at once
        torch.cuda.synchronize()
    print(f"RATE d2h into {layout} pinned memory, read at once: stale {stale}/{TRIALS} "
          f"(torch {torch.__version__}, {torch.cuda.get_device_name()})", flush=True)
    if layout == "strided":
        assert stale == 0, "a D2H into a strided pinned view is synchronous"
    else:
        assert stale > 0


@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_an_h2d_from_pinned_memory(layout: str) -> None:
    cycles = int(STALL_MS * calibrate_sleep_cycles_per_ms())
    late = 0
    for _ in range(TRIALS):
        src = _pinned(layout, 1.0)
        d = torch.zeros(N, device="cuda")
        torch.cuda.synchronize()
        torch.cuda._sleep(cycles)
        d.copy_(src, non_blocking=True)
        src.fill_(2.0)  # the host writes the source right after the call
        torch.cuda.synchronize()
        late += float(d.sum()) != N  # the copy read the source after the host's write
    print(f"RATE h2d from {layout} pinned memory, source rewritten after the call: the copy saw the rewrite "
          f"{late}/{TRIALS} (torch {torch.__version__}, {torch.cuda.get_device_name()})", flush=True)
    if layout == "strided":
        assert late == 0, "an H2D from a strided pinned view reads its source at the call"
    else:
        assert late > 0


# A copy from pinned memory into another dtype is no single memcpy (``copy_requires_temporaries``), and ATen's
# ``copy_kernel_cuda`` converts where ``non_blocking`` says: a blocking copy converts on the host at the call
# (``src.to(dst.dtype)`` into pageable memory, then a synchronous copy of that), a non-blocking one copies the
# pinned source as it is on the stream, then converts on the device (``dispatch._through_host_temporaries``;
# ``tests/property/model/test_copies_through_host_temporaries.py``).


def _converting_h2d_rewritten(non_blocking: bool, cycles: int) -> bool:
    """Whether the copy saw the host's rewrite of its source."""
    src = torch.full((N,), 1.0, pin_memory=True)
    d = torch.zeros(N, dtype=torch.float64, device="cuda")
    torch.cuda.synchronize()
    torch.cuda._sleep(cycles)
    d.copy_(src, non_blocking=non_blocking)  # float32 into float64
    src.fill_(2.0)  # the host writes the source right after the call
    torch.cuda.synchronize()
    return float(d.sum()) != N


@pytest.mark.parametrize("non_blocking", [False, True])
def test_a_converting_h2d_from_pinned_memory_rewritten_after_the_call(non_blocking: bool) -> None:
    """The stream stalled, float32 pinned into float64 on the device, the source rewritten right after the call: a
    blocking copy never sees the rewrite (the call returns once it is done); a non-blocking one reads its source on
    the stream, after the stall, so it does. One warm-up run first: the non-blocking copy's device temporary, from
    a cold caching allocator (``cudaMalloc``), would wait out the stall."""
    cycles = int(STALL_MS * calibrate_sleep_cycles_per_ms())
    _converting_h2d_rewritten(non_blocking, cycles)  # warm-up, not counted
    late = sum(_converting_h2d_rewritten(non_blocking, cycles) for _ in range(TRIALS))
    kind = "non-blocking" if non_blocking else "blocking"
    print(f"RATE {kind} converting h2d from pinned memory, source rewritten after the call: the copy saw the "
          f"rewrite {late}/{TRIALS} (torch {torch.__version__}, {torch.cuda.get_device_name()})", flush=True)
    if non_blocking:
        assert late > 0, "a non-blocking converting H2D read its pinned source at the call, not on the stream"
    else:
        assert late == 0


def _converting_h2d_after_a_waited_d2h(non_blocking: bool, cycles: int, side: torch.cuda.Stream) -> bool:
    """Whether the device got the pinned buffer's zeros, not the D2H's values."""
    x = torch.full((N,), 1.5, device="cuda")
    pinned = torch.zeros(N, pin_memory=True)
    y = torch.empty(N, dtype=torch.float64, device="cuda")
    torch.cuda.synchronize()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(cycles)
        pinned.copy_(x, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
    torch.cuda.current_stream().wait_event(done)  # the stream waits: the host does not
    y.copy_(pinned, non_blocking=non_blocking)  # float32 into float64
    torch.cuda.synchronize()
    return float(y.sum()) != 1.5 * N


@pytest.mark.parametrize("non_blocking", [False, True])
def test_a_converting_h2d_after_a_d2h_the_stream_waited_for(non_blocking: bool) -> None:
    """The simulator test's program: a D2H into a pinned buffer on a stalled side stream, the current stream waiting
    for its event (the host does not), then a converting H2D of that buffer on the current stream. A blocking copy
    converts on the host at the call, before the D2H landed: the device gets the buffer's old zeros (the simulator
    reports the host's read as a race with the side stream). A non-blocking one reads the buffer on the stream,
    after the event: the D2H's values (clean on the simulator)."""
    cycles = int(STALL_MS * calibrate_sleep_cycles_per_ms())
    side = torch.cuda.Stream()
    _converting_h2d_after_a_waited_d2h(non_blocking, cycles, side)  # warm-up, not counted
    stale = sum(_converting_h2d_after_a_waited_d2h(non_blocking, cycles, side) for _ in range(TRIALS))
    kind = "non-blocking" if non_blocking else "blocking"
    print(f"RATE {kind} converting h2d of a pinned buffer a stalled side stream's D2H fills, the stream waiting for "
          f"its event: read before the D2H {stale}/{TRIALS} "
          f"(torch {torch.__version__}, {torch.cuda.get_device_name()})", flush=True)
    if non_blocking:
        assert stale == 0, "a non-blocking converting H2D read its pinned source before the stream's wait"
    else:
        assert stale > 0, "a blocking converting H2D read its pinned source on the stream, not at the call"
