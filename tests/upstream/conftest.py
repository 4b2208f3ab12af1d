"""Each upstream test runs in the repository's root: the schedule lines it checks name its driver
(``tests/upstream/...py::FUNCTION``) relative to it."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _in_the_repository(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
