"""The timeline (``--png``, ``--perfetto``) finds the host step a host's access was made in (CHANGELOG, twenty-sixth
sitting), beyond ``test_a_race_between_two_hosts_gets_a_handshake.py``'s "some host step of the right actor": the
very step that made it, which carries the access's line. An access made as its step began (a thread's ``fill_`` of
pinned memory, the main host's ``sum`` of it) is in the step begun at that moment, not an earlier one of the same
host; one made later than its step began (the saver's ``sum`` of shared memory, after its queue's ``get`` waited)
is in the last step its host began by then, not the first."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

import simdevice
from simdevice import timeline

N = 1024


def _saver(staging: torch.Tensor, q: Any, acks: Any) -> None:
    while True:
        step = q.get()
        if step is None:
            break
        acks.put(float(staging.sum()))


def snapshot_overwritten(late: bool = False) -> None:
    """The trainer overwrites a shared snapshot at each step without the saver's acknowledgement of the last
    (``late``: it starts late, so that the saver's ``get`` waits, and its ``sum`` is made after its step began)."""
    ctx = mp.get_context("spawn")
    staging = torch.zeros(N).share_memory_()
    q, acks = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_saver, args=(staging, q, acks), name="saver", daemon=True)
    p.start()
    if late:
        time.sleep(0.01)
    for step in range(3):
        staging.copy_(torch.full((N,), float(step + 1)))
        q.put(step)
    saved = [acks.get() for _ in range(3)]
    q.put(None)
    p.join()
    assert saved == [float(N * (k + 1)) for k in range(3)], saved


def snapshot_overwritten_late() -> None:
    snapshot_overwritten(late=True)


def filled_by_a_thread() -> None:
    """A thread fills a pinned buffer; the main host reads it without joining the thread first."""
    buf = torch.zeros(N, pin_memory=True)
    t = threading.Thread(target=lambda: buf.fill_(1.0), name="filler")
    t.start()
    total = float(buf.sum())
    t.join()
    assert total == float(N), total


@pytest.mark.parametrize("program", [filled_by_a_thread, snapshot_overwritten,
                                     snapshot_overwritten_late])
def test_each_side_of_a_race_between_hosts_is_the_step_that_made_it(program: Any) -> None:
    found = simdevice.explore(program, max_examples=40).failure
    assert found is not None
    ss = timeline.slices(found)
    races = [r for r in found.run.reports if r.kind == "race"]
    assert races
    for race in races:  # (each side of each: the copy after a put races with the saver's sum too, since that fix)
        for access in (race.previous, race.current):
            s = timeline._accessor(ss, found, access)
            assert s is not None, access
            assert (s.kind, s.actor) == ("host", access.actor), (access, s)
            assert s.source == access.source, (access, s)
