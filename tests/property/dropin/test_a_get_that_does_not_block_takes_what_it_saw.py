"""Rule (processes: ``SimQueue.get``; runtime: ``queue_get(block=False)``): a queue's ``get_nowait`` (and a timed
``get``) of a simulated queue, ``queue.Queue`` and ``multiprocessing``'s alike, takes an item if there is one at its
step and raises ``queue.Empty`` otherwise, as Python's does under its lock: it never waits. Its poll and its get are
two steps, and another getter may take the item between them; the get then finds none and the call goes on as an
empty queue's (Python's call, made a moment later). Before, that get waited for another item: workers that share a
queue of work, each taking until it is empty (``torch.distributed.checkpoint``'s ``FileSystemWriter(thread_count=N)``
writes its files so), deadlocked at the default schedule of a correct program."""

from __future__ import annotations

import queue
import threading
from typing import Any

import pytest
import torch

import simdevice
from simdevice.search.explore import explore


def stealing(items: int = 3, workers: int = 2, timeout: float | None = None) -> list[int]:
    """Each thread takes work until the queue is empty; the main thread too."""
    q: queue.Queue[int] = queue.Queue()
    for i in range(items):
        q.put(i)
    done: list[int] = []
    out = torch.zeros(items, device="cuda")

    def worker() -> None:
        try:
            while True:
                i = q.get_nowait() if timeout is None else q.get(timeout=timeout)
                out[i] = float(i)
                done.append(i)
        except queue.Empty:
            pass

    ts = [threading.Thread(target=worker, name=f"w{k}") for k in range(workers)]
    for t in ts:
        t.start()
    worker()
    for t in ts:
        t.join()
    return [*sorted(done), *out.tolist()]


def test_workers_that_share_a_queue_take_each_item_once() -> None:
    s = simdevice.cuda()
    s.run(stealing)
    s.assert_clean()
    assert s.result.result == [0, 1, 2, 0.0, 1.0, 2.0]


def stealing_timed() -> list[int]:
    return stealing(timeout=0.001)


def stealing_more() -> list[int]:
    return stealing(items=5, workers=3)


@pytest.mark.parametrize("program", [stealing, stealing_timed, stealing_more])
def test_no_schedule_of_workers_sharing_a_queue_deadlocks(program: Any) -> None:
    found = explore(program, max_examples=60, seed=1)
    assert found.failure is None, found.failure.text()


def test_a_get_that_does_not_block_on_an_empty_queue_raises_empty() -> None:
    def program() -> list[str]:
        said = []
        for q in (queue.Queue(), queue.SimpleQueue()):
            try:
                q.get_nowait()
            except queue.Empty:
                said.append("empty")
            q.put(1)
            said.append(str(q.get(timeout=0.5)))
        return said

    s = simdevice.cuda()
    s.run(program)
    s.assert_clean()
    assert s.result.result == ["empty", "1", "empty", "1"]
