"""The simulator's cost model, in integer nanoseconds of virtual time.

One schedule unit is one millisecond (``UNIT_NS``), as on the GPU. Tensors in
the simulator are small CPU tensors; ``byte_scale`` says how many real bytes
one simulated byte stands for, so that a 16 KiB simulated activation costs
what a 16 MiB one costs on an H200-class machine (about 50 GB/s over the
host link, about 3 TB/s to device memory). Only ratios matter for which
interleavings happen; the defaults keep those ratios close to the GPU's.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
from collections.abc import Iterator
from typing import Any

import attrs

UNIT_NS = 1_000_000

#: the most ranks a run makes (``--world-size``, ``world_size=``, ``torch.multiprocessing.spawn``'s ``nprocs``): a
#: race between ranks shows with a few; past about 60, each rank's actor nests the next's start deeper than Python's
#: recursion limit
MAX_WORLD_SIZE = 32


def _positive(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value <= 0:
        raise ValueError(f"SimConfig.{attribute.name} must be > 0, got {value}")


def host_trace(value: Any) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """``SimConfig.host_trace`` from a mapping or pairs of actor -> step costs (ns), each cost a positive integer."""
    pairs = value.items() if isinstance(value, dict) else value
    out = []
    for actor, costs in pairs:
        costs = tuple(costs)
        if not isinstance(actor, str) or not all(isinstance(c, int) and c > 0 for c in costs):
            raise ValueError(f"SimConfig.host_trace: {actor!r} wants positive integer step costs (ns)")
        out.append((actor, costs))
    return tuple(sorted(out))


def host_starts(value: Any) -> tuple[tuple[str, int], ...]:
    """``SimConfig.host_starts`` from a mapping or pairs of actor -> ns, each a positive integer."""
    pairs = value.items() if isinstance(value, dict) else value
    out = tuple(sorted((actor, ns) for actor, ns in pairs))
    if not all(isinstance(a, str) and isinstance(ns, int) and ns > 0 for a, ns in out):
        raise ValueError(f"SimConfig.host_starts: want actor -> a positive integer (ns), got {value!r}")
    return out


def default_device_memory() -> int:
    """The simulated device's default capacity: half of this machine's physical memory (its bytes are real CPU
    bytes; a fixed figure per machine, so a run does not depend on what else is running)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2)
    except (ValueError, OSError, AttributeError):  # no sysconf: 8 GiB
        return 8 << 30


@attrs.frozen
class SimConfig:
    #: real bytes per simulated byte
    byte_scale: int = attrs.field(default=1024, validator=_positive)
    #: host link bandwidth (pinned copies), bytes per ns (= GB/s)
    copy_bytes_per_ns: int = attrs.field(default=50, validator=_positive)
    #: device memory bandwidth seen by kernels, bytes per ns
    kernel_bytes_per_ns: int = attrs.field(default=3000, validator=_positive)
    #: smallest kernel or copy
    launch_ns: int = attrs.field(default=5_000, validator=_positive)
    #: one host step (a launch, a query, a shared-value access)
    host_step_ns: int = attrs.field(default=5_000, validator=_positive)
    #: a host step autograd's engine issues with no Python before it (a backward formula, a gradient's
    #: accumulation: ``reference.origin``), measured apart on a GPU; 0: ``host_step_ns`` like any other
    engine_step_ns: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    #: copies to and from pageable (not pinned) host memory, bytes per microsecond: a copy from a program's own CPU
    #: tensor (staged by the driver) and ``.cpu()`` into a fresh one run far below the pinned rate on a GPU; 0: at
    #: the pinned rate (the fast default)
    pageable_h2d_bytes_per_us: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    pageable_d2h_bytes_per_us: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    #: what issuing a collective costs the host beyond a host step (the process group's own work around NCCL's
    #: enqueue): none on the fast host
    collective_host_ns: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    #: a run in which nothing but polling happens for this long is a deadlock
    stall_horizon_ns: int = attrs.field(default=1_000 * UNIT_NS, validator=_positive)
    #: hard bound on host steps in one run
    max_host_steps: int = attrs.field(default=200_000, validator=_positive)
    #: bytes the caching allocator may reserve (its segments, real CPU bytes); past it, after releasing its cached
    #: segments, an allocation raises torch.OutOfMemoryError as CUDA does
    device_memory: int = attrs.field(factory=default_device_memory, validator=_positive)
    #: the program's sizes are its own (plain torch.cuda code, whose GPU run allocates what it allocates here): the
    #: caching allocator rounds and pools them as CUDA's does (512-byte blocks, small requests up to 1 MiB from
    #: 2 MiB segments, ...); else (the registered programs, whose sizes a GPU run multiplies by ``byte_scale``) at
    #: 1/1024 of CUDA's sizes (``simdevice.runtime.allocator``)
    real_sizes: bool = False
    #: compute the values (the default), or race-only: storages keep their shadows (versions, accesses) and no
    #: operation moves bytes, so memory does not grow with the simulated bytes; races and stale reads are found as
    #: with values, value checks are skipped and a host read of device memory gets a placeholder (``--no-values``)
    values: bool = True
    #: per program (a schedule's program name, ``activation_offload``): that program's own host step, measured on
    #: the profile's GPU, in place of ``host_step_ns`` for its runs (a program the profile did not time gets
    #: ``host_step_ns``, the median over the programs it timed)
    program_host_step_ns: tuple[tuple[str, int], ...] = ()
    #: per host actor (``host``, ``rank0``): the measured cost of each of its counted steps, by index, in place of
    #: ``host_step_ns`` (and ``engine_step_ns``, ``collective_host_ns``, a sleep's length: what the host did
    #: between two steps is in the measurement). A GPU run's own host, step by step (``reference.cuda``'s
    #: ``host_traces``): the simulator then judges that run with its host's pace, and its own device costs. A
    #: step past an actor's trace, an actor without one, and a poll the schedule does not count cost
    #: ``host_step_ns`` as before
    host_trace: tuple[tuple[str, tuple[int, ...]], ...] = attrs.field(default=(), converter=host_trace)
    #: per spawned actor (a ``Process``'s name, ``worker0``): how long after the parent's ``start`` step its first
    #: step came, measured (a GPU's worker starts an interpreter, imports, makes a CUDA context: seconds); else one
    #: ``host_step_ns``. The parent polling for it meanwhile is waiting, not a deadlock
    host_starts: tuple[tuple[str, int], ...] = attrs.field(default=(), converter=host_starts)
    #: a spawned process (a ``Process``, ``worker0``; not a world's ranks) as a GPU's host runs one, measured by
    #: ``scripts/calibrate``: its first step this long after the parent's ``start`` step where no start was measured
    #: for it (``host_starts``; the parent polling for it meanwhile is waiting, not a deadlock), and each of its
    #: steps ``spawned_host_step_ns`` in place of ``host_step_ns`` (its own interpreter's pace). 0: as any actor
    #: (the fast default: a host step after its parent's, at the run's host step)
    spawn_start_ns: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    spawned_host_step_ns: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    #: the cost profile the costs above come from: ``default`` (a fast host, the conservative choice for finding
    #: bugs) or a profile measured on a GPU (``simdevice.runtime.profiles``, ``--profile NAME``); reports name it
    profile: str = "default"
    #: how host actors take turns: ``greenlet`` (the default: one thread, a switch costs little) or ``thread`` (a
    #: thread each). The same run either way; a greenlet run that meets torch state one thread cannot hold for two
    #: actors (inference mode, autocast, two backwards at once: ``simdevice.runtime.tls``) starts again on threads
    actors: str = attrs.field(default="greenlet", validator=attrs.validators.in_(("greenlet", "thread")))

    def for_program(self, program: str) -> SimConfig:
        """The costs of a run of ``program``: its own host step where the profile measured one."""
        if not self.program_host_step_ns:
            return self
        return _for_program(self, program)

    def copy_ns(self, nbytes: int, pageable: str | None = None) -> int:
        """A host copy of ``nbytes``; ``pageable``: ``"h2d"`` from or ``"d2h"`` to pageable host memory, at its own
        rate where the profile measured one."""
        per_us = {"h2d": self.pageable_h2d_bytes_per_us, "d2h": self.pageable_d2h_bytes_per_us}.get(pageable or "", 0)
        if per_us:
            return max(self.launch_ns, nbytes * self.byte_scale * 1000 // per_us)
        return max(self.launch_ns, nbytes * self.byte_scale // self.copy_bytes_per_ns)

    def kernel_ns(self, nbytes: int) -> int:
        return max(self.launch_ns, nbytes * self.byte_scale // self.kernel_bytes_per_ns)


@functools.lru_cache(maxsize=64)
def _for_program(config: SimConfig, program: str) -> SimConfig:
    """:meth:`SimConfig.for_program`, made once per (config, program): every run of a profile asks."""
    own = dict(config.program_host_step_ns).get(program)
    return attrs.evolve(config, host_step_ns=own) if own is not None and own != config.host_step_ns else config


#: SimConfig fields every run made inside :func:`overridden` gets (the command line's ``--max-steps``)
_OVERRIDES: contextvars.ContextVar[tuple[tuple[str, Any], ...]] = contextvars.ContextVar("sim_config_overrides",
                                                                                      default=())


@contextlib.contextmanager
def overridden(**fields: Any) -> Iterator[None]:
    """Runs made inside the block use these :class:`SimConfig` fields (e.g. ``max_host_steps``) whatever config
    their caller built: how the command line reaches every target's runs."""
    token = _OVERRIDES.set(tuple({**dict(_OVERRIDES.get()), **fields}.items()))
    try:
        yield
    finally:
        _OVERRIDES.reset(token)


def with_overrides(config: SimConfig | None) -> SimConfig:
    """``config`` (None: the defaults) with the fields of an enclosing :func:`overridden` block. Made once per
    (config, fields): every run asks, and a search's runs ask with the same two (a config's ``__init__``, its
    validators and converters, cost a tenth of an empty run)."""
    fields = _OVERRIDES.get()
    try:
        return _with(config, fields)
    except TypeError:  # a field's value is not hashable: made afresh
        return _with.__wrapped__(config, fields)


@functools.lru_cache(maxsize=64)
def _with(config: SimConfig | None, fields: tuple[tuple[str, Any], ...]) -> SimConfig:
    base = config if config is not None else SimConfig()
    return attrs.evolve(base, **dict(fields)) if fields else base


def active_overrides() -> tuple[tuple[str, Any], ...]:
    """The fields of the enclosing :func:`overridden` blocks, as ``overridden(**dict(...))`` takes them again (how
    ``check --jobs`` gives its workers the command line's settings)."""
    return _OVERRIDES.get()


def active_profile() -> str:
    """The cost profile runs made now are judged with (``--profile``; ``default`` outside any)."""
    return str(dict(_OVERRIDES.get()).get("profile", "default"))


def active_values() -> bool:
    """Whether runs made now compute values (False under ``--no-values``, a race-only run)."""
    return bool(dict(_OVERRIDES.get()).get("values", True))


def overrides_active() -> bool:
    """Whether runs made now get overridden fields (a cache of runs made without them must not serve these)."""
    return bool(_OVERRIDES.get())
