"""``torch.nn.parallel.DistributedDataParallel`` in a run (``simdevice.dropin.ddp``): the gradient all-reduce of
torch's reducer, made of the simulated group's operations. Wrapping a model was refused (no verdict), so any
training script written with DDP could not be checked.

Rules, each with a test a mutation of it fails:

- construction broadcasts rank 0's parameters and buffers, each forward the buffers (as ``init_sync``,
  ``broadcast_buffers`` and ``forward_sync_buffers`` say); each backward leaves every rank's gradients the world's
  mean (a model trained two steps on two ranks equals the same model trained on the host on both ranks' batches),
  ready on the stream that called ``backward()`` (the gradients are copied back from the bucket there, after it
  waits for the all-reduce): a side stream that reads a gradient after waiting for that stream is clean, one that
  does not races with the copy back;
- with ``gradient_as_bucket_view=True`` each gradient is its bucket's slot, the same mean on the same stream (a
  side stream reading it unwaited races);
- ``no_sync()`` accumulates without communicating; the backward after it reduces the sum;
- with ``device_ids``, a host tensor among the inputs is moved to the module's device (PyTorch's DDP tutorial
  passes ``torch.randn(20, 10)``);
- a backward that left a parameter without a gradient makes the next forward raise torch's error;
- a run that wraps a model offers no ``--gpu`` replay (torch's reducer makes other operations).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: N817  (as training scripts name it)

import simdevice
from simdevice import HostError, Race


def _batch(step: int, rank: int) -> torch.Tensor:
    return torch.randn(8, 16, generator=torch.Generator().manual_seed(100 * step + rank))


def _model() -> nn.Module:
    torch.manual_seed(dist.get_rank() if dist.is_initialized() else 0)  # (each rank's own start: DDP broadcasts)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))


def _train(wait: bool, **options: Any) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    model = _model().cuda()
    ddp = DDP(model, device_ids=[rank], **options)
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    ref.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})  # (rank 0's, after the broadcast)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
    side = torch.cuda.Stream()
    for step in range(2):
        batch = _batch(step, rank) if step else _batch(step, rank).cuda()  # (DDP moves a host batch itself)
        ddp(batch).square().mean().backward()
        if wait:
            side.wait_stream(torch.cuda.current_stream())  # wait: the gradients are copied back on this stream
        with torch.cuda.stream(side):
            norm = model[0].weight.grad.norm()
        torch.cuda.current_stream().wait_stream(side)
        assert torch.isfinite(norm).item()
        opt.step()
        opt.zero_grad()
        (sum(ref(_batch(step, r)).square().mean() for r in range(world)) / world).backward()
        ropt.step()
        ropt.zero_grad()
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-4, atol=1e-5)


def test_ddp_leaves_each_rank_the_mean_gradient_on_the_backward_s_stream() -> None:
    for schedule in (None, "rank1.nccl#0+20", "rank0.default#3+5"):
        s = simdevice.cuda(schedule)
        s.run(lambda: _train(True), world_size=2)
        s.assert_clean()
        assert s.result is not None
        assert not s.result.gpu, "a run with DDP offered a GPU replay"


def _train_unwaited() -> None:
    _train(False)


@pytest.mark.parametrize("options", [{"gradient_as_bucket_view": True},
                                     {"gradient_as_bucket_view": True, "find_unused_parameters": True}])
def test_gradients_kept_as_bucket_views_are_the_mean_on_the_backward_s_stream_too(options: dict[str, Any]) -> None:
    """``gradient_as_bucket_view=True``: each gradient becomes its bucket's slot (copied there once, then
    accumulated there by autograd) and is divided there in place; the all-reduce writes it, and the backward's end
    makes the caller's stream wait for it (no copy back)."""
    for schedule in (None, "rank1.nccl#0+20"):
        s = simdevice.cuda(schedule)
        s.run(lambda: _train(True, **options), world_size=2)
        s.assert_clean()


def _storages(view: bool) -> list[int]:
    model = _model().cuda()
    ddp = DDP(model, gradient_as_bucket_view=view)
    for step in range(2):
        ddp(_batch(step, dist.get_rank()).cuda()).sum().backward()
    return sorted({p.grad.untyped_storage().data_ptr() for p in model.parameters()})


def test_a_gradient_kept_as_a_bucket_view_is_its_bucket_s_bytes() -> None:
    s = simdevice.cuda()
    s.run(lambda: (_storages(True), _storages(False)), world_size=2)
    s.assert_clean()
    for views, copies in s.result.result:
        assert len(views) == 1  # (one bucket: every float32 parameter's slot in it)
        assert len(copies) == 4  # (each gradient its own tensor, copied back into)


def _bucket_view_unwaited() -> None:
    _train(False, gradient_as_bucket_view=True)


def test_a_side_stream_that_reads_a_bucket_view_without_waiting_races() -> None:
    found = simdevice.explore(_bucket_view_unwaited, world_size=2, max_examples=30)
    assert found.failure is not None
    assert any(isinstance(r, Race) for r in found.failure.run.reports), found.failure.text()


def test_a_side_stream_that_reads_a_gradient_without_waiting_races() -> None:
    found = simdevice.explore(_train_unwaited, world_size=2, max_examples=30)
    assert found.failure is not None
    assert any(isinstance(r, Race) for r in found.failure.run.reports), found.failure.text()


def _accumulated() -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    model = _model().cuda()
    ddp = DDP(model)
    with ddp.no_sync():
        ddp(_batch(0, rank).cuda()).sum().backward()
    local = model[0].bias.grad.clone()
    ddp(_batch(1, rank).cuda()).sum().backward()
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    ref.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    ref(_batch(0, rank)).sum().backward()
    torch.testing.assert_close(local.cpu(), ref[0].bias.grad)  # (no_sync: this rank's own)
    ref.zero_grad()
    for step in range(2):
        for r in range(world):
            ref(_batch(step, r)).sum().backward()
    torch.testing.assert_close(model[0].bias.grad.cpu(), ref[0].bias.grad / world, rtol=1e-4, atol=1e-5)


def test_no_sync_accumulates_and_the_next_backward_reduces_the_sum() -> None:
    s = simdevice.cuda()
    s.run(_accumulated, world_size=2)
    s.assert_clean()
    assert s.result is not None
    # the construction's four broadcasts (two weights, two biases) and one all-reduce: none under no_sync
    assert s.result.op_counts.get("rank0.nccl", 0) == 5, s.result.op_counts


class _TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x)


def _unused() -> None:
    ddp = DDP(_TwoHeads().cuda())
    for _ in range(2):
        ddp(torch.ones(2, 4, device="cuda")).sum().backward()


def test_a_parameter_left_without_a_gradient_fails_the_next_forward() -> None:
    s = simdevice.cuda()
    s.run(_unused, world_size=2)
    errors = [r for r in s.reports if isinstance(r, HostError)]
    assert errors, s.text()
    assert "Expected to have finished reduction in the prior iteration" in str(errors[0]), s.text()


@pytest.mark.parametrize("option", ["static_graph", "skip_all_reduce_unused_params"])
def test_an_option_ddp_does_not_simulate_gives_no_verdict(option: str) -> None:
    s = simdevice.cuda()
    s.run(lambda: DDP(nn.Linear(4, 4).cuda(), **{option: True}), world_size=2)
    assert any(f"DistributedDataParallel({option}=True) is not simulated" in str(r) for r in s.reports), s.text()


def _construct(options: dict[str, bool], forward: bool) -> None:
    ddp = DDP(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).cuda(), **options)
    if forward:
        with torch.no_grad():
            ddp(torch.ones(2, 4, device="cuda"))


@pytest.mark.parametrize(("options", "broadcasts"), [
    ({}, (7, 3)),  # four parameters and three buffers at construction, the buffers at the forward
    ({"init_sync": False}, (0, 3)),
    ({"broadcast_buffers": False}, (4, 0)),
    ({"forward_sync_buffers": False}, (7, 0)),
])
def test_construction_and_forward_broadcast_what_the_options_say(options: dict[str, bool],
                                                                 broadcasts: tuple[int, int]) -> None:
    counts = []
    for forward in (False, True):
        s = simdevice.cuda()
        s.run(lambda forward=forward: _construct(options, forward), world_size=2)
        s.assert_clean()
        assert s.result is not None
        counts.append(s.result.op_counts.get("rank0.nccl", 0))
    assert (counts[0], counts[1] - counts[0]) == broadcasts, counts
