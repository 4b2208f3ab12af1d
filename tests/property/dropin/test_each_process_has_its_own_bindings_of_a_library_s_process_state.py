"""Rule (execution: ``PROCESS_MODULES``, ``Execution._own_modules``, ``modules_back``): a module in which a
distributed library binds its per-process state (Megatron's ``parallel_state``: its process groups, which
``initialize_model_parallel()`` asserts are not made yet; its RNG tracker) has its own bindings in each simulated
process, as in each real one: each process starts from them as the run found them, keeps what it binds, and after a
run of more than one process the module holds them as the run found them again, so the next run starts as fresh
processes do. The processes share one interpreter, so before, the second rank found the first rank's groups made
(``AssertionError: ... is already initialized``: no verdict for any Megatron program of two ranks)."""

from __future__ import annotations

import sys
import types

import pytest
import torch
import torch.distributed as dist

import simdevice
from simdevice.runtime import execution

NAME = "simdevice_test_parallel_state"


@pytest.fixture
def state(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """A library's per-process state, as Megatron's ``parallel_state`` keeps it."""
    module = types.ModuleType(NAME)
    exec("GROUP = None\nCALLS = 0\n\ndef initialize(g):\n    global GROUP, CALLS\n    assert GROUP is None, "
         "'model parallel group is already initialized'\n    GROUP = g\n    CALLS += 1\n\ndef group():\n"
         "    return GROUP\n", vars(module))
    monkeypatch.setitem(sys.modules, NAME, module)
    monkeypatch.setattr(execution, "PROCESS_MODULES", (*execution.PROCESS_MODULES, NAME))
    return module


def ranks_initialize() -> list[object]:
    lib = sys.modules[NAME]
    dist.init_process_group("nccl")
    r = dist.get_rank()
    lib.initialize(f"group of rank {r}")
    x = torch.full((4,), float(r), device="cuda")
    dist.all_reduce(x)  # (the ranks take turns here, each binding its own)
    torch.cuda.synchronize()
    mine = lib.group()
    dist.destroy_process_group()
    return [mine, lib.CALLS, float(x[0])]


def test_each_rank_binds_its_own_and_the_run_leaves_them_as_it_found_them(state: types.ModuleType) -> None:
    for _ in range(2):  # (the second run starts as fresh processes do)
        s = simdevice.cuda()
        s.run(ranks_initialize, world_size=2)
        s.assert_clean()
        assert s.result.result == [["group of rank 0", 1, 1.0], ["group of rank 1", 1, 1.0]]
        assert state.GROUP is None
        assert state.CALLS == 0


def test_a_run_of_one_process_keeps_what_it_bound(state: types.ModuleType) -> None:
    def program() -> object:
        sys.modules[NAME].initialize("the host's")
        return sys.modules[NAME].group()

    s = simdevice.cuda()
    s.run(program)
    s.assert_clean()
    assert s.result.result == "the host's"
    assert state.GROUP == "the host's"  # (one process: the caller's own, as before)


def test_the_run_s_end_gives_the_bindings_back_to_its_first_process(state: types.ModuleType) -> None:
    """Where another process ran last, the run's end puts the first process's bindings back (the caller's)."""
    from simdevice import SimDevice

    ex = SimDevice().runtime.execution
    host = ex.new_actor("host", None)
    worker = ex.new_actor("worker", host, process=True)
    ex.own_generator(host)
    state.initialize("the host's")
    ex.own_generator(worker)
    assert state.GROUP is None  # (the worker's own: as the run found them)
    state.initialize("the worker's")
    ex.modules_back()
    assert state.GROUP == "the host's"


def test_ranks_start_afresh_whatever_a_run_of_one_process_bound(state: types.ModuleType) -> None:
    """A run of one process binds the state (Megatron's RNG tracker made by an earlier single-process run, as in a
    test suite); a later run's ranks each start from the module as first seen, and the caller's binding stays."""
    first = simdevice.cuda()
    first.run(ranks_initialize_alone)
    first.assert_clean()
    assert state.GROUP == "the caller's"
    s = simdevice.cuda()
    s.run(ranks_initialize, world_size=2)
    s.assert_clean()
    assert s.result.result == [["group of rank 0", 1, 1.0], ["group of rank 1", 1, 1.0]]
    assert state.GROUP == "the caller's"


def ranks_initialize_alone() -> None:
    sys.modules[NAME].initialize("the caller's")
