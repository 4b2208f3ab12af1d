"""Small plain torch.cuda programs of patterns engineers write, each correct and with one synchronization wrong:
the correct one runs clean, the wrong one races at the default schedule (what CUDA's stream semantics say of
each). A data prefetcher, a double-buffered D2H ring polled by events, an event recorded twice, a wait on an event
never recorded, ``wait_stream``'s snapshot, ``.to("cpu", non_blocking=True)`` synchronized on the wrong stream or
read with ``tolist()`` unsynchronized, a pinned staging buffer reused, nested stream blocks, a side stream's pool
handing a freed block on, and async collectives waited on the wrong stream or in part."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist

import simdevice

N = 1024


def prefetcher(wait: bool = True, record: bool = True) -> None:
    """apex/timm's data prefetcher: the next batch's H2D on a side stream while the current one is used."""
    batches = iter([torch.full((N,), float(i + 1)).pin_memory() for i in range(3)])
    stream = torch.cuda.Stream()

    def preload() -> torch.Tensor | None:
        cpu = next(batches, None)
        if cpu is None:
            return None
        with torch.cuda.stream(stream):
            return cpu.cuda(non_blocking=True)

    nxt = preload()
    sums = []
    while nxt is not None:
        if wait:
            torch.cuda.current_stream().wait_stream(stream)
        b = nxt
        if record:
            b.record_stream(torch.cuda.current_stream())
        nxt = preload()
        sums.append((b * 2).sum())
        del b  # without record_stream its block goes to the side stream's next batch
    assert [s.item() for s in sums] == [2.0 * (i + 1) * N for i in range(3)]


def d2h_ring(mode: str = "sync") -> None:
    """A double-buffered offload: a pinned buffer and an event per slot, a slot read once its event says so."""
    d2h = torch.cuda.Stream()
    pinned = [torch.empty(N, pin_memory=True) for _ in range(2)]
    events = [torch.cuda.Event(blocking=True) for _ in range(2)]
    pending: list[int | None] = [None, None]
    x = torch.zeros(N, device="cuda")
    for step in range(4):
        slot = step % 2
        if pending[slot] is not None:
            if mode == "sync":
                events[slot].synchronize()
            elif mode == "poll":
                while not events[slot].query():
                    time.sleep(1e-4)
            assert pinned[slot][0].item() == 2.0 * (pending[slot] + 1)
        x.add_(1.0)
        y = x * 2
        d2h.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(d2h):
            pinned[slot].copy_(y, non_blocking=True)
            events[slot].record()
        y.record_stream(d2h)
        pending[slot] = step
    torch.cuda.synchronize()


def rerecorded_event(wait_last: bool = True) -> None:
    """An event recorded again: a wait orders after the record before it, not a later one."""
    s = torch.cuda.Stream()
    a, b = torch.empty(N, device="cuda"), torch.empty(N, device="cuda")
    e = torch.cuda.Event()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        a.fill_(1.0)
    e.record(s)
    if not wait_last:
        torch.cuda.current_stream().wait_event(e)  # a's fill only
    with torch.cuda.stream(s):
        b.fill_(2.0)
    e.record(s)
    if wait_last:
        torch.cuda.current_stream().wait_event(e)
    assert (a + b).sum().item() == 3.0 * N


def unrecorded_event(record: bool = True) -> None:
    """A wait on an event never recorded orders nothing (cudaStreamWaitEvent on a fresh event)."""
    s = torch.cuda.Stream()
    e = torch.cuda.Event()
    x = torch.ones(N, device="cuda")
    if record:
        e.record()
    s.wait_event(e)
    with torch.cuda.stream(s):
        y = x * 3
    torch.cuda.current_stream().wait_stream(s)
    assert y.sum().item() == 3.0 * N


def wait_stream_snapshot(wait_after: bool = True) -> None:
    """``wait_stream`` orders after the work queued so far: work queued after it is not covered."""
    side = torch.cuda.Stream()
    x = torch.zeros(N, device="cuda")
    if not wait_after:
        side.wait_stream(torch.cuda.current_stream())
    x.add_(5.0)
    if wait_after:
        side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y = x.clone()
    side.synchronize()
    assert torch.equal(y.cpu(), torch.full((N,), 5.0))


def to_cpu_on_a_side_stream(device_sync: bool = True) -> None:
    """``.to("cpu", non_blocking=True)`` on a side stream: the current stream's synchronize does not cover it."""
    side = torch.cuda.Stream()
    x = torch.arange(N, dtype=torch.float32, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        h = x.to("cpu", non_blocking=True)
    if device_sync:
        torch.cuda.synchronize()
    else:
        torch.cuda.current_stream().synchronize()
    assert h.sum().item() == float(N * (N - 1) // 2)


def sampled_tokens(sync: bool = True) -> None:
    """A sampler's tokens copied to the host with ``.to("cpu", non_blocking=True)`` and read with ``tolist()`` once
    an event recorded after the copy is synchronized (``tolist()`` reads the bytes below the dispatcher)."""
    ids = torch.arange(N, device="cuda").mul_(2)
    host_ids = ids.to("cpu", non_blocking=True)
    copied = torch.cuda.Event()
    copied.record()
    if sync:
        copied.synchronize()
    host_ids.tolist()  # (no check of the values: the read itself races)


def pinned_staging_reused(sync: bool = True) -> None:
    """One pinned staging buffer filled by the host for each step's H2D."""
    staging = torch.empty(N).pin_memory()
    done = torch.cuda.Event()
    outs = []
    for i in range(3):
        if sync:
            done.synchronize()
        staging.fill_(float(i))
        outs.append(torch.empty(N, device="cuda").copy_(staging, non_blocking=True))
        done.record()
    assert [d.sum().item() for d in outs] == [float(i * N) for i in range(3)]


def nested_streams(wait: bool = True) -> None:
    """A stream block inside another's, under ``torch.cuda.device(0)``: the inner stream reads the outer's result."""
    a, b = torch.cuda.Stream(), torch.cuda.Stream()
    x = torch.ones(N, device="cuda")
    a.wait_stream(torch.cuda.current_stream())
    b.wait_stream(torch.cuda.current_stream())
    with torch.cuda.device(0), torch.cuda.stream(a):
        y = x * 2
        with torch.cuda.stream(b):
            if wait:
                torch.cuda.current_stream().wait_stream(a)
            w = y + x
        v = y * 1  # back on a
    torch.cuda.current_stream().wait_stream(a)
    torch.cuda.current_stream().wait_stream(b)
    assert (w.sum().item(), v.sum().item()) == (3.0 * N, 2.0 * N)


def side_pool_reuse(wait: bool = True) -> None:
    """A side stream's tensor read on the default stream and dropped without ``record_stream``: the side stream's
    next allocation of that size takes the block, so it must wait for the read."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        tmp = torch.full((N,), 3.0, device="cuda")
    torch.cuda.current_stream().wait_stream(side)
    total = tmp.sum()
    del tmp
    x = torch.full((N,), 5.0, device="cuda")  # the default stream's own pool: not tmp's block
    if wait:
        side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y = torch.full((N,), 9.0, device="cuda")
    torch.cuda.current_stream().wait_stream(side)
    assert (total.item(), x.sum().item(), y.sum().item()) == (3.0 * N, 5.0 * N, 9.0 * N)


def all_reduce_on_a_side_stream(wait_there: bool = True) -> None:
    """``work.wait()`` makes the current stream wait: called on the default stream, a side stream's read is not
    ordered after the collective."""
    grad = torch.full((N,), float(dist.get_rank() + 1), device="cuda")
    work = dist.all_reduce(grad, async_op=True)
    side = torch.cuda.Stream()
    if not wait_there:
        work.wait()
    with torch.cuda.stream(side):
        if wait_there:
            work.wait()
        total = grad.sum()
    torch.cuda.current_stream().wait_stream(side)
    assert total.item() == 3.0 * N


def buckets_waited(every: bool = True) -> None:
    """Buckets reduced async as they are ready; the step waits for every work (the last one alone also orders
    the ones before it on the one NCCL stream), not the first alone."""
    grads = [torch.full((N,), float(dist.get_rank() + 1), device="cuda") for _ in range(3)]
    works = [dist.all_reduce(g, async_op=True) for g in grads]
    for w in works if every else works[:1]:
        w.wait()
    assert [g.sum().item() for g in grads] == [3.0 * N] * 3
    for w in works:
        w.wait()


def last_bucket_waited() -> None:
    grads = [torch.full((N,), float(dist.get_rank() + 1), device="cuda") for _ in range(3)]
    works = [dist.all_reduce(g, async_op=True) for g in grads]
    works[-1].wait()
    assert [g.sum().item() for g in grads] == [3.0 * N] * 3


#: (program, its arguments when correct, when wrong, its world size)
CASES: dict[str, tuple[Callable[..., None], tuple[Any, ...], tuple[Any, ...], int]] = {
    "prefetcher without the wait": (prefetcher, (), (False, True), 1),
    "prefetcher without record_stream": (prefetcher, (), (True, False), 1),
    "D2H ring polled": (d2h_ring, ("poll",), ("none",), 1),
    "D2H ring synchronized": (d2h_ring, ("sync",), ("none",), 1),
    "event recorded again": (rerecorded_event, (), (False,), 1),
    "event never recorded": (unrecorded_event, (), (False,), 1),
    "wait_stream's snapshot": (wait_stream_snapshot, (), (False,), 1),
    "to cpu on a side stream": (to_cpu_on_a_side_stream, (), (False,), 1),
    "tolist of a non-blocking D2H": (sampled_tokens, (), (False,), 1),
    "pinned staging reused": (pinned_staging_reused, (), (False,), 1),
    "nested stream blocks": (nested_streams, (), (False,), 1),
    "a side stream's pool": (side_pool_reuse, (), (False,), 1),
    "all_reduce read on a side stream": (all_reduce_on_a_side_stream, (), (False,), 2),
    "buckets waited in part": (buckets_waited, (), (False,), 2),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_correct_program_is_clean_and_the_wrong_one_races(case: str) -> None:
    program, good, bad, world = CASES[case]
    clean, wrong = simdevice.cuda(), simdevice.cuda()
    clean.run(lambda: program(*good), world_size=world)
    wrong.run(lambda: program(*bad), world_size=world)
    clean.assert_clean()
    assert wrong.result is not None
    assert "race" in {r.kind for r in wrong.result.reports}, wrong.text()


def test_waiting_the_last_bucket_alone_orders_the_ones_before_it() -> None:
    run = simdevice.cuda()
    run.run(last_bucket_waited, world_size=2)
    run.assert_clean()
