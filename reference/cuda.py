"""``CudaDevice``: the device contract (``reference.contract``) on real CUDA, realizing a schedule.

``CudaDevice(schedule).run(program, *args)`` runs ``program(dev, *args)`` in
this process (actor ``host``), counting operations per actor as the
simulator does (:func:`reference.contract.op_kind`, a dispatch mode) and
stalling the ones the schedule delays: a stream with ``torch.cuda._sleep``
enqueued just before the delayed operation (calibrated at run time), a host
actor with ``time.sleep`` before the delayed step. Worker processes
(``Process``) and ranks (``spawn_ranks``) are real processes (forked from a
preloaded fork server, :func:`process_context`) sharing device memory over
CUDA IPC and talking NCCL.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import io
import os
import pickle
import queue
import sys
import tempfile
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from reference import contract
from reference.contract import MemorySaver, Run, dispatches_itself, op_kind, poison
from reference.naming import LIBRARIES, import_file_as, op_name
from reference.origin import Origin
from reference.schedule import Schedule


def calibrate_sleep_cycles_per_ms(samples: int = 3) -> float:
    """Measure how many ``torch.cuda._sleep`` cycles make one millisecond on this GPU."""
    torch.cuda.synchronize()
    cycles = 10_000_000
    rates = []
    for _ in range(samples):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        rates.append(cycles / start.elapsed_time(end))
    rates.sort()
    return float(rates[len(rates) // 2])


#: how workers and ranks start: the first of these the platform has (:func:`process_context`)
START_METHODS = ("forkserver", "spawn")
#: what the fork server imports once, before it forks any child
PRELOAD = ["torch", "reference.cuda"]


def process_context() -> Any:
    """The ``torch.multiprocessing`` context that workers (``Process``) and ranks (``spawn_ranks``) start from.

    A fork server that has imported torch and this module once, where the platform has one: a new worker then
    costs a fork and its own CUDA initialization, where ``spawn`` starts a fresh interpreter that imports torch
    again (seconds per worker, during which the trainer polls). CUDA is never initialized in the server (it only
    imports), so each child sets up its own CUDA context, as a spawned one does, and device tensors still travel
    over CUDA IPC. A child's environment is the server's, taken when it started: what a child must have set, it
    sets itself (``_rank_entry``)."""
    import multiprocessing

    import torch.multiprocessing as mp

    method = next(m for m in START_METHODS if m in (*multiprocessing.get_all_start_methods(), "spawn"))
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(PRELOAD)
    return ctx


class _Pickler(pickle.Pickler):
    """Pickles as ``pickle`` does, noting the file of each module whose functions and classes it names: a target the
    tool imported by its path has a name of its own (``simdevice_target_...``), which a child cannot import; the
    child loads it from the file (:class:`_Unpickler`), as a spawned child of ``python FILE.py`` loads its main."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.files: dict[str, str] = {}

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (types.FunctionType, type)):
            name = getattr(obj, "__module__", None)
            file = getattr(sys.modules.get(name), "__file__", None) if isinstance(name, str) else None
            if isinstance(file, str):
                self.files.setdefault(name, file)  # type: ignore[arg-type]
        return NotImplemented  # (pickled as pickle pickles it)


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, files: dict[str, str]) -> None:
        super().__init__(io.BytesIO(data))
        self.files = files

    def find_class(self, module: str, name: str) -> Any:
        try:
            return super().find_class(module, name)
        except ModuleNotFoundError as e:
            if e.name != module or module not in self.files:
                raise
        if import_file_as(module, self.files[module]) is None:
            raise ModuleNotFoundError(f"no module named {module!r} ({self.files[module]} is not a Python file)",
                                      name=module)
        return super().find_class(module, name)


def dumps(obj: Any) -> bytes:
    """``obj`` pickled for a child process (:func:`loads`): a function or class of a module imported by its path
    (a target's file) travels with that path."""
    body = io.BytesIO()
    pickler = _Pickler(body)
    pickler.dump(obj)
    return pickle.dumps((pickler.files, body.getvalue()))


def loads(payload: bytes) -> Any:
    """What :func:`dumps` pickled; a module the child cannot import by its name is loaded from its file."""
    files, body = pickle.loads(payload)
    return _Unpickler(body, files).load()


def _warm_caches() -> None:
    """Before a run: free what earlier runs left to Python's cycle collector, so their page-locked and device
    blocks are back in torch's caches. A warm-up run then warms them: without it, a run can pay a fresh
    ``cudaHostAlloc`` (tens of milliseconds for 64 MiB, and it synchronizes the device) wherever the collector
    had not run yet, and the same schedule would run with other timings from one trial to the next."""
    if not _CURRENT:  # a world of one runs inside its parent's run: that one has collected already
        gc.collect()


@contextlib.contextmanager
def _compiled_eagerly() -> Iterator[None]:
    """A function ``torch.compile`` made runs eagerly for the duration (Dynamo's ``force_eager`` stance), as the
    simulator's drop-in runs it: both machines count the same operations (compiled, its fused kernels would be
    counted as none). Set once Dynamo is loaded: now, where the program compiled a function before the run, else at
    its first ``torch.compile`` in the run; the default stance again after it."""
    original = torch.compile
    set_here: list[bool] = []

    def force_eager() -> None:
        if not set_here:
            torch.compiler.set_stance("force_eager")
            set_here.append(True)

    @functools.wraps(original)
    def compile(*args: Any, **kwargs: Any) -> Any:
        force_eager()
        return original(*args, **kwargs)

    if "torch._dynamo" in sys.modules:
        force_eager()
    torch.compile = compile  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.compile = original
        if set_here:
            torch.compiler.set_stance("default")


@contextlib.contextmanager
def _storages_poisoned() -> Iterator[None]:
    """A device storage grown by ``resize_`` (offload code's onload: ``untyped_storage().resize_(n)`` after a
    ``resize_(0)``) gets its new bytes poisoned, as ``_CountingMode`` poisons an allocation and the simulator a
    regrown storage (all bits set: NaN in every float type): the caching allocator may hand back a block that still
    holds an earlier trial's right answer. No operation dispatches for a storage, so none is counted; the fill is the
    tool's own, on the current stream, as the allocation's."""
    from torch.utils._python_dispatch import _disable_current_modes

    original = torch.UntypedStorage.resize_

    @functools.wraps(original)
    def resize_(self: torch.UntypedStorage, size: int) -> Any:
        before = self.nbytes()
        out = original(self, size)
        if self.is_cuda and size > before:
            with _disable_current_modes(), torch.no_grad():
                grown = torch.empty(0, dtype=torch.uint8, device=self.device)
                grown.set_(self, before, (size - before,), (1,)).fill_(255)
        return out

    torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.UntypedStorage.resize_ = original  # type: ignore[method-assign]


class _Counter:
    """Counts operations per actor and stalls the delayed ones (the CUDA side of a schedule).

    Consecutive polls of an actor (host steps that only observe, or sleep: ``Value.value`` reads,
    ``Queue.empty``, an event's or a stream's ``query``, ``is_completed``, ``dev.sleep``) count as one operation,
    the first: a poll right after a poll is not counted (no index, no delay) until the actor makes any other
    counted step. So a polling loop counts the same however long the GPU makes it poll, as the simulator counts
    it (``simdevice.runtime.execution.HostActor.count``, the same rule).
    """

    def __init__(self, schedule: Schedule | None, cycles_per_ms: float, timed: bool = False) -> None:
        self.delays: dict[str, dict[int, int]] = {}
        if schedule is not None:
            for d in schedule.delays:
                self.delays.setdefault(d.actor, {})[d.index] = d.units
        self.counts: dict[str, int] = {}
        self.fired: set[tuple[str, int]] = set()
        #: the actors whose last counted step was a poll
        self.polling: set[str] = set()
        self.cycles_per_ms = cycles_per_ms
        #: with ``timed``: per actor, the wall clock (``perf_counter_ns``) at each of its counted operations (what
        #: ``scripts/calibrate`` measures a host step's cost from), and which of the actors are hosts (a stream's
        #: stamps are its operations' issue times)
        self.stamps: dict[str, list[int]] | None = {} if timed else None
        self.hosts: set[str] = set()
        #: with ``timed``: per host actor, the indices of its stamps that autograd's engine issued
        #: (``reference.origin``), which calibrate times apart from the program's Python
        self.engine: dict[str, set[int]] = {}
        #: with ``timed``: the spawned processes' own step costs (``host_costs``), and how long after the parent's
        #: ``start`` step each one's first step came (ns), as their ``join`` brought them back
        self.children: dict[str, tuple[int, ...]] = {}
        self.starts: dict[str, int] = {}

    def next(self, actor: str, poll: bool = False) -> int:
        """Count one operation of ``actor`` (``poll``: a query or a sleep); return the units it must be stalled
        first (0 for a poll that is not counted)."""
        if poll:
            if actor in self.polling:
                return 0
            self.polling.add(actor)
        else:
            self.polling.discard(actor)
        if self.stamps is not None:
            self.stamps.setdefault(actor, []).append(time.perf_counter_ns())
        k = self.counts.get(actor, 0)
        self.counts[actor] = k + 1
        units = self.delays.get(actor, {}).get(k, 0)
        if units:
            self.fired.add((actor, k))
        return units

    def host_costs(self) -> dict[str, tuple[int, ...]]:
        """With ``timed``: per host actor, each counted step's cost as the simulator charges it
        (``SimConfig.host_trace``): the wall time until the actor's next counted step, less the stall the schedule
        put at that step (the sleep's overshoot stays in). A step's cost holds whatever the host did before its
        next step: the operation itself (a launch, or a wait), then the program's Python (polls the schedule
        does not count included). An actor's last step has none. A spawned process's actors are in it once its
        ``join`` brought their steps back (``starts``: when each one's first step came)."""
        if self.stamps is None:
            return {}
        out = {}
        for actor in sorted(self.hosts):
            ts = self.stamps.get(actor, [])
            stalls = self.delays.get(actor, {})
            out[actor] = tuple(max(1, ts[k + 1] - ts[k] - stalls.get(k, 0) * 1_000_000) for k in range(len(ts) - 1))
        return {**self.children, **out}

    def unfired(self) -> tuple[str, ...]:
        return tuple(
            f"{a}#{k}+{u}" for a, ds in self.delays.items() for k, u in ds.items() if (a, k) not in self.fired
        )


class CudaStream(torch.cuda.Stream):
    """A named ``torch.cuda.Stream`` whose calls count as host steps. It is a ``torch.cuda.Stream`` over the same
    CUDA stream, so torch's own ``t.record_stream(s)`` and ``torch.cuda.stream(s)`` accept it."""

    def __new__(cls, dev: CudaDevice, raw: torch.cuda.Stream, name: str) -> CudaStream:
        return super().__new__(  # type: ignore[no-any-return]
            cls, stream_id=raw.stream_id, device_index=raw.device_index, device_type=raw.device_type
        )

    def __init__(self, dev: CudaDevice, raw: torch.cuda.Stream, name: str) -> None:
        self.dev, self.raw, self._name = dev, raw, name

    @property
    def name(self) -> str:
        return self._name

    def wait_event(self, event: contract.Event) -> None:
        self.dev._host_step()
        self.raw.wait_event(_raw_event(event))

    def wait_stream(self, stream: contract.Stream) -> None:
        self.dev._host_step()
        self.raw.wait_stream(_raw_stream(stream))

    def synchronize(self) -> None:
        self.dev._host_step()
        self.raw.synchronize()

    def query(self) -> bool:
        self.dev._host_step(poll=True)
        return bool(self.raw.query())

    def record_event(self, event: contract.Event | None = None) -> contract.Event:
        event = event or self.dev.Event()
        event.record(self)
        return event

    def __repr__(self) -> str:
        return f"CudaStream({self.name!r})"


def _raw_stream(s: contract.Stream | None) -> torch.cuda.Stream:
    if not isinstance(s, CudaStream):
        raise TypeError(f"expected a stream of a CudaDevice, got {s!r}")
    return s.raw


def _raw_event(e: contract.Event) -> torch.cuda.Event:
    if not isinstance(e, CudaEvent):
        raise TypeError(f"expected an event of a CudaDevice, got {e!r}")
    return e.raw


class CudaEvent:
    def __init__(self, dev: CudaDevice, enable_timing: bool = False) -> None:
        self.dev, self.raw = dev, torch.cuda.Event(enable_timing=enable_timing)

    def record(self, stream: contract.Stream | None = None) -> None:
        self.dev._host_step()
        self.raw.record(_raw_stream(stream or self.dev.current_stream()))

    def wait(self, stream: contract.Stream | None = None) -> None:
        (stream or self.dev.current_stream()).wait_event(self)

    def query(self) -> bool:
        self.dev._host_step(poll=True)
        return bool(self.raw.query())

    def synchronize(self) -> None:
        self.dev._host_step()
        self.raw.synchronize()

    def elapsed_time(self, end_event: contract.Event) -> float:
        self.dev._host_step()
        return float(self.raw.elapsed_time(_raw_event(end_event)))


class CudaValue:
    """A shared ``multiprocessing`` value; each access is a host step of the accessing actor."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw

    @property
    def value(self) -> Any:
        _current_cuda_device()._host_step(poll=True)
        return self.raw.value

    @value.setter
    def value(self, v: Any) -> None:
        _current_cuda_device()._host_step()
        self.raw.value = v


class CudaQueue:
    def __init__(self, raw: Any) -> None:
        self.raw = raw

    def put(self, item: Any) -> None:
        _current_cuda_device()._host_step()
        self.raw.put(item)

    def get(self, timeout: float | None = None) -> Any:
        _current_cuda_device()._host_step()
        return self.raw.get(timeout=timeout)

    def empty(self) -> bool:
        _current_cuda_device()._host_step(poll=True)
        return bool(self.raw.empty())


class CudaProcess:
    """A spawned worker process; ``start`` and ``join`` are host steps of the caller.

    At ``join`` the child's operation counts and fired delays join the caller's, so that a run
    reports delays on a worker's actors as applied (or not) as the simulator does.
    """

    def __init__(self, dev: CudaDevice, raw: Any, counts: Any = None) -> None:
        self.dev, self.raw, self.counts = dev, raw, counts
        self.started = 0

    def start(self) -> None:
        self.dev._host_step()
        self.started = time.perf_counter_ns()  # one monotonic clock for every process of the machine
        self.raw.start()

    def join(self, timeout: float | None = None) -> None:
        self.dev._host_step()
        self.raw.join(timeout)
        if self.counts is not None and self.raw.exitcode is not None:
            import queue

            try:
                counts, fired, costs, first = self.counts.get(timeout=1.0)
            except queue.Empty:  # the child died before it could tell
                return
            counter = self.dev.counter
            counter.counts.update(counts)
            counter.fired |= fired
            if counter.stamps is not None:
                counter.children.update(costs)
                if first is not None and self.started:
                    counter.starts[self.raw.name] = max(1, first - self.started)

    def is_alive(self) -> bool:
        return bool(self.raw.is_alive())

    @property
    def exitcode(self) -> int | None:
        return self.raw.exitcode  # type: ignore[no-any-return]


class CudaWork:
    """An async collective's handle: ``wait()`` makes the current stream wait for it."""

    def __init__(self, dev: CudaDevice, raw: Any) -> None:
        self.dev, self.raw = dev, raw

    def wait(self, timeout: Any = None) -> bool:
        self.dev._host_step()
        return bool(self.raw.wait() if timeout is None else self.raw.wait(timeout))

    def is_completed(self) -> bool:
        self.dev._host_step(poll=True)
        return bool(self.raw.is_completed())


_CURRENT: list[CudaDevice] = []

_OWN_FILES = tuple(str(Path(__file__).with_name(m)) for m in ("cuda.py", "cuda_plain.py", "contract.py", "device.py"))


def _backend_file(filename: str) -> bool:
    """A frame of this backend or of a library (torch's among them), not the program's."""
    return os.path.abspath(filename) in _OWN_FILES or any(s in filename.replace("\\", "/") for s in LIBRARIES)


#: whether a timed host step was issued by autograd's engine (``reference.origin``)
_ORIGIN = Origin(_backend_file)


def _current_cuda_device() -> CudaDevice:
    if not _CURRENT:
        raise RuntimeError("no CudaDevice is running in this process")
    return _CURRENT[-1]


class _CountingMode(TorchDispatchMode):
    """Counts stream operations and host steps as the simulator does, and injects the delays."""

    def __init__(self, dev: CudaDevice, poisons: bool = False) -> None:
        super().__init__()
        self.dev = dev
        self.poisons = poisons

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if any(dispatches_itself(t) for t in types):
            # a wrapper tensor subclass's op (a float8 weight, a nested tensor): the subclass runs it, and the ops it
            # runs on the tensors it wraps come back here, each a kernel of its own, as the simulator counts them
            return NotImplemented
        kwargs = kwargs or {}
        if _composite(func):
            # an op autograd decomposes before a mode sees it, here whole where autograd is skipped (``to`` under
            # inference mode): decomposed, its parts are counted one by one, as the simulator counts them
            with self:
                return func.decompose(*args, **kwargs)
        kind = op_kind(func)
        if kind == "op":
            where = _touches(args, kwargs)
            if where:
                # a host step for every op on device or pinned memory; a stream operation only for device ones
                # (a host op on a pinned buffer runs on the CPU), as the simulator counts them
                what = _copy_kind(func, args, kwargs) if self.dev.timeline is not None else ""
                self.dev._host_step(what=what.split(" ")[0])
                if where == "device":
                    started = self.dev._stream_step(what)
                    out = func(*args, **kwargs)
                    self.dev._stream_done(started)
                    return out
        out = func(*args, **kwargs)
        if kind == "alloc" and self.poisons:
            _poison_allocated(out)
        return out


def _poison_allocated(out: Any) -> None:
    """Uninitialized memory that cannot pass for data: the caching allocators hand back blocks that may still hold a
    previous run's right answer, and a host allocation what the process freed before (the tool's own fill, inside a
    dispatch mode: no operation of the program), as the simulator poisons all three."""
    if isinstance(out, torch.Tensor):
        poison(out)


class _PoisoningMode(TorchDispatchMode):
    """Poisons each allocation as ``_CountingMode`` does, counting nothing (:func:`poisoned`)."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if any(dispatches_itself(t) for t in types):
            return NotImplemented
        out = func(*args, **(kwargs or {}))
        if op_kind(func) == "alloc":
            _poison_allocated(out)
        return out


@contextlib.contextmanager
def poisoned() -> Iterator[None]:
    """Uninitialized memory poisoned as in a counted run (``CudaDevice.run_plain``), nothing counted or delayed: for
    plain code run on a GPU outside a ``CudaDevice`` (``scripts/hazard-syncs``), where a program that checks the
    poison (``tests/hazards.py::unwritten_staging_read``) needs it."""
    with _storages_poisoned(), _PoisoningMode():
        yield


@functools.cache
def _composite(func: Any) -> bool:
    """Whether the op has a CompositeImplicitAutograd kernel (``to``, ``linear``)."""
    return bool(torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"))


def _touches(args: Any, kwargs: Any) -> str:
    """"device" if an op touches device memory, "pinned" if only pinned host memory, "" if neither."""
    pinned = False
    for x in torch.utils._pytree.tree_leaves((args, kwargs)):
        if isinstance(x, torch.Tensor):
            if x.is_cuda:
                return "device"
            pinned = pinned or (x.device.type == "cpu" and x.is_pinned())
        elif isinstance(x, torch.device) and x.type == "cuda":
            return "device"
    return "pinned" if pinned else ""


@contextlib.contextmanager
def _world_of_one() -> Iterator[None]:
    """A real NCCL process group of this one process for the duration, unless the program's launcher made one
    (on the simulator, plain code finds a default group too). NCCL makes its communicator at the first
    collective, so a program with none pays only for the store."""
    import torch.distributed as dist

    if not dist.is_available() or dist.is_initialized():
        yield
        return
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("nccl", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        try:
            # make the communicator now: its set-up synchronizes the device, which inside the program would wait
            # out a stall the schedule put before the program's first collective
            dist.all_reduce(torch.zeros(1, device="cuda"))
            torch.cuda.synchronize()
            yield
        finally:
            dist.destroy_process_group()


_TIMELINES: list[bool] = []
#: inside :func:`host_traces`: the devices made there, in order
_TRACED: list[list[CudaDevice]] = []


@contextlib.contextmanager
def host_traces() -> Iterator[list[CudaDevice]]:
    """Every ``CudaDevice`` made inside is timed and listed in the list this yields: after a run, even one that
    raised, ``dev.counter.host_costs()`` is what its host did, step by step (a world of one's rank is in its
    parent's), for the simulator to judge that run with (``SimConfig.host_trace``)."""
    made: list[CudaDevice] = []
    _TRACED.append(made)
    try:
        yield made
    finally:
        _TRACED.pop()


def measured_hosts(devices: list[CudaDevice]) -> tuple[dict[str, tuple[int, ...]], dict[str, int]]:
    """What :func:`host_traces`' devices measured of a run: each host actor's step costs (``SimConfig.host_trace``)
    and when each spawned process's first step came (``SimConfig.host_starts``)."""
    costs: dict[str, tuple[int, ...]] = {}
    starts: dict[str, int] = {}
    for dev in devices:
        costs.update(dev.counter.host_costs())
        starts.update(dev.counter.starts)
    return costs, starts


@contextlib.contextmanager
def timelines() -> Iterator[None]:
    """Every ``CudaDevice`` made inside keeps the run's GPU timeline in ``Run.trace`` (``replay --gpu --trace``)."""
    _TIMELINES.append(True)
    try:
        yield
    finally:
        _TIMELINES.pop()


class GpuTimeline:
    """A run's timeline on the GPU, in the simulator's trace format: each counted host step at its wall time, each
    counted stream operation's start and end on its stream, from CUDA events recorded around it (``enable_timing``),
    all relative to an event recorded when the run starts (after a device synchronize, so the two clocks start
    together, within the event's own few microseconds). The events cost the host a few microseconds per operation
    beside the counting. A collective runs on NCCL's own stream, which takes no events here: it is shown from its
    launch stream's position (an event there) to its end (an event on a stream of the timeline's own that waits for
    it), so its start is when NCCL could start it. Operations of other processes (spawned ranks, workers) are not
    in it."""

    def __init__(self) -> None:
        self.t0: Any = None
        self.t0_wall = 0
        self.host: list[tuple[int, str, str]] = []
        #: (stream, index, what, start event, end event)
        self.ops: list[tuple[str, int, str, Any, Any]] = []

    def start(self) -> None:
        torch.cuda.synchronize()
        self.t0 = torch.cuda.Event(enable_timing=True)
        self.t0.record(torch.cuda.default_stream())
        self.t0_wall = time.perf_counter_ns()

    def host_step(self, actor: str, what: str) -> None:
        self.host.append((time.perf_counter_ns() - self.t0_wall, actor, what))

    def op_start(self, stream: str, index: int, what: str) -> tuple[str, int, str, Any]:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return stream, index, what, ev

    def op_end(self, started: tuple[str, int, str, Any]) -> None:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        self.ops.append((*started, ev))

    def trace(self) -> tuple[tuple[int, str, str], ...]:
        """The entries, in time order (ns since the run's start); call after the device is synchronized."""
        return timeline_entries(self.host, [(s, k, w, self.t0.elapsed_time(a), self.t0.elapsed_time(b))
                                            for s, k, w, a, b in self.ops])


def timeline_entries(host: list[tuple[int, str, str]],
                     ops: list[tuple[str, int, str, float, float]]) -> tuple[tuple[int, str, str], ...]:
    """Host steps ``(ns, actor, what)`` and stream operations ``(stream, index, what, start ms, end ms)`` as the
    simulator's trace: ``start OP #k`` and ``done OP #k`` on the stream, sorted by time; at one instant host steps
    first, then in operation order (an operation's start before its done, a stream's ``done #k`` before its
    ``start #k+1``, as the simulator's trace has them)."""
    out = [((t, 0, 0, 0), actor, what) for t, actor, what in host]
    for stream, k, what, start, end in ops:
        out.append(((round(start * 1e6), 1, k, 0), stream, f"start {what} #{k}"))
        out.append(((round(end * 1e6), 1, k, 1), stream, f"done {what} #{k}"))
    out.sort(key=lambda e: e[0])
    return tuple((key[0], actor, what) for key, actor, what in out)


def _copy_kind(func: Any, args: Any, kwargs: dict[str, Any] | None = None) -> str:
    """``copy_ (D2H)``, ``_to_copy (H2D)`` and the like for a copy between host and device, as the simulator names
    it; any other operation by its name (``mul_``)."""
    name = op_name(func)
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if name == "copy_" and len(tensors) >= 2 and tensors[0].is_cuda != tensors[1].is_cuda:
        return f"{name} ({'H2D' if tensors[0].is_cuda else 'D2H'})"
    if name == "_to_copy" and tensors:
        dst = (kwargs or {}).get("device")
        if dst is not None and (torch.device(dst).type == "cuda") != tensors[0].is_cuda:
            return f"{name} ({'D2H' if tensors[0].is_cuda else 'H2D'})"
    return name


class CudaDevice:
    """The device contract on real CUDA, realizing a schedule's delays.

    ``CudaDevice(schedule).run(program, *args)`` runs ``program(dev, *args)`` in
    this process (actor ``host``), counting operations like the simulator and
    stalling the ones the schedule delays.
    """

    device = torch.device("cuda")

    def __init__(
        self,
        schedule: Schedule | None = None,
        *,
        actor: str = "host",
        cycles_per_ms: float | None = None,
        timed: bool = False,
    ) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError("CudaDevice needs a CUDA GPU")
        self.schedule = schedule
        self.actor = actor
        self.cycles_per_ms = cycles_per_ms or calibrate_sleep_cycles_per_ms()
        if _TRACED:
            timed = True
            _TRACED[-1].append(self)
        #: ``timed``: ``counter.stamps`` has the wall clock of every counted host step and stream operation
        self.counter = _Counter(schedule, self.cycles_per_ms, timed)
        self._names: dict[int, str] = {}
        self._streams = 0
        self._prefix = "" if actor == "host" else f"{actor}."
        self._names[torch.cuda.default_stream().stream_id] = f"{self._prefix}default"
        self._mp: Any = None
        self._memory_saver: MemorySaver | None = None
        #: inside :func:`timelines`: the run's GPU timeline, in ``Run.trace``
        self.timeline: GpuTimeline | None = GpuTimeline() if _TIMELINES else None
        self._tl_stream: torch.cuda.Stream | None = None

    # -- running a program ---------------------------------------------------
    def run(self, program: Callable[..., Any], *args: Any) -> Run:
        _warm_caches()
        if self.timeline is not None and self.timeline.t0 is None:  # a world-of-one rank shares its parent's
            self.timeline.start()
        _CURRENT.append(self)
        try:
            with _CountingMode(self):
                result = program(self, *args)
            torch.cuda.synchronize()
        finally:
            _CURRENT.pop()
        return self._result(result)

    def _result(self, result: Any) -> Run:
        trace = self.timeline.trace() if self.timeline is not None else ()
        return Run(result=result, op_counts=dict(self.counter.counts), unfired=self.counter.unfired(), trace=trace)

    def _host_step(self, poll: bool = False, what: str | None = None) -> None:
        """One host step of this actor (``poll``: a query or a sleep, see :class:`_Counter`; ``what``: its name in
        a timeline, else the calling method's)."""
        stamps, engine = self.counter.stamps, False
        if stamps is not None:
            self.counter.hosts.add(self.actor)
            engine = _ORIGIN.from_engine()
        before = self.counter.counts.get(self.actor, 0)
        units = self.counter.next(self.actor, poll)
        if engine and stamps is not None and self.counter.counts.get(self.actor, 0) > before:
            self.counter.engine.setdefault(self.actor, set()).add(len(stamps[self.actor]) - 1)
        if units:
            time.sleep(units * 1e-3)
        if self.timeline is not None and self.counter.counts.get(self.actor, 0) > before:
            self.timeline.host_step(self.actor, what or sys._getframe(1).f_code.co_name.lstrip("_"))

    def _stream_step(self, what: str = "op") -> tuple[str, int, str, Any] | None:
        """Count one operation of the current stream, stalled first if the schedule says so; with a timeline, the
        operation's start (pass it to :meth:`_stream_done` once it is issued)."""
        name = self._name_of(torch.cuda.current_stream())
        units = self.counter.next(name)
        if units:
            torch.cuda._sleep(int(units * self.cycles_per_ms))
        if self.timeline is None:
            return None
        return self.timeline.op_start(name, self.counter.counts[name] - 1, what)

    def _timeline_stream(self) -> torch.cuda.Stream:
        if self._tl_stream is None:
            self._tl_stream = torch.cuda.Stream()
        return self._tl_stream

    def _stream_done(self, started: tuple[str, int, str, Any] | None) -> None:
        if started is not None and self.timeline is not None:
            self.timeline.op_end(started)

    def _name_of(self, raw: torch.cuda.Stream) -> str:
        """A stream's schedule name: as given, or ``s1``, ``s2``, ... (counting only unnamed streams, skipping
        names taken), as the simulator names them."""
        name = self._names.get(raw.stream_id)
        if name is None:
            taken = set(self._names.values())
            while True:
                self._streams += 1
                name = f"{self._prefix}s{self._streams}"
                if name not in taken:
                    break
            self._names[raw.stream_id] = name
        return name

    def _wrap(self, raw: torch.cuda.Stream) -> CudaStream:
        return CudaStream(self, raw, self._name_of(raw))

    def run_plain(self, fn: Callable[..., Any], *args: Any, world_size: int | None = None, **kwargs: Any) -> Run:
        """Run plain torch.cuda code ``fn(*args, **kwargs)`` (no ``dev``), counting and stalling it as the
        simulator's drop-in does (``reference.cuda_plain``)."""
        from reference.cuda_plain import counting_torch_cuda

        if world_size is not None:
            # on ranks ``rank0..``, a process and a GPU each, as the simulator's drop-in runs it on ranks
            if self.timeline is not None:
                raise NotImplementedError("a GPU timeline of a run on several ranks is not drawn")
            return self._result(self.spawn_ranks(_PlainCall(fn, args, kwargs), world_size))
        _warm_caches()
        _CURRENT.append(self)
        try:
            with _world_of_one(), counting_torch_cuda(self), _compiled_eagerly(), _storages_poisoned(), \
                    _CountingMode(self, poisons=True):
                if self.timeline is not None:  # after the process group's set-up, which synchronizes the device
                    self.timeline.start()
                result = fn(*args, **kwargs)
            torch.cuda.synchronize()
        finally:
            _CURRENT.pop()
        return self._result(result)

    def name_stream(self, raw: torch.cuda.Stream, name: str) -> None:
        """Give a stream the schedule name ``name`` (a full name, with this actor's prefix)."""
        self._names[raw.stream_id] = name

    def is_named(self, raw: torch.cuda.Stream) -> bool:
        """Whether the stream has its schedule name already (CUDA's pool hands a stream out again)."""
        return raw.stream_id in self._names

    def stream_names(self) -> set[str]:
        return set(self._names.values())

    @property
    def prefix(self) -> str:
        return self._prefix

    def host_step(self, poll: bool = False) -> None:
        """One host step of this actor (delayed if the schedule says so; ``poll``: a query or a sleep)."""
        self._host_step(poll)

    def count_op(self, actor: str) -> int:
        """Count one operation of ``actor``; the units it must be stalled first."""
        return self.counter.next(actor)

    # -- streams and events --------------------------------------------------
    def Stream(self, name: str | None = None, priority: int = 0) -> CudaStream:
        raw = torch.cuda.Stream(priority=priority)
        if name is not None:
            if self._prefix + name in self._names.values():
                raise ValueError(f"a stream named {self._prefix + name!r} already exists")
            self._names[raw.stream_id] = self._prefix + name
        return self._wrap(raw)

    def Event(self, enable_timing: bool = False) -> CudaEvent:
        return CudaEvent(self, enable_timing)

    @contextlib.contextmanager
    def stream(self, s: contract.Stream | None) -> Iterator[contract.Stream | None]:
        if s is None:  # as torch.cuda.stream(None): nothing changes
            yield None
            return
        with torch.cuda.stream(_raw_stream(s)):
            yield s

    def current_stream(self) -> CudaStream:
        return self._wrap(torch.cuda.current_stream())

    def default_stream(self) -> CudaStream:
        return self._wrap(torch.cuda.default_stream())

    def synchronize(self) -> None:
        self._host_step()
        torch.cuda.synchronize()

    # -- host actors -----------------------------------------------------------
    def _ctx(self) -> Any:
        if self._mp is None:
            self._mp = process_context()
        return self._mp

    def Process(self, target: Callable[..., Any], args: tuple[Any, ...] = (), name: str = "worker") -> CudaProcess:
        payload = dumps((self.schedule, self.cycles_per_ms, target, ()))
        counts = self._ctx().Queue()
        # Device tensors and shared values travel as Process arguments (CUDA IPC, shared memory).
        timed = self.counter.stamps is not None
        raw = self._ctx().Process(target=_child_entry, args=(payload, name, args, counts, timed), name=name)
        return CudaProcess(self, raw, counts)

    def Value(self, typecode: str, init: Any) -> CudaValue:
        return CudaValue(self._ctx().Value(typecode, init))

    def Queue(self) -> CudaQueue:
        return CudaQueue(self._ctx().Queue())

    def sleep(self, units: float) -> None:
        self._host_step(poll=True)
        time.sleep(units * 1e-3)

    def empty_cache(self) -> None:
        self._host_step()
        torch.cuda.empty_cache()

    # -- collectives -------------------------------------------------------------
    def all_gather_into_tensor(self, output: torch.Tensor, input: torch.Tensor, async_op: bool = True) -> Any:
        """A :class:`CudaWork` when ``async_op``, else None (``reference.contract.Device`` types it per form)."""
        import torch.distributed as dist
        from torch.utils._python_dispatch import _disable_current_modes

        self._host_step()
        # counted on NCCL's stream, as the simulator counts it (not on the caller's stream)
        units = self.counter.next(f"{self._prefix}nccl")
        launch = torch.cuda.current_stream()
        if units:
            # stall NCCL alone: it waits for the stream it is launched from, which sleeps after the caller's work
            launch = torch.cuda.Stream()
            launch.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(launch):
                torch.cuda._sleep(int(units * self.cycles_per_ms))
        with torch.cuda.stream(launch), _disable_current_modes():
            started = None
            if self.timeline is not None:  # where NCCL's stream can start it: its launch stream's position
                name = f"{self._prefix}nccl"
                started = self.timeline.op_start(name, self.counter.counts[name] - 1, "all_gather")
            raw = dist.all_gather_into_tensor(output, input, async_op=True)
            work = CudaWork(self, raw)
        if started is not None:
            # its end: a stream of the timeline's own waits for the collective, then records (nothing waits on it)
            with torch.cuda.stream(self._timeline_stream()), _disable_current_modes():
                raw.wait()
                self._stream_done(started)
        if async_op:
            return work
        work.wait()  # a host step, as in the simulator
        return None

    def spawn_ranks(self, fn: Callable[..., Any], world_size: int, args: tuple[Any, ...] = ()) -> list[Any]:
        """Run ``fn(dev, *args)`` as actors ``rank0..`` of one NCCL group, a process per GPU; return the results.

        A world of one runs in this process (its own counter; this one's counting paused meanwhile), but for a rank
        ``torch.multiprocessing.spawn`` starts (:class:`SpawnedRank`).
        """
        self._host_step()
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        plain = isinstance(fn, _PlainCall)
        if world_size > 1 and world_size > torch.cuda.device_count():
            raise RuntimeError(f"{world_size} ranks need {world_size} GPUs, a rank each; this machine has "
                               f"{torch.cuda.device_count()}")
        if world_size == 1 and not isinstance(fn, SpawnedRank):
            # (a rank ``torch.multiprocessing.spawn`` starts is a process of its own, as the program's is on a GPU:
            # this process counts the program that spawned it, its patches and counting mode in place)
            from torch.utils._python_dispatch import _disable_current_modes

            _init_nccl_group(0, 1, None)
            timed = self.counter.stamps is not None
            child = CudaDevice(self.schedule, actor="rank0", cycles_per_ms=self.cycles_per_ms, timed=timed)
            child.timeline = self.timeline  # one timeline, one start: the rank's steps land in this run's
            try:
                with _disable_current_modes():
                    if plain:
                        from reference.cuda_plain import torchrun_environment

                        with torchrun_environment(0, 1):
                            run = child.run_plain(fn, *args)
                    else:
                        run = child.run(fn, *args)
            finally:  # (a rank's error is the run's: its counts up to there are kept)
                self.counter.counts.update(child.counter.counts)
                self.counter.fired |= child.counter.fired
            if self.counter.stamps is not None and child.counter.stamps is not None:
                self.counter.stamps.update(child.counter.stamps)
                self.counter.hosts |= child.counter.hosts
                self.counter.engine.update(child.counter.engine)
            return [run.result]
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        ctx = self._ctx()
        results = ctx.Queue()
        payload = dumps((self.schedule, self.cycles_per_ms, fn, args))
        procs = [
            ctx.Process(target=_rank_entry, args=(payload, r, world_size, port, results), name=f"rank{r}")
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        out: dict[int, Any] = {}
        errors: list[str] = []
        try:
            reported: set[int] = set()
            dead: set[int] = set()  # ranks whose process had ended at the last empty poll
            quiet = 0
            while len(reported) < world_size:
                try:
                    r, result, counts, fired, error = results.get(timeout=1)
                except queue.Empty:
                    quiet += 1
                    # a process that ended without its result (killed, or dead before its own error handling) fails
                    # the run at once: its peers would wait for it in NCCL for good; one second's grace first, for
                    # a result still in the pipe
                    gone = sorted(r for r in dead if r not in reported)
                    if gone:
                        errors.append(f"rank{gone[0]} ended (exit code {procs[gone[0]].exitcode}) with no result")
                        break
                    dead = {r for r, p in enumerate(procs) if p.exitcode is not None}
                    # a rank that failed leaves its peers waiting in NCCL for it, maybe for good: a minute for them
                    if quiet >= (60 if errors else 600):
                        break
                    continue
                quiet = 0
                reported.add(r)
                self.counter.counts.update(counts)  # (a failed rank's too: the counts up to its error)
                self.counter.fired |= fired
                if error:
                    errors.append(f"rank{r} failed: {error}")
                else:
                    out[r] = pickle.loads(result)
        finally:
            for p in procs:
                p.join(timeout=5 if errors else 60)
                if p.is_alive():
                    p.kill()
                    p.join()
        if errors:
            raise RuntimeError(errors[0])
        if len(out) < world_size:
            raise RuntimeError(f"rank(s) {', '.join(str(r) for r in range(world_size) if r not in out)} never "
                               "finished (10 minutes)")
        return [out[r] for r in range(world_size)]

    def spawn_spawned(self, fn: Callable[..., Any], args: tuple[Any, ...], nprocs: int) -> list[Any]:
        """``fn(i, *args)`` on rank ``i`` of ``nprocs`` (:meth:`spawn_ranks`), as ``torch.multiprocessing.spawn``
        starts a program's ranks in a counted run (``reference.cuda_plain``)."""
        return self.spawn_ranks(SpawnedRank(fn, args), nprocs)

    @property
    def rank(self) -> int:
        import torch.distributed as dist

        return dist.get_rank() if dist.is_initialized() else 0

    @property
    def world_size(self) -> int:
        import torch.distributed as dist

        return dist.get_world_size() if dist.is_initialized() else 1

    # -- the pausable memory pool -------------------------------------------------
    @property
    def memory_saver(self) -> MemorySaver:
        """``torch_memory_saver``; in a process started with ``TMS_INIT_ENABLE=1``, its process-wide form.

        Started that way (``LD_PRELOAD`` of the library's preload hook, as training frameworks launch a
        trainer that offloads), every device allocation of the process is pausable unless made inside
        ``disable()``: the process is the region. ``region(tag)`` then opens no memory pool of its own (a
        ``disable()`` nested in a region's pool aborts in PyTorch's allocator, docs/memsaver.md), and
        ``pause``/``resume`` act on all of the process's pausable memory.
        """
        if self._memory_saver is None:
            self._memory_saver = CountedMemorySaver(load_memory_saver(), self._host_step)
        return self._memory_saver


def memory_saver_preload() -> str:
    """The path of ``torch_memory_saver``'s preload hook built for this CUDA (what ``LD_PRELOAD`` names)."""
    from torch_memory_saver.utils import get_binary_path_from_package

    return str(get_binary_path_from_package("torch_memory_saver_hook_mode_preload"))


def cuda_runtime_dirs() -> list[str]:
    """The folders of the CUDA runtime torch's wheels carry: a preloaded hook needs it before torch loads it."""
    site = Path(torch.__file__).resolve().parents[1]
    return sorted({str(p.parent) for p in site.glob("nvidia/**/libcudart.so*")} | {str(site / "torch" / "lib")})


def start_memory_saver_process(mode: str) -> tuple[MemorySaver, int]:
    """In a process started with the preload hook (``mode`` ``process``: with ``TMS_INIT_ENABLE=1``; or ``preload``,
    ``torch``: the library's hook modes): the memory saver, NCCL's buffers made first as ordinary memory (a pause
    must not take them), and how many bytes a pause of a 2 GiB region released (none where the hook is not in place:
    then every schedule would look clean; run with nothing else allocating on the GPU)."""
    import torch.distributed as dist
    import torch_memory_saver

    torch_memory_saver.torch_memory_saver.hook_mode = "preload" if mode == "process" else mode
    saver = load_memory_saver()  # what the reference gets from CudaDevice: process-wide in mode "process"
    torch.cuda.set_device(0)
    with saver.disable() if mode == "process" else contextlib.nullcontext():
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
        x = torch.ones(1024, device="cuda")
        out = torch.empty(1024, device="cuda")
        dist.all_gather_into_tensor(out, x)
        torch.cuda.synchronize()
        del x, out
    with saver.region("setup-check", enable_cpu_backup=True):
        held = torch.ones(2 << 30, dtype=torch.uint8, device="cuda")  # large: other processes' use is noise
    torch.cuda.synchronize()
    free0, _ = torch.cuda.mem_get_info()
    saver.pause("setup-check")
    free1, _ = torch.cuda.mem_get_info()
    saver.resume("setup-check")
    del held
    # give the check's segment back: cached, the caching allocator would carve the run's tensors out of it (no
    # size limit on splitting), so a run's layout would not be the simulator's, which starts with no segment; in
    # mode process that segment is pausable, and a later pause would unmap blocks the simulator has mapped
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return saver, free1 - free0


def load_memory_saver() -> MemorySaver:
    """``torch_memory_saver``, or ``ProcessWideMemorySaver`` over it in a process started with ``TMS_INIT_ENABLE=1``."""
    from torch_memory_saver import torch_memory_saver

    if os.environ.get("TMS_INIT_ENABLE") == "1":
        return ProcessWideMemorySaver(torch_memory_saver)
    return cast(MemorySaver, torch_memory_saver)


class ProcessWideMemorySaver:
    """``torch_memory_saver`` in a process whose every allocation is pausable (``TMS_INIT_ENABLE=1``)."""

    def __init__(self, saver: Any) -> None:
        self._saver = saver
        self._backup = os.environ.get("TMS_INIT_ENABLE_CPU_BACKUP") == "1"

    @contextlib.contextmanager
    def region(
        self, tag: str = "default", enable_cpu_backup: bool = False, enable_disk_backup: bool = False,
        cpu_backup_backend: str | None = None,
    ) -> Iterator[None]:
        if enable_cpu_backup != self._backup:
            raise ValueError(
                f"region({tag!r}, enable_cpu_backup={enable_cpu_backup}) in a process-wide memory saver started "
                f"with TMS_INIT_ENABLE_CPU_BACKUP={int(self._backup)}"
            )
        if enable_disk_backup or cpu_backup_backend is not None:
            raise ValueError(
                f"region({tag!r}) with a disk backup or a backup backend in a process-wide memory saver: the "
                "process's environment (TMS_INIT_ENABLE_DISK_BACKUP, TMS_INIT_CPU_BACKUP_BACKEND) sets them"
            )
        yield

    def disable(self) -> Any:
        return self._saver.disable()

    def pause(self, tag: str | None = None) -> None:
        self._saver.pause(None)

    def resume(self, tag: str | None = None) -> None:
        self._saver.resume(None)


class CountedMemorySaver:
    """A memory saver whose ``pause`` and ``resume`` are each one host step of the calling actor, as on the simulated
    device (``simdevice.runtime.memsaver``): a delay on that step lands before the call, and the actor's later
    operations keep the simulator's indices. ``region()`` and ``disable()`` only change where allocations go: no
    step, on either backend."""

    def __init__(self, saver: MemorySaver, step: Callable[[], None]) -> None:
        self._saver, self._step = saver, step

    def region(
        self, tag: str = "default", enable_cpu_backup: bool = False, enable_disk_backup: bool = False,
        cpu_backup_backend: str | None = None,
    ) -> Any:
        more: dict[str, Any] = {}  # passed only where given: a library older than them takes the call as before
        if enable_disk_backup:
            more["enable_disk_backup"] = True
        if cpu_backup_backend is not None:
            more["cpu_backup_backend"] = cpu_backup_backend
        return self._saver.region(tag, enable_cpu_backup=enable_cpu_backup, **more)

    def disable(self) -> Any:
        return self._saver.disable()

    def pause(self, tag: str | None = None) -> None:
        self._step()
        self._saver.pause(tag)

    def resume(self, tag: str | None = None) -> None:
        self._step()
        self._saver.resume(tag)


def _init_nccl_group(rank: int, world_size: int, port: int | None) -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        if dist.get_world_size() != world_size:
            raise RuntimeError(f"a process group of {dist.get_world_size()} ranks exists; asked for {world_size}")
        return
    torch.cuda.set_device(rank % torch.cuda.device_count())
    if port is None:
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    else:
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)


class _PlainCall:
    """Plain torch.cuda code a rank runs: ``fn(*args, **kwargs)`` with no ``dev`` (``run_plain``'s), sent to the
    rank's process by reference (``fn`` a function its module defines, or an object that pickles so)."""

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.fn, self.args, self.kwargs = fn, args, kwargs

    def __call__(self) -> Any:
        return self.fn(*self.args, **self.kwargs)


class SpawnedRank(_PlainCall):
    """A function ``torch.multiprocessing.spawn`` starts on each rank (``reference.cuda_plain``'s): ``fn(rank,
    *args)``, the rank's index first, as torch's spawned processes call it."""

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        super().__init__(fn, args, {})

    def __call__(self) -> Any:
        import torch.distributed as dist

        return self.fn(dist.get_rank(), *self.args)


def _warm_communicators(rank: int, world_size: int) -> None:
    """Make the NCCL communicators plain code may use before it runs: the world's (a collective) and each pair's
    (a send and a receive between every two ranks). NCCL makes one at its first use, and its set-up synchronizes
    the device, which inside the program would wait out a stall the schedule put before that use (as
    ``_world_of_one`` does for a world of one)."""
    import torch.distributed as dist

    dist.all_reduce(torch.zeros(1, device="cuda"))
    one = torch.zeros(1, device="cuda")
    for a in range(world_size):
        for b in range(a + 1, world_size):
            if rank == a:
                dist.send(one, b)
            elif rank == b:
                dist.recv(one, a)
    torch.cuda.synchronize()


def _rank_entry(payload: bytes, rank: int, world_size: int, port: int, results: Any) -> None:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    # NVLink multicast stays off (the machines are shared); a fork server started before spawn_ranks set it
    # would not pass it on
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    dev: CudaDevice | None = None
    try:
        schedule, cycles, fn, args = loads(payload)
        _init_nccl_group(rank, world_size, port)
        dev = CudaDevice(schedule, actor=f"rank{rank}", cycles_per_ms=cycles)
        if isinstance(fn, _PlainCall):
            from reference.cuda_plain import torchrun_environment

            _warm_communicators(rank, world_size)
            with torchrun_environment(rank, world_size):  # (a script written for torchrun reads its rank there)
                run = dev.run_plain(fn, *args)
        else:
            run = dev.run(fn, *args)
        # plain bytes: a shared-memory tensor would need this process alive until the parent opened it
        results.put((rank, pickle.dumps(run.result), dict(dev.counter.counts), set(dev.counter.fired), ""))
    except Exception as e:  # the parent raises it; a silent child would leave it waiting
        counts, fired = (dict(dev.counter.counts), set(dev.counter.fired)) if dev is not None else ({}, set())
        results.put((rank, pickle.dumps(None), counts, fired, f"{type(e).__name__}: {e}"))
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def _child_entry(payload: bytes, name: str, args: tuple[Any, ...], counts: Any = None, timed: bool = False) -> None:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    schedule, cycles, target, _ = loads(payload)
    dev = CudaDevice(schedule, actor=name, cycles_per_ms=cycles, timed=timed)
    try:
        dev.run(target, *args)
    finally:
        if counts is not None:
            # timed: its steps' costs, and its first step's clock (the parent's start step is on the same clock)
            stamps = dev.counter.stamps or {}
            first = stamps[name][0] if stamps.get(name) else None
            counts.put((dict(dev.counter.counts), set(dev.counter.fired), dev.counter.host_costs(), first))
