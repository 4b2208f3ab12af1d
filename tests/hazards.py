"""Small contract programs for hazards of the simulator's model, shared by tests/property and tests/gpu.

``freed_while_side_reads``: the ``record_stream`` hazard. A tensor made on the compute stream is read by a side
stream, then dropped; the caching allocator hands its block to the next allocation on the compute stream, which
overwrites it, while the side stream may still be reading it. ``t.record_stream(side)`` before the drop makes the
allocator hold the block back until the side stream is past that point.
"""

from __future__ import annotations

import torch

from reference.contract import Device


def freed_while_side_reads(dev: Device, record: bool, n: int = 4096) -> torch.Tensor:
    """What the side stream copied out of the dropped tensor (all ones when nothing overwrote it first)."""
    side = dev.Stream(name="side")
    out = torch.empty(n, device=dev.device)
    a = torch.ones(n, device=dev.device)
    # wait: the side stream must not read a before the compute stream filled it
    side.wait_stream(dev.current_stream())
    with dev.stream(side):
        out.copy_(a)
    if record:
        # keep: the allocator must not hand a's block out again before the side stream is done reading it
        a.record_stream(side)
    del a
    b = torch.full((n,), 2.0, device=dev.device)  # the compute stream's next allocation of that size
    # wait: the host reads the copy only once both streams are done
    dev.synchronize()
    del b
    return out.cpu()
