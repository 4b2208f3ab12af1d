"""Megatron-LM's real tensor-parallel layers (megatron-core 0.16.1 from PyPI, unmodified) on two ranks.

``layers(sequence_parallel)`` is plain torch.cuda code: ``parallel_state.initialize_model_parallel(2)`` and
Megatron's model-parallel seed, a ``ColumnParallelLinear`` whose output stays split and a ``RowParallelLinear`` that
reduces it (an all-reduce; with sequence parallelism, an all-gather of the input before and a reduce-scatter
after), a forward and a backward. It returns the output's sum and the same computed from the two layers' weights
gathered whole (``all_gather_into_tensor``), which must agree.

    simdevice check tests/upstream/megatron_tp.py::layers --world-size 2
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist

with warnings.catch_warnings():  # "Transformer Engine and Apex are not installed": expected here
    warnings.simplefilter("ignore")
    from megatron.core import parallel_state
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear, model_parallel_cuda_manual_seed


def _whole(shard: torch.Tensor, dim: int) -> torch.Tensor:
    parts = torch.empty((2 * shard.shape[0], *shard.shape[1:]), device="cuda")
    dist.all_gather_into_tensor(parts, shard.detach().contiguous())
    return parts if dim == 0 else torch.cat(parts.chunk(2, 0), dim=1)


def layers(sequence_parallel: bool = False) -> list[float]:
    dist.init_process_group("nccl")
    torch.cuda.set_device(dist.get_rank())
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    model_parallel_cuda_manual_seed(1234)
    config = ModelParallelConfig(tensor_model_parallel_size=2, sequence_parallel=sequence_parallel,
                                 params_dtype=torch.float32)
    torch.manual_seed(0)
    col = ColumnParallelLinear(16, 32, config=config, init_method=torch.nn.init.xavier_normal_, bias=False,
                               gather_output=False)
    row = RowParallelLinear(32, 16, config=config, init_method=torch.nn.init.xavier_normal_, bias=False,
                            input_is_parallel=True, skip_bias_add=False)
    x = torch.arange(4 * 2 * 16, dtype=torch.float32, device="cuda").reshape(4, 2, 16) / 100.0
    mine = x.chunk(2, 0)[parallel_state.get_tensor_model_parallel_rank()] if sequence_parallel else x
    h, _ = col(mine.clone().requires_grad_())
    y, _ = row(h)
    y.sum().backward()
    got = float(_whole(y.detach(), 0).sum()) if sequence_parallel else float(y.sum())
    w1, w2 = _whole(col.weight, 0), _whole(row.weight, 1)  # [32, 16] and [16, 32]
    expected = float((x @ w1.t() @ w2.t()).sum())
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()
    return [got, expected]


def sequence_parallel() -> list[float]:
    return layers(sequence_parallel=True)
