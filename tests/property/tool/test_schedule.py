"""Schedules: the text form round-trips, and bad input fails with one clear line."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reference.schedule import Delay, Schedule, ScheduleError
from simdevice.programs import REGISTRY, load_all, resolve
from simdevice.search.strategies import schedules

load_all()


@given(st.sampled_from(sorted(REGISTRY)).flatmap(lambda n: st.sampled_from(REGISTRY[n].variants).flatmap(
    lambda v: schedules(REGISTRY[n], v))))
def test_text_form_round_trips(s: Schedule) -> None:
    assert Schedule.parse(str(s)) == s
    assert str(Schedule.parse(str(s))) == str(s)


def test_text_form_examples() -> None:
    s = Schedule("offload_reload", "racy", {"kib": 16}, [Delay("host", 2, 1), Delay("d2h", 0, 3)])
    assert str(s) == "offload_reload/racy:kib=16:d2h#0+3,host#2+1"
    assert str(Schedule("offload_reload", "racy", (), [Delay("d2h", 0, 3)])) == "offload_reload/racy::d2h#0+3"
    assert str(Schedule("offload_reload", "correct")) == "offload_reload/correct"
    assert Schedule.parse("offload_reload/correct:") == Schedule("offload_reload", "correct")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty schedule: expected PROGRAM/VARIANT[:CONFIG[:DELAYS]]"),
        ("offload_reload", "bad schedule target 'offload_reload': expected PROGRAM/VARIANT, FILE.py::FUNCTION or "
                           "MODULE::FUNCTION"),
        ("a/b:c:d:e", "bad schedule 'a/b:c:d:e': more than three ':'-separated fields"),
        ("a/b:kib", "bad configuration item 'kib': expected KEY=VALUE"),
        ("a/b::d2h#0", "bad delay 'd2h#0': expected ACTOR#INDEX+UNITS, e.g. d2h#0+3"),
        ("a/b::d2h#0+0", "units must be in 1..1000000, got 0"),
        ("a/b::d2h#0+1,d2h#0+2", "two delays name the same actor and operation"),
        ("a/b:k=1,k=2", "configuration key repeated in ['k', 'k']"),
    ],
)
def test_malformed_schedules_fail_with_one_line(text: str, message: str) -> None:
    with pytest.raises(ScheduleError) as e:
        Schedule.parse(text)
    assert str(e.value) == message
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nope/racy", "unknown program 'nope'; known: "),
        ("offload_reload/nope", "unknown variant 'nope' of offload_reload; known: correct, racy"),
        ("offload_reload/racy::gpu#0+1", "delay gpu#0+1 names actor 'gpu', which offload_reload does not have"),
        ("offload_reload/racy:kib=x", "configuration kib='x' is not an integer"),
        ("offload_reload/racy:kib=0", "kib must be in 1..1048576, got 0"),
        ("offload_reload/racy:size=1", "unknown configuration key 'size'; known: iters, kib, scratch, work"),
    ],
)
def test_schedules_naming_nothing_known_are_refused(text: str, message: str) -> None:
    with pytest.raises(ScheduleError) as e:
        resolve(Schedule.parse(text))
    assert str(e.value).startswith(message)
