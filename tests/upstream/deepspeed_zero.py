"""A tiny model trained through DeepSpeed's real ZeRO (DeepSpeed, from PyPI, unmodified) on two ranks.

``train(stage, overlap_comm, offload)`` is plain torch.cuda and torch.distributed code, as DeepSpeed's users write
it: ``deepspeed.initialize`` over two ``Linear`` layers with a plain ``torch.optim.SGD``, ZeRO stage 1, 2 or 3, small
buckets (several reductions and all-gathers a step), two steps of ``engine(x)``, ``engine.backward(loss)``,
``engine.step()``; each rank asserts its whole parameters equal those of the same training of a plain model on all
the ranks' data (gradient clipping off: DeepSpeed clips at 1.0 by default). ``simdevice check
tests/upstream/deepspeed_zero.py::zero3 --world-size 2`` runs it on the simulator.

The mutants (``*_trusting_the_device``) run the same code on an accelerator that claims to order a kernel after the
kernels whose results it reads (``resolves_data_dependency()`` True, as DeepSpeed's HPU accelerator answers; its CUDA
accelerator answers False): DeepSpeed then leaves out the stream waits it makes for CUDA (ZeRO-3's compute stream on
the all-gather stream before a prefetched parameter is read; ZeRO-1/2's reduction stream on the gradients' producer
streams, and the compute stream on the reduction stream). Nothing of DeepSpeed is copied or edited.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

os.environ.setdefault("DS_ACCELERATOR", "cuda")  # (DeepSpeed picks its accelerator once, at its first use)

import torch
import torch.distributed as dist

LR = 0.1
STEPS = 2
MICRO = 2  # samples per rank per step


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def _batch(step: int, world: int) -> torch.Tensor:
    return torch.randn(MICRO * world, 8, generator=torch.Generator().manual_seed(100 + step))


def reference(world: int) -> list[torch.Tensor]:
    """The same training of a plain model on the host, on every rank's samples (DeepSpeed averages the ranks'
    gradients: the mean loss over the ranks)."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        opt.zero_grad()
        (model(_batch(step, world)).pow(2).sum() / world).backward()
        opt.step()
    return [p.detach() for p in model.parameters()]


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    log = logging.getLogger("DeepSpeed")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _train(stage: int, overlap_comm: bool = True, offload: bool = False, trusting: bool = False) -> None:
    with _quiet():
        import deepspeed
        from deepspeed.accelerator import get_accelerator

        deepspeed.init_distributed(dist_backend="nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    accelerator = get_accelerator()
    trusted = accelerator.resolves_data_dependency
    if trusting:
        accelerator.resolves_data_dependency = lambda: True  # type: ignore[method-assign]
    try:
        config: dict[str, Any] = {
            "train_batch_size": MICRO * world, "train_micro_batch_size_per_gpu": MICRO, "gradient_clipping": 0.0,
            "zero_optimization": {"stage": stage, "overlap_comm": overlap_comm, "reduce_bucket_size": 64,
                                  "allgather_bucket_size": 64, "stage3_prefetch_bucket_size": 64,
                                  "stage3_param_persistence_threshold": 0},
            "zero_allow_untested_optimizer": True, "zero_force_ds_cpu_optimizer": False, "steps_per_print": 10**6,
        }
        if offload:
            config["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        model = _model()
        with _quiet():
            engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=LR),
                                              config=config)
        for step in range(STEPS):
            x = _batch(step, world)[MICRO * rank: MICRO * (rank + 1)].cuda()
            loss = engine(x).pow(2).sum()
            engine.backward(loss)
            engine.step()
        if stage == 3:
            with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
                got = [p.detach().cpu() for p in engine.module.parameters()]
        else:
            got = [p.detach().cpu() for p in engine.module.parameters()]
    finally:
        accelerator.resolves_data_dependency = trusted  # type: ignore[method-assign]
    for k, (p, q) in enumerate(zip(got, reference(world), strict=True)):
        assert torch.allclose(p, q, atol=1e-5), f"parameter {k} differs from the plain model's by " \
                                                f"{(p - q).abs().max().item():.3g}"


def zero1() -> None:
    _train(1)


def zero2() -> None:
    _train(2)


def zero2_offload() -> None:
    _train(2, offload=True)


def zero3() -> None:
    _train(3)


def zero2_trusting_the_device() -> None:
    _train(2, trusting=True)


def zero3_trusting_the_device() -> None:
    _train(3, trusting=True)
