"""Activation offload: compute waits on a group's ``_reload_event`` only in a pass that scheduled its reload.

The start of a group's backward waits ``_reload_event`` when a prefetch scheduled the group's reload in this pass.
The event lives as long as the group and is reused every pass, so for a group nobody prefetched (reloaded inline,
or resident) it holds a stale record, or none: waiting on it orders nothing new (compute waited that record in
its own pass), so no race and no wrong value shows the extra wait, but it is a stream wait on a stale edge, the
cost the offload latch exists to keep out for ``_offload_event`` (``no_stale_event_wait`` in
``test_activation_offload.py``). The property: every compute wait on a reload event is for a group whose reload
was scheduled in that pass. It catches a mutant of FIXED whose backward start waits unconditionally.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from reference import activation_offload as ao
from reference.schedule import Schedule
from simdevice.programs.activation_offload import PROGRAM
from simdevice.search import Outcome, execute
from simdevice.search.strategies import schedules


def reload_waits_only_where_scheduled(out: Outcome) -> bool:
    """No compute wait on a ``_reload_event`` whose group no prefetch scheduled in this pass."""
    return all(w.prefetched for w in out.run.result["waits"] if w.event == "reload")


@settings(max_examples=40, database=None)
@given(schedules(PROGRAM, "FIXED"))
def test_fixed_waits_on_a_reload_event_only_where_a_reload_was_scheduled(s: Schedule) -> None:
    out = execute(s)
    assert out.clean, out.text()
    assert reload_waits_only_where_scheduled(out), [w for w in out.run.result["waits"] if w.event == "reload"]


#: the first backward group reloaded inline in warmup (nothing prefetched it; the other is), and a pass whose
#: resident groups (fraction 0.5) hold the previous pass's reload records
SHOWN = ["layers=2", "layers=4,mb=2,iters=2,frac=50"]


@pytest.mark.parametrize("cfg", SHOWN)
def test_fixed_waits_on_every_scheduled_reload(cfg: str) -> None:
    """Not vacuous: FIXED does wait on reload events there, once per prefetched group, and on no other."""
    out = execute(Schedule.parse(f"activation_offload/FIXED:{cfg}"))
    assert out.clean, out.text()
    waited = [(w.pass_index, w.chunk, w.group) for w in out.run.result["waits"] if w.event == "reload"]
    prefetched = [(r.pass_index, r.chunk, r.group) for r in out.run.result["reloads"] if r.path == "prefetch"]
    assert waited
    assert sorted(waited) == sorted(prefetched)
    assert reload_waits_only_where_scheduled(out)


def _waits_unconditionally(self: ao.ActivationOffloadManager, group: ao.OffloadTensorGroup) -> None:
    """A mutant of ``on_group_commit_backward``: it waits ``_reload_event`` without ``if group._reload_scheduled``."""
    cur = self.cur_backward_chunk()
    if group.handler is not cur:
        raise AssertionError(f"Chunk mismatch: backward reached group {group.name}")
    self._log(group, "compute", "reload", "commit")
    self.compute_stream.wait_event(group._reload_event)


@pytest.mark.parametrize("cfg", SHOWN)
def test_the_property_catches_a_wait_on_a_reload_nobody_scheduled(cfg: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ao.ActivationOffloadManager, "on_group_commit_backward", _waits_unconditionally)
    out = execute(Schedule.parse(f"activation_offload/FIXED:{cfg}"))
    assert out.clean, out.text()  # the extra waits order nothing new: only the wait record shows them
    assert not reload_waits_only_where_scheduled(out)
