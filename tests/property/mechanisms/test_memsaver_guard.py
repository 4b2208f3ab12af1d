"""Properties of the memory-saver guard (``reference.memsaver_guard``) and the pausable pool, on the simulator.

FIXED holds every property under every drawn schedule and configuration;
each property is shown to catch a named bug variant (or, for the two the
named variants cannot break, a mutant written here). The properties: no
report and the right values; nothing served from a paused segment; every
allocation made while the region is paused comes from outside the paused pool
(a fresh segment of it included: a mutant whose guard exits before the
barrier, which allocates as NCCL's does, breaks only this one); every handle
released once; the guard entered as the fix says; the guard exited on every
path and no transfer after a failed connection. That Hypothesis finds each bug variant
and its shrunk schedule replays is
``tests/property/quality/test_found_and_replays.py``; the pool's own
semantics are ``tests/property/model/test_memory_saver_pool.py`` and
``tests/property/model/test_memory_saver_reuse_while_paused.py``.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given

import reference.memsaver_guard as mg
from reference.schedule import Schedule
from simdevice.programs.memsaver_guard import PROGRAM, VARIANTS, oracle
from simdevice.runtime.allocator import Block, PoolTag
from simdevice.runtime.memory import Storage
from simdevice.runtime.memsaver import SimMemorySaver
from simdevice.runtime.reports import HostError, IllegalAccess
from simdevice.search import device_for, execute
from simdevice.search.strategies import schedules


class Observed:
    """One run of the lifecycle, with the memory saver it ran on."""

    def __init__(
        self, text: str, updater: type[mg.WeightUpdater] | None = None, trainer: type[mg.Trainer] | None = None
    ) -> None:
        self.schedule = Schedule.parse(text)
        self.dev, self.cfg = device_for(self.schedule)
        fixes, _ = VARIANTS[self.schedule.variant]
        self.ms: SimMemorySaver = self.dev.runtime.memsaver
        #: (pool, block, segment) of every allocation made from a pool while that pool was paused: the allocator's
        #: ``served_paused`` plus those it served from a fresh segment of the paused pool (mapped, so no report)
        self.made_while_paused: list[tuple[PoolTag, str, str]] = []
        allocated = self.ms.allocated

        def watch(block: Block, st: Storage) -> None:
            pool = block.segment.pool
            if pool is not None and self.ms.is_paused(pool):
                self.made_while_paused.append((pool, repr(block), block.segment.label))
            allocated(block, st)

        self.ms.allocated = watch  # type: ignore[method-assign]
        originals = mg.WeightUpdater, mg.Trainer
        mg.WeightUpdater, mg.Trainer = updater or mg.WeightUpdater, trainer or mg.Trainer  # type: ignore[misc]
        try:
            self.run = self.dev.run(mg.run_lifecycle, fixes, self.cfg.plan())
        finally:
            mg.WeightUpdater, mg.Trainer = originals  # type: ignore[misc]
        self.record: mg.SyncRecord | None = self.run.result
        self.problems = oracle(self.cfg, self.record) if self.record is not None else ["no result"]


# -- the properties FIXED must hold, each a predicate on one run -----------------------------------


def no_report_right_values(o: Observed) -> bool:
    return not o.run.reports and not o.problems


def nothing_served_from_paused_segments(o: Observed) -> bool:
    return o.ms.allocator.served_paused == []


def allocations_while_paused_avoid_the_paused_pool(o: Observed) -> bool:
    """Every allocation made while the region is paused comes from outside the paused pool.

    Stronger than :func:`nothing_served_from_paused_segments`: a request no cached block fits gets a fresh,
    mapped segment of the paused pool, which faults nowhere yet, but is device memory the sleeping trainer meant
    to give up, and the next pause unmaps it under the cache (the next such allocation is then served from it).
    """
    return o.made_while_paused == [] and o.ms.allocator.served_paused == []


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
        and o.ms.open_contexts() == 0  # every region and disable() context was left
        and not any("transfers" in p or "updates completed" in p for p in o.problems)
    )


PROPERTIES = [
    no_report_right_values,
    nothing_served_from_paused_segments,
    allocations_while_paused_avoid_the_paused_pool,
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
        (allocations_while_paused_avoid_the_paused_pool, "memsaver-connect-unguarded"),
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
    assert not allocations_while_paused_avoid_the_paused_pool(o)


def test_the_paused_pool_watch_sees_what_the_allocator_records() -> None:
    # every allocation the allocator served from a paused segment is one the watch saw made in the paused pool
    o = Observed("memsaver_guard/memsaver-connect-unguarded")
    served = o.ms.allocator.served_paused
    assert served
    assert [s for s in served if s not in o.made_while_paused] == []


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


class _GuardExitsBeforeBarrier(mg.WeightUpdater):
    """A mutant of FIXED: the connection's guard is left before the barrier, whose one-element tensor (NCCL's
    barrier allocates) is then made asleep, from the paused pool."""

    def update_weights(self, engine: mg.RolloutEngine, generation: int) -> None:
        if self.conn_status.needs_reconnect(generation):
            fail = self.cfg.fail and self.attempts == 0
            with self._safe_allocations():
                self.connect_rollout_engines(fail)
                self.conn_status.mark_reconnected(generation)
            self._barrier()
        with self._safe_allocations():
            self._transfer(engine)


def test_allocations_while_paused_property_catches_a_guard_exiting_before_the_barrier() -> None:
    assert allocations_while_paused_avoid_the_paused_pool(Observed("memsaver_guard/FIXED"))
    # each pause is followed by empty_cache (drop=1), so no cached block of a paused segment is left: the barrier's
    # tensor gets a fresh segment of the paused pool, mapped and active, so nothing faults; but it is still cached
    # when the trainer wakes, and the library's resume refuses an allocation that is not paused: the process ends
    # there, at the first wake (a host error)
    bad = Observed("memsaver_guard/FIXED", _GuardExitsBeforeBarrier)
    assert bad.made_while_paused == [("train", "block seg#5+0", "seg#5")]
    assert bad.ms.allocator.served_paused == []
    assert [type(r) for r in bad.run.reports] == [HostError]
    assert "memory_saver.resume('train') meets seg#5 of region 'train', not paused" in str(bad.run.reports[0])
    assert not allocations_while_paused_avoid_the_paused_pool(bad)
    # drop=0: the same (the barrier's segment is still cached at the wake): the process ends at the first wake,
    # before the second pause could unmap that segment under the second barrier's tensor
    late = Observed("memsaver_guard/FIXED:drop=0", _GuardExitsBeforeBarrier)
    assert late.made_while_paused == [("train", "block seg#5+0", "seg#5")]
    assert [type(r) for r in late.run.reports] == [HostError]
    assert not allocations_while_paused_avoid_the_paused_pool(late)


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


# -- the report, and what hides the bug -------------------------------------------------------------


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


def test_gpu_schedules_behave_in_the_simulator_as_on_the_gpu() -> None:
    gpu = "act_kib=128,bucket_kib=16,conn_kib=8,drop=0,kib=64"  # tests/gpu/test_memsaver_guard_gpu.py
    bug = execute(Schedule.parse(f"memsaver_guard/memsaver-connect-unguarded:{gpu}"))
    assert isinstance(bug.run.reports[0], IllegalAccess)
    for extra in ("", ",fail=1", ",offload=0", ",cycles=3,reconnect=0"):
        assert execute(Schedule.parse(f"memsaver_guard/FIXED:{gpu}{extra}")).clean
