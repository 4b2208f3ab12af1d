"""Properties of the memory-saver guard (``reference.memsaver_guard``) and the pausable pool, on the simulator.

FIXED holds every property under every drawn schedule and configuration;
each property is shown to catch a named bug variant (or, for the two the
named variants cannot break, a mutant written here); each bug variant is
found by Hypothesis within the default budget and its shrunk schedule
replays to the same report kind. The pool's own semantics (reuse, pause,
resume, backup, disable, free while paused) are checked on small programs.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import reference.memsaver_guard as mg
from reference.schedule import Schedule
from simdevice.check import check_variant, execute, load_all
from simdevice.device import SimDevice
from simdevice.memsaver import LibraryFixes, SimMemorySaver
from simdevice.programs import resolve
from simdevice.report import HostError, IllegalAccess
from simdevice.strategies import schedules
from simdevice.tensor import peek

load_all()
from simdevice.mechanisms.memsaver_guard import PROGRAM  # noqa: E402  (registered by load_all)


class Observed:
    """One run of the lifecycle, with the memory saver it ran on."""

    def __init__(
        self, text: str, updater: type[mg.WeightUpdater] | None = None, trainer: type[mg.Trainer] | None = None
    ) -> None:
        self.schedule = Schedule.parse(text)
        _, self.cfg = resolve(self.schedule)
        self.dev = SimDevice(self.schedule)
        fixes = mg.VARIANTS[self.schedule.variant]
        self.dev.memory_saver.fixes = LibraryFixes(release_paused_once=fixes.release_paused_once)
        originals = mg.WeightUpdater, mg.Trainer
        mg.WeightUpdater, mg.Trainer = updater or mg.WeightUpdater, trainer or mg.Trainer  # type: ignore[misc]
        try:
            self.run = self.dev.run(mg.run_lifecycle, fixes, self.cfg)
        finally:
            mg.WeightUpdater, mg.Trainer = originals  # type: ignore[misc]
        self.record: mg.SyncRecord | None = self.run.result
        self.ms: SimMemorySaver = self.dev.memory_saver
        self.problems = mg.oracle(self.cfg, self.record) if self.record is not None else ["no result"]


# -- the properties FIXED must hold, each a predicate on one run -----------------------------------


def no_report_right_values(o: Observed) -> bool:
    return not o.run.reports and not o.problems


def nothing_served_from_paused_segments(o: Observed) -> bool:
    return o.ms.allocator.served_paused == []


def every_handle_released_once(o: Observed) -> bool:
    """No double release (it would raise), and every handle a pause or a free released is distinct."""
    return not any(isinstance(r, HostError) for r in o.run.reports) and len(o.ms.released) == len(
        set(o.ms.released)
    )


def guard_entered_as_the_fix_says(o: Observed) -> bool:
    """Offload on: one guard per connection attempt made asleep and one per transfer; offload off: none."""
    if o.record is None:
        return False
    if not o.cfg.offload:
        return o.record.guard_entries == 0 and o.ms.disable_entries == 0
    asleep_connects = o.record.connects + o.record.failed_connects - (0 if o.cfg.reconnect else 1)
    return o.record.guard_entries == asleep_connects + o.record.transfers == o.ms.disable_entries


def guard_exited_and_no_transfer_after_failure(o: Observed) -> bool:
    return (
        o.record is not None
        and o.record.guard_entries == o.record.guard_exits
        and not any(o.ms._tags.values())  # every region and disable() context was left
        and not any("transfers" in p or "updates completed" in p for p in o.problems)
    )


PROPERTIES = [
    no_report_right_values,
    nothing_served_from_paused_segments,
    every_handle_released_once,
    guard_entered_as_the_fix_says,
    guard_exited_and_no_transfer_after_failure,
]


@given(schedules(PROGRAM, "FIXED"))
def test_fixed_holds_every_property(s: Schedule) -> None:
    o = Observed(str(s))
    failed = [p.__name__ for p in PROPERTIES if not p(o)]
    assert failed == [], f"{s}: {failed}\n{o.problems}\n" + "\n".join(map(str, o.run.reports))


# -- each property catches a named bug variant (or a mutant) ---------------------------------------


@pytest.mark.parametrize(
    ("prop", "variant"),
    [
        (no_report_right_values, "memsaver-connect-unguarded"),
        (no_report_right_values, "memsaver-free-while-paused-twice"),
        (nothing_served_from_paused_segments, "memsaver-connect-unguarded"),
        (every_handle_released_once, "memsaver-free-while-paused-twice"),
        (guard_entered_as_the_fix_says, "memsaver-connect-unguarded"),
    ],
)
def test_property_catches_the_variant(prop: Any, variant: str) -> None:
    assert not prop(Observed(f"memsaver_guard/{variant}"))


def test_served_from_paused_is_caught_even_without_a_fitting_use() -> None:
    # the handshake is too big for any cached block: no illegal access, but the guard is still missing
    o = Observed("memsaver_guard/memsaver-connect-unguarded:conn_kib=64,drop=0,cycles=1")
    assert nothing_served_from_paused_segments(o)
    assert not guard_entered_as_the_fix_says(o)


class _TransferAfterFailure(mg.WeightUpdater):
    """A mutant: swallows a failed connection and transfers anyway."""

    def update_weights(self, engine: mg.RolloutEngine, generation: int) -> None:
        with contextlib.suppress(ConnectionError):
            super().update_weights(engine, generation)
        if self.record.failed_connects and self.record.transfers == 0:
            with self._safe_allocations():
                self._transfer(engine)


class _GuardLeaksOnError(mg.WeightUpdater):
    """A mutant: the guard is not exited when the connection raises."""

    @contextlib.contextmanager
    def _safe_allocations(self) -> Iterator[None]:
        if not self.cfg.offload:
            yield
            return
        self.record.guard_entries += 1
        with self.dev.memory_saver.disable():
            yield
        self.record.guard_exits += 1


@pytest.mark.parametrize("mutant", [_TransferAfterFailure, _GuardLeaksOnError])
def test_guard_exit_and_no_transfer_properties_catch_mutants(mutant: type[mg.WeightUpdater]) -> None:
    assert guard_exited_and_no_transfer_after_failure(Observed("memsaver_guard/FIXED:fail=1"))
    assert not guard_exited_and_no_transfer_after_failure(Observed("memsaver_guard/FIXED:fail=1", mutant))


class _PauseWithoutWait(mg.Trainer):
    """A mutant: pauses with the offload copy and the step's kernels still queued."""

    def sleep(self) -> None:
        self.host_weights.copy_(self.weights, non_blocking=True)
        self.dev.memory_saver.pause(mg.TAG)
        self.asleep = True


def test_the_wait_before_pause_is_needed() -> None:
    bad = Observed("memsaver_guard/FIXED:drop=0", trainer=_PauseWithoutWait)
    assert not no_report_right_values(bad)
    assert any(isinstance(r, IllegalAccess) for r in bad.run.reports)


# -- Hypothesis finds each bug variant; the shrunk schedule replays ---------------------------------


@pytest.mark.parametrize(
    ("variant", "kind"),
    [("memsaver-connect-unguarded", IllegalAccess), ("memsaver-free-while-paused-twice", HostError)],
)
def test_variant_found_and_replays(variant: str, kind: type) -> None:
    finding = check_variant(PROGRAM, variant, max_examples=150)
    assert finding.found
    assert finding.schedule is not None
    first = execute(Schedule.parse(finding.schedule))
    again = execute(Schedule.parse(str(Schedule.parse(finding.schedule))))
    assert any(isinstance(r, kind) for r in first.run.reports)
    assert [type(r) for r in again.run.reports] == [type(r) for r in first.run.reports]
    assert [str(r) for r in again.run.reports] == [str(r) for r in first.run.reports]


def test_no_bug_without_offload_or_reconnect() -> None:
    for cfg in ("offload=0", "reconnect=0", "offload=0,reconnect=0"):
        assert execute(Schedule.parse(f"memsaver_guard/memsaver-connect-unguarded:{cfg},drop=0")).clean


def test_report_text_is_pinned() -> None:
    src = inspect.getsource(mg).splitlines()
    line = next(i + 1 for i, t in enumerate(src) if "mine = torch.full(" in t)
    out = execute(Schedule.parse("memsaver_guard/memsaver-connect-unguarded:cycles=1"))
    expected = (
        f"illegal access: full on stream default #10 (reference/memsaver_guard.py:{line}) writes "
        "device#8[0:2048] of device#8, which memory_saver.pause('train') at t=0.248 unmapped "
        "(block seg#1+8192, handed out again from the caching allocator's free list while paused)"
    )
    assert str(out.run.reports[0]) == expected
    twice = execute(Schedule.parse("memsaver_guard/memsaver-free-while-paused-twice:cycles=1"))
    assert str(twice.run.reports[0]).startswith(
        "host error: host raised RuntimeError: memory saver released handle h2 of seg#2 twice "
        "(pause of seg#2, then free of seg#2 while paused): the driver refuses the second release"
    )


# -- the pausable pool itself ------------------------------------------------------------------------


def sim(body: Any) -> tuple[SimDevice, Any]:
    dev = SimDevice()
    run = dev.run(body)
    return dev, run


def test_freed_block_is_reused_in_its_pool_only() -> None:
    def body(dev: Any) -> Any:
        ms = dev.memory_saver
        with ms.region("train"):
            a = torch.zeros(1024, device=dev.device)
            a_at = a._data.data_ptr()
            del a
            b = torch.zeros(1024, device=dev.device)
            with ms.disable():
                c = torch.zeros(1024, device=dev.device)
        return a_at, b._data.data_ptr(), c._data.data_ptr(), b, c

    dev, run = sim(body)
    a_at, b_at, c_at, _, _ = run.result
    alloc = dev.memory_saver.allocator
    assert (a_at, alloc.reused) == (b_at, 1)
    assert c_at != b_at
    assert [s.pool for s in alloc.pools[None]] == [None]


@pytest.mark.parametrize("backup", [False, True])
def test_pause_keeps_addresses_and_contents_only_with_backup(backup: bool) -> None:
    def body(dev: Any) -> Any:
        ms = dev.memory_saver
        with ms.region("train", enable_cpu_backup=backup):
            w = torch.full((256,), 3.0, device=dev.device)
        dev.synchronize()
        at = w._data.data_ptr()
        ms.pause("train")
        ms.resume("train")
        return at, w._data.data_ptr(), w.cpu(), w

    _, run = sim(body)
    before, after, values, w = run.result
    assert before == after
    assert not run.reports
    assert torch.equal(values, torch.full((256,), 3.0)) == backup
    assert backup or bool(torch.isnan(peek(w)).all())


def test_access_while_paused_names_allocation_pause_and_access() -> None:
    def body(dev: Any) -> Any:
        ms = dev.memory_saver
        with ms.region("train"):
            w = torch.zeros(256, device=dev.device)
        dev.synchronize()
        ms.pause("train")
        w.add_(1)
        return w

    _, run = sim(body)
    line = inspect.getsourcelines(body)[1] + 6
    assert [str(r) for r in run.reports] == [
        f"illegal access: add_ on stream default #1 (property/test_memsaver_guard.py:{line}) {verb} "
        "device#1[0:1024] of device#1, which memory_saver.pause('train') at t=0.010 unmapped (block seg#1+0)"
        for verb in ("reads", "writes")
    ]


def test_allocation_in_paused_region_comes_from_cache_or_fresh_segment() -> None:
    def body(dev: Any) -> Any:
        ms = dev.memory_saver
        with ms.region("train"):
            keep = torch.zeros(1024, device=dev.device)  # 4 KiB in a 20 KiB segment: 16 KiB stay cached
            dev.synchronize()
            ms.pause("train")
            cached = torch.empty(512, device=dev.device)  # fits the cached rest: unmapped from birth
            fresh = torch.empty(64 * 1024, device=dev.device)  # fits nothing: a fresh, mapped segment
            cached.fill_(1)
            fresh.fill_(1)
            with ms.disable():
                ordinary = torch.ones(512, device=dev.device)
            ms.resume("train")
        return keep, cached, fresh, ordinary

    dev, run = sim(body)
    assert [type(r) for r in run.reports] == [IllegalAccess]
    assert "device#2" in str(run.reports[0])
    assert len(dev.memory_saver.allocator.served_paused) == 1


@pytest.mark.parametrize("fixed", [True, False])
def test_free_while_paused_releases_each_handle_once(fixed: bool) -> None:
    def body(dev: Any) -> Any:
        dev.memory_saver.fixes = LibraryFixes(release_paused_once=fixed)
        ms = dev.memory_saver
        with ms.region("train"):
            x = torch.zeros(64 * 1024, device=dev.device)
        dev.synchronize()
        ms.pause("train")
        del x
        dev.empty_cache()
        return sorted(ms.released.values())

    _, run = sim(body)
    if fixed:
        assert (run.reports, run.result) == ((), ["pause of seg#1"])
    else:
        assert [type(r) for r in run.reports] == [HostError]


def test_gpu_schedules_behave_in_the_simulator_as_on_the_gpu() -> None:
    gpu = "act_kib=128,bucket_kib=16,conn_kib=8,drop=0,kib=64"  # tests/gpu/test_memsaver_guard_gpu.py
    bug = execute(Schedule.parse(f"memsaver_guard/memsaver-connect-unguarded:{gpu}"))
    assert isinstance(bug.run.reports[0], IllegalAccess)
    for extra in ("", ",fail=1", ",offload=0", ",cycles=3,reconnect=0"):
        assert execute(Schedule.parse(f"memsaver_guard/FIXED:{gpu}{extra}")).clean


# -- the pool under random programs ---------------------------------------------------------------

_OP = st.one_of(
    st.tuples(st.just("alloc"), st.sampled_from([256, 1024, 4096, 16384]), st.booleans()),
    st.tuples(st.just("free"), st.integers(0, 7)),
    st.tuples(st.just("write"), st.integers(0, 7)),
    st.tuples(st.sampled_from(["pause", "resume", "empty_cache"])),
)


def pool_program(ops: list[tuple[Any, ...]], pick: int, fixes: LibraryFixes) -> list[str]:
    """Run a random program on the pool; what it finds wrong (an empty list when all holds)."""

    def body(dev: Any) -> list[str]:
        dev.memory_saver.fixes = fixes
        ms, live, bad = dev.memory_saver, [], []  # live: [tensor, in_region, value, address]
        paused = False
        with ms.region("train", enable_cpu_backup=True):
            for op in ops:
                if op[0] == "alloc":
                    with contextlib.nullcontext() if op[2] else ms.disable():
                        # empty: in a paused region the block may be unmapped, so no write yet
                        live.append([torch.empty(op[1], device=dev.device), op[2], 0.0, 0])
                    live[-1][3] = live[-1][0]._data.data_ptr()
                elif op[0] == "free" and live:
                    del live[op[1] % len(live)]  # the last reference: the block goes back to the cache
                elif op[0] == "write" and live and not (paused and live[op[1] % len(live)][1]):
                    live[op[1] % len(live)][2] += 1
                    live[op[1] % len(live)][0].fill_(live[op[1] % len(live)][2])
                elif op[0] == "pause" and not paused:
                    dev.synchronize()
                    ms.pause("train")
                    paused = True
                elif op[0] == "resume" and paused:
                    ms.resume("train")
                    paused = False
                elif op[0] == "empty_cache":
                    dev.empty_cache()
            if paused:
                ms.resume("train")
            spans = sorted((e[0]._data.data_ptr(), e[0]._data.data_ptr() + 4 * e[0].numel()) for e in live)
            bad += [f"overlap at {a}" for (_, a), (b, _) in itertools.pairwise(spans) if b < a]
            for t, _, value, at in live:
                if t._data.data_ptr() != at:
                    bad.append("an allocation moved")
                # a tensor made while its region was paused, and never written, holds poison
                if value and not torch.equal(t.cpu(), torch.full((t.numel(),), value)):
                    bad.append(f"an allocation lost its value {value}")
        return bad

    dev = SimDevice(Schedule.parse(f"memsaver_guard/FIXED:pick={pick}"))
    run = dev.run(body)
    released = list(dev.memory_saver.released)
    return [str(r) for r in run.reports] + (run.result or []) + (
        ["a handle released twice"] if len(set(released)) != len(released) else []
    )


@given(st.lists(_OP, max_size=24), st.integers(0, 2))
def test_pool_keeps_addresses_values_and_handles(ops: list[tuple[Any, ...]], pick: int) -> None:
    """Live allocations never overlap, keep their address and (backed up) values; each handle is released once."""
    assert pool_program(ops, pick, LibraryFixes()) == []


def test_pool_property_catches_free_while_paused_twice() -> None:
    ops = [("alloc", 16384, True), ("write", 0), ("pause",), ("free", 0), ("empty_cache",)]
    assert pool_program(ops, 0, LibraryFixes()) == []
    assert "released handle h1 of seg#1 twice" in pool_program(ops, 0, LibraryFixes(release_paused_once=False))[0]


def test_pick_chooses_among_fitting_blocks() -> None:
    def body(dev: Any) -> Any:
        a = torch.zeros(16 * 1024, device=dev.device)  # 64 KiB segment
        b = torch.zeros(8 * 1024, device=dev.device)  # 32 KiB segment
        at = {"a": a._data.data_ptr(), "b": b._data.data_ptr()}
        dev.synchronize()  # queued work holds its tensors: only then are both blocks free
        del a, b
        c = torch.zeros(1024, device=dev.device)
        return next(k for k, v in at.items() if v == c._data.data_ptr()), c

    chosen = {pick: SimDevice(Schedule.parse(f"memsaver_guard/FIXED:pick={pick}")).run(body).result[0]
              for pick in (0, 1)}
    assert chosen == {0: "b", 1: "a"}  # best fit first; the schedule may choose the other
