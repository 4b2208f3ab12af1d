"""Rule (processes._shared, memory.Memory.lookup): a host tensor sent to another process (in its arguments, through
a queue) is moved into shared memory as torch sends it (``reduce_storage``: ``_share_fd_cpu_`` copies a storage not
shared yet into a new shared-memory block and points the storage at it, in the sender): a pinned one is then
pinned no longer, for the sender and the receiver alike (``is_pinned()`` False, as explicit ``share_memory_()``
makes it), so a non-blocking copy into it is a pageable one, which CUDA finishes before it returns; and torch's
copy into shared memory (an aten ``copy_`` on the host, which the run sees) reads the buffer, checked against a D2H
into it still in flight.
A storage moved so is found by its address no more, where another buffer may be allocated now.

Before, the sent buffer stayed pinned in the simulator: a checkpoint writer whose D2H into the trainer's buffer
was followed by an acknowledgement without a synchronize was reported as a race and a wrong value, which a GPU
cannot show (the copy into pageable memory is done when ``copy_`` returns); and a trainer that sent the buffer
while its own D2H into it was still in flight was clean, where torch's copy into shared memory reads it."""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.multiprocessing as mp

import simdevice
from simdevice import Race

N = 256


def _writer_fills(buf: torch.Tensor, ack: Any, seen: Any) -> None:
    seen.put(buf.is_pinned())
    w = torch.full((N,), 2.0, device="cuda")
    buf.copy_(w, non_blocking=True)  # pageable memory now: done as it returns
    ack.value = 1


def writer_fills_the_sent_buffer_and_acknowledges() -> None:
    ctx = mp.get_context("spawn")
    buf = torch.zeros(N, pin_memory=True)
    ack, seen = ctx.Value("i", 0), ctx.Queue()
    p = ctx.Process(target=_writer_fills, args=(buf, ack, seen), name="writer")
    p.start()
    assert not buf.is_pinned(), "sent, the buffer is shared memory, pinned no longer"
    assert seen.get() is False
    while ack.value == 0:
        time.sleep(0.001)
    assert torch.equal(buf, torch.full((N,), 2.0)), "the checkpoint differs from the weights"
    p.join()


def _writer_saves(q: Any, out: Any) -> None:
    snapshot = q.get()
    out.put(float(snapshot.sum()))


def _trainer_sends_its_snapshot(sync: bool) -> None:
    ctx = mp.get_context("spawn")
    q, out = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_writer_saves, args=(q, out), name="writer")
    p.start()
    w = torch.ones(N, device="cuda")
    snapshot = torch.empty(N, pin_memory=True)
    snapshot.copy_(w, non_blocking=True)
    if sync:
        torch.cuda.current_stream().synchronize()
    q.put(snapshot)
    assert out.get() == N, "the checkpoint differs from the weights"
    p.join()


def trainer_sends_its_snapshot_after_the_copy() -> None:
    _trainer_sends_its_snapshot(True)


def trainer_sends_its_snapshot_during_the_copy() -> None:
    _trainer_sends_its_snapshot(False)


def test_a_copy_into_a_buffer_that_was_sent_is_a_pageable_one() -> None:
    found = simdevice.explore(writer_fills_the_sent_buffer_and_acknowledges, max_examples=30)
    assert found.failure is None, found.failure.text()


def test_a_buffer_sent_after_its_copy_is_done_is_clean() -> None:
    found = simdevice.explore(trainer_sends_its_snapshot_after_the_copy, max_examples=30)
    assert found.failure is None, found.failure.text()


def test_a_buffer_sent_while_a_copy_into_it_runs_races_with_the_send() -> None:
    found = simdevice.explore(trainer_sends_its_snapshot_during_the_copy, max_examples=30)
    assert found.failure is not None
    races = [r for r in found.failure.run.reports if isinstance(r, Race)]
    # (torch's copy into shared memory, an aten copy_ on the host, reads the pinned buffer the D2H writes)
    assert any("copy_ on host host" in str(r) and "reads pinned" in str(r) and "copy_ (D2H) on stream default" in
               str(r) for r in races), found.failure.text()


def test_a_buffer_allocated_where_a_moved_pinned_one_was_is_not_pinned() -> None:
    seen: list[bool] = []

    def program() -> None:
        for _ in range(8):
            pinned = torch.empty(N, pin_memory=True)
            pinned.share_memory_()
            plain = torch.empty(N)  # (often at the address the pinned block had)
            seen.append(pinned.is_pinned() or plain.is_pinned())
            del pinned, plain

    s = simdevice.cuda()
    s.run(program)
    s.assert_clean()
    assert seen == [False] * 8
