"""Rule (explore.search_target): ``Search.examples`` is the number of schedules the search ran, shrinking included,
probes not counted: the failure it returns is the run it found failing, kept, not a run of that schedule made
again afterwards (one more run of the whole program, uncounted, and, for a program that is not deterministic, maybe
not the run that failed)."""

from __future__ import annotations

from typing import Any

import torch

from reference.schedule import Schedule
from simdevice.search.execute import Outcome
from simdevice.search.explore import search_target
from simdevice.search.targets import from_function


def racy(n: int = 64) -> None:
    """A kernel on a side stream reads ``x`` with no wait for the stream that wrote it."""
    side = torch.cuda.Stream()
    x = torch.ones(n, device="cuda")
    with torch.cuda.stream(side):
        y = x * 2
    assert y.sum().item() == 2 * n


class CountingTarget:
    """A target that counts the runs asked of it (its probes go to the target it wraps: not counted)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.runs: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def run(self, schedule: Schedule, backend: str = "sim") -> Outcome:
        self.runs.append(str(schedule))
        return self.inner.run(schedule, backend)  # type: ignore[no-any-return]


def test_the_search_runs_as_many_schedules_as_it_counts_and_returns_the_failing_run() -> None:
    target = CountingTarget(from_function(racy))
    found = search_target(target, max_examples=30)  # type: ignore[arg-type]
    assert found.failure is not None, "no failure found: the test needs one"
    assert target.runs, "the search ran nothing"
    assert len(target.runs) == found.examples, (
        f"the search ran {len(target.runs)} schedules, counted {found.examples}: {target.runs[-3:]}")
    assert found.failure.corrupted
