"""Rule (``DropInDevice.pool_stream``): ``torch.cuda.Stream()`` hands out a process's streams from a pool of 32 per
priority, in turn, as c10's ``getStreamFromPool`` does: the 33rd stream a process makes is its first again (equal
handles, one queue), a stream of another priority comes from another pool, and the threads of a process share its
pools (another process has its own). A program that makes a stream per layer therefore orders layer k's work before
layer k + 32's on a GPU: the simulator called that a race before. Each function here runs unchanged on a GPU
(docs/confirmations.md, seventieth run). Mutations: the pool's size 33, one pool for every priority, a pool per
thread: each fails here."""

from __future__ import annotations

import threading

import torch

import simdevice

N = 40


def pool_identity() -> dict[str, bool]:
    """Which handles are the same stream (offsets from a process's first stream do not matter: any 32 apart)."""
    low = [torch.cuda.Stream() for _ in range(N)]
    high = [torch.cuda.Stream(priority=-1) for _ in range(N)]
    return {
        "every 32nd the same": all(low[i] == low[i + 32] for i in range(N - 32)),
        "same CUDA handle": all(low[i].cuda_stream == low[i + 32].cuda_stream for i in range(N - 32)),
        "32 in a row distinct": len({s.cuda_stream for s in low[:32]}) == 32,
        "high pool cycles": all(high[i] == high[i + 32] for i in range(N - 32)),
        "pools apart": not ({s.cuda_stream for s in low} & {s.cuda_stream for s in high}),
    }


def layer_streams(reader: int, stall: bool = False) -> float:
    """Stream 0 of a per-layer list writes a buffer; stream ``reader`` reads it with no event between: ordered where
    ``reader`` is 32 (the same stream), a race where it is 1. ``stall``: on a GPU, stream 0 sleeps first."""
    streams = [torch.cuda.Stream() for _ in range(N)]
    x = torch.ones(1 << 14, device="cuda")
    a = torch.zeros_like(x)
    torch.cuda.synchronize()
    with torch.cuda.stream(streams[0]):
        if stall:
            torch.cuda._sleep(100_000_000)
        a.copy_(x * 2)
    with torch.cuda.stream(streams[reader]):
        b = a + 1
    torch.cuda.synchronize()
    return float(b.sum().item())


def layer_32_reads_layer_0() -> float:
    return layer_streams(32)


def layer_1_reads_layer_0() -> float:
    return layer_streams(1)


def test_the_33rd_stream_is_the_first_and_each_priority_has_its_pool() -> None:
    s = simdevice.cuda()
    s.run(pool_identity)
    assert s.result is not None
    assert s.result.result == {"every 32nd the same": True, "same CUDA handle": True, "32 in a row distinct": True,
                               "high pool cycles": True, "pools apart": True}, s.result.result


def test_a_stream_32_later_is_ordered_after_the_first() -> None:
    assert simdevice.explore(layer_32_reads_layer_0, max_examples=60).failure is None
    found = simdevice.explore(layer_1_reads_layer_0, max_examples=60).failure
    assert found is not None
    assert any(r.kind == "race" for r in found.run.reports), found.text()


def thread_shares_the_pool() -> bool:
    """A thread's stream comes from its process's pools: after the main thread made 32, a thread's first is the main
    thread's first."""
    mine = [torch.cuda.Stream() for _ in range(32)]
    got = []
    t = threading.Thread(target=lambda: got.append(torch.cuda.Stream()))
    t.start()
    t.join()
    return bool(got[0] == mine[0])


def test_the_threads_of_a_process_share_its_pools() -> None:
    s = simdevice.cuda()
    s.run(thread_shares_the_pool)
    assert s.result is not None
    assert s.result.reports == (), s.result.reports
    assert s.result.result is True
