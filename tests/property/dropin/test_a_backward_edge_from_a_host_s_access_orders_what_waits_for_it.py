"""An inserted backward edge (``A@L1->B@L2``, ``--edge``) whose ``after`` site is a host's access of memory the
device reaches (a thread filling a pinned buffer; CHANGELOG, twenty-sixth sitting: a host's access is a handshake's
start): the operation at ``before`` waits for the latest access the host made there before it, as it waits for a
stream's latest operation. A thread fills a pinned buffer; the main host, having slept long enough for the fill to
come first (virtual time), copies the buffer to the device without joining the thread: a race, which the edge from
the fill to the copy orders (and the edge matched an access at both of its sites)."""

from __future__ import annotations

import threading
import time

import torch

import simdevice
from simdevice.runtime import Edge, inserted

N = 1024


def _fill(buf: torch.Tensor) -> None:
    buf.fill_(1.0)


def filled_then_copied() -> None:
    buf = torch.zeros(N, pin_memory=True)
    t = threading.Thread(target=_fill, args=(buf,), name="filler")
    t.start()
    time.sleep(0.01)  # (the thread's fill comes first: a latest access for the copy to wait for)
    dev = buf.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    t.join()
    assert bool((dev == 1).all()), "the copy read the buffer before the thread filled it"


def _edge() -> Edge:
    """From the fill's line on the thread to the copy's line on the default stream, as the race names them."""
    run = simdevice.cuda()
    run.run(filled_then_copied)
    (race,) = [r for r in run.result.reports if r.kind == "race"]
    fill, copy = sorted((race.previous, race.current), key=lambda x: x.actor != "filler")
    assert (fill.actor, copy.actor) == ("filler", "default"), race
    return Edge.parse(f"filler@{fill.source}->default@{copy.source}")


def test_without_the_edge_the_copy_races_with_the_fill() -> None:
    run = simdevice.cuda()
    run.run(filled_then_copied)
    assert "race" in {r.kind for r in run.result.reports}, run.text()


def test_the_edge_from_the_host_s_fill_orders_the_copy_after_it() -> None:
    with inserted([_edge()]):
        run = simdevice.cuda()
        run.run(filled_then_copied)
    run.assert_clean()
    assert not [n for n in run.result.notes if "matched no operation" in n], run.result.notes
