"""The stream-ordered caching allocator behind every device tensor: frees, reuse, ``record_stream``.

A dropped tensor's block is free as of its stream's position then, and the next allocation on that stream may
take it at once; a side stream still reading it races with the free (and with the new owner's writes), and
corrupts under a schedule where the new owner writes first. ``t.record_stream(side)`` holds the block back
until the side stream is past the free. Blocks go back only to allocations on their own stream, as in
PyTorch's CUDACachingAllocator. Which free block an allocation takes is a schedule choice (``alloc#k~j``).
"""

from __future__ import annotations

import inspect
from typing import Any

import hazards
import pytest
import torch
from hazards import freed_while_side_reads
from hypothesis import given
from hypothesis import strategies as st

from reference.naming import short_path
from reference.schedule import Choice, Delay, Schedule
from simdevice import Race, SimDevice, StaleRead
from simdevice.dispatch import data_of
from simdevice.runtime.memory import Memory

#: how reports name this file (relative to the working directory when under it)
HERE = short_path(__file__)


def run(body: Any, *args: Any, schedule: str = "t/t") -> Any:
    return SimDevice(Schedule.parse(schedule)).run(body, *args)


def test_a_free_while_a_side_stream_reads_is_a_race_naming_both_lines_at_the_default_schedule() -> None:
    r = run(freed_while_side_reads, False)
    assert torch.equal(r.result, torch.ones(4096))  # nothing corrupts yet: the side stream read first
    races = [str(x) for x in r.reports if isinstance(x, Race)]
    lines = inspect.getsource(hazards).splitlines()

    def at(fragment: str) -> int:
        return next(i for i, text in enumerate(lines, 1) if fragment in text)

    full, copy, free = at("b = torch.full((n,), 2.0"), at("out.copy_(a)"), at("    del a")
    assert races == [
        f"race: full on stream default #1 (tests/hazards.py:{full}) writes device#3[0:16384], which copy_ on stream "
        f"side #0 (tests/hazards.py:{copy}) read as device#2, before the free on stream default (tests/hazards.py:"
        f"{free}) handed its block on; no happens-before edge orders them",
    ]


def _dropped_while_side_reads(dev: Any, reuse_after_wait: bool) -> None:
    side = dev.Stream(name="side")
    out = torch.empty(4096, device=dev.device)
    a = torch.ones(4096, device=dev.device)
    side.wait_stream(dev.current_stream())
    with dev.stream(side):
        out.copy_(a)
    del a  # no record_stream
    if reuse_after_wait:
        dev.current_stream().wait_stream(side)
        torch.full((4096,), 2.0, device=dev.device)  # the block again, ordered after the side stream's read
    dev.synchronize()


def test_a_free_not_ordered_after_another_streams_access_is_a_note_unless_a_reuse_races() -> None:
    for reuse_after_wait in (False, True):
        r = run(_dropped_while_side_reads, reuse_after_wait)
        assert r.reports == ()  # the free itself touches nothing; a reuse ordered after the read is safe
        [note] = r.notes
        assert note.startswith(f"free on stream default ({HERE}:")
        assert "freed device#2, which copy_ on stream side #0" in note
        assert "read unordered before the free (no record_stream on that stream)" in note


def test_with_the_side_stream_stalled_the_new_owner_overwrites_what_it_reads() -> None:
    r = run(freed_while_side_reads, False, schedule="t/t::side#0+1")
    assert torch.equal(r.result, torch.full((4096,), 2.0))
    [stale] = [x for x in r.reports if isinstance(x, StaleRead)]
    assert stale.seen is not None
    assert stale.seen.op == "full"  # the new owner's fill, issued after the read


@given(st.lists(st.tuples(st.sampled_from(["host", "default", "side"]), st.integers(0, 12), st.integers(1, 50)),
                max_size=3, unique_by=lambda d: d[:2]), st.lists(st.integers(0, 3), max_size=3))
def test_with_record_stream_it_is_clean_under_every_schedule(delays: list[tuple[str, int, int]],
                                                            picks: list[int]) -> None:
    schedule = Schedule("t", "t", (), [Delay(*d) for d in delays], [Choice("alloc", k, p) for k, p in
                                                                    enumerate(picks)])
    r = SimDevice(schedule).run(freed_while_side_reads, True)
    assert r.reports == ()
    assert torch.equal(r.result, torch.ones(4096))


def test_with_record_stream_it_is_clean_under_a_500_schedule_search() -> None:
    from hypothesis import find
    from hypothesis.errors import NoSuchExample

    from simdevice.search import search_settings

    delays = st.lists(st.tuples(st.sampled_from(["host", "default", "side"]), st.integers(0, 12),
                                st.integers(1, 50)), max_size=3, unique_by=lambda d: d[:2])

    def fails(ds: list[tuple[str, int, int]]) -> bool:
        r = SimDevice(Schedule("t", "t", (), [Delay(*d) for d in ds])).run(freed_while_side_reads, True)
        return bool(r.reports) or not torch.equal(r.result, torch.ones(4096))

    with pytest.raises(NoSuchExample):
        find(delays, fails, settings=search_settings(max_examples=500))


def test_a_block_goes_back_only_to_its_own_stream() -> None:
    def program(dev: Any) -> tuple[int, int, int]:
        side = dev.Stream(name="side")
        a = torch.ones(1024, device=dev.device)
        at = data_of(a).data_ptr()
        dev.synchronize()
        del a
        with dev.stream(side):
            b = torch.ones(1024, device=dev.device)  # another stream: another segment
        c = torch.ones(1024, device=dev.device)  # the compute stream again: a's block
        dev.synchronize()
        return at, data_of(b).data_ptr(), data_of(c).data_ptr()

    r = run(program)
    at, b, c = r.result
    assert (b != at, c == at, r.reports) == (True, True, ())


def test_a_recorded_block_comes_back_once_the_allocator_sees_the_stream_past_the_free() -> None:
    def program(dev: Any) -> tuple[bool, bool]:
        side = dev.Stream(name="side")
        a = torch.ones(1024, device=dev.device)
        at = data_of(a).data_ptr()
        side.wait_stream(dev.current_stream())
        with dev.stream(side):
            a.mul_(2)
        a.record_stream(side)
        del a
        b = torch.ones(1024, device=dev.device)  # side may still be reading: not a's block
        side.synchronize()
        c = torch.ones(1024, device=dev.device)  # side is past the free: a's block again, and no race
        dev.synchronize()
        return data_of(b).data_ptr() == at, data_of(c).data_ptr() == at

    r = run(program, schedule="t/t::side#0+5")  # the side stream's kernel is still queued when b is made
    assert (r.result, r.reports) == ((False, True), ())


def test_a_host_that_synchronized_before_the_free_made_it_safe() -> None:
    def program(dev: Any) -> torch.Tensor:
        side = dev.Stream(name="side")
        out = torch.empty(1024, device=dev.device)
        a = torch.ones(1024, device=dev.device)
        side.wait_stream(dev.current_stream())
        with dev.stream(side):
            out.copy_(a)
        side.synchronize()  # wait: the host drops a only once the side stream is done reading it
        del a
        torch.full((1024,), 2.0, device=dev.device)
        return out.cpu()

    r = run(program)
    assert r.reports == ()
    assert r.notes == ()  # the free is ordered after the side stream's read: the host saw it done before it
    assert torch.equal(r.result, torch.ones(1024))


def test_an_allocation_choice_takes_another_fitting_block() -> None:
    def program(dev: Any) -> str:
        a = torch.zeros(16 * 1024, device=dev.device)  # 64 KiB segment
        b = torch.zeros(8 * 1024, device=dev.device)  # 32 KiB segment
        at = {"a": data_of(a).data_ptr(), "b": data_of(b).data_ptr()}
        dev.synchronize()
        del a, b
        c = torch.zeros(1024, device=dev.device)
        return next(k for k, v in at.items() if v == data_of(c).data_ptr())

    # the allocations are #0 (a), #1 (b), #2 (c): best fit first, unless the schedule chooses
    assert run(program).result == "b"
    assert run(program, schedule="t/t::alloc#2~1").result == "a"
    assert run(program, schedule="t/t::alloc#2~1").unfired == ()
    assert run(program, schedule="t/t::alloc#9~1").unfired == ("alloc#9~1",)


# -- each rule, shown needed by a mutant ---------------------------------------------------------------------


def test_without_the_free_recorded_the_race_would_not_say_who_handed_the_block_on(monkeypatch: pytest.MonkeyPatch
                                                                                  ) -> None:
    monkeypatch.setattr(Memory, "issue_free", lambda self, who, st: None)
    r = run(freed_while_side_reads, False)
    [race] = [x for x in r.reports if isinstance(x, Race)]
    assert race.current.op == "full"
    assert race.freed is None
    assert run(_dropped_while_side_reads, False).notes == ()


def test_without_the_shadow_kept_across_reuse_the_new_owners_write_would_race_with_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    register = Memory.register

    def fresh(self: Memory, data: torch.Tensor, kind: str, process: str, shadow: Any = None, offset: int = 0) -> Any:
        return register(self, data, kind, process)  # every allocation gets a shadow of its own: no history

    monkeypatch.setattr(Memory, "register", fresh)
    r = run(freed_while_side_reads, False)
    assert [x for x in r.reports if isinstance(x, Race)] == []


def test_without_record_stream_deferral_the_fix_would_corrupt(monkeypatch: pytest.MonkeyPatch) -> None:
    from simdevice.runtime.allocator import CachingAllocator

    monkeypatch.setattr(CachingAllocator, "record_stream", lambda self, st, s: None)
    r = run(freed_while_side_reads, True, schedule="t/t::side#0+1")
    assert torch.equal(r.result, torch.full((4096,), 2.0))
