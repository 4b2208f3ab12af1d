"""Rule (threads: ``_PROGRAM_WORK``, ``_future_init``; reports: ``user_source``): the threads and pools
``torch.distributed.checkpoint`` makes do the program's work, so they are the program's threads in a run, as those
its own code starts: ``async_save`` stages on one ``ThreadPoolExecutor`` (``DefaultStager(use_async_staging=True)``)
and writes on another, and the ``Future`` it returns for the staging is one it makes and completes from a callback.
Such a ``Future`` made in a run waits in the run (its condition is the simulator's), so an untimed ``result()`` lets
the pool's worker run. An operation issued where no frame is the program's (the staging thread's copies) is named
by the library's line that issued it. Before, ``async_save`` was refused (no verdict: the device used from a thread
the simulator does not run), and its staging future's ``result()`` stopped every actor (a real condition's wait).

What this finds in a plain program: the staging thread's non-blocking D2H copies run on a stream of the stager's,
which waits for nothing the program queued, so a state dict saved while its last update is still queued is staged
before (or during) that update unless the program synchronizes first; and an update made before the staging
completed races with the copies."""

from __future__ import annotations

import concurrent.futures
import threading
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp  # (imported before the session, as a program imports it)
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

import simdevice

N = 1 << 10


def save_and_load(where: str, async_staging: bool, sync_first: bool, update_staged: bool) -> list[float]:
    dist.init_process_group("cpu:gloo,cuda:nccl")
    torch.cuda.set_device(dist.get_rank())
    w = torch.full((N,), 1.0, device="cuda")
    w.mul_(3.0)  # the step's update, queued
    if sync_first:
        torch.cuda.current_stream().synchronize()
    stager = DefaultStager(StagingOptions(True, False, True, True)) if async_staging else None
    saved = dcp.async_save({"w": w}, checkpoint_id=where, async_stager=stager)
    if async_staging:
        if update_staged:
            saved.staging_completion.result()
        w.add_(100.0)  # the next step
        saved.upload_completion.result()
        stager.close()
    else:
        w.add_(100.0)
        saved.result()
    back = {"w": torch.empty(N)}
    dcp.load(back, checkpoint_id=where)
    dist.destroy_process_group()
    return sorted(set(back["w"].tolist()))


def _run(tmp_path: Path, *args: bool) -> simdevice.Session:
    s = simdevice.cuda()
    s.run(save_and_load, str(tmp_path / "ckpt"), *args, world_size=2)
    return s


def test_async_save_stages_and_writes_on_the_program_s_threads(tmp_path: Path) -> None:
    s = _run(tmp_path, False, False, False)
    s.assert_clean()
    assert s.result.result == [[3.0], [3.0]]


def test_staging_on_a_thread_after_a_synchronize_is_clean(tmp_path: Path) -> None:
    s = _run(tmp_path, True, True, True)
    s.assert_clean()
    assert s.result.result == [[3.0], [3.0]]


def _kinds(s: simdevice.Session) -> set[str]:
    return {r.kind for r in s.result.reports}


def test_staging_while_the_update_is_queued_races_with_it(tmp_path: Path) -> None:
    s = _run(tmp_path, True, False, True)
    assert {"race", "stale-read"} & _kinds(s), s.text()
    races = [r for r in s.result.reports if r.kind == "race"]
    assert any("_state_dict_stager.py:" in str(r) and "mul_" in str(r) for r in races), s.text()


def test_an_update_before_the_staging_completed_races_with_its_copies(tmp_path: Path) -> None:
    s = simdevice.cuda("rank0.stager#0+1")  # (the staging copy stalled past the update)
    s.run(save_and_load, str(tmp_path / "ckpt"), True, True, False, world_size=2)
    assert "race" in _kinds(s), s.text()
    assert any("add_" in str(r) and "_state_dict_stager.py:" in str(r) for r in s.result.reports), s.text()


def handed_over() -> list[float]:
    """A ``Future`` the program makes and a thread of its own completes: ``result()`` and ``wait`` let the thread
    run and order the reader after it."""
    out = torch.zeros(N, device="cuda")
    done: concurrent.futures.Future[int] = concurrent.futures.Future()

    def produce() -> None:
        out.fill_(2.0)
        torch.cuda.current_stream().synchronize()
        done.set_result(7)

    t = threading.Thread(target=produce)
    t.start()
    finished, _ = concurrent.futures.wait([done])
    assert finished == {done}
    k = done.result()
    t.join()
    return [float(k), *sorted(set(out.tolist()))]


def test_a_future_the_program_makes_waits_in_the_run() -> None:
    s = simdevice.cuda()
    s.run(handed_over)
    s.assert_clean()
    assert s.result.result == [7.0, 2.0]
