"""Rule (``reports.describe``): a bare ``assert`` of the program's that fails (no message: its text is empty) is
reported by the line that failed, ``AssertionError at `<the line>```, as a traceback shows it, not as a bare
``AssertionError``. Mutation: the line left out (the report said ``AssertionError`` alone).

(PYTEST_DONT_REWRITE: the program's ``assert`` here is a plain one, as in a program's own file.)"""

from __future__ import annotations

import torch

import simdevice
from simdevice import HostError


def _checks_its_sum() -> None:
    x = torch.ones(4, device="cuda")
    assert x.sum().item() == 5.0


def test_a_bare_assert_that_fails_is_named_by_its_line() -> None:
    s = simdevice.cuda()
    s.run(_checks_its_sum)
    [error] = [r for r in s.reports if isinstance(r, HostError)]
    assert error.error == "AssertionError at `assert x.sum().item() == 5.0`", error
