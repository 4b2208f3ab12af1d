"""A ``DeviceMesh`` (``init_device_mesh``; what DTensor, FSDP2's ``fully_shard`` and tensor parallelism build on) is
not simulated: the run stops where the program makes one, with a ``NotImplementedError`` naming it, so ``check``
gives no verdict (exit 2, one line). Before, torch's own ``DeviceMesh`` reached the real, uninitialized process
group through the names it imported from ``distributed_c10d`` and failed on a CPU build's missing NCCL, or, given
those names, went on to a ``DTensor`` wrapping a simulated tensor, which the simulator's dispatch does not take."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from simdevice.cli import main
from simdevice.explain import not_run
from simdevice.search.explore import explore

_REFUSED = "NotImplementedError: torch.distributed.device_mesh.DeviceMesh is not simulated"


def _mesh() -> None:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cuda", (dist.get_world_size(),))
    assert mesh.size() == dist.get_world_size()


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
    _mesh,
    _fsdp2(offload=False, reshard=True, explicit_mesh=True),
    _fsdp2(offload=False, reshard=False, explicit_mesh=False),
    _fsdp2(offload=True, reshard=True, explicit_mesh=True),
])
def test_a_device_mesh_is_no_verdict(program: Callable[[], None]) -> None:
    found = explore(program, max_examples=1, world_size=2)
    assert found.failure is not None
    unrun = not_run(found.failure)
    assert unrun is not None, found.failure.text()
    assert unrun.error.startswith(_REFUSED), unrun.error
    assert unrun.actor == "rank0", unrun


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


def test_check_of_an_fsdp2_program_says_the_mesh_is_not_simulated(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "fsdp2_user.py"
    f.write_text(_FSDP2_FILE)
    monkeypatch.chdir(tmp_path)
    assert main(["check", "fsdp2_user.py::train", "--world-size", "2", "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert _REFUSED in err[0], err[0]
    assert "fsdp2_user.py:12" in err[0], err[0]  # the line that made the mesh
