"""Memory-saver guard: a failed connection leaves the trainer unconnected, so the next sync retries it.

``update_weights`` marks the engines' generation connected only after ``connect_rollout_engines`` returned. The
lifecycle of ``reference.memsaver_guard`` changes the engines every cycle (``reconnect=1``), so a sync after a
failed one reconnects whatever the bookkeeping says, and the harness cannot tell the order of the two calls apart.
Here the engines change once and the first connection to them fails: the next sync, to the same generation, must
connect before it sends anything. It catches a mutant of FIXED that marks the generation connected before
connecting: the failure leaves it marked, and the next sync sends the weights over no connection.
"""

from __future__ import annotations

import contextlib

import attrs
import pytest
import torch
from hypothesis import given, settings

import reference.memsaver_guard as mg
from reference.contract import Device
from reference.schedule import Schedule
from simdevice.programs.memsaver_guard import PROGRAM, VARIANTS, expected_weights
from simdevice.search import device_for
from simdevice.search.strategies import schedules

#: the engines' generation: changed once, before the first sync, and then kept
GENERATION = 1


def retry_lifecycle(dev: Device, fixes: mg.Fixes, cfg: mg.Plan) -> mg.SyncRecord:
    """``run_lifecycle``'s cycles, every sync to one new generation, whose first connection fails."""
    record = mg.SyncRecord()
    engine = mg.RolloutEngine(dev, cfg.n)
    with dev.memory_saver.region(mg.TAG, enable_cpu_backup=True):
        trainer = mg.Trainer(dev, cfg)
        updater = mg.WeightUpdater(dev, fixes, cfg, trainer, record)
        for _ in range(cfg.cycles):
            trainer.train_step()
            if cfg.offload:
                trainer.sleep()
            try:
                updater.update_weights(engine, GENERATION)
                record.updated.append(True)
            except ConnectionError:
                record.updated.append(False)
            record.received.append(engine.weights.clone())
            if cfg.offload:
                trainer.wake()
    return record


def run_retry(text: str) -> tuple[mg.Plan, mg.SyncRecord]:
    schedule = Schedule.parse(text)
    dev, cfg = device_for(schedule)
    plan = attrs.evolve(cfg.plan(), fail=True, reconnect=True, cycles=max(2, cfg.cycles))
    run = dev.run(retry_lifecycle, VARIANTS[schedule.variant][0], plan)
    assert not run.reports, "\n".join(map(str, run.reports))
    assert run.result is not None
    return plan, run.result


def retried_before_transfer(plan: mg.Plan, record: mg.SyncRecord) -> bool:
    """The first sync fails and sends nothing; the second connects, then sends; later ones only send."""
    syncs = plan.cycles
    return (
        record.updated == [False] + [True] * (syncs - 1)
        and (record.failed_connects, record.connects, record.transfers) == (1, 1, syncs - 1)
        and torch.equal(record.received[0], torch.zeros(plan.n))
        and torch.equal(record.received[1], expected_weights(plan.n, 2))
    )


@settings(max_examples=30, database=None)
@given(schedules(PROGRAM, "FIXED"))
def test_fixed_connects_again_after_a_failed_connection(s: Schedule) -> None:
    plan, record = run_retry(str(s))
    assert retried_before_transfer(plan, record), record


class _MarksBeforeConnecting(mg.WeightUpdater):
    """A mutant of FIXED: the reconnect bookkeeping before the connection, inside the same guard."""

    def update_weights(self, engine: mg.RolloutEngine, generation: int) -> None:
        if self.conn_status.needs_reconnect(generation):
            fail = self.cfg.fail and self.attempts == 0
            with self._safe_allocations() if self.fixes.guard_connection else contextlib.nullcontext():
                self.conn_status.mark_reconnected(generation)
                self.connect_rollout_engines(fail)
                self._barrier()
        with self._safe_allocations():
            self._transfer(engine)


@pytest.mark.parametrize("cfg", ["", "offload=0", "drop=0,cycles=3"])
def test_the_property_catches_the_bookkeeping_before_the_connection(cfg: str, monkeypatch: pytest.MonkeyPatch) -> None:
    text = f"memsaver_guard/FIXED:{cfg}" if cfg else "memsaver_guard/FIXED"
    assert retried_before_transfer(*run_retry(text))
    monkeypatch.setattr(mg, "WeightUpdater", _MarksBeforeConnecting)
    plan, record = run_retry(text)
    assert not retried_before_transfer(plan, record)
    assert record.connects == 0  # the second sync sent the weights with no connection up
    assert record.transfers == plan.cycles - 1
