"""Plain torch.distributed programs on a world of one rank, run unchanged on the simulator
(``tests/property/dropin/test_collective_programs.py``: the verdicts) and on one GPU (``tests/gpu/test_dropin_gpu.py``:
the operation counts and the rates): each calls one collective with ``async_op=True``, waits for its work or not, and
reads the output on the default stream. Stalled on ``rank0.nccl`` (``exchange::rank0.nccl#0+20``), a read that does
not wait takes the output before NCCL wrote it.

- ``a2a_single``: ``all_to_all_single`` with split sizes (one rank: its own rows);
- ``a2a``: ``all_to_all`` of lists;
- ``reduce_scatter``: ``reduce_scatter`` of a list;
- ``self_batch``: a ``batch_isend_irecv`` of a send to the rank itself and the receive from itself (NCCL matches the
  two within the group).

``torchrun_style`` is a script written for ``torchrun``: it makes the process group, takes its device from
``LOCAL_RANK`` and ends the group, as each process torchrun starts does; an async ``all_gather_into_tensor`` read
after its wait or not (an ``all_reduce`` in place would not do on one rank: the sum of one is its input, so an early
read reads the right numbers; on an H100 its unwaited read was right 5/5, where the simulator named the stale read).

``future_value`` drops an all-reduce's tensor as soon as its work's future is read: on a stream of the future's
(``then``'s callback stream, or a side stream that calls ``wait()``) that the schedule stalls, and the next
allocation on the default stream zeroes a block of its size. torch's future records its value on that stream, so
the block is held until the stream is past its read: the read is right on both machines under the stall
(``future_value:via=then:rank0.s1#0+20``, ``future_value:via=wait:rank0.side#0+20``). The side stream's read after the
work's own ``wait()`` (``via=work``) holds nothing: the block is zeroed under it on both.

``spawned`` is a script's ``main`` that starts its training processes with ``torch.multiprocessing.spawn`` (run as a
function with no ``--world-size``: its ``nprocs`` ranks are the ones ``spawn`` starts), each making its group with
its rank and the world's size, as ``mp.spawn`` tutorials write it, and gathering as ``torchrun_style`` does.
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

CALLS = ("a2a_single", "a2a", "reduce_scatter", "self_batch")


def exchange(call: str = "a2a_single", wait: bool = True, n: int = 4096) -> None:
    """One collective of ``call`` from ``inp`` into ``out``; ``out`` read after its work's ``wait()`` or not."""
    inp = torch.arange(n, dtype=torch.float32, device="cuda")
    out = torch.zeros(n, device="cuda")
    if call == "a2a_single":
        works = [dist.all_to_all_single(out, inp, [n], [n], async_op=True)]
    elif call == "a2a":
        works = [dist.all_to_all([out], [inp], async_op=True)]
    elif call == "reduce_scatter":
        works = [dist.reduce_scatter(out, [inp], async_op=True)]
    else:
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, inp, dist.get_rank()),
                                        dist.P2POp(dist.irecv, out, dist.get_rank())])
    if wait:
        for work in works:
            work.wait()  # wait: the output must have landed before it is read
    total = out.sum().item()
    for work in works:
        work.wait()
    assert total == n * (n - 1) / 2, f"read {total}: the output before the collective wrote it"


def torchrun_style(wait: bool = True, n: int = 4096) -> None:
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    _gathered(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), wait, n, f"cuda:{local_rank}")
    dist.destroy_process_group()


def _gathered(rank: int, world: int, wait: bool, n: int, device: str) -> None:
    """Each rank's ``rank + 1`` gathered asynchronously, the output read after the work's wait or not."""
    x = torch.full((n,), float(rank + 1), device=device)
    # (into a buffer of its own: an all-reduce of one rank writes the values its input had, so a read before it
    # landed would read the right numbers on a world of one)
    out = torch.zeros(n * world, device=device)
    work = dist.all_gather_into_tensor(out, x, async_op=True)
    if wait:
        work.wait()  # wait: every rank's part must have landed before it is read
    total = out.sum().item()
    work.wait()
    assert total == n * world * (world + 1) / 2, f"rank {rank} read {total}: the buffer before the all-gather wrote it"


def future_value(via: str = "then", n: int = 1 << 18) -> None:
    """An all-reduce's tensor read through its future on another stream, dropped, and its size allocated again."""
    t = torch.full((n,), 2.0, device="cuda")
    out = torch.zeros(n, device="cuda")  # (before the all-reduce, which the callback's stream waits for)
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    if via == "then":
        done = fut.then(lambda f: out.copy_(f.value()[0]))  # on a stream of CUDA's pool (``s1``)
    else:
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            if via == "wait":
                out = fut.wait()[0] * 1
            else:  # the work's wait: it records nothing on the side stream
                work.wait()
                out = t * 1
    del t, fut, work
    time.sleep(0.003)  # (past the all-reduce, which holds its tensor's block until it is done; not past the stall)
    reuse = torch.zeros(n, device="cuda")  # the dropped tensor's block, unless the future's stream holds it
    if via == "then":
        done.wait()
    torch.cuda.synchronize()
    total = out.sum().item() + reuse.sum().item()
    assert total == 2.0 * n * dist.get_world_size(), f"read {total}: the block was zeroed under the future's read"


def collected_futures(via: str = "wait_all", n: int = 1 << 18) -> None:
    """An all-gather's output read on the default stream after ``torch.futures``' collection of its future:
    ``wait_all`` (each future's ``wait()``: the stream waits for the gather), ``collect_all(...).wait()`` alone (a
    future of no device: nothing waits, and the read may come first) or that, then each future's ``wait()``."""
    t = torch.full((n,), 2.0, device="cuda")
    out = torch.zeros(n * dist.get_world_size(), device="cuda")
    fut = dist.all_gather_into_tensor(out, t, async_op=True).get_future()
    if via == "wait_all":
        torch.futures.wait_all([fut])
    else:
        collected = torch.futures.collect_all([fut]).wait()
        if via == "each":
            for f in collected:
                f.wait()
    total = out.sum().item()
    assert total == 2.0 * out.numel(), f"read {total}: the gather had not landed"


def _spawned_rank(rank: int, world: int, wait: bool, n: int) -> None:
    os.environ.setdefault("MASTER_ADDR", "localhost")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=rank, world_size=world)
    torch.cuda.set_device(rank)
    _gathered(rank, world, wait, n, "cuda")
    dist.destroy_process_group()


def spawned(nprocs: int = 1, wait: bool = True, n: int = 4096) -> None:
    """``mp.spawn(train, args=(world, ...), nprocs=world)``: the ranks it starts gather, each reading after the wait
    or not."""
    import torch.multiprocessing as mp

    mp.spawn(_spawned_rank, args=(nprocs, wait, n), nprocs=nprocs, join=True)
