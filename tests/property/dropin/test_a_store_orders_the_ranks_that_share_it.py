"""Rule (stores.SimStore): a ``TCPStore``, ``FileStore`` or ``HashStore`` made in a run shares its keys with every
store of its address in the run; a ``get`` or ``wait`` waits for the key another rank or process sets, without
blocking the run, and is then ordered after that ``set`` (an ``add`` after the adds before it). It orders the hosts,
not their streams. Before, the store was torch's own: a rank's ``wait`` for a key its peer sets blocked the run's
one thread until the store's timeout (``DistStoreError``, a host error of a correct program) or for good.

The programs: a hand-written distributed checkpoint (each rank stages its shard to the host and publishes it in the
store, meets the others at a barrier made of ``add`` and ``wait``, then rank 0 writes the metadata of every shard);
and a producer that shares a CUDA buffer with a consumer process once and hands each step over through a store
flag, with and without synchronizing its side stream before it sets the flag."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import simdevice

N = 256
TIMEOUT = timedelta(seconds=2)  # (torch's own store would raise after this, rather than hang the test)


def _run(fn: Any, *args: Any, world_size: int | None = None, schedule: str | None = None) -> Any:
    s = simdevice.cuda(schedule)
    s.run(fn, *args, world_size=world_size)
    assert s.result is not None
    return s.result


def checkpoint(kind: str, sync: bool = True, path: str = "") -> list[str] | None:
    """Each rank stages its shard into pinned memory, publishes it, arrives at the store's barrier; rank 0 reads
    every shard's entry after it (``sync=False``: the staging copy is not waited for); ``kind`` ``file``: a
    ``PrefixStore`` over a ``FileStore`` at ``path``."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if kind == "tcp":
        store = dist.TCPStore("127.0.0.1", 29651, world, rank == 0, timeout=TIMEOUT)
    else:
        files = dist.FileStore(path, world)
        files.set_timeout(TIMEOUT)
        store = dist.PrefixStore("ckpt", files)
    shard = torch.full((8,), float(rank + 1), device="cuda")
    host = torch.empty(8, pin_memory=True)
    host.copy_(shard, non_blocking=True)
    if sync:
        torch.cuda.current_stream().synchronize()
    store.set(f"shard/{rank}", ",".join(f"{v:g}" for v in host.tolist()))
    if store.add("arrived", 1) == world:  # the last to arrive opens the barrier
        store.set("all", "1")
    store.wait(["all"])
    if rank != 0:
        return None
    meta = [store.get(f"shard/{r}").decode() for r in range(world)]
    assert meta == [",".join([f"{r + 1}"] * 8) for r in range(world)], meta
    return meta


@pytest.mark.parametrize("kind", ["tcp", "file"])
@pytest.mark.parametrize("schedule", [None, "rank0#2+5", "rank1#3+5", "rank1.default#0+5"])
def test_a_checkpoint_whose_ranks_meet_in_a_store_is_clean(kind: str, schedule: str | None, tmp_path: Any) -> None:
    run = _run(checkpoint, kind, True, str(tmp_path / "store"), world_size=2, schedule=schedule)
    assert run.reports == (), [str(r) for r in run.reports]
    assert run.gpu is False  # (``replay --gpu`` refuses the program's stores: their steps are not counted there)


def test_a_store_orders_the_hosts_not_their_streams() -> None:
    run = _run(checkpoint, "tcp", False, world_size=2)
    assert "race" in [r.kind for r in run.reports], [str(r) for r in run.reports]


def _consumer(buf: torch.Tensor, out: Any, steps: int) -> None:
    store = dist.TCPStore("127.0.0.1", 29652, 2, False, timeout=TIMEOUT)
    for i in range(steps):
        store.wait([f"ready{i}"])
        out.put(buf.sum().item())
        store.set(f"done{i}", "1")


def handoff(sync: bool, steps: int = 2) -> None:
    """The producer fills the shared buffer on a side stream and sets the step's flag (``sync``: after
    synchronizing the side stream); the consumer process waits for the flag and reads the buffer."""
    ctx = mp.get_context("spawn")
    store = dist.TCPStore("127.0.0.1", 29652, 2, True, timeout=TIMEOUT)
    buf = torch.zeros(N, device="cuda")
    out = ctx.Queue()
    p = ctx.Process(target=_consumer, args=(buf, out, steps), name="consumer")
    p.start()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    for i in range(steps):
        with torch.cuda.stream(side):
            buf.fill_(float(i + 1))
        if sync:
            side.synchronize()
        store.set(f"ready{i}", "1")
        assert out.get() == (i + 1) * N
        store.wait([f"done{i}"])
    p.join()


@pytest.mark.parametrize("schedule", [None, "side#1+5", "consumer#0+5", "host#3+5"])
def test_a_handoff_through_a_store_flag_after_a_synchronize_is_clean(schedule: str | None) -> None:
    run = _run(handoff, True, schedule=schedule)
    assert run.reports == (), [str(r) for r in run.reports]


def handoff_without_a_synchronize() -> None:
    handoff(False)


def test_a_handoff_through_a_store_flag_without_a_synchronize_is_found() -> None:
    found = simdevice.explore(handoff_without_a_synchronize, max_examples=30)
    assert found.failure is not None
    assert "stale read" in found.failure.text()


def test_a_key_no_one_sets_is_a_deadlock_and_a_timed_wait_raises() -> None:
    def never() -> None:
        store = dist.HashStore()
        store.set_timeout(TIMEOUT)
        store.get("nothing")

    def timed() -> bool:
        try:
            dist.HashStore().wait(["nothing"], timedelta(milliseconds=50))
        except dist.DistStoreError:
            return True
        return False

    assert "deadlock" in [r.kind for r in _run(never).reports]
    run = _run(timed)
    assert run.reports == ()
    assert run.result is True


def test_a_store_answers_as_torch_s_hash_store() -> None:
    """The same calls on a simulated store and on torch's own give the same answers."""

    def calls(store: Any) -> list[Any]:
        store.set("a", "x")
        return [store.compare_set("b", "", "y"), store.compare_set("c", "q", "y"), store.compare_set("a", "z", "w"),
                store.compare_set("a", "x", "w"), store.get("a"), store.add("n", 2), store.add("n", 3),
                store.get("n"), store.check(["a", "c"]), store.num_keys(), store.delete_key("a"),
                store.delete_key("zz"), store.append("p", "x"), store.append("p", b"y"), store.get("p"),
                store.multi_get(["p", "b"])]

    real = calls(dist.HashStore())
    assert _run(lambda: calls(dist.HashStore())).result == real


def test_a_gpu_run_refuses_a_store_the_program_makes() -> None:
    from reference import cuda_plain

    with pytest.raises(NotImplementedError, match=r"stores a program makes .* are not replayed on a GPU yet"):
        cuda_plain._no_stores("127.0.0.1", 29653)
