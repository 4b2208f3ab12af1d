"""A thread the program starts sees its own ``threading.local`` values, as on a GPU, though a run's actors take turns
on one machine thread (greenlets): two pool workers that each keep a pinned staging buffer and a stream in a
thread-local get one each, so the correct saver is clean and the one that reads its buffer before its copy is done
is found. Before, the workers shared the first one's buffer and the correct saver raced with itself. The run's first
actor keeps the values of the thread that started the run; each other actor starts with none (a subclass's
``__init__`` runs again in it), on greenlets as on threads.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch

import simdevice
from simdevice import Race
from simdevice.runtime import SimConfig

N = 1024
SHARDS = 4


def _save_shards(sync: bool) -> None:
    """Two writer threads save four shards of the weights, each through its own pinned staging buffer and stream,
    kept in a thread-local; ``sync``: each synchronizes its stream before it reads its buffer."""
    local = threading.local()
    params = [torch.full((N,), float(i), device="cuda") for i in range(SHARDS)]
    torch.cuda.synchronize()

    def save(i: int) -> float:
        if not hasattr(local, "buf"):
            local.buf = torch.empty(N, pin_memory=True)
            local.stream = torch.cuda.Stream()
        with torch.cuda.stream(local.stream):
            local.buf.copy_(params[i], non_blocking=True)
        if sync:
            local.stream.synchronize()
        return float(local.buf.sum())

    with ThreadPoolExecutor(max_workers=2) as pool:
        sums = list(pool.map(save, range(SHARDS)))
    assert sums == [float(i * N) for i in range(SHARDS)], sums


def _saver_syncs() -> None:
    _save_shards(True)


def _saver_reads_early() -> None:
    _save_shards(False)


def _run(fn: Any, actors: str = "greenlet") -> Any:
    s = simdevice.cuda(config=SimConfig(actors=actors))
    s.run(fn)
    assert s.result is not None
    return s.result


@pytest.mark.parametrize("actors", ["greenlet", "thread"])
def test_each_pool_worker_keeps_its_own_staging_buffer(actors: str) -> None:
    run = _run(_saver_syncs, actors)
    assert run.reports == (), [str(r) for r in run.reports]


def test_a_saver_that_syncs_is_clean_under_any_schedule() -> None:
    found = simdevice.explore(_saver_syncs, max_examples=40)
    assert found.failure is None, found.failure.text()


def test_a_saver_that_reads_its_buffer_before_its_copy_is_found() -> None:
    found = simdevice.explore(_saver_reads_early, max_examples=60)
    assert found.failure is not None
    assert any(isinstance(r, Race) and r.current.on == "thread" for r in found.failure.run.reports)


class _Counted(threading.local):
    made = 0

    def __init__(self) -> None:
        type(self).made += 1
        self.value = "fresh"


def _values_per_thread() -> dict[str, Any]:
    """What each actor sees of two locals: one made before the run (the test's), one made in the run."""
    seen: dict[str, Any] = {}
    made = threading.local()
    made.value = "host"
    _BEFORE.value = "host in run"

    def worker() -> None:
        seen["worker made"] = getattr(made, "value", None)
        seen["worker before"] = getattr(_BEFORE, "value", None)
        seen["worker counted"] = _COUNTED.value
        made.value = _BEFORE.value = _COUNTED.value = "worker"
        torch.ones(4, device="cuda").add_(1)  # (a device op: the host may go on meanwhile)

    t = threading.Thread(target=worker)
    t.start()
    torch.ones(4, device="cuda").add_(1)
    t.join()
    seen["host made"] = made.value
    seen["host before"] = _BEFORE.value
    seen["host counted"] = _COUNTED.value
    return seen


_BEFORE = threading.local()
_COUNTED = _Counted()


@pytest.mark.parametrize("actors", ["greenlet", "thread"])
@pytest.mark.parametrize("schedule", [None, "host#0+3", "worker#0+3"])
def test_a_thread_starts_with_no_values_and_leaves_its_starter_s_alone(actors: str, schedule: str | None) -> None:
    _BEFORE.value = "test"
    _COUNTED.value = "test"
    seen: dict[str, Any] = {}
    s = simdevice.cuda(schedule, config=SimConfig(actors=actors))
    s.run(lambda: seen.update(_values_per_thread()))
    assert s.result is not None
    assert s.result.reports == (), s.text()
    assert seen == {
        "worker made": None, "worker before": None, "worker counted": "fresh",
        "host made": "host", "host before": "host in run", "host counted": "test" if actors == "greenlet" else "fresh",
    }
    # the test's own thread: its values as the run left them (the run's first actor's, on greenlets)
    assert _BEFORE.value == ("host in run" if actors == "greenlet" else "test")
    assert _COUNTED.value == "test"
