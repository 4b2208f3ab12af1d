"""The demonstration: offload an activation to pinned memory on a side stream, then reload it.

What it does. An activation is copied device to host into a pinned buffer on
a side stream (``d2h``) while the compute stream goes on with other work;
then it is reloaded host to device on the compute stream and read back.

Invariant: every reloaded value equals the offloaded one, because the H2D
reload is ordered after the D2H that filled the pinned buffer.

Known bug (``racy``, ``Fixes.reload_waits``): (1) the D2H is enqueued on
``d2h``; (2) the reload is enqueued on the compute stream with no edge on
the event recorded after the D2H; (3) harmless while the compute work
outlasts the copy, but a stall of ``d2h`` before its copy (``d2h#0+1``) lets
the H2D read the pinned buffer before the D2H filled it.

The fix (``correct``): the compute stream waits on that event.

Checked by ``tests/property/mechanisms/test_offload_reload.py`` (simulator) and
``tests/gpu/test_offload_reload_gpu.py`` (CUDA).
"""

from __future__ import annotations

import attrs
import torch

from reference.contract import Device


@attrs.frozen
class Fixes:
    #: the compute stream waits on the event recorded after the D2H before the reload reads the pinned buffer
    reload_waits: bool = True


CORRECT = Fixes()
RACY = Fixes(reload_waits=False)
VARIANTS = {"correct": CORRECT, "racy": RACY}


def offload_reload(dev: Device, fixes: Fixes, numel: int, work: int, iters: int, scratch: int) -> list[torch.Tensor]:
    """Offload an activation of ``numel`` floats to pinned memory on ``d2h``, compute, reload it; return what
    came back in each of ``iters`` iterations (``work`` kernels over a buffer ``scratch`` times larger between)."""
    compute = dev.current_stream()
    d2h = dev.Stream(name="d2h")
    offloaded = dev.Event()
    pinned = torch.empty(numel, dtype=torch.float32, pin_memory=True)
    buffer = torch.zeros(numel * scratch, dtype=torch.float32, device=dev.device)
    seen = []
    for it in range(iters):
        act = torch.arange(numel, dtype=torch.float32, device=dev.device) + it * numel
        # wait: the D2H must not read the activation before compute produced it
        d2h.wait_stream(compute)
        with dev.stream(d2h):
            pinned.copy_(act, non_blocking=True)
            offloaded.record()
        for _ in range(work):
            buffer.mul_(0.5)
        if fixes.reload_waits:
            # wait: the H2D must not read the pinned buffer before the D2H filled it
            compute.wait_event(offloaded)
        reloaded = torch.empty_like(act)
        reloaded.copy_(pinned, non_blocking=True)
        seen.append(reloaded.cpu())
        # wait: the next D2H must not overwrite the pinned buffer before this reload read it
        d2h.wait_stream(compute)
    return seen
