"""Rule (``simdevice.dropin.session._script_builtins``): a function TorchScript compiles in a run calls
``torch.zeros``, ``torch.tensor`` and the session's other replaced functions as the aten builtins they are on a GPU.
TorchScript looks up a called function in its table of builtins by the object; the session's replacement is a
Python function there, which TorchScript tried to compile in the builtin's place, and raised (``TypeError`` of
``inspect``): reported as the program's host error, a finding on a correct program. So did importing
``torch.distributed.optim`` in a run (its functional optimizers are scripted as it is imported), which
``ZeroRedundancyOptimizer`` does. Mutation: no replacement entered in the table (the host error). The table is
torch's again after the session: no entry of the session's objects is left in it."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.jit import _builtins

import simdevice
from reference.schedule import Schedule
from simdevice.search.targets import resolve

HAZARD = "tests/hazards.py::scripted_side_read"


def _scripted(wait: bool) -> list[float]:
    @torch.jit.script
    def f(x: torch.Tensor) -> torch.Tensor:
        return x * 3 + torch.zeros(x.shape, device=x.device) + torch.tensor(1.0, device=x.device)

    side = torch.cuda.Stream()
    x = torch.ones(4, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y = f(x)
    if wait:
        torch.cuda.current_stream().wait_stream(side)
    return (y + 1).tolist()


def test_a_function_scripted_in_a_run_runs_its_ops_on_the_stream_it_is_called_on() -> None:
    replaced: list[object] = []

    def program() -> list[float]:
        replaced.append(torch.zeros)  # (the session's: in the table as torch's is)
        assert _builtins._find_builtin(torch.zeros) == "aten::zeros"
        return _scripted(True)

    s = simdevice.cuda()
    s.run(program)
    assert s.clean, s.text()
    assert s.result is not None
    assert s.result.result == [5.0] * 4
    assert replaced[0] is not torch.zeros
    assert _builtins._find_builtin(replaced[0]) is None  # (gone with the session)


def test_its_output_read_unordered_on_another_stream_races() -> None:
    s = simdevice.cuda("side#4+1")  # (its ops on side: mul, zeros, the scalar's copy, the two adds)
    s.run(_scripted, False)
    kinds = {type(r).__name__ for r in s.reports}
    assert "Race" in kinds, s.text()
    assert "HostError" not in kinds, s.text()


def test_the_hazard_program_s_unwaited_read_is_found_and_its_waited_one_is_clean() -> None:
    """``tests/hazards.py::scripted_side_read`` (also run on a GPU, tests/gpu/test_dropin_gpu.py)."""
    target = resolve(HAZARD)
    waited = target.run(Schedule.parse(HAZARD + "::side#5+20"))
    assert waited.clean, waited.text()
    unwaited = target.run(Schedule.parse(HAZARD + ":wait=0:side#5+20"))
    assert unwaited.corrupted, unwaited.text()
    assert unwaited.races, unwaited.text()


def _zero_optimizer() -> list[float]:
    from torch.distributed.optim import ZeroRedundancyOptimizer

    torch.manual_seed(0)
    m = torch.nn.Linear(8, 8).cuda()
    opt = ZeroRedundancyOptimizer(m.parameters(), optimizer_class=torch.optim.SGD, lr=0.1)
    m(torch.ones(2, 8, device="cuda") * (dist.get_rank() + 1)).sum().backward()
    for p in m.parameters():
        dist.all_reduce(p.grad)
    opt.step()  # (each rank steps its shard, then broadcasts it)
    return m.weight.detach().sum(dim=1).tolist()


def test_zero_redundancy_optimizer_steps_its_shards_on_two_ranks() -> None:
    s = simdevice.cuda()
    s.run(_zero_optimizer, world_size=2)
    assert s.clean, s.text()
    assert s.result is not None
    left, right = s.result.result
    assert left == right
