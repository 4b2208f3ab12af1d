"""Plain torch.cuda code on a real GPU, counted and stalled as the simulator's drop-in counts it.

A schedule names a stream and an operation index; for one line to mean the same thing on both machines, the
GPU run must count what the simulator counts, and name the streams as it names them. While
:func:`counting_torch_cuda` is active:

- ``torch.cuda.Stream()`` is a :class:`CountingStream`, a real ``torch.cuda.Stream`` named after the line that
  made it (``reference.naming``, as the simulator does); ``current_stream()`` and ``default_stream()`` return
  such views of the real streams;
- a host step is taken (and a host delay applied) by what takes one in the simulator: a stream's
  ``wait_event``, ``wait_stream``, ``synchronize``, ``query``, an event's ``record``, ``query``,
  ``synchronize``, ``elapsed_time``, ``torch.cuda.synchronize()``, ``empty_cache()``, each collective call,
  ``torch_memory_saver``'s ``pause`` and ``resume`` (``region`` and ``disable`` take none, as in the simulator),
  and (through ``CudaDevice``'s dispatch mode) every aten op on device or pinned memory; consecutive queries
  (``query``, ``is_completed``) count as one, as ``CudaDevice`` counts polls;
- collectives of ``torch.distributed`` count one operation on this actor's ``nccl`` actor (stalled on a side
  stream of their own, so that a delay stalls NCCL alone), and a blocking one a second host step for its wait.

Nothing here fakes the GPU: every stream, event and collective is the real one.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import multiprocessing.process
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch

from reference.contract import GenericClass, torchrun_variables
from reference.naming import LIBRARIES, StreamNames, creation_site, in_standard_library, inside


class CudaDevice(Protocol):
    """What this module needs of ``reference.cuda.CudaDevice``."""

    cycles_per_ms: float

    @property
    def prefix(self) -> str: ...
    def host_step(self, poll: bool = False) -> None: ...
    def count_op(self, actor: str) -> int: ...
    def name_stream(self, raw: torch.cuda.Stream, name: str) -> None: ...
    def is_named(self, raw: torch.cuda.Stream) -> bool: ...
    def stream_names(self) -> set[str]: ...
    def spawn_spawned(self, fn: Callable[..., Any], args: tuple[Any, ...], nprocs: int) -> list[Any]: ...


_INTERNAL = inside(str(__import__("reference").__path__[0]))
_DEV: list[CudaDevice] = []


def _dev() -> CudaDevice:
    return _DEV[-1]


class CountingStream(torch.cuda.Stream):
    """A real CUDA stream whose calls are host steps, named as the simulator names it."""

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> CountingStream:
        s: CountingStream = super().__new__(cls, device=device, priority=priority, **kwargs)
        # a new stream (not a view of an existing one) is named by its site; one the pool hands out again (CUDA's 32
        # of a priority, in turn: the 33rd is the first) keeps its name, as the simulator's does
        if "stream_id" not in kwargs:
            dev = _dev()
            if not dev.is_named(s):
                filename, line, col = creation_site(_INTERNAL)
                dev.name_stream(s, _names(dev).assign(filename, line, col))
        return s

    @classmethod
    def view(cls, raw: torch.cuda.Stream) -> CountingStream:
        return cls(stream_id=raw.stream_id, device_index=raw.device_index, device_type=raw.device_type)

    # torch's own wait_stream / wait_event / record_event call each other and the event's methods: each call of
    # the program's is one host step, so these go to the raw classes' methods directly.
    def wait_event(self, event: Any) -> None:
        _dev().host_step()
        _RawEvent.wait(event, self)

    def wait_stream(self, stream: Any) -> None:
        _dev().host_step()
        e = _RawEvent()
        _RawEvent.record(e, stream)
        _RawEvent.wait(e, self)

    def synchronize(self) -> None:
        _dev().host_step()
        super().synchronize()

    def query(self) -> bool:
        _dev().host_step(poll=True)
        return bool(super().query())

    def record_event(self, event: Any = None) -> Any:
        _dev().host_step()
        event = event if event is not None else CountingEvent()
        _RawEvent.record(event, self)
        return event


_NAMES: dict[int, StreamNames] = {}


def _names(dev: CudaDevice) -> StreamNames:
    names = _NAMES.get(id(dev))
    if names is None:
        names = _NAMES[id(dev)] = StreamNames(dev.prefix, lambda full: full in dev.stream_names())
    return names


class CountingEvent(torch.cuda.Event):
    """A real CUDA event whose calls are host steps."""

    def record(self, stream: Any = None) -> None:
        _dev().host_step()
        _RawEvent.record(self, stream)

    def wait(self, stream: Any = None) -> None:
        _dev().host_step()
        _RawEvent.wait(self, stream)

    def query(self) -> bool:
        _dev().host_step(poll=True)
        return bool(super().query())

    def synchronize(self) -> None:
        _dev().host_step()
        super().synchronize()

    def elapsed_time(self, end_event: Any) -> float:
        _dev().host_step()
        return float(super().elapsed_time(end_event))


#: torch's own classes, as they were when this module was imported (the patches replace the names)
_RawEvent = torch.cuda.Event
_RawStream = torch.cuda.Stream


def _on_cuda(device: Any) -> bool:
    """Whether a generic class's ``device`` is CUDA's (None: the current accelerator, CUDA here)."""
    return device is None or (isinstance(device, int) and not isinstance(device, bool)) or \
        torch.device(device).type == "cuda"


class GenericStream(metaclass=GenericClass):
    """``torch.Stream(device=None, *, priority=0)`` on CUDA: a :class:`CountingStream`, as the simulator makes a
    ``torch.cuda.Stream`` of it (another device's is torch's own)."""

    _of = (torch.Stream,)

    def __new__(cls, device: Any = None, *, priority: int = 0, **kwargs: Any) -> Any:
        if not _on_cuda(device):
            return _RawGenericStream(device, priority=priority, **kwargs)
        return CountingStream(device, priority, **kwargs)


class GenericEvent(metaclass=GenericClass):
    """``torch.Event(device=None, *, enable_timing=False, ...)`` on CUDA: a :class:`CountingEvent`."""

    _of = (torch.Event, torch.cuda.Event)

    def __new__(cls, device: Any = None, *, enable_timing: bool = False, blocking: bool = False,
                interprocess: bool = False) -> Any:
        if not _on_cuda(device):
            return _RawGenericEvent(device, enable_timing=enable_timing, blocking=blocking, interprocess=interprocess)
        return CountingEvent(enable_timing, blocking, interprocess)


_RawGenericStream = torch.Stream
_RawGenericEvent = torch.Event


def accelerator_current_stream(device: Any = None, /) -> CountingStream:
    return CountingStream.view(_ORIGINAL["accelerator_current_stream"](device))


def accelerator_synchronize(device: Any = None, /) -> None:
    _dev().host_step()
    _ORIGINAL["accelerator_synchronize"](device)


def accelerator_empty_cache() -> None:
    _dev().host_step()
    _ORIGINAL["accelerator_empty_cache"]()


class CountingWork:
    """An async collective's handle: ``wait()`` and ``is_completed()`` are host steps, as on the simulator."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw

    def wait(self, timeout: Any = None) -> bool:
        _dev().host_step()
        return bool(self.raw.wait() if timeout is None else self.raw.wait(timeout))

    def is_completed(self) -> bool:
        _dev().host_step(poll=True)
        return bool(self.raw.is_completed())

    def get_future(self) -> CountingFuture:
        return CountingFuture(self.raw.get_future())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


class CountingFuture:
    """A work's future, and those its ``then`` makes: ``wait()``, ``then()`` and ``add_done_callback()`` are a host
    step each, as on the simulator (``value()`` and ``done()`` none); a callback is given the counting future."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw

    def wait(self) -> Any:
        _dev().host_step()
        return self.raw.wait()

    def then(self, callback: Callable[[Any], Any]) -> CountingFuture:
        _dev().host_step()
        return CountingFuture(self.raw.then(lambda f: callback(CountingFuture(f))))

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        _dev().host_step()
        self.raw.add_done_callback(lambda f: callback(CountingFuture(f)))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


def collect_all(futures: list[Any]) -> CountingFuture:
    """``torch.futures.collect_all`` of counting futures: one host step, as on the simulator; its future's value is
    the futures, counting (its ``wait()`` a step, and each of theirs)."""
    _dev().host_step()
    raw = _ORIGINAL["collect_all"]([f.raw if isinstance(f, CountingFuture) else f for f in futures])
    # (a future of no device, collect_all's: its then takes no stream and makes none wait)
    return CountingFuture(raw.then(lambda done: [CountingFuture(f) for f in done.value()]))


def wait_all(futures: list[Any]) -> list[Any]:
    """``torch.futures.wait_all``, as torch's: each future's ``wait()``, of the futures ``collect_all`` collected."""
    return [f.wait() for f in collect_all(futures).wait()]


def current_stream(device: Any = None) -> CountingStream:
    return CountingStream.view(_ORIGINAL["current_stream"](device))


def default_stream(device: Any = None) -> CountingStream:
    return CountingStream.view(_ORIGINAL["default_stream"](device))


def synchronize(device: Any = None) -> None:
    _dev().host_step()
    _ORIGINAL["synchronize"](device)


def empty_cache() -> None:
    _dev().host_step()
    _ORIGINAL["empty_cache"]()


_ORIGINAL: dict[str, Callable[..., Any]] = {}


def _launched_from(dev: Any, units: float) -> Any:
    """The stream a communication call is launched from: the current one, or, to stall NCCL alone by ``units``, a
    raw stream that waits for the current one and then sleeps (NCCL waits for the stream it is launched from; raw
    stream and event: the tool's own calls are no host steps of the program, and name no stream)."""
    launch = torch.cuda.current_stream()
    if units:
        launch = _RawStream()
        after = _RawEvent()
        _RawEvent.record(after, _ORIGINAL["current_stream"]())
        _RawEvent.wait(after, launch)
        with torch.cuda.stream(launch):
            torch.cuda._sleep(int(units * dev.cycles_per_ms))
    return launch


#: the ``torch.distributed`` calls counted as the simulator counts them (every call its process group runs):
#: collectives (an operation of ``nccl``; ``all_gather_single`` and ``reduce_scatter_single`` where torch has them,
#: 2.13 on), those that block the host, point-to-point calls
COLLECTIVES = ("all_gather_into_tensor", "all_gather", "all_reduce", "reduce_scatter_tensor", "reduce_scatter",
               "broadcast", "reduce", "all_to_all_single", "all_to_all", "gather", "scatter", "all_gather_single",
               "reduce_scatter_single")
HOST_COLLECTIVES = ("barrier", "all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list")
POINT_TO_POINT = ("send", "recv", "isend", "irecv", "batch_isend_irecv")


def _collective(original: Callable[..., Any]) -> Callable[..., Any]:
    """A collective call: one host step, one operation of ``nccl`` (stalled alone), a host step for a blocking
    call's wait; the real call made with the counting mode off (its internals are no program ops)."""

    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        from torch.utils._python_dispatch import _disable_current_modes

        dev = _dev()
        dev.host_step()
        units = dev.count_op(f"{dev.prefix}nccl")
        async_op = bool(kwargs.get("async_op", False))
        launch = _launched_from(dev, units)
        with torch.cuda.stream(launch), _disable_current_modes():
            kwargs["async_op"] = True
            work = original(*args, **kwargs)
        if async_op:
            return CountingWork(work) if work is not None else None
        dev.host_step()
        if work is not None:
            work.wait()
        return None

    return call


#: a ``batch_isend_irecv`` under way (its ops' own calls are not counted again)
_IN_BATCH: list[str] = []


def _point_to_point(original: Callable[..., Any], raw: dict[str, Callable[..., Any]]) -> Callable[..., Any]:
    """``isend``, ``irecv``, ``send``, ``recv`` as the simulator counts them: one host step, one operation of the pair's
    ``p2pPEER-nccl`` actor (stalled alone, as a collective's), and for ``send`` and ``recv`` a host step for the
    wait; ``batch_isend_irecv``: one host step, one operation of ``nccl`` per op (their stalls, summed, before the
    group)."""
    name = original.__name__
    blocking = name in ("send", "recv")

    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        from torch.utils._python_dispatch import _disable_current_modes

        if _IN_BATCH:  # torch's batch calls each op's ``isend`` or ``irecv``: counted with the batch already
            return raw[name](*args, **kwargs)
        dev = _dev()
        dev.host_step()
        if name == "batch_isend_irecv":
            units = sum(dev.count_op(f"{dev.prefix}nccl") for _ in args[0])
        else:
            peer = args[1] if len(args) > 1 else kwargs.get("dst" if "send" in name else "src",
                                                              kwargs.get("group_dst", kwargs.get("group_src")))
            units = dev.count_op(f"{dev.prefix}p2p{peer}-nccl")
        launch = _launched_from(dev, units)
        with torch.cuda.stream(launch), _disable_current_modes():
            if blocking:  # (the async call and its wait, as torch's own send and recv make them)
                work = raw["isend" if name == "send" else "irecv"](*args, **kwargs)
            else:
                _IN_BATCH.append(name)
                try:
                    work = original(*args, **kwargs)
                finally:
                    _IN_BATCH.pop()
        if name == "batch_isend_irecv":
            return [CountingWork(w) for w in work]
        if not blocking:
            return CountingWork(work) if work is not None else None
        dev.host_step()
        if work is not None:
            work.wait()
        return (args[1] if len(args) > 1 else kwargs.get("src")) if name == "recv" else None

    return call


def _host_collective(original: Callable[..., Any]) -> Callable[..., Any]:
    """An object collective or a barrier: one host step; its internals are no program ops."""

    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        from torch.utils._python_dispatch import _disable_current_modes

        dev = _dev()
        dev.host_step()
        if original.__name__ == "barrier":
            dev.count_op(f"{dev.prefix}nccl")
        with _disable_current_modes():
            work = original(*args, **kwargs)
        if work is not None and original.__name__ == "barrier":
            return CountingWork(work)  # ``barrier(async_op=True).wait()`` is a host step, as on the simulator
        return work

    return call


def _counted_step(original: Callable[..., Any]) -> Callable[..., Any]:
    """A memory saver's ``pause`` or ``resume``: one host step before the library's call, as the simulated library
    takes one (``simdevice.runtime.memsaver``)."""

    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        _dev().host_step()
        return original(*args, **kwargs)

    return call


def _memory_saver_class() -> Any:
    """``torch_memory_saver.TorchMemorySaver`` where the library is installed (imported now, so that an import by the
    program finds the class already counted), else None."""
    module = sys.modules.get("torch_memory_saver")
    if module is None:
        if importlib.util.find_spec("torch_memory_saver") is None:
            return None
        try:
            module = importlib.import_module("torch_memory_saver")
        except (ImportError, OSError):  # installed but not loadable here (its CUDA build): the program cannot use it
            return None
    return getattr(module, "TorchMemorySaver", None)


def _group_made(*args: Any, **kwargs: Any) -> None:
    """The program's ``init_process_group`` in a run whose group is made already: that group is the program's."""


def _group_kept(group: Any = None) -> None:
    """The program's ``destroy_process_group``: the run ends the group it made, after the program."""


@contextlib.contextmanager
def torchrun_environment(rank: int, world_size: int) -> Iterator[None]:
    """The variables torchrun sets in the environment of each process it starts, on one node, for the duration (as
    the simulator's ranks read them: ``simdevice.dropin.distributed.RankEnviron``); put back after."""
    values = torchrun_variables(rank, world_size)
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def counting_torch_cuda(dev: CudaDevice) -> Iterator[None]:
    """Count and stall plain torch.cuda code on ``dev``'s schedule for the duration."""
    import torch.distributed as dist

    saved: list[tuple[Any, str, Any]] = []

    def put(owner: Any, name: str, value: Any) -> None:
        saved.append((owner, name, vars(owner).get(name, _MISSING)))
        setattr(owner, name, value)

    for name in ("current_stream", "default_stream", "synchronize", "empty_cache"):
        _ORIGINAL[name] = getattr(torch.cuda, name)
    for name in ("current_stream", "synchronize", "empty_cache"):
        _ORIGINAL[f"accelerator_{name}"] = getattr(torch.accelerator, name)
    # each run starts with the default stream current, as a new process does (and as each run does on the
    # simulator), whatever stream the last run left current (``torch.cuda.set_stream``, a ``torch.cuda.stream(s)``
    # entered again inside its own block leaves ``s`` current after it); put back after
    before = torch.cuda.current_stream() if torch.cuda.is_available() else None
    if before is not None:
        torch.cuda.set_stream(torch.cuda.default_stream())
    _DEV.append(dev)
    try:
        put(torch.cuda, "Stream", CountingStream)
        put(torch.cuda, "Event", CountingEvent)
        # (where torch defines them: ``torch.cuda.streams.Stream()`` is named and counted as the simulator's is)
        put(torch.cuda.streams, "Stream", CountingStream)
        put(torch.cuda.streams, "Event", CountingEvent)
        put(torch.cuda, "current_stream", current_stream)
        put(torch.cuda, "default_stream", default_stream)
        put(torch.cuda, "synchronize", synchronize)
        put(torch.cuda, "empty_cache", empty_cache)
        _ORIGINAL["collect_all"] = torch.futures.collect_all
        put(torch.futures, "collect_all", collect_all)
        put(torch.futures, "wait_all", wait_all)
        # device-agnostic code's spellings of the same (``torch.Stream()``, ``torch.accelerator.synchronize()``)
        put(torch, "Stream", GenericStream)
        put(torch, "Event", GenericEvent)
        for module in (torch.accelerator, getattr(torch.accelerator, "memory", None)):
            for name, counted in (("current_stream", accelerator_current_stream),
                                  ("synchronize", accelerator_synchronize), ("empty_cache", accelerator_empty_cache)):
                if module is not None and hasattr(module, name):
                    put(module, name, counted)
        _ORIGINAL["process_start"] = multiprocessing.process.BaseProcess.start
        put(multiprocessing.process.BaseProcess, "start", _no_processes)
        # ``spawn`` calls ``start_processes`` by its module's name for it (a ``spawn`` imported by name too)
        for owner in (torch.multiprocessing, sys.modules["torch.multiprocessing.spawn"]):
            put(owner, "start_processes", _start_ranks)
        put(threading.Thread, "start", _no_program_threads(threading.Thread.start))
        put(torch.cuda.graphs.CUDAGraph, "capture_begin", _no_graphs)
        saver = _memory_saver_class()
        if saver is not None:
            # the library's singleton and any other instance: the class's methods (what the program calls,
            # ``torch_memory_saver.torch_memory_saver.pause(tag)``, is the class's)
            for name in ("pause", "resume"):
                put(saver, name, _counted_step(getattr(saver, name)))
        if dist.is_available():
            for name in STORES:
                put(dist, name, _no_stores)
            if dist.is_initialized():  # the run's own group (a world of one, or the ranks'): the program's is that
                # one, as the simulator's is the world it runs in (a script written for torchrun makes and ends it)
                for owner in (dist, dist.distributed_c10d):
                    put(owner, "init_process_group", _group_made)
                    put(owner, "destroy_process_group", _group_kept)
            for name in COLLECTIVES:
                if hasattr(dist, name):
                    put(dist, name, _collective(getattr(dist, name)))
            for name in HOST_COLLECTIVES:
                put(dist, name, _host_collective(getattr(dist, name)))
            # (``send`` and ``recv`` call the unwrapped ``isend`` and ``irecv``: one count each)
            raw = {name: getattr(dist, name) for name in ("isend", "irecv")}
            p2p = {name: _point_to_point(getattr(dist, name), raw) for name in POINT_TO_POINT}
            for name, wrapped in p2p.items():
                put(dist, name, wrapped)
                # (``P2POp`` takes only ``distributed_c10d``'s own ``isend`` and ``irecv`` for its op)
                put(dist.distributed_c10d, name, wrapped)
        yield
    finally:
        while saved:
            owner, name, old = saved.pop()
            if old is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, old)
        _DEV.pop()
        _NAMES.pop(id(dev), None)
        if before is not None:
            torch.cuda.set_stream(before)


_MISSING = object()


def _no_program_threads(start: Callable[[Any], None]) -> Callable[[Any], None]:
    """``Thread.start`` in a counted run: a thread the program starts is a host actor of its own on the simulator,
    whose steps are not counted on the GPU, so its schedule would not mean the same operations here. A thread the
    standard library or torch starts goes on as it would."""

    def checked(self: Any) -> None:
        f: Any = sys._getframe(1)
        while f is not None and f.f_code.co_filename.endswith(f"{os.sep}threading.py"):
            f = f.f_back  # (a subclass's start that calls its base's)
        path = os.path.realpath(f.f_code.co_filename) if f is not None else ""
        if f is not None and not in_standard_library(path) and not any(s in path for s in LIBRARIES):
            raise NotImplementedError("threads a program starts are not replayed on a GPU yet: their steps are not "
                                      "counted there (the simulator runs them)")
        start(self)

    return checked


def _no_graphs(*args: Any, **kwargs: Any) -> None:
    """A CUDA graph captured in a counted run: what its replays launch passes no dispatch to be counted on the GPU
    (the simulator counts each replayed operation), so its schedule would not mean the same operations here."""
    raise NotImplementedError("CUDA graphs are not replayed on a GPU yet: a replay's operations are not counted there "
                              "(the simulator counts them)")


#: the stores of ``torch.distributed`` a program may make (the simulator's are host actors' steps)
STORES = ("TCPStore", "FileStore", "HashStore")


def _no_stores(*args: Any, **kwargs: Any) -> None:
    """A store the program makes in a counted run: each of its calls is a host step on the simulator, not counted
    on the GPU, so its schedule would not mean the same operations here."""
    raise NotImplementedError("stores a program makes (TCPStore, FileStore, HashStore) are not replayed on a GPU yet: "
                              "their steps are not counted there (the simulator counts them)")


#: set while ``_start_ranks`` starts the ranks' processes (``CudaDevice.spawn_ranks``'s, which count their own steps)
_STARTING_RANKS: list[bool] = []


def _start_ranks(fn: Callable[..., Any], args: tuple[Any, ...] = (), nprocs: int = 1, join: bool = True,
                 daemon: bool = False, start_method: str = "spawn") -> None:
    """``torch.multiprocessing.start_processes`` (and ``spawn``) in a counted run: ``fn(i, *args)`` on rank ``i`` of
    ``nprocs`` ranks, a process and a GPU each, one NCCL group (``CudaDevice.spawn_ranks``, counted and stalled on
    the schedule as the simulator's ranks are; the program's ``init_process_group`` is that group's), waited for."""
    if not join:
        raise NotImplementedError("torch.multiprocessing.spawn and start_processes with join=False are not replayed "
                                  "on a GPU (the simulator does not run them either): join=True")
    if nprocs < 1:
        return None
    _STARTING_RANKS.append(True)
    try:
        _DEV[-1].spawn_spawned(fn, tuple(args), nprocs)
    finally:
        _STARTING_RANKS.pop()
    return None


def _no_processes(self: Any) -> None:
    """``Process.start`` in a counted run: a child's steps are not counted on the GPU (the simulator runs it as an
    actor of the run), so its schedule would not mean the same operations here."""
    if _STARTING_RANKS:
        return _ORIGINAL["process_start"](self)  # type: ignore[no-any-return]
    raise NotImplementedError("processes a program starts are not replayed on a GPU yet: their steps are not "
                              "counted there (the simulator runs them)")
