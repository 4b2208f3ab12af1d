"""Rule (execution: ``graph_task``): ``torch._C._current_graph_task_id()`` answers each actor its own graph task.
Greenlet actors share a thread, where autograd keeps the graph task of a backward: an actor suspended inside its
backward left it for the next, and FSDP2's ``is_bw()`` then took another rank's forward for a recomputation in a
backward (it skipped its reshard, and the ranks' collectives differed). A mutation that answers the thread's task
fails here."""

from __future__ import annotations

import torch
import torch.distributed as dist

import simdevice


def tasks() -> list[int]:
    seen: list[int] = []
    if dist.get_rank() == 1:
        x = torch.ones(2, device="cuda", requires_grad=True)

        def hook(grad: torch.Tensor) -> torch.Tensor:
            seen.append(torch._C._current_graph_task_id())
            dist.barrier()  # (rank1 stops inside its backward until rank0 reaches the barrier)
            return grad

        y = x * 3
        y.register_hook(hook)
        y.sum().backward()
    else:
        torch.ones(2, device="cuda")  # (its host step stalled: rank1 goes into its backward and stops there)
        seen.append(torch._C._current_graph_task_id())
        dist.barrier()
    return seen


def test_a_rank_outside_a_backward_sees_no_graph_task() -> None:
    s = simdevice.cuda("rank0#0+50")  # (rank0 stalled at its first op: rank1 is in its backward first)
    s.run(tasks, world_size=2)
    assert not s.reports, s.text()
    rank0, rank1 = s.result.result
    assert rank0 == [-1], rank0
    assert rank1 != [-1], rank1
