"""Rule (distributed: ``_reduce``): a reduction by ``torch.distributed._make_nccl_premul_sum(factor)`` (NCCL's
``ncclRedOpCreatePreMulSum``, FSDP's division of gradients in the collective) multiplies each rank's input by the
factor, then sums, in ``all_reduce`` and ``reduce_scatter_tensor`` alike. A factor given as a tensor, which NCCL
reads on the device, is refused (no verdict). Before, every premul sum was refused."""

from __future__ import annotations

import torch
import torch.distributed as dist

import simdevice
from simdevice.explain import not_run
from simdevice.search.explore import explore


def scaled() -> list[list[float]]:
    dist.init_process_group("nccl")
    r = dist.get_rank()
    x = torch.full((4,), float(r + 1), device="cuda")
    dist.all_reduce(x, op=dist._make_nccl_premul_sum(0.5))
    shard = torch.empty(2, device="cuda")
    dist.reduce_scatter_tensor(shard, torch.arange(4, dtype=torch.float32, device="cuda") * (r + 1),
                               op=dist._make_nccl_premul_sum(0.25))
    out = [x.tolist(), shard.tolist()]
    dist.destroy_process_group()
    return out


def test_a_premul_sum_multiplies_each_input_by_its_factor() -> None:
    s = simdevice.cuda()
    s.run(scaled, world_size=2)
    s.assert_clean()
    assert s.result.result == [[[1.5] * 4, [0.0, 0.75]], [[1.5] * 4, [1.5, 2.25]]]


def by_a_tensor() -> None:
    dist.init_process_group("nccl")
    dist.all_reduce(torch.ones(4, device="cuda"), op=dist._make_nccl_premul_sum(torch.tensor(0.5)))
    torch.cuda.synchronize()


def test_a_factor_given_as_a_tensor_is_no_verdict() -> None:
    found = explore(by_a_tensor, max_examples=1, world_size=2)
    assert found.failure is not None
    unrun = not_run(found.failure)
    assert unrun is not None, found.failure.text()
    assert "PREMUL_SUM with a tensor factor is not simulated" in unrun.error
