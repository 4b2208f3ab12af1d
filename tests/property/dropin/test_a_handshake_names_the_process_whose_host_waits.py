"""A race whose two sides are two hosts' gets a handshake (CHANGELOG, twenty-sixth sitting), named in the program's
words on both sides: where the host that must wait is another process's (the saver reads the shared snapshot before
the trainer has written it), the fix says "the host of `saver`", as it names the host it waits for, not the bare
process name ``_where`` gives a stream's side."""

from __future__ import annotations

from typing import Any

import torch
import torch.multiprocessing as mp

import simdevice
from simdevice.explain import suggest
from simdevice.search.explore import as_target

N = 1024


def _saver(staging: torch.Tensor, go: Any, saved: Any) -> None:
    go.get()
    saved.put(float(staging.sum()))


def read_before_written() -> None:
    """The trainer tells the saver to go, then writes the snapshot: the saver must have saved what it wrote."""
    ctx = mp.get_context("spawn")
    staging = torch.zeros(N).share_memory_()
    go, saved = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_saver, args=(staging, go, saved), name="saver", daemon=True)
    p.start()
    go.put(0)
    torch.cuda.synchronize()  # (a host step between the put and the write)
    staging.fill_(1.0)
    total = saved.get()
    p.join()
    assert total == float(N), total


def test_the_saver_s_host_is_named_as_the_one_that_waits() -> None:
    found = simdevice.explore(read_before_written, max_examples=40).failure
    assert found is not None
    assert "race" in {r.kind for r in found.run.reports}, found.text()
    fix = suggest(as_target(read_before_written), found, schedules=20)
    assert fix.checked, fix.lines()
    assert any(a.startswith("have the host of `saver` wait for a handshake from the host after `fill_`")
               for a in fix.advice), fix.advice
