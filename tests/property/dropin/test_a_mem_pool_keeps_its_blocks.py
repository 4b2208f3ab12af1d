"""``torch.cuda.MemPool`` and ``torch.cuda.use_mem_pool`` on the simulated device: the allocations a thread makes in
the block come from the pool, whose blocks no other allocation takes, and whose segments ``empty_cache`` keeps while
the pool object lives; a CUDA graph captured with ``pool=pool.id`` allocates there too. Before, making a pool raised
``NotImplementedError``: no verdict for a program that uses one (NCCL's symmetric memory, an inference engine's
weight pool). Mutations each fails: allocations in the block from the ordinary pool (the first three tests);
``empty_cache`` giving the pool's segments back while it lives, or never once it is dropped (the third); a graph
given the pool's id capturing into a pool of its own (the fourth).
"""

from __future__ import annotations

import threading

import torch

import simdevice

N = 1 << 12
BIG = 3 << 20  # (12 MiB: past CUDA's 10 MiB, a segment of its own)


def _run(fn: object) -> simdevice.DropIn:
    sim = simdevice.cuda()
    sim.run(fn)  # type: ignore[arg-type]
    return sim


def _routed() -> None:
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        a = torch.ones(N, device="cuda")
        b = torch.ones(N, device="cuda")
    outside = torch.ones(N, device="cuda")
    ids = {seg["segment_pool_id"] for seg in pool.snapshot()}
    assert ids == {pool.id}, ids
    owned = [seg for seg in pool.snapshot() if any(blk["state"] == "active_allocated" for blk in seg["blocks"])]
    assert sum(blk["state"] == "active_allocated" for seg in owned for blk in seg["blocks"]) == 2
    assert all(blk["address"] != outside.data_ptr() for seg in pool.snapshot() for blk in seg["blocks"])
    everything = {seg["segment_pool_id"] for seg in torch.cuda.memory_snapshot()}
    assert everything == {pool.id, (0, 0)}, everything
    freed = a.data_ptr()
    del a
    c = torch.full((N,), 5.0, device="cuda")  # not a's block: the pool's is no ordinary allocation's
    assert c.data_ptr() != freed
    assert torch.equal(b.cpu(), torch.ones(N))
    assert pool.use_count() >= 1


def test_allocations_in_use_mem_pool_come_from_the_pool() -> None:
    run = _run(_routed)
    assert run.clean, run.text()


def _thread_local() -> None:
    pool = torch.cuda.MemPool()
    got: list[int] = []

    def other() -> None:
        t = torch.ones(N, device="cuda")
        got.append(t.data_ptr())

    with torch.cuda.use_mem_pool(pool):
        mine = torch.ones(N, device="cuda")
        worker = threading.Thread(target=other)
        worker.start()
        worker.join()
    pool_blocks = [blk["address"] for seg in pool.snapshot() for blk in seg["blocks"]
                   if blk["state"] == "active_allocated"]
    assert pool_blocks == [mine.data_ptr()], (pool_blocks, mine.data_ptr(), got)


def test_only_the_thread_that_entered_use_mem_pool_allocates_from_it() -> None:
    run = _run(_thread_local)
    assert run.clean, run.text()


def _kept_while_alive() -> None:
    torch.cuda.empty_cache()
    base = torch.cuda.memory_reserved()
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        t = torch.ones(BIG, device="cuda")
    del t
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() == base + BIG * 4  # the pool's free segment kept
    del pool
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() == base


def test_empty_cache_keeps_a_pool_s_segments_while_the_pool_lives() -> None:
    run = _run(_kept_while_alive)
    assert run.clean, run.text()


def _graph_in_the_pool() -> None:
    pool = torch.cuda.MemPool()
    x = torch.ones(N, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, pool=pool.id):
        out = x * 2
    assert {seg["segment_pool_id"] for seg in pool.snapshot()} == {pool.id}
    assert any(blk["address"] == out.data_ptr() for seg in pool.snapshot() for blk in seg["blocks"])
    assert g.pool() == pool.id
    g.replay()
    assert torch.equal(out.cpu(), torch.full((N,), 2.0))


def test_a_graph_given_a_pool_s_id_captures_into_it() -> None:
    run = _run(_graph_in_the_pool)
    assert run.clean, run.text()
