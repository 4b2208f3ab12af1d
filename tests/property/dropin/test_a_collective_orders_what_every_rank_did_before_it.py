"""Rule (``Collectives._post``, ``sync.late``): a collective's receive lands once every rank's send ran, and
each rank's send comes after what that rank did before it called the collective, so whatever waits for the receive
(the work's ``wait()`` and a sync after it, a blocking collective read on the host, a ``barrier``, a ``recv``) is
ordered after every rank's past at its call, whichever rank called first. A rank that calls before a peer cannot know
that past yet: its communication stream's records carry the collective, and so does every stream that waits for
one; a host that sees such a record done is ordered after every caller (the receive landed, so all had called), and
a stream that carries it is ordered after every caller once the last rank calls.

Before, the receive carried only the peers that had called by the time this rank called: a correct program whose
ranks share memory (rank 0 writes it, the ranks meet in a ``barrier``, rank 1 reads it: "rank 0 prepares, the others
read") was a race wherever rank 0 reached the barrier last, at the default schedule itself when rank 0 had work of
its own to do first, though on a GPU rank 1's barrier cannot return before rank 0 has called it.

Each part of the rule has a test a mutation of it fails (named in the tests); the unordered programs race with the
rule, and a rank is ordered after its peers' calls, not after their own receives (which may still be landing)."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from hypothesis import strategies as st

import simdevice

N = 256


def _join_world(rank: int, port: int) -> None:
    """This process is rank ``rank`` of a world of two, met at ``port``, on its own device."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("nccl", rank=rank, world_size=2)
    torch.cuda.set_device(rank)


def _worker(rank: int, shared: torch.Tensor, how: str, prepare: int) -> None:
    _join_world(rank, 29561)
    if rank == 0:
        # rank 0 prepares what it shares (its peer meanwhile goes straight to the collective), then writes it
        w = torch.ones(N, device="cuda")
        for _ in range(prepare):
            w.mul_(1.0)
        shared.copy_(w * 7.0)  # the host write every rank's collective comes after
    t = torch.ones(4, device="cuda")
    if how == "barrier":
        dist.barrier()
    elif how == "work_wait":
        dist.all_reduce(t, async_op=True).wait()
        torch.cuda.current_stream().synchronize()
    elif how == "item":
        dist.all_reduce(t)
        assert t.sum().item() == 8.0
    elif how == "all_gather":
        out = torch.empty(8, device="cuda")
        dist.all_gather_into_tensor(out, t)
        torch.cuda.synchronize()
    elif how == "send_recv":
        if rank == 0:
            dist.send(t, 1)
        else:
            dist.recv(t, 0)
        torch.cuda.synchronize()
    if rank == 1:
        seen = shared.sum().item()
        # unordered (``how == "none"``), rank 1 may read before rank 0 wrote: the race is the finding (an assertion
        # would end the run before rank 0's write)
        assert how == "none" or seen == 7.0 * N, "rank 1 read the shared buffer before rank 0 wrote it"
    dist.destroy_process_group()


def _two_ranks(target: Any, *args: Any, exitcodes: bool = True) -> None:
    """``target(rank, *args)`` in two spawned processes, which meet in ``init_process_group``; both end cleanly."""
    ctx = mp.get_context("spawn")
    ps = [ctx.Process(target=target, args=(r, *args)) for r in range(2)]
    for p in ps:
        p.start()
    for p in ps:
        p.join()
    if exitcodes:
        assert [p.exitcode for p in ps] == [0, 0], [p.exitcode for p in ps]


def handshake(how: str, prepare: int = 0) -> None:
    """Rank 0 writes host memory both processes share (after ``prepare`` operations of its own), then the two meet
    in a collective (``how``), then rank 1 reads it."""
    shared = torch.zeros(N).share_memory_()
    _two_ranks(_worker, shared, how, prepare)


def _run(how: str, schedule: str | None) -> Any:
    s = simdevice.cuda(schedule)
    s.run(handshake, how)
    assert s.result is not None
    return s.result


HOW = ["barrier", "work_wait", "item", "all_gather", "send_recv"]
#: rank 0 (the first process started) stalls before its write (its step 1), or before its collective, or rank 1
#: stalls: whichever calls first, the read is after the write
SCHEDULES = [None, "SpawnProcess-1#1+50", "SpawnProcess-1#2+50", "SpawnProcess-2#1+50"]


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("how", HOW)
def test_what_a_rank_did_before_a_collective_is_before_what_its_peers_do_after_it(how: str,
                                                                                   schedule: str | None) -> None:
    run = _run(how, schedule)
    assert run.unfired == (), run.unfired
    assert run.reports == (), run.reports


@pytest.mark.parametrize("schedule", ["SpawnProcess-1#1+50"])
def test_without_a_collective_between_them_the_read_races(schedule: str) -> None:
    run = _run("none", schedule)
    assert [r.kind for r in run.reports if r.kind == "race"], run.reports
    assert "shared#" in str(run.reports)


def prepared(how: str = "barrier") -> None:
    handshake(how, prepare=6)


@pytest.mark.parametrize("how", ["barrier", "item"])
def test_a_rank_that_prepares_before_it_writes_is_clean_at_every_schedule(how: str) -> None:
    """Rank 1 reaches the collective first at the default schedule itself, where ``check`` named a race."""
    found = simdevice.explore(prepared, max_examples=20, default_config={"how": how},
                              config=st.just({"how": how}))
    assert found.failure is None, found.failure.text()


def test_a_rank_that_prepares_and_reads_unordered_races_at_the_default_schedule() -> None:
    found = simdevice.explore(prepared, max_examples=5, default_config={"how": "none"}, config=st.just({"how": "none"}))
    assert found.failure is not None
    assert "shared#" in found.failure.text()


def _peer_reader(rank: int, q: Any, back: Any, wait_peer: bool) -> None:
    _join_world(rank, 29562)
    t = torch.ones(N, device="cuda")
    if rank == 0:
        q.put(t)  # rank 1 maps rank 0's tensor (CUDA IPC)
        for _ in range(6):  # rank 0 calls the collective last
            t.mul_(1.0)
        dist.all_reduce(t)
        if wait_peer:
            torch.cuda.synchronize()
        q.put(None)  # rank 0 is past its call (and, waiting, past its receive)
        back.get()  # rank 1 is done with the tensor
    else:
        peer = q.get()
        dist.all_reduce(t)
        torch.cuda.synchronize()
        q.get()
        # rank 1's receive has landed; rank 0's need not have (unless rank 0 waited for it before its message)
        float(peer.sum().item())
        del peer
        back.put("done")
    dist.destroy_process_group()


def peer_reader(wait_peer: bool) -> None:
    ctx = mp.get_context("spawn")
    _two_ranks(_peer_reader, ctx.Queue(), ctx.Queue(), wait_peer)


@pytest.mark.parametrize("wait_peer", [False, True])
def test_a_rank_is_ordered_after_its_peers_calls_not_after_their_receives(wait_peer: bool) -> None:
    """Rank 1 reads rank 0's output after its own receive: rank 0's receive may still be landing (a race), unless
    rank 0 waited for it before it told rank 1 (a mutation that orders the held rank after the last rank's whole
    communication stream, its receive included, hides the race)."""
    run = _run_fn(peer_reader, wait_peer)
    races = [r for r in run.reports if r.kind == "race"]
    assert bool(races) != wait_peer, run.reports
    assert all("all_reduce (receive)" in str(r) for r in races), races


def _run_fn(fn: Any, *args: Any) -> Any:
    s = simdevice.cuda(None)
    s.run(fn, *args)
    assert s.result is not None
    return s.result


def _device_writer(rank: int, q: Any, done: Any, via: str) -> None:
    _join_world(rank, 29563)
    x = torch.ones(4, device="cuda")
    if rank == 0:
        t0 = torch.zeros(N, device="cuda")
        q.put(t0)  # rank 1 maps it (CUDA IPC) before rank 0 writes it
        w = torch.ones(N, device="cuda")
        for _ in range(6):  # rank 0 calls the collective after rank 1 did
            w.mul_(1.0)
        t0.fill_(5.0)
        torch.cuda.synchronize()
        dist.all_reduce(x)
        done.get()
    else:
        peer = q.get()
        work = dist.all_reduce(x, async_op=True)
        if via != "none":
            work.wait()  # the current stream waits for the receive, which lands after rank 0's fill
        ev = torch.cuda.Event()
        ev.record()
        time.sleep(1.0)  # rank 0 calls meanwhile; rank 1's host sees nothing of it
        if via == "event":  # another stream waits for the event, once rank 0 has called
            s2 = torch.cuda.Stream()
            s2.wait_event(ev)
            with torch.cuda.stream(s2):
                peer.add_(1.0)
        else:
            peer.add_(1.0)
        torch.cuda.synchronize()
        del peer
        done.put("done")
    dist.destroy_process_group()


def device_writer(via: str) -> None:
    ctx = mp.get_context("spawn")
    _two_ranks(_device_writer, ctx.Queue(), ctx.Queue(), via)


@pytest.mark.parametrize("via", ["stream", "event", "none"])
def test_a_stream_that_waits_for_the_receive_is_ordered_after_every_caller_once_the_last_calls(via: str) -> None:
    """Rank 1's device op on rank 0's tensor is issued after rank 0 called, on a stream that waits for rank 1's
    receive (its current stream, or another through an event recorded on it before rank 0 called): ordered after
    rank 0's write, with no host of rank 1 seeing anything of rank 0. Without the wait it races. (Mutations: the
    streams that carry a collective not ordered when the last rank calls; a stream that waits for a record after its
    collective's last call carrying it instead of being ordered.)"""
    run = _run_fn(device_writer, via)
    races = [r for r in run.reports if r.kind == "race"]
    assert bool(races) == (via == "none"), run.reports


def _side_stream_input(rank: int, synced: bool) -> None:
    _join_world(rank, 29564)
    x = torch.empty(N, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        x.fill_(float(rank + 1))
    if synced:
        side.synchronize()  # the host saw the side stream's write done before it called the collective
    dist.all_reduce(x)  # NCCL's stream waits for the current stream, not the side stream
    assert x.sum().item() == 3.0 * N or not synced
    dist.destroy_process_group()


def side_stream_input(synced: bool) -> None:
    _two_ranks(_side_stream_input, synced, exitcodes=synced)


@pytest.mark.parametrize("synced", [True, False])
def test_a_collective_s_send_comes_after_what_its_caller_saw_done(synced: bool) -> None:
    """The send reads an input a side stream wrote, which the host synchronized before the call: ordered (a mutation
    that leaves the caller's past out of the communication stream's, ``sync.collective_issued``, names a race).
    Without the host's sync, NCCL's wait for the current stream does not cover the side stream: a race."""
    run = _run_fn(side_stream_input, synced)
    races = [r for r in run.reports if r.kind == "race"]
    assert bool(races) != synced, run.reports


def _meet(how: str) -> None:
    """The collective the two ranks meet in."""
    if how == "barrier":
        dist.barrier()
    elif how == "all_reduce":
        dist.all_reduce(torch.ones(1, device="cuda"))
    elif how == "all_gather_object":
        dist.all_gather_object([None, None], dist.get_rank())
    else:
        dist.broadcast_object_list([dist.get_rank()], src=0)


def _queued_before(rank: int, q: Any, back: Any, how: str, on: str) -> None:
    _join_world(rank, 29565)
    if rank == 0:
        t0 = torch.zeros(N, device="cuda")
        q.put(t0)  # rank 1 maps it (CUDA IPC)
        back.get()  # rank 1 has it
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side if on == "side" else torch.cuda.current_stream()):
            t0.fill_(7.0)  # queued, not synchronized: NCCL's stream waits for the current stream's work alone
        _meet(how)
        back.get()
    else:
        peer = q.get()
        back.put("got")
        _meet(how)
        if how == "all_reduce":
            torch.cuda.synchronize()
        float(peer.sum().item())
        del peer
        back.put("done")
    dist.destroy_process_group()


def queued_before(how: str, on: str) -> None:
    ctx = mp.get_context("spawn")
    _two_ranks(_queued_before, ctx.Queue(), ctx.Queue(), how, on)


@pytest.mark.parametrize("on", ["current", "side"])
@pytest.mark.parametrize("how", ["barrier", "all_reduce", "all_gather_object", "broadcast_object_list"])
def test_what_a_rank_queued_on_its_current_stream_before_the_call_lands_before_its_send(how: str, on: str) -> None:
    """Rank 0 writes a tensor rank 1 maps on its current stream, unsynchronized, then calls the collective; rank 1
    reads it after the collective: ordered, as NCCL's stream waits for the caller's current stream before the send
    (a mutation that orders the peers after the caller's host alone, ``sync.collective_issued``, names a race). An
    object collective is NCCL's too (torch sends the pickled bytes with NCCL and reads them back on the host): the
    host waits for every rank's current stream as it called (a mutation that waits for the objects alone names a
    race, and rank 1 reads the tensor before rank 0's write lands). The same write on a side stream the collective
    does not wait for races."""
    run = _run_fn(queued_before, how, on)
    races = [r for r in run.reports if r.kind == "race"]
    assert bool(races) == (on == "side"), run.reports


def _own_stream(rank: int, how: str) -> None:
    _join_world(rank, 29566)
    x = torch.full((N,), float(rank + 1), device="cuda")
    host = torch.empty(N, pin_memory=True)
    host.copy_(x, non_blocking=True)  # queued on the current stream
    _meet(how)  # the host reads the objects back, after its current stream's work
    assert host.sum().item() == float(rank + 1) * N
    dist.destroy_process_group()


def own_stream(how: str) -> None:
    _two_ranks(_own_stream, how)


@pytest.mark.parametrize("how", ["all_gather_object", "broadcast_object_list", "barrier"])
def test_an_object_collective_returns_after_the_caller_s_current_stream(how: str) -> None:
    """A rank's non-blocking D2H into pinned memory, then an object collective (or a barrier), then a host read of
    it: ordered, as torch's object collective reads the gathered bytes back on the host, which waits for the current
    stream (a mutation that does not wait for the callers' streams names a race, with the pinned buffer unfilled)."""
    run = _run_fn(own_stream, how)
    assert run.reports == (), run.reports
