"""Pageable host memory shared between processes (``share_memory_()``, or a host tensor torch moves into shared memory
as it sends it to another process) is tracked as pinned memory is: one process's host reading it while another's
writes it, directly or through a blocking D2H into it, with nothing ordering them (a queue's message, an event, a
join), is a race. A hand-made asynchronous checkpoint that hands a pageable shared snapshot to a saver process and
overwrites it at the next step without the saver's acknowledgement was clean here unless the program checked the
values it saved (no race was named even then: "no two accesses racing")."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

import simdevice

N = 1024


def _saver(staging: torch.Tensor, q: Any, acks: Any) -> None:
    while True:
        step = q.get()
        if step is None:
            break
        acks.put((step, float(staging.sum())))


def _handoff(ack: bool, shared_by: str, steps: int = 3) -> None:
    """The trainer copies its weights into the staging buffer (a blocking D2H into pageable memory, or a host
    ``copy_`` of a host copy), tells the saver, and (``ack``) waits for the saver's acknowledgement of the last one
    before it overwrites the buffer. The program checks nothing: the race alone is the finding."""
    ctx = mp.get_context("spawn")
    staging = torch.zeros(N)
    if shared_by == "share_memory_":
        staging.share_memory_()  # (else torch moves it into shared memory as it sends it)
    q, acks = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_saver, args=(staging, q, acks), daemon=True)
    p.start()
    w = torch.zeros(N, device="cuda")
    for step in range(steps):
        w.add_(1.0)
        if ack and step:
            acks.get()
        if shared_by == "host_copy":
            staging.copy_(w.cpu())
        else:
            staging.copy_(w)
        q.put(step)
    for _ in range(1 if ack else steps):
        acks.get()
    q.put(None)
    p.join()


@pytest.mark.parametrize("shared_by", ["share_memory_", "sent", "host_copy"])
def test_a_snapshot_overwritten_before_the_saver_read_it_races(shared_by: str) -> None:
    found = simdevice.explore(_racy, max_examples=30, config=_just(shared_by))
    assert found.failure is not None
    races = [r for r in found.failure.run.reports if r.kind == "race"]
    assert races, found.failure.text()
    assert "shared#" in found.failure.text()
    assert "on host saver" in found.failure.text() or "on host SpawnProcess" in found.failure.text()


@pytest.mark.parametrize("shared_by", ["share_memory_", "sent", "host_copy"])
def test_a_snapshot_overwritten_after_the_saver_acknowledged_it_is_clean(shared_by: str) -> None:
    assert simdevice.explore(_acked, max_examples=30, config=_just(shared_by)).failure is None


def _racy(shared_by: str = "share_memory_") -> None:
    _handoff(False, shared_by)


def _acked(shared_by: str = "share_memory_") -> None:
    _handoff(True, shared_by)


def _just(shared_by: str) -> Any:
    from hypothesis import strategies as st

    return st.just({"shared_by": shared_by})


def test_shared_memory_is_tracked_in_the_run_that_shared_it_only() -> None:
    """Shared outside a run (or in an earlier run), memory is Python's own: a host op on it is no access."""
    kept = torch.zeros(N).share_memory_()
    run = simdevice.cuda()
    run.run(lambda: kept.add_(1.0))
    run.assert_clean()
    assert float(kept[0]) == 1.0


def _host_ops(share: bool) -> None:
    t = torch.zeros(N)
    if share:
        t.share_memory_()
    t.add_(1.0)
    x = torch.ones(N, device="cuda")
    t.copy_(x)  # (a blocking D2H: an operation of the default stream either way)
    t.mul_(2.0)
    assert float(t.sum()) == 2.0 * N


def test_an_op_on_shared_memory_takes_no_host_step_of_its_own() -> None:
    """As on a GPU, whose counting takes a step for an op on device or pinned memory only: the accesses of shared
    memory are checked within the actor's last step, so a schedule line means the same operations either way."""
    counts = []
    for share in (False, True):
        run = simdevice.cuda()
        run.run(lambda share=share: _host_ops(share))
        run.assert_clean()
        counts.append({k: v for k, v in run.result.op_counts.items() if v})
    assert counts[0] == counts[1], counts
