"""Rule (reports.process_of with an access's ``on``): a race's two accesses are across processes only where their
processes differ, whatever the program named its processes. A process named ``saver`` whose host reads the snapshot
its own side stream still copies is told to synchronize on an event, with no "(across processes: ...)" (before, a
process not named ``rankN`` or ``workerN`` was taken for the main process's stream of that name: its host read and
its own stream were in different processes, and a race between the main process and it was in one)."""

from __future__ import annotations

from typing import Any

import torch
import torch.multiprocessing as mp

import simdevice
from simdevice.explain import suggest
from simdevice.runtime.reports import process_of
from simdevice.search.explore import as_target
from simdevice.timeline import perfetto

N = 256


def _snapshot(x: torch.Tensor, out: Any) -> None:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        snap = x.to("cpu", non_blocking=True)
    out.put(snap.sum().item())  # no synchronize: the host reads what its side stream may still copy


def saver_reads_its_own_copy_early() -> None:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    x = torch.ones(N, device="cuda")
    torch.cuda.synchronize()
    p = ctx.Process(target=_snapshot, args=(x, out), name="saver")
    p.start()
    assert out.get() == N
    p.join()


def test_the_fix_of_a_race_within_a_named_process_is_not_across_processes() -> None:
    found = simdevice.explore(saver_reads_its_own_copy_early, max_examples=20).failure
    assert found is not None
    fix = suggest(as_target(saver_reads_its_own_copy_early), found, schedules=20)
    assert fix.checked, fix.lines()
    (advice,) = fix.advice
    assert "synchronize on an event recorded on `saver.side`" in advice, advice
    assert "across processes" not in advice, advice


def test_an_access_s_process_is_its_host_s_or_its_stream_s_prefix() -> None:
    assert [process_of("saver", "host"), process_of("saver.side", "stream"), process_of("side", "stream"),
            process_of("rank1.saver", "host"), process_of("rank1.saver.d2h", "stream"),
            process_of("host", "host")] == ["saver", "saver", "host", "rank1.saver", "rank1.saver", "host"]


def test_the_timeline_puts_a_named_process_s_tracks_in_that_process() -> None:
    """The Perfetto trace's processes and the picture's lanes: ``saver`` and ``saver.side`` are the process
    ``saver``'s (they were the main process's, beside its own host and streams)."""
    found = simdevice.explore(saver_reads_its_own_copy_early, max_examples=20).failure
    assert found is not None
    events = perfetto(found)["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    threads = {e["args"]["name"]: names[e["pid"]] for e in events if e["name"] == "thread_name"}
    assert threads["saver (host)"] == threads["saver.side (stream)"] == "saver", threads
    assert threads["host (host)"] == "host", threads
