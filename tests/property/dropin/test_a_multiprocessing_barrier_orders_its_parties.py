"""Rule (processes.SimBarrier): ``multiprocessing.Barrier`` in a run orders each party, as it leaves a round, after
every party's past at its arrival; a party that arrives in a round the others never complete waits forever (the
run's deadlock), or for its ``timeout`` of virtual time, after which the barrier is broken (``BrokenBarrierError``,
for it and for every party that waits in it later); ``action`` runs once a round, in its last party; ``wait``
returns each party's place in its round. Before, a program using one as its checkpoint barrier got no verdict
(``NotImplementedError``).

The checkpoint protocol of the zero-cost checkpoint, written with a barrier: the trainer steps a device tensor,
meets the saver at the barrier, which snapshots the tensor, and meets it again before the next step. The barrier
orders the two hosts, not the trainer's stream: the trainer must synchronize before it arrives."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

import simdevice

N = 256


def _run(fn: Any, *args: Any, schedule: str | None = None) -> Any:
    s = simdevice.cuda(schedule)
    s.run(fn, *args)
    assert s.result is not None
    return s.result


def _saver(w: torch.Tensor, barrier: Any, steps: int, seen: Any) -> None:
    for _ in range(steps):
        barrier.wait()  # the step is done
        seen.put(float(w.sum().item()))
        barrier.wait()  # the snapshot is taken: the trainer may step again


def checkpointed(mode: str, steps: int = 2) -> list[float]:
    """``ok``: the trainer synchronizes before it tells the saver; ``no-sync``: it does not (its step may still
    run when the saver reads); ``no-second-wait``: it steps again without waiting for the snapshot."""
    ctx = mp.get_context("spawn")
    barrier, seen = ctx.Barrier(2), ctx.Queue()
    w = torch.zeros(N, device="cuda")
    torch.cuda.synchronize()
    p = ctx.Process(target=_saver, args=(w, barrier, steps, seen), name="saver")
    p.start()
    for _ in range(steps):
        w.add_(1)  # the step
        if mode != "no-sync":
            torch.cuda.synchronize()
        barrier.wait()  # the saver may read
        if mode != "no-second-wait":
            barrier.wait()  # the saver has read
    if mode == "no-second-wait":
        for _ in range(steps):
            barrier.wait()  # (the saver's rounds, met late)
    got = [seen.get() for _ in range(steps)]
    p.join()
    assert got == [float(N * (k + 1)) for k in range(steps)], got
    return got


@pytest.mark.parametrize("schedule", [None, "saver#1+5", "host#2+5", "default#0+5"])
def test_a_checkpoint_that_synchronizes_before_the_barrier_is_clean(schedule: str | None) -> None:
    run = _run(checkpointed, "ok", schedule=schedule)
    assert run.reports == ()
    assert run.result == [float(N), float(2 * N)]


@pytest.mark.parametrize("mode", ["no-sync", "no-second-wait"])
def test_a_checkpoint_the_barrier_does_not_order_races(mode: str) -> None:
    run = _run(checkpointed, mode)
    assert "race" in [r.kind for r in run.reports], [str(r) for r in run.reports]


def _arrive(barrier: Any, places: Any) -> None:
    places.put(barrier.wait())


def three_parties(parties: int) -> list[int]:
    """Two children and the parent meet at a barrier of ``parties``; the action counts the rounds."""
    ctx = mp.get_context("spawn")
    rounds = ctx.Value("i", 0)

    def count() -> None:
        rounds.value += 1

    barrier, places = ctx.Barrier(parties, action=count), ctx.Queue()
    kids = [ctx.Process(target=_arrive, args=(barrier, places), name=f"worker{k}") for k in range(2)]
    for k in kids:
        k.start()
    mine = barrier.wait()
    got = sorted([mine, places.get(), places.get()])
    for k in kids:
        k.join()
    assert rounds.value == 1
    return got


def test_each_party_leaves_with_its_place_and_the_action_runs_once() -> None:
    run = _run(three_parties, 3)
    assert run.reports == ()
    assert run.result == [0, 1, 2]


def test_a_round_the_others_never_complete_is_a_deadlock() -> None:
    run = _run(three_parties, 4)
    assert [r.kind for r in run.reports] == ["deadlock"]
    assert "the other parties of a barrier (3 of 4 arrived)" in str(run.reports[0])


def alone_with_a_timeout() -> list[str]:
    barrier = mp.get_context("spawn").Barrier(2)
    out = []
    for _ in range(2):
        try:
            barrier.wait(timeout=0.05)
            out.append("passed")
        except threading.BrokenBarrierError:
            out.append("broken")
    barrier.reset()
    out.append("broken" if barrier.broken else "whole")
    return out


def test_a_timed_out_wait_breaks_the_barrier_until_it_is_reset() -> None:
    run = _run(alone_with_a_timeout)
    assert run.reports == ()
    assert run.result == ["broken", "broken", "whole"]
