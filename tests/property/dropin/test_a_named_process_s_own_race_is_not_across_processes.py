"""Rule (reports.process_of with an access's ``on``): a race's two accesses are across processes only where their
processes differ, whatever the program named its processes. A process named ``saver`` whose host reads the snapshot
its own side stream still copies is told to synchronize on an event, with no "(across processes: ...)" (before, a
process not named ``rankN`` or ``workerN`` was taken for the main process's stream of that name: its host read and
its own stream were in different processes, and a race between the main process and it was in one)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

import simdevice
from simdevice.explain import suggest
from simdevice.runtime.reports import process_of
from simdevice.search.explore import as_target
from simdevice.timeline import figure, perfetto

N = 256


def _snapshot(x: torch.Tensor, out: Any) -> None:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        snap = x.to("cpu", non_blocking=True)
    out.put(snap.sum().item())  # no synchronize: the host reads what its side stream may still copy


def saver_reads_its_own_copy_early(name: str = "saver") -> None:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    x = torch.ones(N, device="cuda")
    torch.cuda.synchronize()
    p = ctx.Process(target=_snapshot, args=(x, out), name=name)
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
    # every slice, flow and marker is drawn in its track's process
    pids = {e["tid"]: e["pid"] for e in events if e["name"] == "thread_name"}
    drawn = [e for e in events if e["ph"] != "M"]
    assert {e["ph"] for e in drawn} >= {"X", "i", "s", "f"}, {e["ph"] for e in drawn}
    assert [e for e in drawn if e["pid"] != pids[e["tid"]]] == []


def checkpointer_reads_its_own_copy_early() -> None:
    saver_reads_its_own_copy_early("checkpointer")


def test_the_picture_draws_a_named_process_s_lanes_below_the_main_process_s() -> None:
    """The main process's lanes first, then each process's host above its streams: ``checkpointer`` among the main
    process's lanes (before ``default``, by name) was where a process not named ``rankN`` or ``workerN`` was drawn."""
    pytest.importorskip("matplotlib", reason="matplotlib is not installed")
    import matplotlib.pyplot as plt

    found = simdevice.explore(checkpointer_reads_its_own_copy_early, max_examples=20).failure
    assert found is not None
    fig = figure(found)
    try:
        (ax,) = fig.axes
        lanes = [t.get_text() for t in ax.get_yticklabels()]
    finally:
        plt.close(fig)
    assert lanes == ["host", "default", "checkpointer", "checkpointer.default", "checkpointer.side"], lanes


def _reuse_after_the_ack(q: Any, ack: Any) -> None:
    x, other = torch.empty(N, device="cuda"), torch.empty(N, device="cuda")  # (one segment)
    x.fill_(5.0)
    q.put((x, other))
    del x, other
    ack.wait()  # the consumer let go of it
    y = torch.empty(N, device="cuda")  # the sent block
    y.fill_(7.0)
    torch.cuda.synchronize()


def rank_s_consumer_drops_early() -> None:
    """Each rank starts a producer process and reads what it sends on a side stream, drops it and tells the producer,
    which reuses the block: a race between ``rank0.side`` and ``rank0.producer.default``, two processes (the rank's
    and the one it started, ``rank0.producer``), though both names begin with ``rank0.``."""
    ctx = mp.get_context("spawn")
    q, ack = ctx.Queue(), ctx.Event()
    p = ctx.Process(target=_reuse_after_the_ack, args=(q, ack), name="producer")
    p.start()
    x, _kept = q.get()  # (another tensor of the segment kept: the drop waits for the current stream alone)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        s = x.sum()
    del x
    ack.set()
    torch.cuda.current_stream().wait_stream(side)
    assert s.item() == 5 * N
    p.join()


def test_a_race_with_a_process_a_rank_started_is_across_processes() -> None:
    """The fix is across processes, and offers no ``record_stream`` (the block is the producer's: a stream of the
    rank's cannot keep it), as where the main process started the producer."""
    found = simdevice.explore(rank_s_consumer_drops_early, max_examples=20, world_size=2).failure
    assert found is not None
    fix = suggest(as_target(rank_s_consumer_drops_early, world_size=2), found, schedules=20)
    assert fix.checked, fix.lines()
    assert len(fix.advice) == 2, fix.advice  # (one a rank)
    for advice in fix.advice:
        assert "(across processes: an interprocess event, or a handshake the other process waits for)" in advice, advice
        assert "record_stream" not in advice, advice


def _overwrite_after_sending(q: Any, read: Any) -> None:
    x = torch.full((N,), 5.0, device="cuda")
    q.put(x)
    x.fill_(7.0)  # the next values, written before the consumer has read the sent ones: no handshake
    read.wait()


def rank_s_consumer_reads_late() -> None:
    """Each rank starts a producer that overwrites what it sent before the rank has read it: ordered as issued (the
    rank waiting for the write), the read is still wrong, so the fix is a forward edge, a handshake that the
    producer's host waits for, the producer being a process of its own."""
    ctx = mp.get_context("spawn")
    q, read = ctx.Queue(), ctx.Event()
    p = ctx.Process(target=_overwrite_after_sending, args=(q, read), name="producer")
    p.start()
    x = q.get()
    assert x.sum().item() == 5 * N
    read.set()
    p.join()


def test_a_forward_fix_with_a_process_a_rank_started_is_a_handshake() -> None:
    found = simdevice.explore(rank_s_consumer_reads_late, max_examples=20, world_size=2).failure
    assert found is not None
    fix = suggest(as_target(rank_s_consumer_reads_late, world_size=2), found, schedules=20)
    assert fix.checked, fix.lines()
    forward = [(e, a) for e, a in zip(fix.edges, fix.advice, strict=True) if e.forward]
    assert forward, fix.advice
    assert all(a.startswith(f"have `{e.before.actor.rsplit('.', 1)[0]}`'s host wait for `sum` on ") and
               a.endswith(": a handshake") for e, a in forward), fix.advice
