"""Names the program's modules bound at import time, before a session opened (``from torch.cuda import Stream``,
``from threading import Event, Thread``, ``from concurrent.futures import ThreadPoolExecutor``, ``from time import
sleep``: this file's own imports), hold the session's for the session, and the originals again after it. Before,
they kept torch's and Python's: ``Stream()`` failed on the CPU build (no verdict), a ``ThreadPoolExecutor`` was a
real pool whose worker could not pin memory, and a thread's wait on an ``Event`` hung the whole run for good.
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from queue import Queue
from threading import Event, Lock, Thread
from time import sleep
from typing import Any

import torch
from torch.cuda import Event as CudaEvent
from torch.cuda import Stream, current_stream

import simdevice
from simdevice import Race

N = 1024
#: what a session replaces (``Thread`` is Python's class still: its ``start`` is the session's)
_ORIGINALS = {"Stream": Stream, "CudaEvent": CudaEvent, "current_stream": current_stream, "Event": Event,
              "Lock": Lock, "Queue": Queue, "ThreadPoolExecutor": ThreadPoolExecutor, "sleep": sleep}


def _reload(wait: bool) -> None:
    """An offload to pinned memory on a side stream and its reload, all through names imported at the top."""
    act = torch.arange(N, dtype=torch.float32, device="cuda")
    pinned = torch.empty(N, pin_memory=True)
    side = Stream()
    side.wait_stream(current_stream())
    with torch.cuda.stream(side):
        pinned.copy_(act, non_blocking=True)
        done = CudaEvent()
        done.record()
    if wait:
        current_stream().wait_event(done)
    back = torch.empty_like(act).copy_(pinned, non_blocking=True)
    assert torch.equal(back.cpu(), torch.arange(N, dtype=torch.float32))


def _reload_waits() -> None:
    _reload(True)


def _reload_races() -> None:
    _reload(False)


def test_a_stream_and_an_event_imported_from_torch_cuda_are_the_simulated_ones() -> None:
    assert simdevice.explore(_reload_waits, max_examples=30).failure is None
    found = simdevice.explore(_reload_races, max_examples=30)
    assert found.failure is not None
    assert any(isinstance(r, Race) for r in found.failure.run.reports), found.failure.text()


def _handshake() -> None:
    """A producer thread fills a device tensor and signals an Event; a pool worker pins a buffer; a lock and a
    queue pass a value; a sleep waits a virtual second."""
    ready = Event()
    out: list[torch.Tensor] = []
    lock = Lock()
    q: Queue[int] = Queue()

    def producer() -> None:
        with lock:
            out.append(torch.ones(N, device="cuda"))
        q.put(1)
        ready.set()

    t = Thread(target=producer)
    t.start()
    ready.wait()
    assert q.get() == 1
    with ThreadPoolExecutor(max_workers=1) as pool:
        buf = pool.submit(lambda: torch.empty(N, pin_memory=True)).result()
    assert buf.is_pinned()
    sleep(1.0)
    assert out[0].sum().item() == N
    t.join()


def test_threading_names_imported_at_the_top_are_the_simulated_ones() -> None:
    start = time.monotonic()
    s = simdevice.cuda()
    s.run(_handshake)
    assert s.clean, s.text()
    assert time.monotonic() - start < 0.9  # the sleep was virtual


def test_the_names_are_the_originals_again_after_the_session() -> None:
    here = vars(sys.modules[__name__])
    seen: dict[str, Any] = {}

    def look() -> None:
        seen.update({name: here[name] for name in _ORIGINALS})

    simdevice.cuda().run(look)
    assert all(seen[name] is not original for name, original in _ORIGINALS.items()), seen
    assert all(here[name] is original for name, original in _ORIGINALS.items())


def test_a_name_the_program_rebinds_in_the_run_stays_as_it_left_it() -> None:
    here = vars(sys.modules[__name__])

    def rebind() -> None:
        here["sleep"] = print  # (as ``global sleep; sleep = print`` would)

    try:
        simdevice.cuda().run(rebind)
        assert here["sleep"] is print
    finally:
        here["sleep"] = _ORIGINALS["sleep"]
