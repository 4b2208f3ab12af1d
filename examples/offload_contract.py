"""``examples/offload_plain.py`` against the device contract: the same protocols, ``dev`` in place of torch.cuda.

    simdevice check examples/offload_contract.py::reload_racy

A function whose first parameter is ``dev`` is contract code: it runs on ``SimDevice`` (or ``CudaDevice``).
"""

from typing import Any

import torch


def _reload(dev: Any, wait: bool, n: int) -> None:
    act = torch.arange(n, dtype=torch.float32, device=dev.device)
    pinned = torch.empty(n, pin_memory=True)
    d2h_stream = dev.Stream(name="d2h_stream")
    scratch = torch.zeros(16 * n, device=dev.device)
    d2h_stream.wait_stream(dev.current_stream())  # wait: the D2H must not read act before it is made
    with dev.stream(d2h_stream):
        pinned.copy_(act, non_blocking=True)
        offloaded = dev.Event()
        offloaded.record()
    for _ in range(4):
        scratch.mul_(0.5)
    if wait:
        dev.current_stream().wait_event(offloaded)  # wait: the H2D must not read pinned before the D2H filled it
    back = torch.empty_like(act)
    back.copy_(pinned, non_blocking=True)
    assert torch.equal(back.cpu(), torch.arange(n, dtype=torch.float32)), "the reload differs from the offload"


def reload_racy(dev: Any, n: int = 4096) -> None:
    _reload(dev, False, n)


def reload_correct(dev: Any, n: int = 4096) -> None:
    _reload(dev, True, n)


def _side_copy(dev: Any, record: bool, n: int) -> None:
    side = dev.Stream(name="side")
    out = torch.empty(n, device=dev.device)
    a = torch.ones(n, device=dev.device)
    side.wait_stream(dev.current_stream())  # wait: the side stream must not read a before it is filled
    with dev.stream(side):
        out.copy_(a)
    if record:
        a.record_stream(side)  # keep: a's block must not be handed out before the side stream is done with it
    del a
    torch.full((n,), 2.0, device=dev.device)
    dev.synchronize()
    assert torch.equal(out.cpu(), torch.ones(n)), "the side stream copied another allocation's bytes"


def freed_racy(dev: Any, n: int = 4096) -> None:
    _side_copy(dev, False, n)


def freed_correct(dev: Any, n: int = 4096) -> None:
    _side_copy(dev, True, n)


def _gather(dev: Any, wait: bool, n: int) -> None:
    shard = torch.full((n,), 3.0, device=dev.device)
    full = torch.zeros(n * dev.world_size, device=dev.device)
    work = dev.all_gather_into_tensor(full, shard, async_op=True)
    if wait:
        work.wait()  # wait: the compute stream must not read the bucket before the gather wrote it
    total = full.sum()
    assert total.item() == 3.0 * n * dev.world_size, "read the bucket before the all-gather landed"
    work.wait()


def gather_racy(dev: Any, n: int = 4096) -> None:
    _gather(dev, False, n)


def gather_correct(dev: Any, n: int = 4096) -> None:
    _gather(dev, True, n)
