"""A non-blocking copy between pinned memory and the device, as the simulator models it
(``simdevice.dispatch._through_host_temporaries``), on a real GPU.

The device stream is stalled (``torch.cuda._sleep``) before each copy, so an asynchronous copy is still queued when
the host goes on:

- a D2H into contiguous pinned memory is asynchronous: the host reads the destination stale at once; into a
  strided pinned view (no single memcpy: ATen copies into a pageable temporary, then on the host) it is
  synchronous: the host reads it right;
- an H2D from contiguous pinned memory reads its source on the stream, after the stall: a host write right after
  the call reaches the device; from a strided pinned view the host reads the source at the call (into a
  temporary): the write right after does not reach it.

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
