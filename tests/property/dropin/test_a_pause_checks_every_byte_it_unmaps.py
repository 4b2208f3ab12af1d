"""A ``torch_memory_saver`` pause unmaps every segment of the regions it pauses, all of their bytes
(``Memory.issue_unmap``): a kernel still possibly in flight that reads region memory, or writes any part of a
segment, in any of the paused regions, races with the pause. Each program is plain ``torch.cuda``."""

from __future__ import annotations

import pytest
import torch

import simdevice


def kernel_then_pause(access: str, tag: str | None) -> None:
    """Two regions, each with a tensor; a side stream's kernel on region ``b``'s tensor (a read, or a write of its
    last quarter), then a pause of ``tag`` (None: all regions) with no wait between them."""
    from torch_memory_saver import torch_memory_saver as tms

    with tms.region("a"):
        x = torch.zeros(1 << 16, device="cuda")
    with tms.region("b"):
        w = torch.zeros(1 << 23, device="cuda")  # (32 MiB: a segment of its own, every byte of it)
    out = torch.empty(1, device="cuda")
    side = torch.cuda.Stream()
    torch.cuda.synchronize()  # (the zeros are done: only the side stream's kernel may be in flight)
    with torch.cuda.stream(side):
        if access == "read":
            torch.sum(w, 0, keepdim=True, out=out)
        else:
            w[3 << 21:].add_(1)
    tms.pause(tag)
    tms.resume(tag)
    del x


@pytest.mark.parametrize(("access", "tag"), [("read", "b"), ("write-tail", "b"), ("read", None)])
def test_a_kernel_on_paused_memory_in_flight_at_the_pause_is_a_race(access: str, tag: str | None) -> None:
    """The kernel reads the region (or writes only its tail, or the pause names no region): a race naming the
    pause, as the unmap does not wait for the kernel."""
    s = simdevice.cuda()
    run = s.run(kernel_then_pause, access, tag)
    assert [r.kind for r in run.reports] == ["race"], s.text()
    assert str(run.reports[0]).startswith(f"race: memory_saver.pause({tag!r}) on host host ("), s.text()
