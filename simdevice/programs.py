"""Programs the tool knows by name: what ``simdevice check`` and ``replay`` run.

A :class:`Program` bundles a body written against the device contract, its
variants (which must be clean, which are known bugs), the actors a schedule
may delay, a configuration class, and a value oracle that says what the
body's result should have been. Mechanisms in ``reference/`` register
themselves here the same way the demonstration below does.

The demonstration, ``offload_reload``: an activation is copied device to
host into a pinned buffer on a side stream (``d2h``) while the compute
stream goes on with other work; then it is reloaded host to device on the
compute stream and read back.

- ``racy``: the reload does not wait for the D2H. Harmless while the compute
  work outlasts the copy; a stall of ``d2h`` before its copy (``d2h#0+1``)
  lets the reload read the pinned buffer before the copy filled it.
- ``correct``: the compute stream waits on the event recorded after the D2H.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import torch

from reference.schedule import Schedule, ScheduleError, in_range


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
    #: parse a configuration (str -> str) into the body's configuration object
    config: Callable[[dict[str, str]], Any]
    #: body(dev, variant, config) -> result
    body: Callable[[Any, str, Any], Any]
    #: oracle(config, result) -> problems (empty when the values are right)
    oracle: Callable[[Any, Any], list[str]]
    #: operation indices a drawn delay may name, per actor (0..max_index)
    max_index: int = 8
    #: configuration values Hypothesis may draw, per key (the first is the default)
    config_space: dict[str, tuple[str, ...]] = attrs.field(factory=dict)
    #: configuration keys that are sizes: a GPU run multiplies them by ``SimConfig.byte_scale``
    size_keys: tuple[str, ...] = ()
    #: drawn configurations must pass this (e.g. to leave out a documented limitation); None: all pass
    config_filter: Callable[[dict[str, str]], bool] | None = None

    @property
    def variants(self) -> tuple[str, ...]:
        return self.clean + tuple(self.buggy)


REGISTRY: dict[str, Program] = {}


def register(p: Program) -> Program:
    REGISTRY[p.name] = p
    return p


def resolve(schedule: Schedule) -> tuple[Program, Any]:
    """The program and parsed configuration a schedule names; ScheduleError if it names none."""
    p = REGISTRY.get(schedule.program)
    if p is None:
        known = ", ".join(sorted(REGISTRY))
        raise ScheduleError(f"unknown program {schedule.program!r}; known: {known}")
    if schedule.variant not in p.variants:
        raise ScheduleError(
            f"unknown variant {schedule.variant!r} of {p.name}; known: {', '.join(p.variants)}"
        )
    config = p.config(schedule.config_dict())
    for d in schedule.delays:
        if d.actor not in p.actors:
            raise ScheduleError(
                f"delay {d} names actor {d.actor!r}, which {p.name} does not have; actors: {', '.join(p.actors)}"
            )
    return p, config


def int_config(cls: type, values: dict[str, str]) -> Any:
    """Build an attrs configuration of int fields from text, with one-line errors."""
    fields = {f.name for f in attrs.fields(cls)}
    kwargs = {}
    for k, v in values.items():
        if k not in fields:
            raise ConfigError(f"unknown configuration key {k!r}; known: {', '.join(sorted(fields))}")
        try:
            kwargs[k] = int(v)
        except ValueError:
            raise ConfigError(f"configuration {k}={v!r} is not an integer") from None
    try:
        return cls(**kwargs)
    except ValueError as e:
        raise ConfigError(str(e)) from None


# ---------------------------------------------------------------------------
# The demonstration: offload then reload.




@attrs.frozen
class OffloadReloadConfig:
    #: activation size in KiB (simulated; the GPU test scales it)
    kib: int = attrs.field(default=16, validator=in_range(1, 1 << 20))
    #: compute kernels between the offload and the reload
    work: int = attrs.field(default=4, validator=in_range(0, 64))
    #: iterations (each with fresh activation values)
    iters: int = attrs.field(default=2, validator=in_range(1, 16))
    #: scratch buffer size, as a multiple of the activation
    scratch: int = attrs.field(default=16, validator=in_range(1, 1024))


def offload_reload(dev: Any, variant: str, cfg: OffloadReloadConfig) -> list[torch.Tensor]:
    """Offload an activation to pinned memory on ``d2h``, compute, reload it; return what came back."""
    n = cfg.kib * 256  # float32 elements
    compute = dev.current_stream()
    d2h = dev.Stream(name="d2h")
    offloaded = dev.Event()
    pinned = torch.empty(n, dtype=torch.float32, pin_memory=True)
    scratch = torch.zeros(n * cfg.scratch, dtype=torch.float32, device=dev.device)
    seen = []
    for it in range(cfg.iters):
        act = torch.arange(n, dtype=torch.float32, device=dev.device) + it * n
        # wait: the D2H must not read the activation before compute produced it
        d2h.wait_stream(compute)
        with dev.stream(d2h):
            pinned.copy_(act, non_blocking=True)
            offloaded.record()
        for _ in range(cfg.work):
            scratch.mul_(0.5)
        if variant == "correct":
            # wait: the H2D must not read the pinned buffer before the D2H filled it
            compute.wait_event(offloaded)
        reloaded = torch.empty_like(act)
        reloaded.copy_(pinned, non_blocking=True)
        seen.append(reloaded.cpu())
        # wait: the next D2H must not overwrite the pinned buffer before this reload read it
        d2h.wait_stream(compute)
    return seen


def offload_reload_oracle(cfg: OffloadReloadConfig, seen: list[torch.Tensor]) -> list[str]:
    n = cfg.kib * 256
    problems = []
    for it, got in enumerate(seen):
        want = torch.arange(n, dtype=torch.float32) + it * n
        if not torch.equal(got, want):
            bad = int((got != want).sum())
            problems.append(f"iteration {it}: {bad} of {n} reloaded values differ from the offloaded ones")
    return problems


register(
    Program(
        name="offload_reload",
        doc="D2H into a pinned buffer on a side stream, then an H2D reload on the compute stream",
        clean=("correct",),
        buggy={"racy": "the reload does not wait for the event recorded after the D2H"},
        actors=("host", "default", "d2h"),
        config=lambda values: int_config(OffloadReloadConfig, values),
        body=offload_reload,
        oracle=offload_reload_oracle,
        max_index=6,
        size_keys=("kib",),
    )
)
