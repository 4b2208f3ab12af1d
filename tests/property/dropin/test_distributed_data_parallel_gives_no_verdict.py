"""What of ``torch.nn.parallel.DistributedDataParallel`` is not simulated gives no verdict: torch's constructor
checks the parameters across ranks and broadcasts them with C++ functions of ``torch.distributed`` that take the
process group (``_verify_params_across_processes``, ``_broadcast_coalesced``), which cannot take the simulated
group, so a run simulates DDP itself (``simdevice.dropin.ddp``: ``test_ddp_all_reduces_the_gradients.py``) and
refuses the options it does not simulate (``static_graph``, ...) where the program wraps its model, with
a ``NotImplementedError`` naming them, so ``check`` gives no verdict (exit 2, one line); those C++ functions called
directly are refused naming themselves. Before, the constructor handed the simulated group (or ``dist.group.WORLD``,
``None`` here) to C++, and the whole ``check`` process died of a segmentation fault, with no message."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from simdevice.cli import main
from simdevice.explain import not_run
from simdevice.search.explore import explore

_REFUSED = ("NotImplementedError: torch.nn.parallel.DistributedDataParallel(static_graph=True) is not "
            "simulated")


def _ddp() -> None:
    model = torch.nn.Linear(8, 4).cuda()
    ddp = torch.nn.parallel.DistributedDataParallel(model, static_graph=True)
    ddp(torch.ones(2, 8, device="cuda")).sum().backward()


def _verify() -> None:
    dist._verify_params_across_processes(dist.group.WORLD, [torch.ones(2, device="cuda")])


def _broadcast_coalesced() -> None:
    dist._broadcast_coalesced(dist.distributed_c10d._get_default_group(), [torch.ones(2, device="cuda")], 1024, 0)


@pytest.mark.parametrize(("program", "refused"), [
    (_ddp, _REFUSED),
    (_verify, "NotImplementedError: torch.distributed._verify_params_across_processes is not simulated"),
    (_broadcast_coalesced, "NotImplementedError: torch.distributed._broadcast_coalesced is not simulated"),
])
def test_ddp_and_the_c_functions_it_calls_are_no_verdict(program: Callable[[], None], refused: str) -> None:
    found = explore(program, max_examples=1, world_size=2)
    assert found.failure is not None
    unrun = not_run(found.failure)
    assert unrun is not None, found.failure.text()
    assert unrun.error.startswith(refused), unrun.error
    assert unrun.actor == "rank0", unrun


_DDP_FILE = '''
import torch
import torch.distributed as dist


def train() -> None:
    model = torch.nn.Linear(8, 4).cuda()
    ddp = torch.nn.parallel.DistributedDataParallel(model, static_graph=True)
    ddp(torch.ones(2, 8, device="cuda")).sum().backward()
'''


def test_check_of_a_ddp_program_says_what_of_ddp_is_not_simulated(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "ddp_user.py"
    f.write_text(_DDP_FILE)
    monkeypatch.chdir(tmp_path)
    assert main(["check", "ddp_user.py::train", "--world-size", "2", "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert _REFUSED in err[0], err[0]
    assert "ddp_user.py:8" in err[0], err[0]  # the line that wrapped the model
