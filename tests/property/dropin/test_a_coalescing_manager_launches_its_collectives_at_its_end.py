"""Rule (distributed: ``_launched``, ``_coalesce_state``, ``_Group.allreduce_coalesced`` and kin): in torch's own
``torch.distributed._coalescing_manager`` block (Megatron's buckets gather their parameters and reduce their
gradients in one, through the name its module bound at import), the ``all_reduce``,
``all_gather_into_tensor`` and ``reduce_scatter_tensor`` calls on its group are recorded, not issued (an async one
gives torch's ``_IllegalWork``, whose ``wait()`` raises), and launched together at the block's end, in order, on
the group's stream: every reduction with the first one's op; one kind only (torch's error otherwise). With
``async_ops`` the manager holds their work, and what they write is read safely after ``cm.wait()`` alone; without,
the current stream waits at the end. A write to an input after its call and before the block's end is in what is
sent (the launch comes after it). Each rank records in its own state, as each process has its own. Before, the
manager was refused: no verdict for Megatron's DDP and distributed optimizer."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

import simdevice

N = 8
#: torch's manager as an installed package holds it (bound at import, before any session: kept as it is)
HELD = {"manager": dist.distributed_c10d._coalescing_manager}


def _run(fn: Any, *args: Any, schedule: str | None = None) -> Any:
    s = simdevice.cuda(schedule)
    s.run(fn, *args, world_size=2)
    return s


def buckets_gathered(wait: bool, held: bool = False, device: bool = False) -> list[list[float]]:
    """Two buckets' shards gathered in one coalesced launch (Megatron's ``start_param_sync``), read after the
    manager's wait, or not; through the name an installed package bound at import (``held``), given the device or
    not."""
    dist.init_process_group("nccl")
    r = dist.get_rank()
    shards = [torch.full((N,), 10.0 * b + r, device="cuda") for b in range(2)]
    params = [torch.empty(2 * N, device="cuda") for _ in range(2)]
    manager = HELD["manager"] if held else dist._coalescing_manager
    with manager(device=torch.device("cuda", r) if device else None, async_ops=True) as cm:
        for p, s in zip(params, shards, strict=True):
            dist.all_gather_into_tensor(p, s, async_op=True)
    if wait:
        cm.wait()
    out = [sorted(set(p.tolist())) for p in params]
    dist.destroy_process_group()
    return out


@pytest.mark.parametrize(("held", "device"), [(False, False), (True, False), (False, True)])
def test_what_the_block_gathered_is_read_after_the_manager_s_wait(held: bool, device: bool) -> None:
    s = _run(buckets_gathered, True, held, device)
    s.assert_clean()
    assert s.result.result == [[[0.0, 1.0], [10.0, 11.0]]] * 2
    assert s.result.gpu is False  # (a run that coalesces offers no replay on a GPU)


@pytest.mark.parametrize("held", [False, True])
def test_what_the_block_gathered_read_before_its_wait_races(held: bool) -> None:
    s = _run(buckets_gathered, False, held)
    assert "race" in {r.kind for r in s.result.reports}, s.text()
    assert any("all_gather" in str(r) for r in s.result.reports if r.kind == "race"), s.text()


def written_in_the_block(async_ops: bool) -> list[float]:
    """The input written after its all_reduce call, inside the block: the launch at the end sends the new value."""
    dist.init_process_group("nccl")
    grad = torch.full((N,), 1.0, device="cuda")
    with dist._coalescing_manager(async_ops=async_ops) as cm:
        dist.all_reduce(grad)
        grad.add_(2.0)  # (before the launch: in what is sent)
    if async_ops:
        cm.wait()
    out = sorted(set(grad.tolist()))
    dist.destroy_process_group()
    return out


@pytest.mark.parametrize("async_ops", [False, True])
def test_a_write_before_the_block_s_end_is_in_what_it_sends(async_ops: bool) -> None:
    s = _run(written_in_the_block, async_ops)
    s.assert_clean()
    assert s.result.result == [[6.0], [6.0]]


def torch_s_rules() -> list[str]:
    dist.init_process_group("nccl")
    r = dist.get_rank()
    said = []
    a, b = torch.full((N,), 1.0 + r, device="cuda"), torch.full((N,), 1.0 + r, device="cuda")
    with dist._coalescing_manager():
        dist.all_reduce(a, op=dist.ReduceOp.SUM)
        dist.all_reduce(b, op=dist.ReduceOp.MAX)  # (coalesced with the first one's op, as torch does)
    said.append(f"{a[0].item()} {b[0].item()}")
    with dist._coalescing_manager(async_ops=True) as cm:
        work = dist.all_reduce(a, async_op=True)
        with pytest.raises(ValueError, match="Illegal to call wait on IllegalWork object"):
            work.wait()
    cm.wait()
    mixed = dist._coalescing_manager()
    mixed.__enter__()
    dist.all_reduce(a)
    dist.reduce_scatter_tensor(torch.empty(N // 2, device="cuda"), b)
    with pytest.raises(RuntimeError, match="requires all collectives to be the same type"):
        mixed.__exit__(None, None, None)
    said.append(str(len(cm.works)))
    dist.destroy_process_group()
    return said


def test_the_manager_keeps_torch_s_rules() -> None:
    s = _run(torch_s_rules)
    s.assert_clean()
    assert s.result.result == [["3.0 3.0", "1"]] * 2


def reduced_in_shards() -> list[float]:
    dist.init_process_group("nccl")
    r = dist.get_rank()
    grads = [torch.arange(2 * N, dtype=torch.float32, device="cuda") * (r + 1) for _ in range(2)]
    shards = [torch.empty(N, device="cuda") for _ in range(2)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for shard, g in zip(shards, grads, strict=True):
            dist.reduce_scatter_tensor(shard, g, async_op=True)
    cm.wait()
    out = [x for s in shards for x in s.tolist()]
    dist.destroy_process_group()
    return out


def test_reductions_coalesced_give_each_rank_its_shard() -> None:
    s = _run(reduced_in_shards)
    s.assert_clean()
    mine = [[3.0 * x for x in range(k * N, (k + 1) * N)] * 2 for k in range(2)]
    assert s.result.result == mine
