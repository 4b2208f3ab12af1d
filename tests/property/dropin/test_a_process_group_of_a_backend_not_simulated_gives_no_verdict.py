"""A process group of a backend the simulator does not run (``mpi``, ``ucc``, ``"cpu:mpi,cuda:nccl"``) stops the run
where the program makes it, with a ``NotImplementedError`` naming the backend, so ``check`` gives no verdict; NCCL's
and gloo's run (gloo's: ``test_a_gloo_group_runs_collectives_of_host_tensors.py``). A gloo group was refused so
until the thirty-fifth sitting; before that it was taken for NCCL's: a program that reads pinned memory after a
gloo barrier, with the D2H that fills it still running on the default stream (a race on a GPU: gloo's barrier waits
for no stream), was clean, as NCCL's barrier waits for the current stream, and a gloo all-reduce of a host tensor,
which torch runs, was a host error blamed on the program ("Tensors must be CUDA and dense"): both now as on a
GPU."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.distributed as dist

import simdevice
from simdevice.explain import not_run
from simdevice.search.explore import explore

N = 256


def _read_after_gloo_barrier() -> None:
    cpu_group = dist.new_group(backend="gloo")
    pinned = torch.empty(N, pin_memory=True)
    pinned.copy_(torch.ones(N, device="cuda"), non_blocking=True)
    dist.barrier(group=cpu_group)  # (orders the hosts alone: the copy may still be running)
    assert torch.equal(pinned, torch.ones(N))


def _gloo_all_reduce_of_a_host_tensor() -> None:
    cpu_group = dist.new_group(backend=dist.Backend.GLOO)
    t = torch.ones(4)
    dist.all_reduce(t, group=cpu_group)
    assert t.sum().item() == 8


def _mpi_world() -> None:
    dist.init_process_group("mpi")


def _ucc_group() -> None:
    dist.new_group(backend="ucc")


def _mixed_mpi_world() -> None:
    dist.init_process_group(backend="cpu:mpi,cuda:nccl")


@pytest.mark.parametrize(("program", "backend"), [
    (_mpi_world, "mpi"), (_ucc_group, "ucc"), (_mixed_mpi_world, "cpu:mpi,cuda:nccl"),
])
def test_a_group_of_a_backend_not_simulated_is_no_verdict(program: Callable[[], None], backend: str) -> None:
    found = explore(program, max_examples=5, world_size=2)
    assert found.failure is not None
    unrun = not_run(found.failure)
    assert unrun is not None, found.failure.text()
    assert unrun.error.startswith(f"NotImplementedError: torch.distributed: a process group of backend "
                                  f"{backend!r} is not simulated"), unrun.error


def test_gloo_s_barrier_and_all_reduce_have_a_gpu_s_verdicts() -> None:
    """The two programs that were wrong verdicts, then no verdict: the read after gloo's barrier races; gloo's
    all-reduce of a host tensor is clean."""
    s = simdevice.cuda()
    s.run(_read_after_gloo_barrier, world_size=2)
    assert any(r.kind == "race" for r in s.result.reports), s.text()
    s = simdevice.cuda()
    s.run(_gloo_all_reduce_of_a_host_tensor, world_size=2)
    assert s.clean, s.text()


def _nccl_groups() -> None:
    dist.init_process_group(backend="nccl")
    for g in (dist.new_group(backend="nccl"), dist.new_group(backend=dist.Backend.NCCL), dist.new_group()):
        t = torch.ones(N, device="cuda")
        dist.all_reduce(t, group=g)
        assert t.sum().item() == 2 * N


def test_groups_of_nccl_s_run() -> None:
    s = simdevice.cuda()
    s.run(_nccl_groups, world_size=2)
    assert s.clean, s.text()
