"""torch's own ``DeviceMesh``, DTensor and FSDP2's ``fully_shard`` run unmodified on the simulated process groups:
a mesh of every rank is the default group, a mesh's dimensions the groups ``new_group`` makes; a DTensor shows the
device of its local tensor; FSDP2's all-gathers, copy-outs, reduce-scatters and CPU offload are simulated ops on its
own streams. Before, a ``DeviceMesh`` was refused (no verdict): torch's mesh looked its groups up in C++ and through
names it bound at import, a DTensor showed its local tensor's ``meta`` shell as its device, FSDP2's copy-out skipped
the wait of a work that was not an instance of torch's ``Work``, and DTensor's sharding propagation under torch's
fake tensor mode ran as simulated ops."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import model_programs as programs
import pytest
import torch
import torch.distributed as dist

import simdevice
from simdevice.cli import main
from simdevice.search.explore import explore


def _fsdp2(offload: bool, reshard: bool, explicit_mesh: bool) -> Callable[[], None]:
    def program() -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

        torch.cuda.set_device(dist.get_rank())
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        if not offload:
            model = model.cuda()
        mesh = init_device_mesh("cuda", (dist.get_world_size(),)) if explicit_mesh else None
        policy = CPUOffloadPolicy() if offload else OffloadPolicy()
        for m in (model[0], model[2], model):
            fully_shard(m, mesh=mesh, reshard_after_forward=reshard, offload_policy=policy)
        model(torch.randn(2, 8, device="cuda")).sum().backward()

    return program


@pytest.mark.parametrize("program", [
    _fsdp2(offload=False, reshard=True, explicit_mesh=True),
    _fsdp2(offload=False, reshard=False, explicit_mesh=False),
    _fsdp2(offload=True, reshard=True, explicit_mesh=True),
], ids=["mesh-reshard", "default-mesh", "cpu-offload"])
def test_fsdp2_forward_and_backward_run_clean(program: Callable[[], None]) -> None:
    found = explore(program, max_examples=3, world_size=2)
    assert found.failure is None, found.failure.text()


def trained() -> None:
    """Two FSDP2 steps on each rank's batch; the ranks' whole parameters equal a plain model trained on the mean of
    their losses (FSDP2 averages the gradients)."""
    from torch.distributed.fsdp import fully_shard

    def wrap(model: torch.nn.Module) -> torch.nn.Module:
        for m in (model[0], model[2], model):
            fully_shard(m)
        return model

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).cuda()
    wrapped, ref = programs.trained_beside_a_plain_copy(model, wrap)
    for (name, p), q in zip(wrapped.named_parameters(), ref.parameters(), strict=True):
        whole = p.full_tensor()  # (a functional all-gather, waited for)
        assert torch.allclose(whole, q, atol=1e-5), (name, (whole - q).abs().max().item())
    torch.cuda.synchronize()


def test_fsdp2_training_gives_a_plain_model_s_numbers() -> None:
    s = simdevice.cuda()
    s.run(trained, world_size=2)
    assert not s.reports, s.text()


def test_another_rank_s_backward_does_not_make_a_forward_skip_its_reshard() -> None:
    """rank1 runs ahead into its backward while rank0 is stalled at its start: rank0's forward must still reshard
    after each layer (FSDP2 tells a backward's recomputation by autograd's current graph task; a greenlet actor saw
    the one rank1 was suspended in, and skipped the all-gathers of its backward: the ranks' collectives differed)."""
    run = simdevice.cuda("rank0#0+42,rank1#0+5,rank1#252+36")
    run.run(trained, world_size=2)
    assert not run.reports, run.text()


def _side(wait: bool) -> Callable[[], None]:
    def program() -> None:
        from torch.distributed.fsdp import fully_shard

        torch.manual_seed(0)
        layer = programs.SideLinear(32, torch.cuda.Stream(), wait).cuda()
        fully_shard(layer)
        with torch.no_grad():
            layer(torch.randn(4, 32, device="cuda"))
        torch.cuda.synchronize()

    return program


def test_a_side_stream_reading_fsdp2_s_unsharded_weight_unordered_races() -> None:
    """The weight FSDP2 copies out of its all-gather on the current stream, read by a side stream that does not wait
    for it: a race, named at FSDP2's copy-out; with the wait, clean."""
    found = explore(_side(wait=False), max_examples=20, world_size=2)
    assert found.failure is not None
    text = found.failure.text()
    assert "race: mm on stream rank0.layer" in text or "race: mm on stream rank1.layer" in text, text  # (the side
    # stream, named after the line that made it)
    assert "which split_with_sizes_copy on stream" in text, text
    clean = explore(_side(wait=True), max_examples=20, world_size=2)
    assert clean.failure is None, clean.failure.text()


def tensor_parallel() -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cuda", (dist.get_world_size(),))
    torch.manual_seed(0)
    a, b = torch.randn(8, 4, device="cuda"), torch.randn(4, 6, device="cuda")
    product = distribute_tensor(a, mesh, [Shard(0)]) @ distribute_tensor(b, mesh, [Replicate()])
    assert product.device == torch.device("cuda", 0)
    assert torch.allclose(product.full_tensor(), a @ b, atol=1e-5)


def two_dimensions() -> int:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cuda", (2, 2), mesh_dim_names=("dp", "tp"))
    x = torch.full((2,), float(dist.get_rank()), device="cuda")
    dist.all_reduce(x, group=mesh["tp"].get_group())
    return int(x[0].item())


def test_a_dtensor_computes_on_its_shards_and_a_mesh_dimension_is_a_group() -> None:
    s = simdevice.cuda()
    s.run(tensor_parallel, world_size=2)
    assert not s.reports, s.text()
    s = simdevice.cuda()
    s.run(two_dimensions, world_size=4)
    assert not s.reports, s.text()
    assert s.result.result == [1, 1, 5, 5]  # (ranks 0+1 and 2+3: the "tp" dimension's groups)


_FSDP2_FILE = '''
import torch
import torch.distributed as dist


def train() -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.cuda.set_device(dist.get_rank())
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)).cuda()
    mesh = init_device_mesh("cuda", (dist.get_world_size(),))
    fully_shard(model, mesh=mesh)
    model(torch.randn(2, 8, device="cuda")).sum().backward()
'''


def test_check_of_an_fsdp2_program_is_a_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "fsdp2_user.py"
    f.write_text(_FSDP2_FILE)
    monkeypatch.chdir(tmp_path)
    assert main(["check", "fsdp2_user.py::train", "--world-size", "2", "-q", "--examples", "10"]) == 0
    assert re.match(r"fsdp2_user.py::train: clean over \d+ schedules", capsys.readouterr().out)


def _coordinates_and_checkpoint(path: str) -> Callable[[], tuple[int, ...]]:
    def program() -> tuple[int, ...]:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.fsdp import fully_shard

        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)).cuda()
        for m in (model[0], model[1], model):
            fully_shard(m)
        before = {k: v.full_tensor().clone() for k, v in model.state_dict().items()}
        dcp.save(model.state_dict(), checkpoint_id=path)
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
        state = model.state_dict()
        dcp.load(state, checkpoint_id=path)
        model.load_state_dict(state)
        for k, v in model.state_dict().items():
            assert torch.equal(v.full_tensor(), before[k]), k
        torch.cuda.synchronize()
        return model[0].weight.device_mesh.get_coordinate()  # type: ignore[no-any-return]

    return program


def test_each_rank_s_dtensors_are_on_its_own_mesh(tmp_path: Path) -> None:
    """Two ranks' default meshes are equal as torch compares meshes, and torch's caches are one interpreter's: each
    process's meshes are its own (as torch's threaded backend makes them), so a rank's DTensors have its own
    coordinate, and a sharded checkpoint saved by ``torch.distributed.checkpoint`` has both shards (before, the
    second rank's parameters were on the first's mesh: the global plan was refused, "invalid fill")."""
    s = simdevice.cuda("rank0#0+1")
    s.run(_coordinates_and_checkpoint(str(tmp_path / "checkpoint")), world_size=2)
    assert not s.reports, s.text()
    assert s.result.result == [(0,), (1,)]
