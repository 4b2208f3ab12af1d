"""Offload protocols written in plain torch.cuda, as a framework writes them: ``simdevice check`` runs them as is.

    simdevice check examples/offload_plain.py::reload_racy      # found: the reload does not wait for the D2H
    simdevice check examples/offload_plain.py::reload_correct   # clean

Each asserts what it must hold (the value oracle). ``examples/offload_contract.py`` is the same set against the
device contract (``dev``): both give the same verdicts.
"""

import torch
import torch.distributed as dist


def _reload(wait: bool, n: int) -> None:
    """Offload to pinned memory on a side stream, compute, reload on the compute stream."""
    act = torch.arange(n, dtype=torch.float32, device="cuda")
    pinned = torch.empty(n, pin_memory=True)
    d2h_stream = torch.cuda.Stream()
    scratch = torch.zeros(16 * n, device="cuda")
    d2h_stream.wait_stream(torch.cuda.current_stream())  # wait: the D2H must not read act before it is made
    with torch.cuda.stream(d2h_stream):
        pinned.copy_(act, non_blocking=True)
        offloaded = torch.cuda.Event()
        offloaded.record()
    for _ in range(4):
        scratch.mul_(0.5)
    if wait:
        torch.cuda.current_stream().wait_event(offloaded)  # wait: the H2D must not read pinned before the D2H
    back = torch.empty_like(act)
    back.copy_(pinned, non_blocking=True)
    assert torch.equal(back.cpu(), torch.arange(n, dtype=torch.float32)), "the reload differs from the offload"


def reload_racy(n: int = 4096) -> None:
    """The reload does not wait for the D2H that fills the pinned buffer."""
    _reload(False, n)


def reload_correct(n: int = 4096) -> None:
    _reload(True, n)


def _side_copy(record: bool, n: int) -> None:
    side = torch.cuda.Stream()
    out = torch.empty(n, device="cuda")
    a = torch.ones(n, device="cuda")
    side.wait_stream(torch.cuda.current_stream())  # wait: the side stream must not read a before it is filled
    with torch.cuda.stream(side):
        out.copy_(a)
    if record:
        a.record_stream(side)  # keep: a's block must not be handed out before the side stream is done with it
    del a
    torch.full((n,), 2.0, device="cuda")  # the compute stream's next allocation of that size
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), torch.ones(n)), "the side stream copied another allocation's bytes"


def freed_racy(n: int = 4096) -> None:
    """A tensor a side stream reads is dropped without record_stream: its block goes to the next allocation."""
    _side_copy(False, n)


def freed_correct(n: int = 4096) -> None:
    _side_copy(True, n)


def _gather(wait: bool, n: int) -> None:
    shard = torch.full((n,), 3.0, device="cuda")
    full = torch.zeros(n * dist.get_world_size(), device="cuda")
    work = dist.all_gather_into_tensor(full, shard, async_op=True)
    if wait:
        work.wait()  # wait: the compute stream must not read the bucket before the gather wrote it
    total = full.sum()
    assert total.item() == 3.0 * n * dist.get_world_size(), "read the bucket before the all-gather landed"
    work.wait()


def gather_racy(n: int = 4096) -> None:
    """An async all-gather (a group of one) read without waiting its work handle."""
    _gather(False, n)


def gather_correct(n: int = 4096) -> None:
    _gather(True, n)
