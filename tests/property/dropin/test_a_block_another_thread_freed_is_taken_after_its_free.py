"""A block one thread of a process frees and another takes again is handed on under CUDA's caching allocator's
lock: the taking thread is ordered after the free, after what the freeing thread did before it (a synchronize) and
after the events of the streams recorded with it (``record_stream``), which some thread's allocation queried done
before the block came back. The simulator ordered only the host that queried those events, and never the freeing
host's past: a producer thread that copies each batch H2D on its own stream and hands it to the trainer through a
queue, the trainer using it on its stream and then dropping it after ``record_stream`` or after a synchronize, was
reported as racing (the producer's next H2D into the reused block against the trainer's kernel), which no GPU does.
Without either synchronization the race is still found."""

from __future__ import annotations

import queue
import threading
import time

import pytest
import torch

import simdevice
from simdevice.runtime.reports import Race

N = 256  # (a kilobyte: each batch takes the block another thread freed)
STEPS = 6
K = 1024  # (floats: two neighbouring blocks of one small segment)


def prefetching_thread(release: str) -> None:
    """A loader thread copies each batch H2D on its own stream and puts it on a queue with an event recorded after
    the copy; the trainer waits on the event, uses the batch on its stream and drops it, having made its block
    wait for that use (``release``: ``"record_stream"``, ``"synchronize"``) or not (``"none"``)."""
    q: queue.Queue[tuple[torch.Tensor, torch.cuda.Event] | None] = queue.Queue(maxsize=2)

    def loader() -> None:
        side = torch.cuda.Stream()
        for i in range(STEPS):
            batch = torch.full((N,), float(i + 1)).pin_memory()
            with torch.cuda.stream(side):
                on_device = batch.cuda(non_blocking=True)
                copied = torch.cuda.Event()
                copied.record()
            q.put((on_device, copied))
            del on_device, copied
        q.put(None)

    t = threading.Thread(target=loader)
    t.start()
    sums = []
    while (item := q.get()) is not None:
        x, copied = item
        del item
        torch.cuda.current_stream().wait_event(copied)  # wait: the batch is on the device
        if release == "record_stream":
            x.record_stream(torch.cuda.current_stream())  # its block is not handed on before this stream's use
        sums.append((x * 2).sum())
        if release == "synchronize":
            torch.cuda.current_stream().synchronize()  # wait: the use is done before the block is handed on
        del x
    t.join()
    assert [s.item() for s in sums] == [2.0 * (i + 1) * N for i in range(STEPS)]


@pytest.mark.parametrize("release", ["record_stream", "synchronize"])
def test_a_block_freed_after_its_use_is_safe_for_the_other_thread(release: str) -> None:
    run = simdevice.cuda()
    run.run(lambda: prefetching_thread(release))
    run.assert_clean()


def dropped_during_its_use() -> None:
    prefetching_thread("none")


def test_a_block_freed_during_its_use_races_with_the_other_thread_s_copy() -> None:
    found = simdevice.explore(dropped_during_its_use, max_examples=30)
    assert found.failure is not None
    assert any(isinstance(r, Race) and r.freed is not None for r in found.failure.run.reports), found.failure.text()


def merged_block_taken_after_both_frees(first: str) -> float:
    """Two neighbouring blocks: the thread uses the second one's tensor on its stream and frees it there after a
    synchronize; the main thread frees the first one's, ``first`` (``"main"``: the thread's free then merges into the
    free block before it) or after the thread (``"thread"``: the main thread's free merges with the free block after
    it). The main thread then takes the merged block, with no order with the thread but the allocator's lock, which
    orders it after both frees (``_release`` keeps both parts' orders)."""
    a = torch.zeros(K, device="cuda")
    b = torch.zeros(K, device="cuda")
    assert b.data_ptr() == a.data_ptr() + 4 * K  # (the block after a's, in a's segment)

    def work(x: torch.Tensor) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.default_stream())
        with torch.cuda.stream(side):
            x.mul_(2)
        side.synchronize()  # (its use done: its block may be handed on as the thread lets go of it)

    t = threading.Thread(target=work, args=(b,))
    t.start()
    del b
    if first == "main":
        del a
    time.sleep(0.01)  # (no order with the thread)
    if first == "thread":
        del a
    c = torch.ones(2 * K, device="cuda")  # (the merged block)
    t.join()
    return float(c.sum().item())


@pytest.mark.parametrize("first", ["main", "thread"])
def test_a_merged_block_is_taken_after_the_free_of_each_of_its_parts(first: str) -> None:
    """Mutations: the freed block's order left out of its merge into the free block before it (``"main"``), the next
    free block's left out of a merge with it (``"thread"``): the new tensor's fill races the thread's use."""
    run = simdevice.cuda()
    run.run(merged_block_taken_after_both_frees, first)
    run.assert_clean()
    assert run.result is not None
    assert run.result.result == 2.0 * K
