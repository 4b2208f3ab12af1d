"""Programs the tool knows by name: what ``simdevice check`` and ``replay`` run.

A :class:`Program` bundles a body written against the device contract, its
variants (which must be clean, which are known bugs), the actors a schedule
may delay, a configuration class, and a value oracle that says what the
body's result should have been. Each module of this package is the harness
of one protocol of ``reference/`` (its configuration, driver, expected
values, oracle and pinned schedules) and registers it here;
:func:`load_all` imports them all.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import Any

import attrs

from reference.contract import Device
from reference.schedule import Schedule, ScheduleError, parse_int
from simdevice.runtime import Options


class ConfigError(ScheduleError):
    """A configuration value a program cannot use."""


@attrs.frozen
class Program:
    name: str
    doc: str
    #: variants that must be clean under every schedule
    clean: tuple[str, ...]
    #: known bug variants, each with a one-line description
    buggy: dict[str, str]
    #: actors a schedule may delay (names as counted by both backends)
    actors: tuple[str, ...]
    #: the configuration: an attrs class of int fields with defaults and validators
    config: type
    #: body(dev, variant, config) -> result
    body: Callable[[Device, str, Any], Any]
    #: oracle(config, result) -> problems (empty when the values are right)
    oracle: Callable[[Any, Any], list[str]]
    #: configuration values Hypothesis may draw, per key (the first is where shrinking goes)
    config_space: dict[str, tuple[str, ...]] = attrs.field(factory=dict)
    #: configuration keys that are sizes: a GPU run multiplies them by ``SimConfig.byte_scale``
    size_keys: tuple[str, ...] = ()
    #: drawn configurations must pass this (e.g. to leave out a documented limitation); None: all pass
    config_filter: Callable[[dict[str, str]], bool] | None = None
    #: how the simulated device is built for a variant and configuration (e.g. the memory-saver library's
    #: version); None: the defaults
    sim_options: Callable[[str, Any], Options] | None = None
    #: per bug variant: counterexamples the GPU tests replay (each corrupts in the simulator, a quality test checks)
    pinned: dict[str, tuple[str, ...]] = attrs.field(factory=dict)

    @property
    def variants(self) -> tuple[str, ...]:
        return self.clean + tuple(self.buggy)

    def parse_config(self, values: dict[str, str]) -> Any:
        """The configuration ``values`` give; a frozen configuration class's is made once and shared (every run of
        a schedule asks, two times)."""
        if not _frozen(self.config):
            return int_config(self.config, values)
        key = (self.config, tuple(sorted(values.items())))
        got = _CONFIGS.get(key)
        if got is None:
            if len(_CONFIGS) >= 4096:
                _CONFIGS.clear()
            got = _CONFIGS[key] = int_config(self.config, values)
        return got

    def defaults(self) -> dict[str, str]:
        """The configuration's defaults, as text."""
        return {f.name: str(f.default) for f in attrs.fields(self.config)}

    def canonical(self, schedule: Schedule) -> Schedule:
        """The same schedule with configuration values equal to the defaults left out."""
        defaults = self.defaults()
        config = tuple((k, v) for k, v in schedule.config if defaults.get(k) != v)
        return attrs.evolve(schedule, config=config)

    def options(self, variant: str, config: Any) -> Options:
        return self.sim_options(variant, config) if self.sim_options is not None else Options()


REGISTRY: dict[str, Program] = {}


def register(p: Program) -> Program:
    REGISTRY[p.name] = p
    return p


def resolve(schedule: Schedule) -> tuple[Program, Any]:
    """The program and parsed configuration a schedule names; ScheduleError if it names none."""
    p = REGISTRY.get(schedule.program) or _load(schedule.program)
    if p is None:
        load_all()
        known = ", ".join(sorted(REGISTRY))
        raise ScheduleError(f"unknown program {schedule.program!r}; known: {known}")
    if schedule.variant not in p.variants:
        raise ScheduleError(
            f"unknown variant {schedule.variant!r} of {p.name}; known: {', '.join(p.variants)}"
        )
    config = p.parse_config(schedule.config_dict())
    for d in schedule.delays:
        if d.actor not in p.actors:
            raise ScheduleError(
                f"delay {d} names actor {d.actor!r}, which {p.name} does not have; actors: {', '.join(p.actors)}"
            )
    return p, config


#: the configurations made so far, by class and values (frozen classes only: see ``Program.parse_config``)
_CONFIGS: dict[tuple[type, tuple[tuple[str, str], ...]], Any] = {}
_FROZEN: dict[type, bool] = {}


def _frozen(cls: type) -> bool:
    """Whether instances of the attrs class ``cls`` refuse to change (then one may serve every run)."""
    known = _FROZEN.get(cls)
    if known is None:
        try:
            instance = cls()
            field = attrs.fields(cls)[0].name
            setattr(instance, field, getattr(instance, field))
            known = False
        except attrs.exceptions.FrozenInstanceError:
            known = True
        except Exception:  # no defaults, no fields: made afresh each time, as before
            known = False
        _FROZEN[cls] = known
    return known


def int_config(cls: type, values: dict[str, str]) -> Any:
    """Build an attrs configuration of int fields from text, with one-line errors."""
    fields = {f.name for f in attrs.fields(cls)}
    kwargs = {}
    for k, v in values.items():
        if k not in fields:
            raise ConfigError(f"unknown configuration key {k!r}; known: {', '.join(sorted(fields))}")
        try:
            kwargs[k] = parse_int(v)
        except ValueError:
            raise ConfigError(f"configuration {k}={v!r} is not an integer") from None
    try:
        return cls(**kwargs)
    except ValueError as e:
        raise ConfigError(str(e)) from None


_LOADED: list[bool] = []


def _modules() -> list[str]:
    """The program modules of this package (each registers the program of its name): the demonstration first,
    then by name."""
    names = sorted(m.name for m in pkgutil.iter_modules(__path__))
    return sorted(names, key=lambda n: n != "offload_reload")


def _load(name: str) -> Program | None:
    """The program ``name``, its module imported alone (a replay runs one program: the others' imports were about
    20 ms of its start); None if this package has no such module."""
    if name not in _modules():
        return None
    importlib.import_module(f"{__name__}.{name}")
    return REGISTRY.get(name)


def load_all() -> None:
    """Import every program module of this package so that it registers itself (once)."""
    if _LOADED:
        return
    _LOADED.append(True)
    names = _modules()
    for name in names:
        importlib.import_module(f"{__name__}.{name}")
    # the registry in that order, whichever of them resolve() loaded first (programs() lists them so)
    for name in names:
        if name in REGISTRY:
            REGISTRY[name] = REGISTRY.pop(name)


def programs(names: list[str] | None = None) -> list[Program]:
    load_all()
    if not names:
        return list(REGISTRY.values())
    return [REGISTRY[n] for n in names]
