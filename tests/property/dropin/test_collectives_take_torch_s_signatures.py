"""Rule (dropin.distributed): each simulated collective takes the parameters of the installed torch's own, so a
program written against torch's signature runs as it would under NCCL. Before, ``broadcast(t, group_src=1)``,
``reduce(t, group_dst=1)``, ``broadcast_object_list(objs, group_src=1)`` and ``barrier(timeout=...)`` raised
TypeError: a host error of the simulator's making where the program was correct. The root is given one way, as
torch's ``_canonicalize_group_rank`` requires: both, or neither, is the program's ValueError."""

from __future__ import annotations

import datetime
import inspect
from typing import Any

import pytest
import torch
import torch.distributed as dist

import simdevice
from reference import cuda_plain
from simdevice.dropin import distributed


@pytest.mark.parametrize("name", distributed.SIMULATED)
def test_every_simulated_collective_takes_torch_s_parameters(name: str) -> None:
    ours = list(inspect.signature(getattr(distributed, name)).parameters)
    torch_s = list(inspect.signature(getattr(dist, name)).parameters)
    assert ours == torch_s, f"{name}: {ours} where torch takes {torch_s}"


def test_roots_given_as_ranks_of_the_group_and_a_timed_barrier_run() -> None:
    got: dict[int, list[Any]] = {}

    def program() -> None:
        r = dist.get_rank()
        t = torch.full((4,), float(r + 10), device="cuda")
        dist.broadcast(t, group_src=1)
        u = torch.full((4,), float(r + 1), device="cuda")
        dist.reduce(u, group_dst=1)
        objs: list[Any] = [f"from {r}"]
        dist.broadcast_object_list(objs, group_src=1)
        dist.barrier(timeout=datetime.timedelta(seconds=60))
        got[r] = [t.cpu().tolist(), u.cpu().tolist(), objs]

    s = simdevice.cuda()
    s.run(program, world_size=2)
    s.assert_clean()
    assert got[0] == [[11.0] * 4, [1.0] * 4, ["from 1"]]
    assert got[1] == [[11.0] * 4, [3.0] * 4, ["from 1"]]


def test_a_root_given_both_ways_is_the_program_s_error() -> None:
    def program() -> None:
        dist.broadcast(torch.ones(4, device="cuda"), src=0, group_src=0)

    s = simdevice.cuda()
    s.run(program, world_size=2)
    errors = [str(r) for r in s.reports]
    assert errors
    assert all("ValueError: Can't specify both group_rank and global_rank" in e for e in errors), errors


def test_a_gpu_run_counts_every_call_the_simulator_runs() -> None:
    # ``replay --gpu`` counts each call as the simulator does (reference/cuda_plain.py wraps it); a call the simulator
    # runs that the GPU run does not wrap shifts every later operation's index there (all_to_all and reduce_scatter
    # of lists were simulated before a GPU run counted them)
    counted = {*cuda_plain.COLLECTIVES, *cuda_plain.HOST_COLLECTIVES, *cuda_plain.POINT_TO_POINT}
    assert counted == set(distributed.SIMULATED)
