"""A library binds ``from concurrent.futures import ThreadPoolExecutor, Future, as_completed, wait`` and ``from
threading import Event`` when it is imported, before any session: what it makes through those names in a run is
the simulator's, as what the program makes is. Before, its pool's workers were Python's threads, which the simulator
does not run (a worker's device work stopped the run with no verdict: transformers' ``from_pretrained(device_map=
"cuda")`` loads its weights so), and a wait on its event, Python's own, stopped every actor of the run. The library
here lies in a folder named ``site-packages``, as an installed package does (its globals are not rebound)."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import simdevice
from simdevice import Deadlock, HostError, Race

LIBRARY = '''
from concurrent.futures import Future, ThreadPoolExecutor, as_completed, wait, FIRST_COMPLETED
from queue import LifoQueue
from threading import Event

import torch


class Loader:
    """A library's class keeping an event for the process's life (as tqdm's monitor does)."""
    stopped = None


def to_device(tensors, collect="result"):
    """Each host tensor moved to the device by a pool worker; the futures collected by ``collect``."""
    pool = ThreadPoolExecutor(max_workers=2)
    futures = [pool.submit(lambda t=t: t.to("cuda")) for t in tensors]
    assert all(isinstance(f, Future) for f in futures)
    if collect == "as_completed":
        done = {id(f): f.result() for f in as_completed(futures)}
        out = [done[id(f)] for f in futures]
    elif collect == "wait":
        finished, pending = wait(futures)
        assert not pending and len(finished) == len(futures)
        out = [f.result() for f in futures]
    elif collect == "first":
        finished, _ = wait(futures, return_when=FIRST_COMPLETED)
        assert finished
        out = [f.result() for f in futures]
    else:
        out = [f.result() for f in futures]
    pool.shutdown()
    return out


def snapshot_in_a_worker(x, pinned, wait_for_copy):
    """A worker copies ``x`` into pinned memory without waiting (or waiting) for the copy; the caller reads it."""
    def copy():
        pinned.copy_(x, non_blocking=True)
        if wait_for_copy:
            torch.cuda.current_stream().synchronize()
    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(copy).result()
    return pinned.clone()


def signalled(set_it):
    """The caller waits, untimed, on an event a worker sets (or nothing sets)."""
    ready = Event()
    with ThreadPoolExecutor(max_workers=1) as pool:
        if set_it:
            pool.submit(ready.set)
        ready.wait()
    return ready.is_set()


def kept_event():
    """An event made in the first run and kept in a class attribute, used in each later run."""
    if Loader.stopped is None:
        Loader.stopped = Event()
    was = Loader.stopped.is_set()
    Loader.stopped.set()
    return was


def lifo():
    return LifoQueue()
'''


@pytest.fixture
def library(tmp_path: Path) -> Iterator[Any]:
    folder = tmp_path / "site-packages"
    folder.mkdir()
    (folder / "boundlib.py").write_text(textwrap.dedent(LIBRARY))
    sys.path.insert(0, str(folder))
    try:
        import boundlib  # (before any session: its names are Python's own classes and functions)

        yield boundlib
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("boundlib", None)


def _run(fn: Any) -> Any:
    s = simdevice.cuda()
    s.run(fn)
    assert s.result is not None
    return s.result


@pytest.mark.parametrize("collect", ["result", "as_completed", "wait", "first"])
def test_a_library_s_pool_runs_its_workers_as_threads_of_the_program(library: Any, collect: str) -> None:
    def program() -> None:
        host = [torch.arange(8, dtype=torch.float32) + 10 * k for k in range(3)]
        moved = library.to_device(host, collect)
        assert all(t.is_cuda for t in moved)
        for k, t in enumerate(moved):
            assert torch.equal(t.cpu(), host[k]), f"tensor {k} was not moved"

    run = _run(program)
    assert not run.reports, [str(r) for r in run.reports]
    assert {"pool_0", "pool_1"} <= set(run.op_counts), run.op_counts


def test_a_race_in_a_library_s_worker_is_found_and_named_by_its_thread(library: Any) -> None:
    def program(wait_for_copy: bool) -> None:
        x = torch.arange(1 << 12, dtype=torch.float32, device="cuda")
        pinned = torch.empty(1 << 12, pin_memory=True)
        got = library.snapshot_in_a_worker(x, pinned, wait_for_copy)
        assert torch.equal(got, torch.arange(1 << 12, dtype=torch.float32)), "the snapshot is not x"

    racy = _run(lambda: program(False))
    races = [r for r in racy.reports if isinstance(r, Race)]
    assert races, [str(r) for r in racy.reports]
    assert any("which _to_copy" in str(r) or "copy_ (D2H) on stream default" in str(r) for r in races), races
    assert not _run(lambda: program(True)).reports


def test_an_untimed_wait_on_a_library_s_event_lets_the_setter_run_or_is_a_deadlock(library: Any) -> None:
    assert not _run(lambda: library.signalled(True)).reports
    stuck = _run(lambda: library.signalled(False))
    assert any(isinstance(r, Deadlock) for r in stuck.reports), [str(r) for r in stuck.reports]


def test_a_library_s_event_kept_across_runs_is_new_in_each_and_a_flag_outside_them(library: Any) -> None:
    seen: list[bool] = []
    for _ in range(2):
        _run(lambda: seen.append(library.kept_event()))
    assert seen == [False, False]  # (each run's, clear, as a new process would make it)
    kept = library.Loader.stopped
    kept.set()  # outside any run (a library's atexit handler): a plain flag
    assert kept.is_set()
    assert kept.wait()


def test_a_library_s_refused_queue_is_refused_through_its_own_name(library: Any) -> None:
    (err,) = _run(library.lifo).reports
    assert isinstance(err, HostError)
    assert "queue.LifoQueue made in a run is not simulated" in err.error


def test_outside_a_run_the_library_s_names_make_python_s_own(library: Any) -> None:
    import concurrent.futures
    import queue
    import threading

    with library.ThreadPoolExecutor(1) as pool:
        assert type(pool) is concurrent.futures.ThreadPoolExecutor
        assert pool.submit(lambda: 3).result() == 3
    assert type(library.Event()) is threading.Event
    assert type(library.LifoQueue()) is queue.LifoQueue
