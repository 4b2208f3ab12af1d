"""Rule (distributed: ``_backends_of``, ``_via_gloo``, ``_gloo_exchange``): a process group whose CPU backend is gloo
(``init_process_group("gloo")``, ``new_group(backend="gloo")``, ``"cpu:gloo,cuda:nccl"``, as Megatron's and
``torch.distributed.checkpoint``'s side groups are) runs collectives of host tensors as gloo does: one host step,
in which the host reads what it sends (pinned memory checked as the host's read), blocks until every rank has given
its part, and writes what it receives (checked as the host's write); nothing on a stream. Its barrier orders the
hosts alone. Such a run offers no replay on a GPU. A device tensor on gloo, gloo's asynchronous work and its calls
not simulated are refused (no verdict), as is a backend other than NCCL's and gloo's. Before, every gloo group was
refused: no verdict for any program that made one."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

import simdevice
from simdevice.explain import not_run
from simdevice.search.explore import explore

N = 1 << 12


def _run(fn: Any, *args: Any, schedule: str | None = None) -> Any:
    s = simdevice.cuda(schedule)
    s.run(fn, *args, world_size=2)
    return s


def every_collective(backend: str) -> list[str]:
    """Each collective gloo runs, of host tensors, on two ranks: torch's results."""
    dist.init_process_group(backend)
    r, w = dist.get_rank(), dist.get_world_size()
    t = torch.full((4,), float(r + 1))
    dist.all_reduce(t)
    assert t.tolist() == [3.0] * 4
    b = torch.full((4,), float(r))
    dist.broadcast(b, src=1)
    assert b.tolist() == [1.0] * 4
    outs = [torch.empty(4) for _ in range(w)]
    dist.all_gather(outs, torch.full((4,), float(r)))
    assert [o.tolist() for o in outs] == [[0.0] * 4, [1.0] * 4]
    flat = torch.empty(2, 4)
    dist.all_gather_into_tensor(flat, torch.full((4,), float(r)))
    assert flat.tolist() == [[0.0] * 4, [1.0] * 4]
    shard = torch.empty(4)
    dist.reduce_scatter_tensor(shard, torch.arange(8, dtype=torch.float32) * (r + 1))
    assert shard.tolist() == [3.0 * x for x in range(4 * r, 4 * r + 4)]
    red = torch.full((4,), 2.0 + 2 * r)
    dist.reduce(red, dst=0)
    assert red.tolist() == ([6.0] * 4 if r == 0 else [4.0] * 4)  # (written on dst alone)
    top = torch.full((4,), 1.0 + r)
    dist.all_reduce(top, op=dist.ReduceOp.MAX)
    assert top.tolist() == [2.0] * 4
    gathered = [torch.empty(4) for _ in range(w)] if r == 0 else None
    dist.gather(torch.full((4,), float(r)), gathered, dst=0)
    assert gathered is None or [g.tolist() for g in gathered] == [[0.0] * 4, [1.0] * 4]
    piece = torch.empty(4)
    dist.scatter(piece, [torch.full((4,), 10.0 + q) for q in range(w)] if r == 1 else None, src=1)
    assert piece.tolist() == [10.0 + r] * 4
    mixed = torch.empty(3 if r == 0 else 5)
    dist.all_to_all_single(mixed, torch.arange(4, dtype=torch.float32) + 10 * r,
                           output_split_sizes=[1, 2] if r == 0 else [3, 2], input_split_sizes=[1, 3] if r == 0
                           else [2, 2])
    assert mixed.tolist() == ([0.0, 10.0, 11.0] if r == 0 else [1.0, 2.0, 3.0, 12.0, 13.0])
    dist.barrier()
    names = [None, None]
    dist.all_gather_object(names, f"rank{r}")
    assert names == ["rank0", "rank1"]
    with pytest.raises(RuntimeError, match=r"Cannot use ReduceOp\.AVG with Gloo"):
        dist.all_reduce(torch.ones(2), op=dist.ReduceOp.AVG)
    return [dist.get_backend(), dist.get_backend(dist.new_group(backend="gloo")), dist.get_backend(dist.new_group())]


def test_every_collective_of_host_tensors_gives_torch_s_results() -> None:
    s = _run(every_collective, "gloo")
    s.assert_clean()
    assert s.result.result == [["gloo", "gloo", "gloo"]] * 2


def test_a_side_group_of_gloo_leaves_the_world_s_nccl() -> None:
    def program() -> list[Any]:
        g = dist.new_group(backend="gloo")
        t = torch.ones(2)
        dist.all_reduce(t, group=g)
        d = torch.ones(2, device="cuda")
        dist.all_reduce(d)
        with pytest.raises(ValueError, match="Tensors must be CUDA and dense"):
            dist.all_reduce(torch.ones(2))  # (the world's NCCL, as ProcessGroupNCCL refuses it)
        return [t.tolist(), d.cpu().tolist(), dist.get_backend(), dist.get_backend(g)]

    s = _run(program)
    s.assert_clean()
    assert s.result.result == [[[2.0, 2.0], [2.0, 2.0], "nccl", "gloo"]] * 2


def host_copy_reduced(wait: int) -> None:
    """A checkpoint's pinned host copy, made by a non-blocking D2H, summed across the ranks on gloo, the stream
    synchronized before (``wait``) or not."""
    dist.init_process_group("cpu:gloo,cuda:nccl")
    w = torch.full((N,), float(dist.get_rank() + 1), device="cuda")
    host = torch.empty(N, pin_memory=True)
    host.copy_(w, non_blocking=True)
    if wait:
        torch.cuda.current_stream().synchronize()
    dist.all_reduce(host)
    assert host.tolist() == [3.0] * N, "summed what the D2H had not written"


def test_gloo_reads_a_pinned_buffer_as_the_host_reads_it() -> None:
    _run(host_copy_reduced, 1).assert_clean()
    s = _run(host_copy_reduced, 0)
    assert not s.clean
    assert "all_reduce (gloo) on host rank0" in s.text(), s.text()
    assert "read pinned#" in s.text(), s.text()


def written_under_an_upload(wait: int) -> None:
    """Gloo broadcasts into a pinned buffer that a non-blocking H2D still reads, the stream synchronized before
    (``wait``) or not: the upload may take the broadcast's values."""
    dist.init_process_group("cpu:gloo,cuda:nccl")
    r = dist.get_rank()
    host = torch.full((N,), float(r), pin_memory=True)
    dev = torch.empty(N, device="cuda")
    dev.copy_(host, non_blocking=True)
    if wait:
        torch.cuda.current_stream().synchronize()
    dist.broadcast(host, src=0)
    assert dev.cpu().tolist() == [float(r)] * N, "the upload took the broadcast's values"


def test_gloo_writes_a_pinned_buffer_as_the_host_writes_it() -> None:
    _run(written_under_an_upload, 1, schedule="rank1.default#0+5").assert_clean()
    s = _run(written_under_an_upload, 0, schedule="rank1.default#0+5")
    assert "broadcast (gloo) on host rank1" in s.text(), s.text()


def read_after_a_barrier(wait: int, backend: str) -> None:
    dist.init_process_group(backend)
    host = torch.empty(N, pin_memory=True)
    host.copy_(torch.arange(N, device="cuda", dtype=torch.float32), non_blocking=True)
    dist.barrier()
    if wait:
        torch.cuda.synchronize()
    assert torch.equal(host, torch.arange(N, dtype=torch.float32)), "read before the D2H landed"


@pytest.mark.parametrize("backend", ["gloo", "cpu:gloo,cuda:nccl"])
def test_a_gloo_barrier_orders_the_hosts_not_the_streams(backend: str) -> None:
    _run(read_after_a_barrier, 1, backend).assert_clean()
    assert not _run(read_after_a_barrier, 0, backend).clean
    _run(read_after_a_barrier, 0, "nccl").assert_clean()  # (NCCL's barrier waits for the current stream)


def counted(backend: str) -> None:
    dist.init_process_group(backend)
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    dist.barrier()


def test_a_gloo_collective_is_one_host_step_and_no_stream_operation() -> None:
    """(A run with a gloo group offers no replay on a GPU, whose run's group is NCCL's alone; one of NCCL's does.)"""
    s = _run(counted, "gloo")
    assert not s.result.gpu
    assert _run(lambda: dist.init_process_group("nccl")).result.gpu
    counts = s.result.op_counts
    assert {a: n for a, n in counts.items() if "nccl" in a} == {}
    steps = {a: n for a, n in counts.items() if a in ("rank0", "rank1")}
    base = {a: n for a, n in _run(lambda: dist.init_process_group("gloo")).result.op_counts.items()
            if a in ("rank0", "rank1")}
    assert {a: n - base[a] for a, n in steps.items()} == {"rank0": 4, "rank1": 4}


def _async() -> None:
    dist.init_process_group("gloo")
    dist.all_reduce(torch.ones(2), async_op=True)


def _device_tensor() -> None:
    dist.init_process_group("gloo")
    dist.all_reduce(torch.ones(2, device="cuda"))


def _send() -> None:
    dist.init_process_group("gloo")
    dist.send(torch.ones(2), 1 - dist.get_rank())


def _async_barrier() -> None:
    dist.init_process_group("gloo")
    dist.barrier(async_op=True)


def _mpi() -> None:
    dist.init_process_group("mpi")


@pytest.mark.parametrize(("program", "says"), [
    (_async, "torch.distributed.all_reduce(async_op=True) on a gloo process group is not simulated"),
    (_device_tensor, "torch.distributed.all_reduce of a device tensor on a gloo process group is not simulated"),
    (_send, "torch.distributed.point-to-point call"),
    (_async_barrier, "torch.distributed.barrier(async_op=True) on a gloo process group is not simulated"),
    (_mpi, "torch.distributed: a process group of backend 'mpi' is not simulated"),
], ids=["async", "device-tensor", "send", "async-barrier", "mpi"])
def test_what_is_not_simulated_of_gloo_and_other_backends_is_no_verdict(program: Any, says: str) -> None:
    found = explore(program, max_examples=1, world_size=2)
    assert found.failure is not None
    unrun = not_run(found.failure)
    assert unrun is not None, found.failure.text()
    assert unrun.error.startswith(f"NotImplementedError: {says}"), unrun.error
