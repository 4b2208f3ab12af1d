"""Cost profiles: the simulator's costs measured on a GPU, by name.

The default costs (:class:`~simdevice.runtime.config.SimConfig`) model a fast host: a host step costs 5 µs, so
the simulator sees the narrowest windows a program opens, which is what finding bugs wants. A *profile* holds
the costs ``scripts/calibrate`` measured on one GPU with one torch (a host step's median wall time between two
counted operations of the real programs, the copy and kernel laws fitted to timed copies and kernels): with it
the simulator judges a schedule as that machine would (``--profile NAME``; the fidelity campaign).

A profile is a JSON file: ``{"name": ..., "fields": {SimConfig field: int, ...}, "programs": {program:
{"host_step_ns": int}, ...}, "measured": {...}}``, shipped under ``simdevice/profiles/NAME.json`` or given by its
path. ``programs`` (optional) holds each timed program's own host step: the host's speed differs between programs
(on the H200, activation_offload's median step took 169 µs, param_readiness's 64 µs), so a program's runs are
judged with its own; any other program, a user's among them, gets ``fields``' median. ``engine_step_ns``
(optional) is the step autograd's engine issues with no Python before it (a backward formula; ``reference.origin``),
timed apart from the program's own steps since 2026-12-03. ``spawn_start_ns`` and ``spawned_host_step_ns``
(optional, since 2026-12-03's fifth sitting) are a spawned process's start and its own step (zcc's workers: an
interpreter of their own, started seconds after the trainer's ``start``, at about twice its step).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import attrs

from simdevice.runtime.config import SimConfig, overridden

SHIPPED = Path(__file__).resolve().parent.parent / "profiles"

T = TypeVar("T")

#: the SimConfig fields a profile may set: the cost model, nothing about bounds or capacity (nor byte_scale, which
#: maps simulated sizes to the GPU replay's and so must be the same on both)
COST_FIELDS = ("host_step_ns", "engine_step_ns", "copy_bytes_per_ns", "kernel_bytes_per_ns", "launch_ns",
               "collective_host_ns", "pageable_h2d_bytes_per_us", "pageable_d2h_bytes_per_us", "spawn_start_ns",
               "spawned_host_step_ns")

#: the costs of the host's own time (what ``Profile.overrides(pace=)`` scales)
HOST_COSTS = ("host_step_ns", "engine_step_ns", "collective_host_ns", "spawn_start_ns", "spawned_host_step_ns")
#: the host's pace from one calibration to another of the same GPU, as factors of a profile's host costs: over eight
#: calibrations on the H200 (2026-12-01 to 03) a program's median host step lay between x0.66 and x1.31 of its
#: middle value. A verdict that turns within it is *pace-sensitive*: a GPU shows it at a rate, trial by trial.
PACE_SPREAD = (0.75, 1.33)


class ProfileError(ValueError):
    """A profile that cannot be loaded (one line, naming the problem)."""


@attrs.frozen
class Profile:
    name: str
    fields: dict[str, int]
    #: what was measured, on what (device, torch, date, command, samples): shown, never read by the simulator
    measured: dict[str, Any]
    #: program -> its own costs (only ``host_step_ns``)
    programs: dict[str, dict[str, int]] = attrs.field(factory=dict)

    def overrides(self, pace: float = 1.0) -> dict[str, Any]:
        """The SimConfig fields it sets, its name among them (what ``config.overridden`` takes). ``pace``: every
        host cost (a step, the engine's step, a program's own, a collective's issue) times this, the copies and
        kernels as measured: the same GPU under a slower or faster host (a calibration's host step differs from
        the next one's by a quarter either way, docs/fidelity.md)."""
        own = tuple(sorted((p, c["host_step_ns"]) for p, c in self.programs.items()))
        fields: dict[str, Any] = {**self.fields, "program_host_step_ns": own, "profile": self.name}
        if pace != 1.0:
            base = SimConfig()
            for name in HOST_COSTS:
                v = fields.get(name, getattr(base, name))
                if v:
                    fields[name] = max(1, round(v * pace))
            fields["program_host_step_ns"] = tuple((p, max(1, round(c * pace))) for p, c in own)
        return fields

    def config(self, base: SimConfig | None = None) -> SimConfig:
        return attrs.evolve(base or SimConfig(), **self.overrides())


def paced(profile: Profile, run: Callable[[], T], spread: Sequence[float] = PACE_SPREAD) -> dict[float, T]:
    """``run()`` once per factor of ``spread``, with ``profile``'s host costs scaled by it
    (``Profile.overrides(pace=)``): whether a verdict turns on the host's pace (``replay --profile``,
    ``scripts/fidelity``)."""
    out: dict[float, T] = {}
    for factor in spread:
        with overridden(**profile.overrides(pace=factor)):
            out[factor] = run()
    return out


def fields_from(measured: dict[str, Any]) -> dict[str, int]:
    """A profile's costs from what ``scripts/calibrate`` measured (its ``measured`` block): the host step is the
    median of the programs' median gaps before their Python's steps (so no program's step count outweighs
    another's), the engine's step the median gap before autograd's engine's, the laws their medians.
    ValueError if a measurement is missing."""
    steps = measured.get("host_steps", {})
    medians = [_python_step(v) for k, v in steps.items() if k != "engine" and "median_ns" in v]
    if not medians:
        raise ValueError("no program's host steps were timed")
    fields = {"host_step_ns": round(statistics.median(medians)),
              "copy_bytes_per_ns": max(1, round(measured["copies"]["bytes_per_ns"])),
              "kernel_bytes_per_ns": max(1, round(measured["kernels"]["bytes_per_ns"])),
              "launch_ns": max(1, round(measured["launch"]["ns"]))}
    if "median_ns" in steps.get("engine", {}):
        fields["engine_step_ns"] = max(1, round(steps["engine"]["median_ns"]))
    if "collective" in measured:
        # the host time of issuing a collective beyond issuing a kernel (a host step already pays for that)
        gather = measured["collective"]
        extra = statistics.median(r["issue_ns"] for r in gather["samples"]) - gather["kernel_issue_ns"]
        fields["collective_host_ns"] = max(1, round(extra))
    spawned = measured.get("spawned", {})
    if "step_median_ns" in spawned and "start_median_ns" in spawned:
        # a spawned process's own pace and start, as zcc's workers showed them (calibrate's ``spawned``)
        fields["spawned_host_step_ns"] = max(1, round(spawned["step_median_ns"]))
        fields["spawn_start_ns"] = max(1, round(spawned["start_median_ns"]))
    if "pageable" in measured:
        # copies from and to pageable CPU tensors: bytes over the median time of each direction
        pageable = measured["pageable"]
        for way in ("h2d", "d2h"):
            ms = statistics.median(pageable[f"{way}_ms"])
            fields[f"pageable_{way}_bytes_per_us"] = max(1, round(pageable["bytes"] / (ms * 1000)))
    return fields


def spawned_measured(traces: Sequence[dict[str, Sequence[int]]], starts: Sequence[dict[str, int]]) -> dict[str, Any]:
    """``measured["spawned"]`` from timed runs of a program that spawns processes (calibrate's zcc/FIXED runs, or
    a campaign's FIXED trials): per run, each host actor's measured step costs (``host_traces``) and when each
    spawned process's first step came after its parent's ``start`` (``host_starts``; the actors it names are the
    spawned ones). The medians are what ``fields_from`` takes; {} if no spawned process ran."""
    steps = sorted(c for trace, begun in zip(traces, starts, strict=True)
                   for actor, costs in trace.items() if actor in begun for c in costs)
    begun = sorted(v for run in starts for v in run.values())
    if not steps or not begun:
        return {}
    q = statistics.quantiles(steps, n=10) if len(steps) > 1 else [steps[0]]
    return {"runs": len(traces), "processes": len(begun), "steps": len(steps),
            "step_median_ns": round(statistics.median(steps)), "step_p10_ns": round(q[0]),
            "step_p90_ns": round(q[-1]), "start_median_ns": round(statistics.median(begun)),
            "starts_ns": begun}


def programs_from(measured: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Each timed program's own host step (the median gap of its run; ``measured["host_steps"]`` is keyed by the
    schedule calibrate ran, ``activation_offload/FIXED``)."""
    out: dict[str, dict[str, int]] = {}
    for spec, v in measured.get("host_steps", {}).items():
        if spec != "engine" and "median_ns" in v:
            out[spec.split("/", 1)[0]] = {"host_step_ns": max(1, round(_python_step(v)))}
    return out


def _python_step(timed: dict[str, Any]) -> float:
    """A timed program's step of its own Python: the median of the gaps before the steps it issued (autograd's
    engine's apart), or of all its gaps where the measurement did not tell them apart (before 2026-12-03)."""
    return float(timed.get("python_median_ns", timed["median_ns"]))


#: profile name -> how it was asked for (a shipped name or a path): what a replay line must say to get it again
_SOURCES: dict[str, str] = {}


def spec_of(name: str) -> str:
    """How to ask for the profile ``name`` again (``--profile``): its path if it was loaded from one."""
    return _SOURCES.get(name, name)


def names() -> list[str]:
    """The shipped profiles."""
    return sorted(p.stem for p in SHIPPED.glob("*.json"))


def parse(doc: Any, where: str) -> Profile:
    if not isinstance(doc, dict):
        raise ProfileError(f"{where}: a profile is a JSON object, got {type(doc).__name__}")
    name = doc.get("name")
    if not isinstance(name, str) or not name or len(name) > 64 or not name.isprintable():
        raise ProfileError(f"{where}: 'name' must be a short string")
    fields = doc.get("fields")
    if not isinstance(fields, dict) or not fields:
        raise ProfileError(f"{where}: 'fields' must be an object of SimConfig costs ({', '.join(COST_FIELDS)})")
    for k, v in fields.items():
        if k not in COST_FIELDS:
            raise ProfileError(f"{where}: {k!r} is not a cost a profile may set ({', '.join(COST_FIELDS)})")
        if type(v) is not int or not 0 < v < 1 << 62:
            raise ProfileError(f"{where}: {k} must be a positive integer, got {v!r}")
    programs = doc.get("programs", {})
    if not isinstance(programs, dict):
        raise ProfileError(f"{where}: 'programs' must be an object of program -> {{\"host_step_ns\": int}}")
    for program, costs in programs.items():
        if not isinstance(costs, dict) or set(costs) != {"host_step_ns"}:
            raise ProfileError(f"{where}: programs[{program!r}] must be {{\"host_step_ns\": int}}")
        v = costs["host_step_ns"]
        if type(v) is not int or not 0 < v < 1 << 62:
            raise ProfileError(f"{where}: programs[{program!r}].host_step_ns must be a positive integer, got {v!r}")
    measured = doc.get("measured", {})
    return Profile(name, dict(fields), measured if isinstance(measured, dict) else {},
                   {p: dict(c) for p, c in programs.items()})


def load(spec: str) -> Profile:
    """A profile by shipped name or by path; ProfileError (one line) if there is none or it is malformed."""
    path = Path(spec) if spec.endswith(".json") or "/" in spec else SHIPPED / f"{spec}.json"
    if spec == "default":
        return Profile("default", {}, {"note": "the built-in fast host (5 µs per host step)"})
    try:
        text = path.read_text()
    except FileNotFoundError:
        known = ", ".join(["default", *names()])
        raise ProfileError(f"no cost profile {spec!r} (known: {known}; or a path to a profile's .json)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ProfileError(f"cannot read the cost profile {spec!r}: {e}") from None
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise ProfileError(f"{spec}: not JSON ({e})") from None
    profile = parse(doc, spec)
    _SOURCES[profile.name] = spec
    return profile
