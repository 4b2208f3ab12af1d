"""A block freed while its segment is paused, handed out again before resume, on the simulated memory saver.

The caching allocator knows nothing of pausing (``simdevice.runtime.allocator``): a tensor of the region freed
while its segment is paused goes back on the free list of that segment, and the next request of the region that
fits takes it, still before resume. The model's answer: the allocator records the allocation in
``served_paused``, the new tensor is unmapped from birth (its first access is an illegal access naming the pause
and the reuse), the free itself is no access (nothing reported), and resume maps the tensor again. Inside
``disable()`` the same request comes from ordinary memory and leaves the paused block alone.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from reference.naming import short_path
from simdevice import SimDevice
from simdevice.dispatch import data_of

#: how reports name this file (relative to the working directory when under it)
HERE = short_path(__file__)


def reuse_while_paused(dev: Any, guarded: bool) -> Any:
    ms = dev.memory_saver
    with ms.region("train"):
        keep = torch.zeros(1024, device=dev.device)  # 4 KiB at seg#1+0 keeps the 20 KiB segment from empty_cache
        old = torch.zeros(1024, device=dev.device)  # 4 KiB at seg#1+4096
        old_at = data_of(old).data_ptr()
        dev.synchronize()
        ms.pause("train")
        del old  # freed while paused: back on seg#1's free list, which the pause does not touch
        dev.empty_cache()  # seg#1 is not entirely free: it stays, paused, with its cached block
        if guarded:
            with ms.disable():
                new = torch.empty(1024, device=dev.device)
        else:
            new = torch.empty(1024, device=dev.device)  # handed out again before resume
        new_at = data_of(new).data_ptr()
        new.fill_(1.0)
        ms.resume("train")
        new.fill_(2.0)  # mapped again
    return old_at, new_at, new.cpu(), keep


def test_block_freed_while_paused_is_handed_out_again_unmapped() -> None:
    dev = SimDevice()
    run = dev.run(reuse_while_paused, False)
    old_at, new_at, values, _ = run.result
    allocator = dev.runtime.memsaver.allocator
    assert new_at == old_at
    assert allocator.served_paused == [("train", "block seg#1+4096", "seg#1")]
    src, first = inspect.getsourcelines(reuse_while_paused)
    line = first + next(i for i, t in enumerate(src) if "new.fill_(1.0)" in t)
    assert [str(r) for r in run.reports] == [
        f"illegal access: fill_ on stream default #2 ({HERE}:{line}) writes device#3[0:4096] of device#3, which "
        "memory_saver.pause('train') at t=0.015 unmapped (block seg#1+4096, handed out again from the caching "
        "allocator's free list while paused)"
    ]
    assert torch.equal(values, torch.full((1024,), 2.0))
    assert dev.runtime.memsaver.released == {1: "pause of seg#1"}


def test_inside_disable_the_paused_block_is_left_alone() -> None:
    dev = SimDevice()
    run = dev.run(reuse_while_paused, True)
    old_at, new_at, values, _ = run.result
    allocator = dev.runtime.memsaver.allocator
    assert new_at != old_at
    assert (run.reports, allocator.served_paused) == ((), [])
    assert [s.pool for s in allocator.pools[None]] == [None]
    assert torch.equal(values, torch.full((1024,), 2.0))
