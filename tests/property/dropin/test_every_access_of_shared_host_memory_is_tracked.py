"""Pageable host memory shared between processes is tracked as pinned memory is (CHANGELOG, twenty-sixth sitting),
through every way a program reaches it, beyond ``test_host_memory_shared_between_processes_is_tracked.py``'s whole
tensors: a view at an offset (its address is not its storage's), an H2D copy from it (pageable: the host reads it
as the copy is issued), a write at indices on the device (``table[ids] = 0``: the host's op after the indices' D2H),
its NumPy view, and a tensor shared again (``share_memory_`` of memory already shared keeps what was tracked). Each
program lets the main host's access and the other process's go unordered (a race in every schedule); the same
program ordered by the other process's word is clean."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

import simdevice

N = 1024


def _reads(staging: torch.Tensor, go: Any, done: Any) -> None:
    go.get()
    done.put(float(staging[1:].sum()))


def _writes(staging: torch.Tensor, go: Any, done: Any) -> None:
    go.get()
    staging[1:].fill_(3.0)
    done.put(1)


def _main_writes_a_view(staging: torch.Tensor) -> None:
    staging[1:].fill_(2.0)


def _main_writes_through_numpy(staging: torch.Tensor) -> None:
    staging.numpy()[1:] = 2.0


def _main_writes_at_device_indices(staging: torch.Tensor) -> None:
    staging[torch.arange(1, N, device="cuda")] = 2.0


def _main_copies_it_to_the_device(staging: torch.Tensor) -> None:
    staging[1:].to("cuda")  # (an H2D from pageable memory: staged, the host reads it now)


def _main_shares_it_again_and_writes(staging: torch.Tensor) -> None:
    time.sleep(0.01)  # (the other process has read it by then: what was tracked before must be kept)
    staging.share_memory_()  # (already shared: torch does nothing)
    staging[1:].fill_(2.0)


ACCESSES = {
    "view": (_main_writes_a_view, _reads),
    "numpy": (_main_writes_through_numpy, _reads),
    "device-indices": (_main_writes_at_device_indices, _reads),
    "h2d": (_main_copies_it_to_the_device, _writes),
    "shared-again": (_main_shares_it_again_and_writes, _reads),
}


def _program(access: str, ordered: bool) -> Any:
    """The other process reads (or writes) ``staging[1:]`` once told to go; the main host makes its access after
    the go (unordered with the other process's), or (``ordered``) after the other process's word that it is done."""
    main, other = ACCESSES[access]

    def program() -> None:
        ctx = mp.get_context("spawn")
        staging = torch.zeros(N).share_memory_()
        go, done = ctx.Queue(), ctx.Queue()
        p = ctx.Process(target=other, args=(staging, go, done), name="other", daemon=True)
        p.start()
        go.put(0)
        if ordered:
            done.get()
        else:
            # (a host step after the put: an access of shared memory with none of its own right after a put is
            # taken as the put's, ordered before the other's get, test_a_write_right_after_a_put_races below)
            torch.cuda.synchronize()
        main(staging)
        if not ordered:
            done.get()
        p.join()

    return program


@pytest.mark.parametrize("access", list(ACCESSES))
def test_an_unordered_access_of_shared_memory_races(access: str) -> None:
    run = simdevice.cuda()
    run.run(_program(access, ordered=False))
    races = [r for r in run.result.reports if r.kind == "race"]
    assert races, run.text()
    assert "shared#" in run.text(), run.text()


@pytest.mark.parametrize("access", list(ACCESSES))
def test_the_same_access_after_the_other_process_s_word_is_clean(access: str) -> None:
    run = simdevice.cuda()
    run.run(_program(access, ordered=True))
    run.assert_clean()


def test_memory_shared_outside_a_run_while_a_search_holds_the_patches_is_python_s_own() -> None:
    """A search keeps torch patched across its runs (``session.held``): between them (a config strategy, the
    search's own code) no run is under way, and ``share_memory_`` is torch's, tracked by no run."""
    from simdevice.dropin import session

    with session.held():
        kept = torch.zeros(N).share_memory_()
        assert kept.is_shared()
    run = simdevice.cuda()
    run.run(lambda: kept.add_(1.0))
    run.assert_clean()


def _main_writes_it_whole(staging: torch.Tensor) -> None:
    staging.fill_(2.0)


def _reads_it_whole(staging: torch.Tensor, go: Any, done: Any) -> None:
    go.get()
    done.put(float(staging.sum()))


def _written_right_after_the_put() -> None:
    ctx = mp.get_context("spawn")
    staging = torch.zeros(N).share_memory_()
    go, done = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_reads_it_whole, args=(staging, go, done), name="other", daemon=True)
    p.start()
    go.put(0)
    _main_writes_it_whole(staging)  # (no host step between the put and the write)
    done.get()
    p.join()


def test_a_write_right_after_a_put_races() -> None:
    """On a machine the other process may read the snapshot after the put and before or during the write. An access
    of shared pageable memory has no host step of its own: it was checked with the epoch of its host's last step,
    here the put's, which the other process's get had acquired (a missed race in every schedule); it now takes an
    epoch of its own."""
    assert simdevice.explore(_written_right_after_the_put, max_examples=20).failure is not None


def _child_writes_before_its_first_step(staging: torch.Tensor, done: Any) -> None:
    staging.fill_(3.0)  # (the child's first act: no host step of its own before it)
    done.put(0)


def _read_while_the_child_may_write() -> None:
    ctx = mp.get_context("spawn")
    staging = torch.zeros(N).share_memory_()
    done = ctx.Queue()
    p = ctx.Process(target=_child_writes_before_its_first_step, args=(staging, done), name="other", daemon=True)
    p.start()
    total = float(staging.sum())  # (not ordered after the child's write: no get before it)
    done.get()
    p.join()
    assert total in (0.0, 3.0 * N)


def test_a_child_s_access_before_its_first_step_races() -> None:
    """A child's access before any host step of its own had epoch 0, which every clock covers: it never raced."""
    found = simdevice.explore(_read_while_the_child_may_write, max_examples=20)
    assert found.failure is not None
    assert "race" in {r.kind for r in found.failure.run.reports}, found.failure.text()
