"""Rule (distributed): ``send_object_list`` and ``recv_object_list`` are torch's own, over the simulated ``send`` and
``recv`` (the pickled objects a device tensor, as torch sends them with NCCL); ``torch.distributed.pipelining``'s
schedules, which exchange their stages' shapes so, run. Before, both calls were refused (no verdict)."""

from __future__ import annotations

import torch
import torch.distributed as dist

import simdevice


def objects() -> list[object]:
    if dist.get_rank() == 0:
        dist.send_object_list([1, "a", {"k": [2, 3]}], dst=1)
        got: list[object] = [None]
        dist.recv_object_list(got, src=1)
    else:
        got = [None, None, None]
        dist.recv_object_list(got, src=0)
        dist.send_object_list(["back"], dst=0, device=torch.device("cuda"))
    return got


def test_objects_sent_point_to_point_arrive() -> None:
    s = simdevice.cuda()
    s.run(objects, world_size=2)
    assert not s.reports, s.text()
    assert s.result.result == [["back"], [1, "a", {"k": [2, 3]}]]


def gpipe() -> bool:
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    layers = [torch.nn.Linear(8, 8) for _ in range(world)]
    whole = torch.nn.Sequential(*layers).cuda()
    stage = PipelineStage(torch.nn.Sequential(layers[rank]).cuda(), rank, world, torch.device("cuda"))
    schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=lambda out, target: ((out - target) ** 2).sum())
    x, target = torch.randn(4, 8, device="cuda"), torch.zeros(4, 8, device="cuda")
    if rank == 0:
        schedule.step(x)
        return True
    out = schedule.step(target=target, losses=[])
    return bool(torch.allclose(out, whole(x), atol=1e-5))


def test_a_pipeline_schedule_runs_its_stages_on_the_ranks() -> None:
    s = simdevice.cuda()
    s.run(gpipe, world_size=2)
    assert not s.reports, s.text()
    assert s.result.result == [True, True]
