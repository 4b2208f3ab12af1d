"""Small plain torch.cuda programs of several processes, ranks and memory-saver phases, each correct and with one
synchronization wrong: the correct one runs clean, the wrong one is found (what CUDA's, torch's, NCCL's and
torch_memory_saver's semantics say of each). A consumer reading a received tensor on a side stream, a producer
filling one on a side stream before a ``Queue`` sends it, a child writing into a buffer its parent gave it, a
consumer dropping a received tensor before its read is done while the producer reuses the block."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

import simdevice
from simdevice.explain import suggest
from simdevice.search.explore import as_target

N = 256


# -- processes and CUDA IPC ------------------------------------------------------------------------------------------


def _consume_on_a_side_stream(q: Any, out: Any, wait: bool) -> None:
    x = q.get()  # the IPC event is waited for by the current stream
    side = torch.cuda.Stream()
    if wait:
        side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        s = x.sum()
    side.synchronize()
    out.put(s.item())


def consumer_side_stream(wait: bool = True) -> None:
    """The consumer reads a received tensor on a side stream, which must wait for the stream that waited for the
    producer's IPC event (``wait=False``: it does not)."""
    ctx = mp.get_context("spawn")
    q, out = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_consume_on_a_side_stream, args=(q, out, wait), name="consumer")
    p.start()
    x = torch.empty(N, device="cuda")
    x.fill_(2.0)
    q.put(x)
    assert out.get() == 2 * N
    p.join()


def _produce_on_a_side_stream(q: Any, done: Any, sync: bool) -> None:
    side = torch.cuda.Stream()
    x = torch.empty(N, device="cuda")
    with torch.cuda.stream(side):
        x.fill_(3.0)
    if sync:
        torch.cuda.current_stream().wait_stream(side)
    q.put(x)  # a Queue's feeder thread pickles it: the IPC event is recorded on the default stream
    done.wait()


def producer_side_stream(sync: bool = True) -> None:
    """The producer fills the tensor on a side stream and sends it through a ``Queue``, whose IPC event is on the
    default stream: the default stream must wait for the side stream first (``sync=False``: it does not)."""
    ctx = mp.get_context("spawn")
    q, done = ctx.Queue(), ctx.Event()
    p = ctx.Process(target=_produce_on_a_side_stream, args=(q, done, sync), name="producer")
    p.start()
    x = q.get()
    assert x.sum().item() == 3 * N
    del x
    done.set()
    p.join()


def _write_result(buf: torch.Tensor, done: Any, sync: bool) -> None:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        buf.copy_(torch.arange(N, dtype=torch.float32, device="cuda"))
    if sync:
        side.synchronize()
    done.set()  # a host handshake: orders the parent's host after this host, not after the side stream


def child_writes_result(sync: bool = True) -> None:
    """The parent hands a child an output buffer; the child writes it on a side stream and sets an ``Event``; the
    parent reads it. The child must synchronize before the handshake (``sync=False``: it does not)."""
    ctx = mp.get_context("spawn")
    done = ctx.Event()
    buf = torch.zeros(N, device="cuda")
    p = ctx.Process(target=_write_result, args=(buf, done, sync), name="worker")
    p.start()
    done.wait()
    assert torch.equal(buf.cpu(), torch.arange(N, dtype=torch.float32))
    p.join()


def _reuse_after_the_ack(q: Any, ack: Any) -> None:
    x = torch.empty(N, device="cuda")
    x.fill_(5.0)
    q.put(x)
    del x
    ack.wait()  # the consumer let go of it
    y = torch.empty(N, device="cuda")  # the sent block, once the consumer released it
    y.fill_(7.0)
    torch.cuda.synchronize()


def consumer_drops_early(side: bool = False, record: bool = False) -> None:
    """The consumer queues a read of a received tensor, drops the tensor and tells the producer, which allocates
    again (the sent block). torch's deleter of a received storage synchronizes the consumer's current stream
    before it releases the producer's block, so a read on the current stream is done by then; one on a side
    stream (``side=True``) is not, and ``record_stream`` of a received tensor (``record=True``) does nothing:
    torch's caching allocator skips a pointer it did not allocate."""
    ctx = mp.get_context("spawn")
    q, ack = ctx.Queue(), ctx.Event()
    p = ctx.Process(target=_reuse_after_the_ack, args=(q, ack), name="producer")
    p.start()
    x = q.get()
    st = torch.cuda.Stream()
    st.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(st if side else torch.cuda.current_stream()):
        s = x.sum()
    if record:
        x.record_stream(st)
    del x
    ack.set()
    torch.cuda.current_stream().wait_stream(st)
    assert s.item() == 5 * N
    p.join()


# -- the verdicts ----------------------------------------------------------------------------------------------------

#: (function, its correct configuration, its wrong one, the world's size)
PROGRAMS: list[tuple[Callable[..., None], dict[str, Any], dict[str, Any], int | None]] = [
    (consumer_side_stream, {}, {"wait": False}, None),
    (producer_side_stream, {}, {"sync": False}, None),
    (child_writes_result, {}, {"sync": False}, None),
    (consumer_drops_early, {}, {"side": True}, None),
    (consumer_drops_early, {}, {"side": True, "record": True}, None),
]

#: schedules the correct programs must survive too (a stall of the process that would race)
STALLS = {
    consumer_drops_early: "producer#0+5",
}


def _reports(fn: Callable[..., None], kwargs: dict[str, Any], world_size: int | None,
             schedule: str | None = None) -> list[str]:
    run = simdevice.cuda(schedule)
    run.run(fn, world_size=world_size, **kwargs)
    assert run.result is not None
    return [str(r) for r in run.result.reports]


@pytest.mark.parametrize(("fn", "ok", "bad", "world"), PROGRAMS, ids=[p[0].__name__ for p in PROGRAMS])
def test_the_correct_program_is_clean_and_the_wrong_one_is_found(
        fn: Callable[..., None], ok: dict[str, Any], bad: dict[str, Any], world: int | None) -> None:
    assert _reports(fn, ok, world) == []
    if fn in STALLS:
        assert _reports(fn, ok, world, STALLS[fn]) == []
    assert _reports(fn, bad, world) != []


def test_record_stream_of_a_received_tensor_is_neither_done_nor_advised() -> None:
    """A read of a received tensor on a side stream, the tensor dropped: ``record_stream`` in the receiver is no
    fix (torch's allocator ignores a block of another process's), so the suggested fix is the wait alone."""
    found = simdevice.explore(consumer_drops_early_on_a_side_stream, max_examples=20).failure
    assert found is not None
    fix = suggest(as_target(consumer_drops_early_on_a_side_stream), found, schedules=20)
    assert fix.checked, fix.lines()
    assert not any("record_stream" in a for a in fix.advice), fix.advice


def consumer_drops_early_on_a_side_stream() -> None:
    consumer_drops_early(side=True)
