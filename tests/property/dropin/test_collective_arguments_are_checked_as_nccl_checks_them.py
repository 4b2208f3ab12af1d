"""Rule (dropin.distributed._check_tensor, _check_pair): a collective checks its tensors at the call, as
ProcessGroupNCCL does before it launches anything: device tensors, contiguous, and for a collective from one
tensor into another (``all_gather_into_tensor``, ``reduce_scatter_tensor``) one dtype and sizes in the world's
ratio; ``all_gather``'s list holds one tensor per rank. Before, a strided view was reduced in place, a
``reduce_scatter_tensor`` of the wrong sizes or dtypes ran to a clean verdict (on a GPU each raises), and a short
``all_gather`` list failed on the communication stream with zip()'s message."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.distributed as dist

import simdevice


def _strided_all_reduce() -> None:
    m = torch.zeros(4, 4, device="cuda")
    dist.all_reduce(m[:, 1])  # a column: not contiguous


def _reduce_scatter_of_wrong_sizes() -> None:
    dist.reduce_scatter_tensor(torch.empty(4, device="cuda"), torch.ones(10, device="cuda"))


def _reduce_scatter_of_two_dtypes() -> None:
    out = torch.empty(4, device="cuda", dtype=torch.float16)
    dist.reduce_scatter_tensor(out, torch.ones(8, device="cuda"))


def _all_gather_into_two_dtypes() -> None:
    out = torch.empty(8, device="cuda", dtype=torch.float16)
    dist.all_gather_into_tensor(out, torch.ones(4, device="cuda"))


def _all_gather_into_a_short_list() -> None:
    dist.all_gather([torch.empty(4, device="cuda")], torch.ones(4, device="cuda"))


def _host_tensor() -> None:
    dist.broadcast(torch.ones(4), src=0)


@pytest.mark.parametrize(("program", "error"), [
    (_strided_all_reduce, "ValueError: Tensors must be contiguous"),
    (_reduce_scatter_of_wrong_sizes, "ValueError: input tensor must be the same size as output size times world size"),
    (_reduce_scatter_of_two_dtypes, "TypeError: input tensor must be the same type as the output tensor."),
    (_all_gather_into_two_dtypes, "TypeError: output tensor must have the same type as input tensor"),
    (_all_gather_into_a_short_list, "ValueError: all_gather: tensor_list holds 1 tensors, one per rank (2)"),
    (_host_tensor, "ValueError: Tensors must be CUDA and dense"),
])
def test_a_collective_s_wrong_tensors_raise_at_the_program_s_call(program: Callable[[], None], error: str) -> None:
    s = simdevice.cuda()
    s.run(program, world_size=2)
    errors = [str(r) for r in s.reports]
    assert errors, f"{program.__name__} ran clean"
    assert all(f"rank0 raised {error}" in e or f"rank1 raised {error}" in e for e in errors), errors
    assert all("test_collective_arguments_are_checked_as_nccl_checks_them.py:" in e for e in errors), errors


def test_contiguous_tensors_of_every_layout_nccl_takes_run() -> None:
    def program() -> None:
        img = torch.ones(2, 3, 4, 4, device="cuda").to(memory_format=torch.channels_last)
        dist.all_reduce(img)
        dist.all_reduce(torch.ones((), device="cuda"))
        m = torch.ones(4, 4, device="cuda")
        dist.all_reduce(m[1])  # a row: contiguous
        assert img.cpu().eq(2.0).all()

    s = simdevice.cuda()
    s.run(program, world_size=2)
    s.assert_clean()


def test_a_channels_last_tensor_is_gathered_in_the_order_its_bytes_lie() -> None:
    """NCCL moves a tensor's bytes in memory order, whatever its layout: gathering a channels-last image into a flat
    tensor gives its elements channel-innermost. Mutation caught: the values sent in the tensor's logical order (the
    gathered run held each channel's plane in turn); the receive written through ``view(-1)`` (it raised: a
    channels-last tensor has no flat view in logical order); what a rank sends taken in logical order and landed in
    memory order (an all-reduce or a broadcast of a channels-last image permuted its elements)."""

    def program() -> None:
        img = torch.arange(2 * 3 * 2 * 2, dtype=torch.float32, device="cuda").view(2, 3, 2, 2)
        img = img.to(memory_format=torch.channels_last)
        out = torch.empty(2 * img.numel(), device="cuda")
        dist.all_gather_into_tensor(out, img)
        mine = out.cpu()[: img.numel()]
        expected = img.cpu().permute(0, 2, 3, 1).reshape(-1)  # (N, H, W, C): the order of its bytes
        assert torch.equal(mine, expected), (mine, expected)
        back = torch.empty_like(img)  # channels-last too: the gathered bytes land as they lie
        dist.all_reduce(back.zero_())
        logical = img.cpu()
        summed = img.clone()
        dist.all_reduce(summed)  # every element meets its own on the other rank
        assert torch.equal(summed.cpu(), 2 * logical), (summed.cpu(), 2 * logical)
        dist.broadcast(img, 0)
        assert img.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(img.cpu(), logical), (img.cpu(), logical)

    s = simdevice.cuda()
    s.run(program, world_size=2)
    s.assert_clean()
