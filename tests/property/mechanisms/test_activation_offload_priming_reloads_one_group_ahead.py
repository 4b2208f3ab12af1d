"""Activation offload: priming the next chunk reloads one group ahead of its backward, never more.

``pre_reload_last_layer`` prefetches the next chunk's last offloaded group, once, so the chunk's backward does not
start inline; the rest of that chunk is prefetched one group at a time by its own backward. Reloading more of it
ahead of its backward breaks no ordering (each prefetch waits the D2H, compute waits each reload), so no report and
no wrong value shows it: the device holds those chunks' activations again before anything needs them, which is what
offloading them was meant to avoid. The property: when a chunk's backward starts, at most one of its groups has
been prefetched in that pass. It catches a mutant of FIXED whose priming does not look at ``_primed``: every group
whose backward ends with an empty LIFO primes another group of the next chunk.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from hypothesis import given, settings

from reference import activation_offload as ao
from reference.schedule import Schedule
from simdevice.programs.activation_offload import PROGRAM
from simdevice.search import execute
from simdevice.search.strategies import schedules

#: (what, pass, chunk) in host order: "prefetch" when a group's reload is enqueued, "backward" at a group's start
Event = tuple[str, int, int]


@contextmanager
def watched() -> Iterator[list[Event]]:
    """Record every prefetch and every group's backward start of the runs made inside the block."""
    events: list[Event] = []
    manager = ao.ActivationOffloadManager
    prefetch, start = manager.bulk_reload_group, manager.on_group_commit_backward

    def bulk_reload_group(self: ao.ActivationOffloadManager, group: ao.OffloadTensorGroup) -> None:
        events.append(("prefetch", self.pass_index, group.handler.chunk))
        prefetch(self, group)

    def on_group_commit_backward(self: ao.ActivationOffloadManager, group: ao.OffloadTensorGroup) -> None:
        events.append(("backward", self.pass_index, group.handler.chunk))
        start(self, group)

    ao.ActivationOffloadManager.bulk_reload_group = bulk_reload_group  # type: ignore[method-assign]
    ao.ActivationOffloadManager.on_group_commit_backward = on_group_commit_backward  # type: ignore[method-assign]
    try:
        yield events
    finally:
        ao.ActivationOffloadManager.bulk_reload_group = prefetch  # type: ignore[method-assign]
        ao.ActivationOffloadManager.on_group_commit_backward = start  # type: ignore[method-assign]


def ahead_of_backward(events: list[Event]) -> dict[tuple[int, int], int]:
    """Per (pass, chunk): how many of its groups were prefetched before its backward started."""
    started: set[tuple[int, int]] = set()
    ahead: dict[tuple[int, int], int] = {}
    for what, pass_index, chunk in events:
        key = (pass_index, chunk)
        if what == "backward":
            started.add(key)
        elif key not in started:
            ahead[key] = ahead.get(key, 0) + 1
    return ahead


def primes_one_group_ahead(s: Schedule) -> dict[tuple[int, int], int]:
    with watched() as events:
        out = execute(s)
    assert out.clean, out.text()
    ahead = ahead_of_backward(events)
    assert all(n <= 1 for n in ahead.values()), f"{s}: groups prefetched ahead of their chunk's backward: {ahead}"
    return ahead


@settings(max_examples=40, database=None)
@given(schedules(PROGRAM, "FIXED"))
def test_fixed_primes_at_most_one_group_ahead_of_a_chunk_backward(s: Schedule) -> None:
    primes_one_group_ahead(s)


#: configurations where two groups of a chunk end their backward on an empty LIFO while the next chunk still has
#: two offloaded groups to reload: four layers at fraction 0.5 (two offloaded, two resident), every forward first
#: or 1F1B with two microbatches in flight (with one in flight the next chunk has not run its forward yet when a
#: chunk's backward ends, so nothing is primed at all)
SHOWN = [
    "layers=4,mb=2,iters=2,frac=50",
    "layers=4,mb=3,iters=2,frac=50,warmup=0,inflight=2",
]


@pytest.mark.parametrize("cfg", SHOWN)
def test_fixed_primes_exactly_the_next_chunk_once(cfg: str) -> None:
    """The property is not vacuous there: FIXED does prime each later chunk, one group of it."""
    ahead = primes_one_group_ahead(Schedule.parse(f"activation_offload/FIXED:{cfg}"))
    mb = int(dict(kv.split("=") for kv in cfg.split(","))["mb"])
    assert {chunk for (p, chunk), n in ahead.items() if p == 1 and n == 1} == set(range(1, mb))


def _primes_every_time(self: ao.ActivationOffloadManager) -> None:
    """A mutant of ``pre_reload_last_layer``: no ``_primed`` test, so it primes the next chunk again and again."""
    nxt = self._cur_backward + 1
    if nxt >= len(self.handlers):
        return
    handler = self.handlers[nxt]
    if not handler._groups_to_reload:
        return
    handler._primed = True
    self.bulk_reload_group(handler._groups_to_reload.pop())


@pytest.mark.parametrize("cfg", SHOWN)
def test_the_property_catches_priming_without_the_primed_flag(cfg: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ao.ActivationOffloadManager, "pre_reload_last_layer", _primes_every_time)
    s = Schedule.parse(f"activation_offload/FIXED:{cfg}")
    with watched() as events:
        out = execute(s)
    assert out.clean, out.text()  # no race, no wrong value: only the count shows it
    assert max(ahead_of_backward(events).values()) > 1
    with pytest.raises(AssertionError, match="prefetched ahead of their chunk's backward"):
        primes_one_group_ahead(s)
