"""``torch_memory_saver.region()`` routes the allocations of the thread that entered it, and no other thread's: the
library's region configuration is ``thread_local`` (its ``ThreadLocalConfig``) and torch's ``use_mem_pool``, which
it enters, routes "only current thread's allocations" to the pool (its docstring: a thread started inside the
context allocates outside it). The simulator kept one region stack per process, so an engine thread inside
``region("kv_cache")`` put the trainer thread's plain tensor in the KV cache's pool: the pause unmapped it, and the
trainer's next kernel on it was reported as an illegal access no GPU makes."""

from __future__ import annotations

import threading

import pytest
import torch

import simdevice

N = 1 << 16


def trainer_allocates_while_the_engine_is_in_its_region(touch_kv_while_paused: bool = False) -> float:
    """The engine thread makes its KV cache inside ``region("kv_cache")`` and stays in it while the trainer (the
    main thread, in no region) makes its own tensor; the engine sleeps (pause) and the trainer works on its tensor.
    ``touch_kv_while_paused``: the trainer also writes the paused KV cache, the bug of this pattern."""
    from torch_memory_saver import torch_memory_saver as tms

    inside, done = threading.Event(), threading.Event()
    box: dict[str, torch.Tensor] = {}

    def engine() -> None:
        with tms.region(tag="kv_cache"):
            box["kv"] = torch.zeros(N, device="cuda")
            inside.set()
            done.wait()

    t = threading.Thread(target=engine)
    t.start()
    inside.wait()
    g = torch.ones(N, device="cuda")  # the trainer's own memory: outside any region of its thread
    done.set()
    t.join()
    torch.cuda.synchronize()  # wait: the engine's kernels are done before its memory is unmapped
    tms.pause("kv_cache")
    g.mul_(2.0)
    if touch_kv_while_paused:
        box["kv"].fill_(1.0)
    out = g.sum().item()
    tms.resume("kv_cache")
    return out


def thread_started_inside_a_region() -> float:
    """The main thread is inside ``region("weights")`` when it starts a loader thread; the loader's tensor is not
    the region's (torch: a thread spawned inside ``use_mem_pool`` does not route to its pool)."""
    from torch_memory_saver import torch_memory_saver as tms

    box: dict[str, torch.Tensor] = {}

    def loader() -> None:
        box["buf"] = torch.full((N,), 3.0, device="cuda")

    with tms.region(tag="weights"):
        w = torch.zeros(N, device="cuda")
        t = threading.Thread(target=loader)
        t.start()
        t.join()
    torch.cuda.synchronize()
    tms.pause("weights")
    out = box["buf"].sum().item()  # the loader's buffer is plain memory: readable while the weights sleep
    tms.resume("weights")
    del w
    return out


def test_another_thread_s_allocation_is_not_in_the_region() -> None:
    run = simdevice.cuda().run(trainer_allocates_while_the_engine_is_in_its_region)
    assert not run.reports, [str(r) for r in run.reports]
    assert run.result == 2.0 * N


def test_the_engine_thread_s_own_allocation_is_still_paused() -> None:
    run = simdevice.cuda().run(trainer_allocates_while_the_engine_is_in_its_region, touch_kv_while_paused=True)
    kinds = {r.kind for r in run.reports}
    assert kinds == {"illegal-access"}, [str(r) for r in run.reports]
    assert all("memory_saver.pause('kv_cache')" in str(r) for r in run.reports)
    assert all("fill_" in str(r) for r in run.reports)


def test_a_thread_started_inside_a_region_allocates_outside_it() -> None:
    run = simdevice.cuda().run(thread_started_inside_a_region)
    assert not run.reports, [str(r) for r in run.reports]
    assert run.result == 3.0 * N


@pytest.mark.parametrize("program", [trainer_allocates_while_the_engine_is_in_its_region,
                                     thread_started_inside_a_region])
def test_no_schedule_finds_a_bug_in_the_correct_programs(program: object) -> None:
    assert simdevice.explore(program, max_examples=20).failure is None  # type: ignore[arg-type]
