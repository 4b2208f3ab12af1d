"""``torch.compile``: a compiled function called in a run raises ``NotImplementedError`` (no verdict), whether it was
compiled in the run or before the session; before, Dynamo traced the simulator's own code (a stream's pending work
ran inside the compiled frame) or inductor failed on the simulated device, a host error reported as a finding of a
correct program. Dynamo is back as it was after the session."""

from __future__ import annotations

import torch

import simdevice
from simdevice.explain import not_run
from simdevice.search.explore import explore


def _double(a: torch.Tensor) -> torch.Tensor:
    return a * 2 + 1


_before = torch.compile(_double)


def _compiled_in_the_run() -> None:
    x = torch.ones(4, device="cuda")
    assert torch.compile(_double)(x).sum().item() == 12


def _compiled_before() -> None:
    x = torch.ones(4, device="cuda")
    assert _before(x).sum().item() == 12


def test_a_compiled_function_is_no_verdict() -> None:
    import torch._dynamo.eval_frame as eval_frame

    original = eval_frame._callback_from_stance
    for program in (_compiled_in_the_run, _compiled_before):
        found = explore(program, max_examples=1)
        assert found.failure is not None
        unrun = not_run(found.failure)
        assert unrun is not None, found.failure.text()
        assert unrun.error.startswith("NotImplementedError: torch.compile is not simulated"), unrun.error
    assert eval_frame._callback_from_stance is original


def test_a_function_dynamo_leaves_uncompiled_runs() -> None:
    with simdevice.cuda() as sim:
        x = torch.ones(4, device="cuda")
        y = torch._dynamo.disable(_double)(x)
        assert y.sum().item() == 12
    sim.assert_clean()
