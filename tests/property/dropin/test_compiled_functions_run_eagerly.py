"""``torch.compile``: a compiled function (or module) called in a run runs eagerly, whether it was compiled in the
run or before the session, and the run notes it; its operations are the simulator's as any other (a race inside it
is found). ``replay --gpu`` runs it eagerly too (``reference.cuda``'s ``force_eager`` stance), so both machines
count the same operations: ``tests/hazards.py::compiled_reload`` on a GPU in ``tests/gpu/test_dropin_gpu.py``.
Before, a compiled function gave no verdict (``NotImplementedError``); earlier still, Dynamo traced the simulator's
own code or inductor failed on the simulated device. Dynamo is back as it was after the session."""

from __future__ import annotations

import torch
from hazard_checks import races_only_unwaited

import simdevice
from simdevice.dropin.facade import COMPILE_NOTE


def _double(a: torch.Tensor) -> torch.Tensor:
    return a * 2 + 1


_before = torch.compile(_double)


def _compiled_in_the_run() -> None:
    x = torch.ones(4, device="cuda")
    assert torch.compile(_double)(x).sum().item() == 12


def _compiled_before() -> None:
    x = torch.ones(4, device="cuda")
    assert _before(x).sum().item() == 12


def _compiled_module() -> None:
    torch.manual_seed(0)
    model = torch.compile(torch.nn.Linear(4, 4).cuda())
    x = torch.ones(2, 4)
    want = x @ model.weight.detach().cpu().t() + model.bias.detach().cpu()
    assert torch.allclose(model(x.cuda()).detach().cpu(), want)


def _compiled_on_a_side_stream_unwaited() -> None:
    """The compiled function reads ``x`` on a side stream that does not wait for the stream that wrote it."""
    x = torch.full((1 << 12,), 3.0, device="cuda")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        y = torch.compile(_double)(x)
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(y.cpu(), torch.full((1 << 12,), 7.0))


def test_a_compiled_function_runs_eagerly_and_the_run_says_so() -> None:
    import torch._dynamo.eval_frame as eval_frame

    original = eval_frame._callback_from_stance
    for program in (_compiled_in_the_run, _compiled_before, _compiled_module):
        s = simdevice.cuda()
        s.run(program)
        assert s.result is not None
        assert not s.result.reports, [str(r) for r in s.result.reports]
        assert COMPILE_NOTE in s.result.notes, s.result.notes
    assert eval_frame._callback_from_stance is original


def test_a_race_inside_a_compiled_function_is_found() -> None:
    s = simdevice.cuda()
    s.run(_compiled_on_a_side_stream_unwaited)
    assert s.result is not None
    assert "race" in {r.kind for r in s.result.reports}, [str(r) for r in s.result.reports]


def test_a_function_dynamo_leaves_uncompiled_runs() -> None:
    with simdevice.cuda() as sim:
        x = torch.ones(4, device="cuda")
        y = torch._dynamo.disable(_double)(x)
        assert y.sum().item() == 12
    sim.assert_clean()


def test_the_compiled_model_s_output_races_only_unwaited() -> None:
    """``tests/hazards.py::compiled_reload`` (what tests/gpu runs on a GPU)."""
    races_only_unwaited("compiled_reload", "side#0+20")
