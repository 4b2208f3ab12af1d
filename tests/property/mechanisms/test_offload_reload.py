"""The demonstration program: offload then reload, in a racy and a correct form.

The same property checks both: the correct form holds it under every schedule;
for the racy form Hypothesis finds a schedule that breaks it and shrinks it to
one stall of the D2H (that it replays: ``tests/property/quality``).
"""

import pytest
from hypothesis import find, given

from reference.schedule import Schedule
from simdevice.programs.offload_reload import PROGRAM
from simdevice.search import Outcome, execute, exhaust, search_settings
from simdevice.search.strategies import schedules


def reload_equals_offload(s: Schedule) -> Outcome:
    """The property: no report of any kind, and every reloaded value equals the offloaded one."""
    out = execute(s)
    out.assert_clean()  # on failure: every report and the line that replays the schedule
    return out


@given(schedules(PROGRAM, "correct"))
def test_correct_form_is_clean_under_every_schedule(s: Schedule) -> None:
    reload_equals_offload(s)


def _breaks_property(s: Schedule) -> bool:
    try:
        reload_equals_offload(s)
    except AssertionError:
        return True
    return False


def test_race_detector_flags_the_racy_form_whatever_the_timing() -> None:
    racy = execute(Schedule("offload_reload", "racy"))
    races = {(r.current.op, r.current.kind, r.previous.op, r.previous.kind) for r in racy.run.reports}
    assert races == {
        ("copy_ (H2D)", "read", "copy_ (D2H)", "write"),  # the reload reads the pinned buffer the D2H fills
        # and a second hazard of the same missing wait: the next iteration drops the activation the D2H may
        # still be reading, and the caching allocator gives its block to the reload's destination
        ("copy_ (H2D)", "write", "copy_ (D2H)", "read"),
    }
    reuse = next(r for r in racy.run.reports if r.current.kind == "write")
    assert reuse.freed is not None
    assert reuse.freed.source == "reference/offload_reload.py:51"  # the line whose drop handed the block on
    assert racy.problems == ()  # the compute work outlasts the copy: no corruption without a stall
    assert execute(Schedule("offload_reload", "correct")).clean


def test_hypothesis_shrinks_a_corrupting_schedule_to_one_stall_of_the_d2h() -> None:
    found = find(
        schedules(PROGRAM, "racy"),
        lambda s: execute(s).corrupted,
        settings=search_settings(),
    )
    assert str(found) == PROGRAM.pinned["racy"][0] == "offload_reload/racy::d2h#0+1"
    out = execute(found)
    assert sorted({r.kind for r in out.run.reports}) == ["race", "stale-read"]
    assert out.problems == ("iteration 0: 4096 of 4096 reloaded values differ from the offloaded ones",)
    assert _breaks_property(found)  # the property the correct form holds is the one this schedule breaks


def test_the_stall_needed_is_what_the_cost_model_says() -> None:
    # work: 4 kernels over a 16x scratch buffer outlast the D2H by less than one unit
    assert not execute(Schedule.parse("offload_reload/racy:work=4")).corrupted
    assert execute(Schedule.parse("offload_reload/racy:work=0")).corrupted
    assert not execute(Schedule.parse("offload_reload/racy::default#0+5")).corrupted


def test_correct_form_is_clean_over_every_single_delay_schedule() -> None:
    n, failed = exhaust(PROGRAM, "correct", max_delays=1, units=(1, 5, 20))
    # every operation there is (host 27, default 17, d2h 2: the probe's counts) x 3 stalls, plus the empty schedule
    assert (n, failed) == (1 + (27 + 17 + 2) * 3, None)


def test_exhaustive_mode_finds_the_racy_form() -> None:
    _, failed = exhaust(PROGRAM, "racy", max_delays=1, units=(1, 5, 20))
    assert failed is not None
    assert str(failed.schedule) == "offload_reload/racy::d2h#0+1"


@pytest.mark.slow
def test_correct_form_is_clean_over_every_two_delay_schedule() -> None:
    n, failed = exhaust(PROGRAM, "correct", max_delays=2, units=(1, 5, 20))
    assert failed is None
    slots = 27 + 17 + 2
    assert n == 1 + slots * 3 + (slots * (slots - 1) // 2) * 9
