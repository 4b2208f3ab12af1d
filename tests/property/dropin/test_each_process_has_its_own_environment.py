"""Rule (``distributed.RankEnviron``): every process of a run but its first has an environment of its own, as an
operating system gives each process: a copy of its parent's as the parent starts it, or for a rank a launcher
started, the interpreter's with torchrun's variables its own; what a process writes stays its own.

Before, a process a launched rank started (a saving process, a data worker) saw none of the rank's torchrun
variables (``RANK`` unset in it, where on a machine it inherits its parent's), and what a launched rank wrote into
``os.environ`` was the interpreter's, so its peer saw it (rank 0's child read rank 1's value).

Mutations each test fails: a started process's environment not copied from its parent's (the interpreter's
instead), a launched rank's write reaching the interpreter's environment, a child's copy shared with its parent."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

import simdevice

VAR = "SIMDEVICE_TEST_OWN_ENV"


def _report(q: Any) -> None:
    q.put({k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", VAR)})
    os.environ[VAR] = "child"  # its own: its parent does not see it


def launched_rank_child() -> None:
    """Each launched rank writes a value of its own, starts a child, then writes again."""
    dist.init_process_group("nccl")
    rank = os.environ["RANK"]
    os.environ[VAR] = f"rank{rank}"
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_report, args=(q,))
    p.start()
    os.environ[VAR] = f"rank{rank}, after the start"  # not the child's
    got = q.get()
    p.join()
    assert got == {"RANK": rank, "WORLD_SIZE": "2", "LOCAL_RANK": rank, VAR: f"rank{rank}"}, got
    dist.barrier()  # both ranks wrote: each still reads its own
    assert os.environ[VAR] == f"rank{rank}, after the start", os.environ[VAR]
    dist.destroy_process_group()


def host_child() -> None:
    os.environ[VAR] = "host"
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_report, args=(q,))
    p.start()
    os.environ[VAR] = "host, after the start"
    got = q.get()
    p.join()
    assert (got[VAR], got["RANK"]) == ("host", None), got
    assert os.environ[VAR] == "host, after the start", os.environ[VAR]


def _run(fn: Any, world_size: int | None = None) -> Any:
    s = simdevice.cuda()
    if world_size:
        s.run(fn, world_size=world_size)
    else:
        s.run(fn)
    assert s.result is not None
    return s.result


@pytest.fixture(autouse=True)
def _clean_var() -> Any:
    os.environ.pop(VAR, None)
    yield
    os.environ.pop(VAR, None)


def test_a_child_of_a_launched_rank_starts_with_its_environment_and_a_rank_s_writes_are_its_own() -> None:
    run = _run(launched_rank_child, world_size=2)
    assert run.reports == (), run.reports
    assert VAR not in os.environ  # nor did any reach the interpreter's


def test_a_child_of_the_first_process_starts_with_a_copy_of_its_environment() -> None:
    run = _run(host_child)
    assert run.reports == (), run.reports
