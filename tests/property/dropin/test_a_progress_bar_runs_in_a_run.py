"""A program with a progress bar (tqdm, in most training scripts and in Hugging Face's loaders) gets a verdict.
tqdm makes a ``multiprocessing.RLock`` for its output, kept in a class attribute for the process's life, and
starts a monitor thread that waits on a ``threading.Event`` it made through a name bound at import, with a 10 s
timeout, between its refreshes. Before, the ``RLock`` was refused (no verdict for any such program); a lock an
earlier run made could not be used by the next; and the monitor's wait, Python's own, stopped every actor of the
run for 10 s of real time at each refresh (the actors take turns on one thread)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from hypothesis import strategies as st
from tqdm import tqdm

import simdevice
from simdevice.search.explore import explore

N = 1 << 12


def _offload_with_a_bar(wait: int = 1, steps: int = 3) -> None:
    """A D2H into pinned memory on a side stream each step, the host reading it after ``side.synchronize()``
    (``wait``) or at once, in a loop shown by a tqdm bar."""
    x = torch.arange(N, dtype=torch.float32, device="cuda")
    pinned = torch.empty(N, pin_memory=True)
    side = torch.cuda.Stream()
    for step in tqdm(range(steps), desc="offload"):
        x.add_(1.0)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            pinned.copy_(x, non_blocking=True)
        if wait:
            side.synchronize()
        assert pinned[0].item() == step + 1, "the host read the copy before it landed"


@pytest.mark.parametrize("wait", [0, 1])
def test_a_loop_with_a_progress_bar_gets_its_verdict(wait: int) -> None:
    found = explore(_offload_with_a_bar, max_examples=20, default_config={"wait": wait},
                    config=st.just({"wait": wait, "steps": 3}))
    if wait:
        assert found.failure is None, found.failure.text() if found.failure else ""
    else:
        assert found.failure is not None
        assert "race" in {r.kind for r in found.failure.run.reports}, found.failure.text()


def test_a_multiprocessing_rlock_is_taken_again_by_its_holder_and_by_the_next_run() -> None:
    kept: list[Any] = []

    def program() -> None:
        lock = kept[0] if kept else mp.RLock()
        kept.append(lock)
        with lock, lock:  # (its holder takes it again)
            pass
        lock.acquire()
        errors: list[BaseException] = []

        def other() -> None:
            try:
                lock.release()  # (not its holder)
            except AssertionError as e:
                errors.append(e)

        t = threading.Thread(target=other, name="other")
        t.start()
        t.join()
        lock.release()
        (error,) = errors
        assert "not owned" in str(error)

    for _ in range(2):  # (the second run uses the lock the first made, as a library's class attribute keeps it)
        run = simdevice.cuda()
        run.run(program)
        run.assert_clean()


def test_a_timed_wait_on_python_s_own_event_passes_in_virtual_time() -> None:
    made_before = threading.Event()  # (Python's own: made before the run)
    waited: list[bool] = []

    def program() -> None:
        waited.append(made_before.wait(5.0))  # (nothing sets it: it times out in virtual time)
        setter = threading.Thread(target=lambda: made_before.set(), name="setter")
        setter.start()
        waited.append(made_before.wait(5.0))
        setter.join()

    run = simdevice.cuda()
    run.run(program)
    run.assert_clean()
    assert waited == [False, True]
