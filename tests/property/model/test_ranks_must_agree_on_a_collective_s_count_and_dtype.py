"""Rule (runtime.collectives.Collective.check_agreed): the ranks of one collective pass tensors of one size and one
dtype (NCCL takes one count and one type for every rank: otherwise a GPU hangs, or reads bytes of one type as
another); where they do not, the run's error says so, naming the program's call, for every kind of collective.
Before, only an all-reduce's sizes were compared: ranks reducing a float32 and a float16 tensor ran to a clean
verdict, and an all-gather of different sizes failed with torch.cat's message."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.distributed as dist

import simdevice


def _all_reduce_of_two_dtypes() -> None:
    t = torch.ones(4, device="cuda", dtype=torch.float32 if dist.get_rank() == 0 else torch.float16)
    dist.all_reduce(t)
    torch.cuda.synchronize()


def _all_gather_of_two_sizes() -> None:
    n = 4 * (dist.get_rank() + 1)
    dist.all_gather_into_tensor(torch.empty(2 * n, device="cuda"), torch.ones(n, device="cuda"))
    torch.cuda.synchronize()


def _broadcast_into_a_longer_buffer() -> None:
    dist.broadcast(torch.ones(4 + dist.get_rank(), device="cuda"), src=0)
    torch.cuda.synchronize()


@pytest.mark.parametrize(("program", "error"), [
    (_all_reduce_of_two_dtypes, "different dtypes (float32, float16, by rank): every rank must pass tensors of the "
                                "same dtype in all_reduce (receive)"),
    (_all_gather_of_two_sizes, "different sizes (4, 8 elements, by rank): every rank must pass tensors of the same "
                               "size in all_gather (receive)"),
    (_broadcast_into_a_longer_buffer, "different sizes (4, 5 elements, by rank): every rank must pass tensors of the "
                                      "same size in broadcast (receive)"),
])
def test_ranks_that_disagree_on_a_collective_s_tensors_are_told_so(program: Callable[[], None], error: str) -> None:
    s = simdevice.cuda()
    s.run(program, world_size=2)
    text = s.text()
    assert f"raised RuntimeError: the ranks passed tensors of {error}" in text, text
    assert "test_ranks_must_agree_on_a_collective_s_count_and_dtype.py:" in text.split(error)[1], text
