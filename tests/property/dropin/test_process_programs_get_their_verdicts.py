"""Small plain torch.cuda programs of several processes, ranks and memory-saver phases, each correct and with one
synchronization wrong: the correct one runs clean, the wrong one is found (what CUDA's, torch's, NCCL's and
torch_memory_saver's semantics say of each). A consumer reading a received tensor on a side stream, a producer
filling one on a side stream before a ``Queue`` sends it, a child writing into a buffer its parent gave it, a
consumer dropping a received tensor before its read is done while the producer reuses the block; on two ranks,
async all-gather, reduce-scatter and broadcast with ``work.wait()`` before or after the use, a ZeRO-3 prefetch on a
side stream, gradients reduce-scattered from a hook during backward, ``dist.barrier()`` taken for a device sync;
memory-saver regions paused for a rollout with and without a synchronize, with and without a CPU backup, an
allocation while paused, two tags, ``pause()`` of every tag."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
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
    x, other = torch.empty(N, device="cuda"), torch.empty(N, device="cuda")  # (one segment)
    x.fill_(5.0)
    q.put((x, other))
    del x, other
    ack.wait()  # the consumer let go of it
    y = torch.empty(N, device="cuda")  # the sent block, once the consumer released it
    y.fill_(7.0)
    torch.cuda.synchronize()


def consumer_drops_early(side: bool = False, record: bool = False, keep: bool = True) -> None:
    """The consumer queues a read of a received tensor, drops the tensor and tells the producer, which allocates
    again (the sent block). torch's deleter of a received storage synchronizes the consumer's current stream
    before it releases the producer's block, so a read on the current stream is done by then; one on a side
    stream (``side=True``) is not, and ``record_stream`` of a received tensor (``record=True``) does nothing:
    torch's caching allocator skips a pointer it did not allocate. That is while the consumer holds another
    tensor of the producer's segment (``keep``); where it holds none, the deleter unmaps the segment, which waits
    for all its streams."""
    ctx = mp.get_context("spawn")
    q, ack = ctx.Queue(), ctx.Event()
    p = ctx.Process(target=_reuse_after_the_ack, args=(q, ack), name="producer")
    p.start()
    x, other = q.get()
    if not keep:
        del other
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


def _work_until_the_ack(q: Any, ack: Any) -> None:
    x, other = torch.empty(N, device="cuda"), torch.empty(N, device="cuda")  # (one segment)
    x.fill_(5.0)
    q.put((x, other))
    del x, other
    z = torch.zeros(N, device="cuda")
    while not ack.is_set():  # its own work meanwhile: host steps while the consumer drops what it received
        z.add_(1.0)
        time.sleep(0.001)


def consumer_copies_out(keep: bool = False, busy: bool = False) -> None:
    """The consumer copies a received tensor into pinned memory on a side stream, drops it and reads the copy on
    the host with no wait of its own: right only where the drop unmapped the producer's segment (no other tensor
    of it kept), which blocks the host until every stream of the consumer is done. ``busy``: the producer takes
    host steps of its own meanwhile (what the drop blocks is the consumer's host, not the next host to step)."""
    ctx = mp.get_context("spawn")
    q, ack = ctx.Queue(), ctx.Event()
    p = ctx.Process(target=_work_until_the_ack if busy else _reuse_after_the_ack, args=(q, ack), name="producer")
    p.start()
    x, other = q.get()
    if not keep:
        del other
    pinned = torch.empty(N, pin_memory=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        pinned.copy_(x, non_blocking=True)
    del x
    assert pinned.sum().item() == 5 * N
    ack.set()
    p.join()


def _reuse_once_let_go(q: Any, reused: Any) -> None:
    x, other = torch.empty(N, device="cuda"), torch.empty(N, device="cuda")  # (one segment)
    x.fill_(5.0)
    q.put((x, other))
    del x, other
    time.sleep(0.05)  # no handshake: meanwhile the consumer drops the tensor, which lets the block go (torch's limbo)
    torch.cuda.synchronize()  # (a step: the simulator's allocation takes none, so what came meanwhile comes first)
    torch.cuda.ipc_collect()
    y = torch.empty(N, device="cuda")  # the sent block, released by the consumer's drop
    y.fill_(7.0)
    torch.cuda.synchronize()
    reused.set()


def consumer_drops_unannounced(keep: bool = False) -> None:
    """The consumer reads a received tensor on a side stream and drops it, telling the producer nothing; the
    producer allocates again a while later. The drop of the segment's last tensor unmaps it, and the block is let go
    once every stream of the consumer is done, the side stream too (the consumer's host, which waits for them at its
    next step, tells the producer nothing); with another tensor of the segment kept (``keep``), once the current
    stream is, so the producer's reuse races with the side stream's read."""
    ctx = mp.get_context("spawn")
    q, reused = ctx.Queue(), ctx.Event()
    p = ctx.Process(target=_reuse_once_let_go, args=(q, reused), name="producer")
    p.start()
    x, other = q.get()
    if not keep:
        del other
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        s = x.sum()
    del x
    reused.wait()
    torch.cuda.current_stream().wait_stream(side)
    assert s.item() == 5 * N
    p.join()


# -- ranks (world_size=2) --------------------------------------------------------------------------------------------


def gather_wait(mode: str = "ok") -> None:
    """An async all_gather_into_tensor: the gathered tensor used after ``work.wait()`` (``ok``), before it
    (``early``), or after a wait made with a side stream current (``side``: it orders the side stream)."""
    ws, r = dist.get_world_size(), dist.get_rank()
    shard = torch.full((N,), float(r + 1), device="cuda")
    full = torch.empty(ws * N, device="cuda")
    work = dist.all_gather_into_tensor(full, shard, async_op=True)
    if mode == "early":
        s = full.sum()
        work.wait()
    elif mode == "side":
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            work.wait()
        s = full.sum()
    else:
        work.wait()
        s = full.sum()
    assert s.item() == sum(range(1, ws + 1)) * N


def reduce_scatter_wait(mode: str = "ok") -> None:
    """async reduce_scatter_tensor of gradients; the input overwritten after wait (ok) or before (reuse)."""
    ws, r = dist.get_world_size(), dist.get_rank()
    grads = torch.full((ws * N,), float(r + 1), device="cuda")
    out = torch.empty(N, device="cuda")
    work = dist.reduce_scatter_tensor(out, grads, async_op=True)
    if mode == "reuse":
        grads.zero_()
        work.wait()
    else:
        work.wait()
        grads.zero_()
    assert out.sum().item() == sum(range(1, ws + 1)) * N


def broadcast_wait(mode: str = "ok") -> None:
    r = dist.get_rank()
    x = torch.full((N,), 7.0, device="cuda") if r == 0 else torch.zeros(N, device="cuda")
    work = dist.broadcast(x, src=0, async_op=True)
    if mode == "ok":
        work.wait()
    y = x * 2
    if mode != "ok":
        work.wait()
    assert y.sum().item() == 14 * N


def zero3_prefetch(mode: str = "ok") -> None:
    """ZeRO-3: each layer's weight all-gathered on a side stream ahead of use; the compute waits on an event.
    mode: ok, no-event (compute doesn't wait), no-input-wait (the side stream doesn't wait for the shard update)."""
    ws = dist.get_world_size()
    layers = 3
    shards = [torch.zeros(N, device="cuda") for _ in range(layers)]
    ag = torch.cuda.Stream()
    x = torch.ones(ws * N, device="cuda")
    full = [None] * layers
    events = [None] * layers

    def prefetch(i):
        shards[i].fill_(float(i + 1))  # the shard updated on the compute stream (last step's optimizer)
        if mode != "no-input-wait":
            ag.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(ag):
            w = torch.empty(ws * N, device="cuda")
            dist.all_gather_into_tensor(w, shards[i])
            ev = torch.cuda.Event()
            ev.record()
        full[i], events[i] = w, ev

    prefetch(0)
    for i in range(layers):
        if i + 1 < layers:
            prefetch(i + 1)
        if mode != "no-event":
            torch.cuda.current_stream().wait_event(events[i])
        w = full[i]
        w.record_stream(torch.cuda.current_stream())
        x = x * w
        full[i] = None
        del w
    assert x.sum().item() == 6.0 * ws * N


def grad_reduce_scatter_in_backward(mode: str = "ok") -> None:
    """Gradients reduce-scattered from a post-accumulate-grad hook on a side stream, overlapped with the rest of
    backward; mode: ok, no-wait-stream (the side stream doesn't wait for the gradient), no-final-wait."""
    ws, r = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(2 * ws, 2 * ws, bias=False), torch.nn.Linear(2 * ws, 2 * ws, bias=False)).cuda()
    rs = torch.cuda.Stream()
    outs, works = {}, []

    def hook(p):
        if mode != "no-wait-stream":
            rs.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(rs):
            out = torch.empty(p.numel() // ws, device="cuda")
            works.append(dist.reduce_scatter_tensor(out, p.grad.reshape(-1), async_op=True))
            outs[p] = out

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)
    x = torch.ones(4, 2 * ws, device="cuda")
    model(x).sum().backward()
    with torch.cuda.stream(rs):
        for w in works:
            if mode != "no-final-wait":
                w.wait()
    torch.cuda.current_stream().wait_stream(rs)
    for p in model.parameters():
        want = p.grad.reshape(-1)[r * (p.numel() // ws):(r + 1) * (p.numel() // ws)] * ws
        assert torch.allclose(outs[p], want), (outs[p], want)


def barrier_as_sync(mode: str = "ok") -> None:
    """A D2H into pinned memory then dist.barrier() before the host reads it. On the current stream the barrier's
    wait synchronizes that stream (ProcessGroupNCCL); on a side stream nothing orders it (mode side)."""
    x = torch.arange(N, dtype=torch.float32, device="cuda") * 2
    pinned = torch.empty(N, pin_memory=True)
    if mode == "side":
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            pinned.copy_(x, non_blocking=True)
    else:
        pinned.copy_(x, non_blocking=True)
    dist.barrier()
    assert torch.equal(pinned, torch.arange(N, dtype=torch.float32) * 2)


# -- torch_memory_saver ------------------------------------------------------------------------------------------------

M = 4096


def rollout_phase(mode: str = "ok") -> None:
    """An RL trainer: weights in a region with a CPU backup; a train step on a side stream; pause for the rollout,
    resume, check the weights. mode: ok; no-sync (pause without synchronize)."""
    from torch_memory_saver import torch_memory_saver as tms

    with tms.region("train", enable_cpu_backup=True):
        w = torch.ones(M, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        w.mul_(2)
    torch.cuda.current_stream().wait_stream(side)
    if mode != "no-sync":
        torch.cuda.synchronize()
    tms.pause("train")
    kv = torch.zeros(M, device="cuda")  # the rollout's memory
    kv.add_(1)
    del kv
    tms.resume("train")
    assert w.sum().item() == 2 * M


def no_backup(backup: bool = True) -> None:
    """Values read after resume: with a CPU backup they are back; without, they are gone."""
    from torch_memory_saver import torch_memory_saver as tms

    with tms.region("train", enable_cpu_backup=backup):
        w = torch.full((M,), 3.0, device="cuda")
    torch.cuda.synchronize()
    tms.pause("train")
    tms.resume("train")
    assert w.sum().item() == 3 * M


def alloc_while_paused(mode: str = "disable") -> None:
    """While paused, the rollout allocates: inside disable() (ok), or in the region (region), or plainly (plain)."""
    from torch_memory_saver import torch_memory_saver as tms

    with tms.region("train", enable_cpu_backup=True):
        w = torch.ones(M, device="cuda")
        tmp = w * 2
        del tmp
        torch.cuda.synchronize()
        tms.pause("train")
        if mode == "disable":
            with tms.disable():
                h = torch.ones(512, device="cuda")
                assert h.sum().item() == 512
                del h
        elif mode == "region":
            h = torch.ones(512, device="cuda")
            assert h.sum().item() == 512
            del h
    if mode == "plain":
        h = torch.ones(512, device="cuda")
        assert h.sum().item() == 512
        del h
    tms.resume("train")
    assert w.sum().item() == M


def two_tags(mode: str = "ok") -> None:
    """Weights in 'weights', KV cache in 'kv'; pause 'kv' while the weights are in use (ok); or pause 'kv' while a
    kernel on the kv cache may still run (busy)."""
    from torch_memory_saver import torch_memory_saver as tms

    with tms.region("weights", enable_cpu_backup=True):
        w = torch.ones(M, device="cuda")
    with tms.region("kv"):
        kv = torch.zeros(M, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        kv.add_(w)
    if mode == "ok":
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
    tms.pause("kv")
    y = w * 3  # the weights stay in use
    assert y.sum().item() == 3 * M
    tms.resume("kv")
    torch.cuda.synchronize()


def pause_all(mode: str = "ok") -> None:
    """pause() with no tag pauses every region; disable() guard for the weight-sync buffer."""
    from torch_memory_saver import torch_memory_saver as tms

    with tms.region("a", enable_cpu_backup=True):
        a = torch.ones(M, device="cuda")
    with tms.region("b", enable_cpu_backup=True):
        b = torch.full((M,), 2.0, device="cuda")
    torch.cuda.synchronize()
    tms.pause()
    if mode == "touch":
        a.add_(1)  # a kernel on paused memory: illegal access
    tms.resume()
    assert a.sum().item() + b.sum().item() == 3 * M


# -- the verdicts ----------------------------------------------------------------------------------------------------

#: (function, its correct configuration, its wrong one, the world's size)
PROGRAMS: list[tuple[Callable[..., None], dict[str, Any], dict[str, Any], int | None]] = [
    (consumer_side_stream, {}, {"wait": False}, None),
    (producer_side_stream, {}, {"sync": False}, None),
    (child_writes_result, {}, {"sync": False}, None),
    (consumer_drops_early, {}, {"side": True}, None),
    (consumer_drops_early, {}, {"side": True, "record": True}, None),
    (consumer_drops_early, {"side": True, "keep": False}, {"side": True}, None),  # (the segment's last: it waits)
    (consumer_copies_out, {}, {"keep": True}, None),
    (consumer_copies_out, {"busy": True}, {"keep": True, "busy": True}, None),
    (consumer_drops_unannounced, {}, {"keep": True}, None),
    (gather_wait, {}, {"mode": "early"}, 2),
    (gather_wait, {}, {"mode": "side"}, 2),
    (reduce_scatter_wait, {}, {"mode": "reuse"}, 2),
    (broadcast_wait, {}, {"mode": "late"}, 2),
    (zero3_prefetch, {}, {"mode": "no-event"}, 2),
    (zero3_prefetch, {}, {"mode": "no-input-wait"}, 2),
    (grad_reduce_scatter_in_backward, {}, {"mode": "no-wait-stream"}, 2),
    (grad_reduce_scatter_in_backward, {}, {"mode": "no-final-wait"}, 2),
    (barrier_as_sync, {}, {"mode": "side"}, 2),
    (rollout_phase, {}, {"mode": "no-sync"}, None),
    (no_backup, {}, {"backup": False}, None),
    (alloc_while_paused, {}, {"mode": "region"}, None),
    (alloc_while_paused, {"mode": "plain"}, {"mode": "region"}, None),
    (two_tags, {}, {"mode": "busy"}, None),
    (pause_all, {}, {"mode": "touch"}, None),
]

#: schedules the correct programs must survive too (a stall of the process that would race)
STALLS = {
    consumer_drops_early: "producer#0+5",
    consumer_drops_unannounced: "producer#0+5",
    gather_wait: "rank0.nccl#0+5",
    zero3_prefetch: "rank1.ag#0+5",
    grad_reduce_scatter_in_backward: "rank0.rs#0+5",
    rollout_phase: "side#0+5",
    two_tags: "side#0+5",
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


def test_a_region_paused_without_a_backup_is_named_where_its_values_are_wrong(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Read after the resume, a tensor of a region with no CPU backup holds garbage: the run's notes name the pause
    that discarded it, and the fix's "no edge" line says no wait brings it back (it once named the program's logic
    or a host read the simulator does not see). With a backup, no such note."""
    from simdevice.cli import main

    here = "tests/property/dropin/test_process_programs_get_their_verdicts.py"
    assert main(["check", f"{here}::no_backup:backup=False"]) == 1
    out = capsys.readouterr().out
    assert "note: memory_saver.pause('train') at t=" in out, out
    assert "(region 'train' has no CPU backup)" in out, out
    (line,) = [x for x in out.splitlines() if "no edge suggested" in x]
    assert "discarded the contents of a region with no CPU backup" in line, line
    run = simdevice.cuda().run(no_backup, True)
    assert not run.reports, run.reports
    assert not any("discarded" in n for n in run.notes), run.notes
