"""Megatron-LM's real ``DistributedDataParallel`` (megatron-core 0.16.1 from PyPI, unmodified) with its distributed
optimizer's buffers and both overlaps on, on two ranks.

``step(steps, read_early)`` is plain torch.cuda code: a two-layer model wrapped by Megatron's DDP
(``use_distributed_optimizer=True``, ``overlap_grad_reduce=True``, ``overlap_param_gather=True``, small buckets so
that each layer has its own), a forward and backward whose gradients the buckets reduce-scatter as they fill,
``finish_grad_sync()``, then ``start_param_sync()``: every bucket's parameters all-gathered in one coalesced launch
(torch's ``_coalescing_manager``, which Megatron calls through the name it bound at import), whose wait each layer's
forward pre-hook makes before the layer reads its weights (the third seed's mechanism: a prefetch of weights and the
readiness of each bucket). ``read_early``: a weight read outside the forward, before its bucket's gather is waited
for (the hook's wait bypassed), the race the fix of that seed guards against.

``trained(steps)``: the same model and DDP trained by Megatron's own distributed optimizer
(``get_megatron_optimizer``, Adam): each ``step()`` reduces, clips (its gradient norm made of device tensors read
on the host), updates its shard and gathers the parameters again.

    simdevice check tests/upstream/megatron_ddp.py::step --world-size 2          # clean
    simdevice check tests/upstream/megatron_ddp.py::read_early --world-size 2    # found
    simdevice check tests/upstream/megatron_ddp.py::trained --world-size 2       # clean
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist

with warnings.catch_warnings():  # "Transformer Engine and Apex are not installed": expected here
    warnings.simplefilter("ignore")
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer import TransformerConfig


def _ddp() -> tuple[torch.nn.Module, DistributedDataParallel, ProcessGroupCollection]:
    dist.init_process_group("nccl")
    r = dist.get_rank()
    torch.cuda.set_device(r)
    dp = dist.new_group()
    singles = [dist.new_group([q]) for q in range(dist.get_world_size())]
    groups = ProcessGroupCollection()
    groups.dp = groups.expt_dp = groups.dp_cp = groups.intra_dp_cp = groups.intra_expt_dp = dp
    groups.intra_dist_opt = dp
    groups.inter_dist_opt = None
    groups.tp = groups.pp = groups.ep = groups.cp = groups.tp_ep_pp = groups.mp = singles[r]
    config = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=1)
    ddp_config = DistributedDataParallelConfig(use_distributed_optimizer=True, overlap_grad_reduce=True,
                                               overlap_param_gather=True, bucket_size=256)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)).cuda()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ddp = DistributedDataParallel(config, ddp_config, model, pg_collection=groups)
    return model, ddp, groups


def step(steps: int = 1, read_early: bool = False) -> float:
    model, ddp, _ = _ddp()
    x = torch.ones(4, 16, device="cuda")
    out = 0.0
    for _ in range(steps):
        ddp.zero_grad_buffer()
        ddp(x).sum().backward()
        ddp.finish_grad_sync()
        ddp.start_param_sync()  # the next step's weights, gathered ahead
        if read_early:
            out = float(model[0].weight.sum())  # outside the forward: no pre-hook waits for the gather
        out = float(ddp(x).sum())
    dist.destroy_process_group()
    return out


def read_early() -> float:
    return step(read_early=True)


def trained(steps: int = 2) -> float:
    _, ddp, groups = _ddp()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=0.01, use_distributed_optimizer=True),
                                     [ddp], use_gloo_process_groups=False, pg_collection=groups)
    x = torch.ones(4, 16, device="cuda")
    for _ in range(steps):
        ddp.zero_grad_buffer()
        opt.zero_grad()
        ddp(x).sum().backward()
        ddp.finish_grad_sync()
        opt.step()
    out = float(ddp(x).sum())
    dist.destroy_process_group()
    return out
