"""Schedules: the text form round-trips, and bad input fails with one clear line."""

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from reference.schedule import Choice, Delay, Schedule, ScheduleError
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
    # delays and choices in one order, by actor, then operation (what a shrunk schedule's line shows)
    s = Schedule("offload_reload", "racy", (), [Delay("host", 0, 1), Delay("d2h", 2, 3), Delay("d2h", 1, 3)],
                 [Choice("alloc", 3, 1), Choice("a", 5, 0)])
    assert str(s) == "offload_reload/racy::d2h#1+3,d2h#2+3,host#0+1,a#5~0,alloc#3~1"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty schedule: expected PROGRAM/VARIANT[:CONFIG[:DELAYS]]"),
        ("offload_reload", "bad schedule target 'offload_reload': expected PROGRAM/VARIANT, FILE.py::FUNCTION or "
                           "MODULE::FUNCTION"),
        ("x.py::", "bad schedule target 'x.py::': expected FILE.py::FUNCTION or MODULE::FUNCTION (a function's "
                   "name after '::')"),
        ("x.py::9f:k=1", "bad schedule target 'x.py::9f': expected FILE.py::FUNCTION or MODULE::FUNCTION (a "
                         "function's name after '::')"),
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


def test_a_frozen_configuration_is_made_once_a_mutable_one_for_each_run() -> None:
    """A run's configuration is shared by every run of the same values only where nothing can change it."""
    load_all()
    program = REGISTRY["offload_reload"]
    values = {"iters": "3", "kib": "4"}
    assert program.parse_config(values) is program.parse_config(dict(reversed(values.items())))
    assert program.parse_config(values) is not program.parse_config({"iters": "2", "kib": "4"})

    @attrs.define
    class Mutable:
        iters: int = 1

    mutable = attrs.evolve(program, config=Mutable)
    first = mutable.parse_config({"iters": "3"})
    first.iters = 5  # a program that changes its configuration changes its own run's alone
    assert mutable.parse_config({"iters": "3"}).iters == 3


def test_configuration_text_is_kept_as_given_whatever_came_before() -> None:
    """Values given as numbers keep their own text (1 and 1.0 are equal, not the same text), and a refused value
    is refused each time."""
    assert Schedule("a.py::f", "", {"x": 1.0}).config == (("x", "1.0"),)
    assert Schedule("a.py::f", "", {"x": 1}).config == (("x", "1"),)
    assert Schedule("a.py::f", "", {"x": "2", "y": "a"}).config == Schedule("a.py::f", "", {"y": "a", "x": "2"}).config
    for _ in range(2):
        with pytest.raises(ScheduleError, match="bad value"):
            Schedule("a.py::f", "", {"x": "a b"})
