"""Schedules: the interleaving of one run, in a form both backends realize.

A schedule names a program (``offload_reload/racy``), that program's
configuration (``kib=16``) and a short list of delays, each "stall actor A
before its k-th operation by d units". Actors are host actors (``host``,
``worker0``, ``rank1``) and streams (``default``, ``d2h``, ``worker0.d2h``).
One unit is one millisecond of GPU time; the simulator's cost model is in
the same unit (see ``simdevice.runtime.config``).

A schedule may also make choices the simulator would otherwise make by a
fixed rule: ``alloc#3~1`` gives the 3rd device allocation of host actor
``host`` (``rank1.alloc#3~1``: of ``rank1``) the second-best-fitting free
block instead of the best (``~0``). A GPU has no such choice and ignores it.

The text form is one line that round-trips::

    offload_reload/racy:kib=16,work=1:d2h#0+3,host#2+1,alloc#1~2

Fields are separated by ``:``; the configuration and the delays may be
empty (``offload_reload/correct``, ``offload_reload/racy::d2h#0+3``).

The target is a registered program and variant (``PROGRAM/VARIANT``) or a
function of the user's, ``path/to/file.py::fn`` or ``package.module::fn``
(``examples/offload.py::racy::d2h_stream#0+3``: no configuration, one delay).

This module is shared by ``reference.device.CudaDevice`` and
``simdevice.SimDevice``: it is the contract between the two machines.
"""

from __future__ import annotations

import functools
import operator
import re
from collections.abc import Callable, Iterable, Mapping

import attrs

ActorName = str

_NAME = r"[A-Za-z_][A-Za-z0-9_.\-]*"
_DELAY_RE = re.compile(rf"^({_NAME})#(\d+)\+(\d+)$", re.ASCII)  # ASCII: no other script's digits
_CHOICE_RE = re.compile(rf"^({_NAME})#(\d+)~(\d+)$", re.ASCII)
_INT_RE = re.compile(r"^[+-]?[0-9]+$", re.ASCII)


def parse_int(text: str) -> int:
    """An integer written in ASCII digits with an optional sign (``int`` also takes ``1_6`` and other scripts'
    digits, which a schedule line must not: it would be rewritten when printed); ValueError otherwise."""
    if not _INT_RE.match(text):
        raise ValueError(f"not an integer: {text!r}")
    return int(text)
_TARGET_RE = re.compile(rf"^({_NAME})/({_NAME})$")
#: a function of the user's: a file (``dir/x.py``) or a module (``pkg.mod``), then ``::`` and its name
_FUNCTION = r"((?:[^:]*\.py)|(?:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*))::([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)"
_FUNCTION_RE = re.compile(rf"^{_FUNCTION}$")
_FUNCTION_PREFIX_RE = re.compile(rf"^{_FUNCTION}(?=:|$)")
_NAME_RE = re.compile(_NAME)
_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_VALUE_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")


class ScheduleError(ValueError):
    """A schedule string or value that cannot be used; the message is one line."""


def is_actor_name(text: str) -> bool:
    """Whether ``text`` can name an actor in a schedule (letters, digits, '_', '.', '-'; not a digit first)."""
    return _NAME_RE.fullmatch(text) is not None


def _check_name(_: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not _NAME_RE.fullmatch(value):
        raise ScheduleError(f"bad {attribute.name} {value!r}: use letters, digits, '_', '.', '-'")


@functools.lru_cache(maxsize=1024)
def is_function_target(text: str) -> bool:
    """Whether a target names a function of the user's (``x.py::fn``, ``pkg.mod::fn``). (Cached: every schedule made
    asks three times.)"""
    return bool(_FUNCTION_RE.match(text))


def _check_program(instance: Schedule, attribute: attrs.Attribute[str], value: str) -> None:
    if not is_function_target(value):
        _check_name(instance, attribute, value)


def _check_variant(instance: Schedule, attribute: attrs.Attribute[str], value: str) -> None:
    if is_function_target(instance.program):
        if value:
            raise ScheduleError(f"a function target ({instance.program}) has no variant, got {value!r}")
        return
    _check_name(instance, attribute, value)


#: the largest operation index and stall a schedule may name: a billion operations, a million units (1000 s)
MAX_INDEX = 10**9
MAX_UNITS = 10**6


def _shown(value: int) -> str:
    text = str(value)
    return text if len(text) <= 20 else f"{text[:8]}...({len(text)} digits)"


def _check_nonneg(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not 0 <= value <= MAX_INDEX:
        raise ScheduleError(f"{attribute.name} must be in 0..{MAX_INDEX}, got {_shown(value)}")


def _check_positive(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not 1 <= value <= MAX_UNITS:
        raise ScheduleError(f"{attribute.name} must be in 1..{MAX_UNITS}, got {_shown(value)}")


@attrs.frozen(order=True)
class Delay:
    """Stall ``actor`` by ``units`` just before its ``index``-th operation (counted from 0)."""

    actor: ActorName = attrs.field(validator=_check_name)
    index: int = attrs.field(validator=_check_nonneg)
    units: int = attrs.field(validator=_check_positive)

    def __str__(self) -> str:
        return f"{self.actor}#{self.index}+{self.units}"

    @classmethod
    def parse(cls, text: str) -> Delay:
        m = _DELAY_RE.match(text.strip())
        if not m:
            raise ScheduleError(f"bad delay {text!r}: expected ACTOR#INDEX+UNITS, e.g. d2h#0+3")
        return cls(m.group(1), int(m.group(2)), int(m.group(3)))


@attrs.frozen(order=True)
class Choice:
    """Make allocator ``actor``'s ``index``-th allocation take the ``pick``-th best-fitting free block (from 0)."""

    actor: ActorName = attrs.field(validator=_check_name)
    index: int = attrs.field(validator=_check_nonneg)
    pick: int = attrs.field(validator=_check_nonneg)

    def __str__(self) -> str:
        return f"{self.actor}#{self.index}~{self.pick}"

    @classmethod
    def parse(cls, text: str) -> Choice:
        m = _CHOICE_RE.match(text.strip())
        if not m:
            raise ScheduleError(f"bad choice {text!r}: expected ALLOCATOR#INDEX~PICK, e.g. alloc#0~1")
        return cls(m.group(1), int(m.group(2)), int(m.group(3)))


def in_range(lo: int, hi: int) -> Callable[[object, attrs.Attribute[int], int], None]:
    """An attrs validator for a program's integer configuration field: ``lo <= value <= hi``."""

    def check(_: object, a: attrs.Attribute[int], v: int) -> None:
        if not lo <= v <= hi:
            raise ValueError(f"{a.name} must be in {lo}..{hi}, got {v}")

    return check


#: what :func:`_config_items` answered, by the pairs of text it was given (a search makes the same configurations
#: over and over, a schedule or more for each run)
_CONFIG_ITEMS: dict[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]] = {}


def _config_items(value: Iterable[tuple[str, str]] | Mapping[str, object]) -> tuple[tuple[str, str], ...]:
    pairs = tuple(value.items() if isinstance(value, Mapping) else value)
    if not all(type(k) is str and type(v) is str for k, v in pairs):  # (1 and 1.0 are equal keys, not equal text)
        return _checked_config(pairs)
    got = _CONFIG_ITEMS.get(pairs)
    if got is not None:
        return got
    items = _checked_config(pairs)
    if len(_CONFIG_ITEMS) >= 4096:
        _CONFIG_ITEMS.clear()
    _CONFIG_ITEMS[pairs] = items
    return items


def _checked_config(pairs: tuple[tuple[object, object], ...]) -> tuple[tuple[str, str], ...]:
    items = tuple(sorted((str(k), _config_text(v)) for k, v in pairs))
    for k, v in items:
        if not _KEY_RE.match(k):
            raise ScheduleError(f"bad configuration key {k!r}")
        if not _VALUE_RE.match(v):
            raise ScheduleError(f"bad value {v!r} for configuration key {k!r}")
    keys = [k for k, _ in items]
    if len(set(keys)) != len(keys):
        raise ScheduleError(f"configuration key repeated in {keys}")
    return items


def _config_text(v: object) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    return str(v)


#: the order attrs gives delays and choices (their fields in turn), as a key: sorted compares it in C
_ORDER = operator.attrgetter("actor", "index", "units")
_ORDER_CHOICE = operator.attrgetter("actor", "index", "pick")


def _delays(value: Iterable[Delay]) -> tuple[Delay, ...]:
    delays = tuple(sorted(value, key=_ORDER))
    seen = {(d.actor, d.index) for d in delays}
    if len(seen) != len(delays):
        raise ScheduleError("two delays name the same actor and operation")
    return delays


def _choices(value: Iterable[Choice]) -> tuple[Choice, ...]:
    choices = tuple(sorted(value, key=_ORDER_CHOICE))
    if len({(c.actor, c.index) for c in choices}) != len(choices):
        raise ScheduleError("two choices name the same allocator and allocation")
    return choices


@attrs.frozen
class Schedule:
    """One replayable interleaving: program, variant, configuration, delays."""

    #: a registered program, or a function target (``x.py::fn``), whose variant is then empty
    program: str = attrs.field(validator=_check_program)
    variant: str = attrs.field(default="", validator=_check_variant)
    config: tuple[tuple[str, str], ...] = attrs.field(default=(), converter=_config_items)
    delays: tuple[Delay, ...] = attrs.field(default=(), converter=_delays)
    choices: tuple[Choice, ...] = attrs.field(default=(), converter=_choices)

    @property
    def target(self) -> str:
        return self.program if is_function_target(self.program) else f"{self.program}/{self.variant}"

    def config_dict(self) -> dict[str, str]:
        return dict(self.config)

    def delays_for(self, actor: ActorName) -> dict[int, int]:
        """The delays of one actor, as {operation index: units}."""
        return {d.index: d.units for d in self.delays if d.actor == actor}

    def choices_for(self, allocator: ActorName) -> dict[int, int]:
        """The choices of one allocator, as {allocation index: pick}."""
        return {c.index: c.pick for c in self.choices if c.actor == allocator}

    def __str__(self) -> str:
        cfg = ",".join(f"{k}={v}" for k, v in self.config)
        dl = ",".join([*(str(d) for d in self.delays), *(str(c) for c in self.choices)])
        if dl:
            return f"{self.target}:{cfg}:{dl}"
        if cfg:
            return f"{self.target}:{cfg}"
        return self.target

    @classmethod
    def parse(cls, text: str) -> Schedule:
        text = text.strip()
        if not text:
            raise ScheduleError("empty schedule: expected PROGRAM/VARIANT[:CONFIG[:DELAYS]]")
        if len(text) > 4000:
            raise ScheduleError(f"schedule of {len(text)} characters: too long to be one")
        fn = _FUNCTION_PREFIX_RE.match(text)
        if fn is not None:
            program, variant = f"{fn.group(1)}::{fn.group(2)}", ""
            fields = [program, *text[fn.end() + 1:].split(":")] if fn.end() < len(text) else [program]
        else:
            fields = text.split(":")
            m = _TARGET_RE.match(fields[0])
            if not m and "::" in text:  # a function target whose function is missing or not a name
                where, _, rest = text.partition("::")
                given = f"{where}::{rest.split(':')[0]}"
                raise ScheduleError(f"bad schedule target {given[:200]!r}: expected FILE.py::FUNCTION or "
                                    "MODULE::FUNCTION (a function's name after '::')")
            if not m:
                raise ScheduleError(
                    f"bad schedule target {fields[0][:200]!r}: "
                    "expected PROGRAM/VARIANT, FILE.py::FUNCTION or MODULE::FUNCTION"
                )
            program, variant = m.group(1), m.group(2)
        if len(fields) > 3:
            raise ScheduleError(f"bad schedule {text!r}: more than three ':'-separated fields")
        config: list[tuple[str, str]] = []
        if len(fields) > 1 and fields[1]:
            for item in fields[1].split(","):
                key, eq, value = item.partition("=")
                if not eq or not key or not value:
                    raise ScheduleError(f"bad configuration item {item!r}: expected KEY=VALUE")
                config.append((key.strip(), value.strip()))
        delays, choices = [], []
        if len(fields) > 2 and fields[2]:
            for item in fields[2].split(","):
                if "~" in item:
                    choices.append(Choice.parse(item))
                else:
                    delays.append(Delay.parse(item))
        return cls(program, variant, config, delays, choices)
