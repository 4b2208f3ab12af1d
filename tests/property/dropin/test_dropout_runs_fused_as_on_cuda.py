"""``F.dropout`` (``nn.Dropout``) and ``torch.dropout`` of a device tensor in training run one ``native_dropout``, as
ATen runs them on a CUDA tensor (``facade._native_dropout``). Before, C++ saw the simulated tensor's meta shell and
took the unfused path (``bernoulli_``, ``div_``, ``mul``): two operations more per call than a GPU counts, so a
checkpointed block with dropout counted 174 operations on the default stream where an H100 counted 162, and a
schedule's delay after a dropout fell on another operation in a GPU replay."""

from __future__ import annotations

import torch

import simdevice

N = 256


def _forward_backward(how: str) -> tuple[float, float]:
    torch.manual_seed(0)
    x = torch.ones(N, device="cuda", requires_grad=True)
    if how == "native":
        y = torch.native_dropout(x, 0.5, True)[0]
    elif how == "functional":
        y = torch.nn.functional.dropout(x, 0.5, training=True)
    elif how == "module":
        y = torch.nn.Dropout(0.5)(x)
    else:
        y = torch.dropout(x, 0.5, True)
    y.sum().backward()
    assert x.grad is not None
    return float(y.sum().item()), float(x.grad.sum().item())


def test_dropout_in_training_counts_as_one_native_dropout() -> None:
    native = simdevice.cuda().run(_forward_backward, "native")
    assert not native.reports, native.reports
    for how in ("functional", "module", "torch"):
        run = simdevice.cuda().run(_forward_backward, how)
        assert not run.reports, (how, run.reports)
        assert run.op_counts == native.op_counts, (how, run.op_counts, native.op_counts)
        kept, grad = run.result
        assert kept == grad  # (each kept element is scaled by 1/(1-p) in both directions)
        assert kept % 2.0 == 0.0  # (kept ones scaled by 2)


def _unfused(inplace: bool, training: bool) -> float:
    x = torch.ones(N, device="cuda")
    y = torch.nn.functional.dropout(x, 0.5, training=training, inplace=inplace)
    return float(y.sum().item())


def test_in_place_and_evaluation_dropout_are_left_as_torch_runs_them() -> None:
    """``dropout_`` takes ATen's unfused path on CUDA too; out of training it is the input itself (no op)."""
    inplace = simdevice.cuda().run(_unfused, True, True)
    outplace = simdevice.cuda().run(_unfused, False, True)
    assert inplace.op_counts["default"] > outplace.op_counts["default"], (inplace.op_counts, outplace.op_counts)
    evaluation = simdevice.cuda().run(_unfused, False, False)
    assert evaluation.result == float(N)
