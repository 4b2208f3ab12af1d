"""A program's failing ``assert`` during a simulated run, where pytest rewrote it
(``simdevice.runtime.runtime.assert_explanations_plain``).

Rule, with a test a mutation of it fails: during a run, pytest's comparison hook (the module global
``_pytest.assertion.util._reprcompare``) is not called; the assert says pytest's plain message, and the hook is back
once the run ends. A search fails the program's assert at schedule after schedule; with the hook, each failure
diffed the operands, which took hours per failure for a 1024-element list where pytest does not truncate (its CI
mode): a test that searched such a program never ended.

This module is a test module, so pytest rewrote the asserts of its programs as it rewrites a user's.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from _pytest.assertion import util

import simdevice
from simdevice import SimDevice
from simdevice.runtime.reports import HostError


@pytest.fixture
def hook_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The comparison hook replaced by one that counts its calls (pytest sets it for the running test)."""
    calls: list[str] = []

    def spy(op: str, left: object, right: object) -> str | None:
        calls.append(op)
        return None

    monkeypatch.setattr(util, "_reprcompare", spy)
    return calls


def _compares(dev: Any) -> None:
    x = torch.zeros(1024, device=dev.device)
    assert x.cpu().tolist() == [1.0] * 1024


def test_a_program_s_failing_assert_calls_no_comparison_hook(hook_calls: list[str]) -> None:
    """Mutation caught: the run without ``assert_explanations_plain`` (the hook called once)."""
    (error,) = SimDevice().run(_compares).reports
    assert isinstance(error, HostError)
    assert "AssertionError: assert [0.0, 0.0, 0.0" in error.error  # pytest's plain message: the operands' reprs
    assert hook_calls == []
    util._reprcompare("==", 1, 2)  # the hook is back after the run
    assert hook_calls == ["=="]


def _racy() -> None:
    side = torch.cuda.Stream()
    x = torch.zeros(1024, device="cuda")
    with torch.cuda.stream(side):
        x.add_(1)  # no wait for the compute stream's fill
    torch.cuda.synchronize()
    assert x.cpu().tolist() == [1.0] * 1024


def test_a_search_whose_program_s_assert_fails_calls_no_comparison_hook(hook_calls: list[str]) -> None:
    """The same through ``simdevice.explore``, which runs the program under many schedules and shrinks."""
    found = simdevice.explore(_racy, max_examples=20)
    assert found.failure is not None
    assert hook_calls == []


def test_outside_pytest_s_test_run_there_is_no_hook_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no hook set (a program run from a script: pytest sets one only for a test it runs), a run leaves it so."""
    monkeypatch.setattr(util, "_reprcompare", None)
    (error,) = SimDevice().run(_compares).reports
    assert isinstance(error, HostError)
    assert util._reprcompare is None
