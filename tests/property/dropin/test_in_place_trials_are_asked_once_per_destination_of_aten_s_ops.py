"""The trial that raises an in-place op's argument errors at the call (``dispatch._check_in_place``) is asked once per
destination tensor and op: a destination the op wrote before is not asked again, whatever its arguments (the cost
CHANGELOG's twenty-ninth sitting measured: none on a repeated destination). And it is asked of aten's ops alone: a
library's own in-place op whose host kernel raises on zeros and ones says nothing of what its CUDA kernel checks, and
runs on the stream with the program's values. Mutations caught (a sweep of the twenty-ninth sitting's rules): the
destination not remembered (asked at every call), a library's op tried too (raised at the call where its kernel
takes the program's values)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import simdevice
from simdevice import dispatch

_LIB = torch.library.Library("simdevice_in_place_trials", "DEF")
_LIB.define("scale_(Tensor(a!) x) -> Tensor(a!)")


def _scale_(x: torch.Tensor) -> torch.Tensor:
    """Doubles ``x``; refuses a tensor with no element above 1 (zeros and ones alike)."""
    if not bool((x > 1).any()):
        raise RuntimeError("scale_: no element above 1")
    return x.mul_(2)


_LIB.impl("scale_", _scale_, "CPU")


def test_a_destination_is_asked_once_per_op(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[Any] = []
    check = dispatch._check_in_place

    def counted(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        asked.append(func)
        check(func, args, kwargs)

    monkeypatch.setattr(dispatch, "_check_in_place", counted)

    def program() -> None:
        d = torch.ones(4, device="cuda")
        for _ in range(5):
            d.add_(1)
        d.mul_(2)
        e = torch.ones(4, device="cuda")
        e.add_(1)
        assert d.cpu().tolist() == [12.0] * 4

    s = simdevice.cuda()
    s.run(program)
    s.assert_clean()
    names = [f._schema.name for f in asked]
    assert [n for n in names if n in ("aten::add_", "aten::mul_")] == ["aten::add_", "aten::mul_", "aten::add_"]


def test_a_library_s_in_place_op_runs_with_the_program_s_values() -> None:
    got: list[Any] = []

    def program() -> None:
        d = torch.full((4,), 3.0, device="cuda")
        try:
            torch.ops.simdevice_in_place_trials.scale_(d)
        except RuntimeError as e:
            got.append(str(e))
        got.append(d.cpu().tolist())

    s = simdevice.cuda()
    s.run(program)
    s.assert_clean()
    assert got == [[6.0] * 4]
