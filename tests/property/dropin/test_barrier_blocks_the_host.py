"""Rule (dropin.distributed.barrier): ``dist.barrier()`` blocks each rank's host until every rank reached it, so what
a rank did before the barrier is seen by every rank after it, however late that rank came."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

import simdevice


def test_no_rank_leaves_the_barrier_before_the_last_one_reached_it() -> None:
    arrived: list[int] = []
    seen: dict[int, list[int]] = {}

    def program() -> None:
        r = dist.get_rank()
        if r == dist.get_world_size() - 1:
            time.sleep(0.001)  # the last rank comes late (virtual host time)
        arrived.append(r)
        dist.barrier()
        seen[r] = sorted(arrived)

    s = simdevice.cuda()
    s.run(program, world_size=2)
    s.assert_clean()
    assert seen == {0: [0, 1], 1: [0, 1]}


def _host_reads_after_an_async_barrier(side: bool, stalled: bool = False) -> None:
    x = torch.arange(16, dtype=torch.float32, device="cuda") * 2
    pinned = torch.empty(16, pin_memory=True)
    s = torch.cuda.Stream() if side else torch.cuda.current_stream()
    s.wait_stream(torch.cuda.current_stream())
    if stalled:
        torch.cuda._sleep(10_000_000)  # about 15 ms: the barrier, behind it on the stream, is not done at wait()
    work = dist.barrier(async_op=True)
    with torch.cuda.stream(s):
        pinned.copy_(x, non_blocking=True)  # (queued after the barrier's call, before its wait)
    work.wait()
    assert torch.equal(pinned, torch.arange(16, dtype=torch.float32) * 2), "the host read before the D2H"


def barrier_work_then_host_read() -> None:
    _host_reads_after_an_async_barrier(False)


def stalled_barrier_work_then_host_read() -> None:
    _host_reads_after_an_async_barrier(False, stalled=True)


def barrier_work_then_host_read_of_a_side_stream() -> None:
    _host_reads_after_an_async_barrier(True)


def test_a_barrier_s_work_wait_blocks_the_host_until_the_current_stream_is_done() -> None:
    """ProcessGroupNCCL's ``wait()`` of a barrier's work not done yet (behind a stall of the current stream)
    synchronizes the current stream (``cudaStreamSynchronize``), all it was given by then: a D2H queued on it after
    the call is done before the host reads its buffer."""
    s = simdevice.cuda()
    s.run(stalled_barrier_work_then_host_read, world_size=2)
    s.assert_clean()


def test_a_barrier_s_work_wait_once_it_is_done_does_not_block_the_host() -> None:
    """``WorkNCCL::wait`` synchronizes the current stream only ``if (isBarrierOp_ && !isCompleted())``: a barrier
    done by the time of ``wait()`` leaves the D2H queued after the barrier's call unwaited, and the host's read of
    its buffer races. A simulator that blocks the host at every barrier's ``wait()`` calls this program clean."""
    found = simdevice.explore(barrier_work_then_host_read, world_size=2, max_examples=30)
    assert found.failure is not None
    assert "race" in found.failure.text()


def test_a_barrier_s_work_wait_does_not_synchronize_another_stream() -> None:
    found = simdevice.explore(barrier_work_then_host_read_of_a_side_stream, world_size=2, max_examples=30)
    assert found.failure is not None
    assert "race" in found.failure.text()


def d2h_then_barrier_work_then_host_read() -> None:
    """The D2H is queued before the barrier's call: a barrier found done at ``wait()`` has run after it."""
    x = torch.arange(16, dtype=torch.float32, device="cuda") * 2
    pinned = torch.empty(16, pin_memory=True)
    pinned.copy_(x, non_blocking=True)
    work = dist.barrier(async_op=True)
    time.sleep(0.01)  # the host does other work meanwhile: the barrier is done by the time of wait()
    work.wait()
    assert torch.equal(pinned, torch.arange(16, dtype=torch.float32) * 2), "the host read before the D2H"


def test_a_barrier_found_done_at_wait_orders_what_came_before_it_on_the_stream() -> None:
    """``wait()`` of a barrier already done does not block, but the host saw it done (``isCompleted()``): what the
    current stream was given before the barrier is done, and the host's read of a D2H queued then is clean under
    every schedule (a host that did not observe the done barrier raced)."""
    s = simdevice.cuda()
    s.run(d2h_then_barrier_work_then_host_read, world_size=2)  # done at wait(): no host block
    s.assert_clean()
    found = simdevice.explore(d2h_then_barrier_work_then_host_read, world_size=2, max_examples=30)
    assert found.failure is None, found.failure.text()


def stalled_barrier_work_synchronized_then_host_read() -> None:
    """The stalled barrier of :func:`stalled_barrier_work_then_host_read`, its work's ``synchronize()`` in place of
    ``wait()``."""
    x = torch.arange(16, dtype=torch.float32, device="cuda") * 2
    pinned = torch.empty(16, pin_memory=True)
    torch.cuda._sleep(10_000_000)  # the barrier, behind it on the stream, is not done at synchronize()
    work = dist.barrier(async_op=True)
    pinned.copy_(x, non_blocking=True)
    work.synchronize()
    assert torch.equal(pinned, torch.arange(16, dtype=torch.float32) * 2), "the host read before the D2H"


def test_a_barrier_s_work_synchronize_does_not_block_the_host() -> None:
    """``Work.synchronize()`` of a barrier's work is any work's, a stream wait: the host is not blocked even where
    the barrier is not done, so its read of the D2H queued after the barrier races (a simulator that blocks the
    host there, as ``wait()`` does, calls it clean)."""
    s = simdevice.cuda()
    s.run(stalled_barrier_work_synchronized_then_host_read, world_size=2)
    assert "race" in s.text(), s.text()
