"""``multiprocessing`` in a torch.cuda session: the processes a program starts are host actors of the run.

A process the program starts inside a run (``multiprocessing.Process``, ``torch.multiprocessing.Process``, a
context's ``Process`` from ``get_context("spawn")``, or a subclass of any of them with its own ``run``) becomes a
host actor with its own streams, as ``SimDevice.Process`` makes one; ``join``, ``is_alive`` and ``exitcode`` answer
for it (0 when its target returns, ``n`` for ``sys.exit(n)`` or ``os._exit(n)``; what else it raises is a host
error of the run). Queues (``Queue``, ``SimpleQueue``), ``Pipe``, ``Event``, ``Value``, ``Lock`` and ``Barrier``
made in the run are the simulator's: each put, send, get, recv, set, wait and read is a host step that orders the
receiver after the sender (a barrier's parties after each other's arrivals), and a blocking one that can never
return is a deadlock, not a hang. The other primitives (``Pool``, ``Manager``, ``Condition``, ...) raise
``NotImplementedError`` in a run, so the program gets no verdict rather than a wrong one.

A device tensor sent to another process (in a process's arguments, or through a queue) is CUDA IPC, as torch does
it (``torch.multiprocessing.reductions``): the sender records an interprocess event on its stream as it pickles the
tensor (its current stream for a process's arguments and a ``SimpleQueue``; for a ``Queue``, whose feeder thread
pickles, the device's default stream), and the receiver's current stream waits for that event when it maps the
memory, the first time only: while the receiver still holds a tensor of that storage, a tensor of it received
again maps nothing and waits for nothing (``storage_from_cache``). The receiver gets a tensor of its own over the
same memory; sending on a tensor received from another process raises, as torch does.

What is sent (a process's arguments, an item put on a queue) is pickled as it is sent, so the receiver gets a copy
as a real child does: made anew at each receipt, with nothing the sender changes later. Tensors cross by reference
(torch shares their memory: CUDA IPC, or shared memory for a host tensor), as do the run's queues, events, values,
locks and streams. An object that does not pickle here (a local function or class in it) is shared instead, but for
the lists, tuples, dicts and sets on the way to a device tensor, which are copied.
"""

from __future__ import annotations

import _thread
import multiprocessing
import multiprocessing.context
import multiprocessing.process
import os
import sys
import threading
import types
import weakref
from collections.abc import Callable
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch

from reference.schedule import is_actor_name
from simdevice.api import SharedValueHandle
from simdevice.dispatch import SimTensor, data_of, storage_of
from simdevice.dropin.patches import Patches
from simdevice.dropin.pickling import pickled, unpickled
from simdevice.runtime.config import MAX_WORLD_SIZE, UNIT_NS
from simdevice.runtime.reports import user_source
from simdevice.runtime.runtime import EMPTY, Mailbox, SharedCell

#: the primitives a run refuses (those it simulates: ``_MADE``)
_REFUSED = ("Pool", "Manager", "JoinableQueue", "Condition", "Array", "RawArray", "RawValue")
#: what pickling does not look into for tensors (by reference: classes, modules, functions)
_OPAQUE = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType)
#: virtual time a timed wait (``join(timeout)``, ``get(timeout=)``, ``wait(timeout)``) sleeps between its polls, in
#: units (1 unit = 1 ms)
_POLL_UNITS = 1.0


#: Python's own semaphores, as imported (a primitive made in a run is one of these outside any run)
_SEMAPHORE, _BOUNDED_SEMAPHORE = threading.Semaphore, threading.BoundedSemaphore


def _session() -> Any:
    from simdevice.dropin import facade  # (facade imports this module's installer)

    return facade.session_device()


def _in_run() -> bool:
    from simdevice.dropin import facade

    return facade.in_actor()


def real_outside(primitive: Any, make: Callable[[], Any]) -> Any:
    """Where no run is going on, ``primitive``'s real one (its ``_real``, made by ``make()`` at the first such use: a
    lock or a semaphore a module made at its import in a run, used after the session by the program, a library or a
    GPU run in the same process); else None."""
    if _in_run():
        return None
    if primitive._real is None:
        primitive._real = make()
    return primitive._real


# -- CUDA IPC -------------------------------------------------------------------------------------------------------


def _reached(obj: Any, found: list[Any], seen: set[int], kind: type | tuple[type, ...] = SimTensor) -> None:
    """The objects of ``kind`` in ``obj`` (device tensors, by default), as pickling would reach them (containers and
    objects' attributes)."""
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, kind):
        found.append(obj)
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for x in obj:
            _reached(x, found, seen, kind)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _reached(k, found, seen, kind)
            _reached(v, found, seen, kind)
    elif hasattr(obj, "__dict__") and not isinstance(obj, (_OPAQUE, torch.Tensor)):
        for v in vars(obj).values():
            _reached(v, found, seen, kind)


class _Sent:
    """What a process sent: its object pickled as a real send pickles it (``payload``), with the objects that cross
    by reference taken out (``refs``: tensors, which torch shares through CUDA IPC or shared memory, and the run's
    primitives and streams); ``payload`` None where the object would not pickle here (a local function or class in
    it: a spawned child could not take it, a forked one would share its copy of the memory), and ``obj`` goes as it
    is. ``events``: the IPC event each device storage in it was sent with (by storage)."""

    __slots__ = ("events", "obj", "payload", "refs")

    def __init__(self, obj: Any, payload: bytes | None, refs: list[Any], events: dict[int, Any]) -> None:
        self.obj = obj if payload is None else None  # (the copy is the payload's: nothing later done to obj shows)
        self.payload = payload
        self.refs = refs
        self.events = events

    def __reduce__(self) -> tuple[Any, tuple[int]]:
        """Pickled by the program itself (``ForkingPickler`` bytes of ``reduce_tensor``'s pair, which it sends as it
        likes): by its place among the run's sent objects, which hold it until the run ends, as torch's CUDA IPC
        keeps a sent storage until its receivers release it (here, until the run ends: it is never reused)."""
        made = _session().reduced
        made.append(self)
        return (_sent_at, (len(made) - 1,))


def _sent_at(i: int) -> _Sent:
    """The run's ``i``-th sent object pickled by the program (:meth:`_Sent.__reduce__`)."""
    return _session().reduced[i]  # type: ignore[no-any-return]


def _by_reference(x: Any) -> bool:
    """Whether ``x`` crosses to another process as itself: a tensor (torch shares its memory), a primitive or handle
    of the run (a queue, an event, a value, a lock, a stream, an event of a stream)."""
    from simdevice.dropin import facade

    if isinstance(x, facade.Event):
        # torch pickles an event by its IPC handle (``reduce_event``), which the receiver opens as the same CUDA event
        # (``rebuild_event``): an interprocess event crosses as itself (:class:`facade.Event` shares its CUDA event
        # with every event opened from its handle); a plain one has no handle, recorded or not (``ipc_handle()``
        # raises CUDA's error, as it does on a GPU)
        x.ipc_handle()
        return True
    return isinstance(x, (torch.Tensor, torch.UntypedStorage, SimQueue, SimConnection, SimEvent, SimLock, SimSemaphore,
                          SimBarrier, SharedValueHandle, facade.Stream, _Sent))


def _sent(dev: Any, obj: Any, stream: Any) -> _Sent:
    """Pickle ``obj`` for another process, now (what the sender changes later does not reach the receiver): for
    each device tensor in it, the IPC event recorded on ``stream`` (by storage). A tensor received from another
    process cannot be sent on (torch raises the same)."""
    _no_real_primitives((obj,))
    payload, refs = pickled(obj, _by_reference)
    found: list[SimTensor] = []
    if payload is None:
        _reached(obj, found, set())
    else:
        found = [x for x in refs if isinstance(x, SimTensor)]
    _shared(refs)
    # a pipe's end crosses as a handle of its own (a duplicated descriptor): the sender may close its copy
    refs = [x.duplicate() if isinstance(x, SimConnection) else x for x in refs]
    sender = dev.runtime.current().process
    events: dict[int, Any] = {}
    for t in found:
        st = storage_of(t)
        if st.kind != "device":
            continue
        if st.process != sender:
            raise RuntimeError("Attempted to send CUDA tensor received from another process; this is not currently "
                               "supported. Consider cloning before sending.")
        if id(st) not in events:
            events[id(st)] = dev.runtime.ipc_sent(stream)
    return _Sent(obj, payload, refs, events)


def _shared(refs: list[Any]) -> None:
    """The host tensors and storages among what crosses by reference (``refs``), moved into shared memory as torch
    sends them (``reduce_storage``: ``_share_fd_cpu_``, or ``_share_filename_cpu_``, copies a storage not shared yet
    into a new shared-memory block and points the storage at it, in the sender's process): a pinned one is no
    longer pinned, for the sender and the receiver (``is_pinned()`` False; a non-blocking copy into or from it is a
    pageable one), and torch's copy into shared memory is the sender's host reading all of it (an aten ``copy_``,
    which the run sees), checked against a copy into it still in flight. (What does not pickle is not sent so: a
    spawned child could not take it.)"""
    for x in refs:
        if not isinstance(x, (torch.Tensor, torch.UntypedStorage)) or isinstance(x, SimTensor):
            continue
        if x.device.type != "cpu":
            continue
        storage = x if isinstance(x, torch.UntypedStorage) else x.untyped_storage()
        if not storage.is_shared():
            storage.share_memory_()


class _Mapping:
    """A device storage mapped into a receiving process: while a tensor of it lives there, it stays mapped. It
    holds the storage's bytes (``data``), so the sender's block is freed after the mapping ends, never before."""

    __slots__ = ("__weakref__", "data")

    def __init__(self, data: torch.Tensor) -> None:
        self.data = data


class _Segment:
    """The sender's segment of a received storage, mapped into a receiving process: torch maps it once by its IPC
    handle (``getIpcDevPtr``), however many of its storages the process holds, and unmaps it with the last."""

    __slots__ = ("live",)

    def __init__(self) -> None:
        self.live = 0  # its storages mapped in the receiver


def _unmapped(dev: Any, st: Any, key: tuple[str, int] | None) -> Callable[[Any], None]:
    """What ends a mapping of ``st`` (a weak reference's callback): the receiver's stream as it lets go, which the
    sender's block waits for before its reuse, or all its streams where the segment ``key`` names is unmapped with
    it (``Runtime.ipc_unmapped``)."""
    segments: dict[tuple[str, int], _Segment] = dev.ipc_segments

    def done(_ref: Any) -> None:
        closes = False
        if key is not None and key in segments:  # (a weak reference's callback must not raise)
            segment = segments[key]
            segment.live -= 1
            closes = segment.live == 0
            if closes:
                del segments[key]
        dev.runtime.ipc_unmapped(st, closes)

    return done


def _received(dev: Any, sent: _Sent) -> Any:
    """What was sent, as the receiving process unpickles it: objects of its own, made anew at each receipt; where
    the receiver holds no tensor of a device tensor's storage yet, its current stream waits for the sender's event;
    each device tensor is a tensor of its own over the same memory, which holds the mapping."""
    events = sent.events
    receiver = dev.runtime.current().process
    maps: dict[tuple[str, int], weakref.ref[Any]] = dev.ipc_maps
    found: list[SimTensor] = []
    if sent.payload is None:
        _reached(sent.obj, found, set())
    else:
        found = [x for x in sent.refs if isinstance(x, SimTensor)]
    #: each storage's mapping in the receiver: held by every tensor of it there, views too (``SimTensor._ipc``)
    tokens: dict[int, _Mapping] = {}
    for t in found:
        st = storage_of(t)
        rec = events.get(id(st))
        if rec is None or id(st) in tokens:
            continue
        key = (receiver, id(st))
        held = maps.get(key)
        token = held() if held is not None else None
        if token is None:  # not mapped here, or no tensor of it left: mapped now, and waited for
            dev.runtime.ipc_mapped(rec)
            token = _Mapping(data_of(t))
            segment = dev.runtime.ipc_segment(st)
            at = None if segment is None else (receiver, id(segment))
            if at is not None:  # (while a storage of it is mapped here, its block keeps the segment: no id reused)
                dev.ipc_segments.setdefault(at, _Segment()).live += 1
            maps[key] = weakref.ref(token, _unmapped(dev, st, at))
        tokens[id(st)] = token
    done: dict[int, Any] = {}

    def tensor(x: SimTensor) -> Any:
        st = storage_of(x)
        if id(st) not in events:
            return x
        if id(x) not in done:
            with torch.no_grad():
                out = x.detach()
            out.requires_grad_(x.requires_grad)
            out._ipc = tokens[id(st)]
            done[id(x)] = out
        return done[id(x)]

    if sent.payload is not None:
        refs = sent.refs
        try:
            return unpickled(sent.payload, lambda i: tensor(refs[i]) if isinstance(refs[i], SimTensor) else refs[i])
        finally:
            done.clear()
    if not events:
        return sent.obj

    def rebuild(x: Any) -> Any:
        if id(x) in done:
            return done[id(x)]
        if isinstance(x, SimTensor):
            return tensor(x)
        out: Any
        if isinstance(x, (list, tuple, set, frozenset)):
            items = [rebuild(i) for i in x]
            out = type(x)(*items) if isinstance(x, tuple) and hasattr(x, "_fields") else type(x)(items)
        elif isinstance(x, dict):
            out = type(x)((rebuild(k), rebuild(v)) for k, v in x.items())
        else:
            out = x  # another object: shared, its tensors the sender's (it did not pickle)
        done[id(x)] = out
        return out

    try:
        return rebuild(sent.obj)
    finally:
        done.clear()  # (``rebuild`` refers to itself: the cycle must not keep the received tensors alive)


def _rebuild_reduced(sent: _Sent) -> Any:
    """``func(*args)`` of what ``reduce_tensor`` gave, called in the receiving process (torch's
    ``rebuild_cuda_tensor``): the tensor, received there as one sent through a queue is (mapped, its current stream
    waiting for the event ``reduce_tensor`` recorded, where the process holds no tensor of its storage yet)."""
    return _received(_session(), sent)


def _reduce_tensor(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``torch.multiprocessing.reductions.reduce_tensor`` in a run: of a simulated tensor, a rebuild function and
    its arguments, as torch's (vLLM and SGLang send them to another process to share weights without a queue's
    pickling); the IPC event recorded now, on the current stream, as torch's ``_share_cuda_`` records it. The
    arguments hold what was sent (``_Sent``), which crosses to another process by reference."""

    def reduce_tensor(tensor: Any) -> Any:
        if not (_in_run() and isinstance(tensor, SimTensor)):
            return original(tensor)
        dev = _session()
        return (_rebuild_reduced, (_sent(dev, tensor, dev.runtime.current().current_stream),))

    return reduce_tensor


# -- processes ------------------------------------------------------------------------------------------------------


def _used_cuda(rt: Any, actor: Any) -> bool:
    """Whether a process's actor used the device: an operation on one of its streams, a stream of its own besides
    its default one, or device memory its allocator handed out."""
    return (len(actor.streams) > 1 or any(s.enqueued for s in actor.streams)
            or rt.memory_stats(actor.process)["peak"] > 0)


def _exit_code(code: Any) -> int:
    """``sys.exit(code)``'s exit status, as the operating system reports it to the parent: an integer's low byte
    (``sys.exit(-1)`` is 255, ``sys.exit(256)`` 0, ``sys.exit(True)`` 1), 0 for None, 1 for anything else."""
    if code is None:
        return 0
    return int(code) & 0xFF if isinstance(code, int) else 1


class ProcessExit(SystemExit):
    """``os._exit(n)`` in a run: that process ends at once (its ``finally`` blocks run here; in the main process
    the run ends with a host error, as ``sys.exit`` there does)."""

    def __str__(self) -> str:
        return f"os._exit({self.code})"


def _start_method(proc: Any) -> str:
    """How ``proc`` would start: its context's method (``fork`` for a plain ``Process`` where that is the
    default)."""
    method = getattr(proc, "_start_method", None) or multiprocessing.get_start_method(allow_none=True)
    return str(method or multiprocessing.get_all_start_methods()[0])  # (the first is the platform's default)


def _os_exit(original: Callable[[int], Any]) -> Callable[[int], Any]:
    def _exit(n: int) -> Any:
        if _in_run():
            raise ProcessExit(n)
        return original(n)

    return _exit


class _Child:
    """What a simulated process's ``Process`` object holds: its actor and its exit status."""

    def __init__(self) -> None:
        self.actor: Any = None
        self.exitcode: int | None = None
        #: the name of the actor that started it
        self.parent = ""


def _name(dev: Any, proc: Any) -> str:
    """The actor's name, which a schedule line names it by, the same whatever the order its processes start in:
    the name the program gave the process where the schedule grammar takes it (``saver``; ``saver-2`` for a second
    one of that name, as ``multiprocessing`` allows), else multiprocessing's default form counted in this run
    (``SpawnProcess-1``, ...: the default name's own number counts the processes of the whole interpreter, so it
    would differ from run to run); prefixed, as its streams are, by the actor that started it where that is not the
    host (``rank1.saver``: each rank may start its own ``saver``)."""
    rt = dev.runtime
    taken = set(rt.execution.actors) | set(rt.streams())
    parent = rt.current().process
    prefix = "" if parent == "host" else f"{parent}."
    kind = type(proc).__name__
    name = str(proc.name)
    if name == f"{kind}-" + ":".join(str(i) for i in proc._identity) or not is_actor_name(name):
        base, k = (kind if is_actor_name(kind) else "Process"), 1  # SpawnProcess-1, -2, ...
    else:
        base, k = name, 0  # saver, saver-2, ...
    while True:
        full = f"{prefix}{base}" + (f"-{k}" if k else "")
        if full not in taken:
            return full
        k = 2 if k == 0 else k + 1


def _patch_process(p: Patches) -> None:
    base = multiprocessing.process.BaseProcess
    start, join, is_alive = base.start, base.join, base.is_alive
    exitcode: property = vars(base)["exitcode"]
    pid: property = vars(base)["pid"]

    def sim_start(self: Any) -> None:
        if not _in_run():
            return start(self)
        if getattr(self, "_simdevice", None) is not None:
            raise AssertionError("cannot start a process twice")
        dev = _session()
        rt = dev.runtime
        child = self._simdevice = _Child()
        sent = _sent(dev, (self._args, self._kwargs), rt.current().current_stream)

        def body() -> None:
            self._args, self._kwargs = _received(dev, sent)
            try:
                self.run()
                child.exitcode = 0
            except SystemExit as e:
                child.exitcode = _exit_code(e.code)
            finally:
                if forked_after_cuda and _used_cuda(rt, child.actor):
                    rt.note(forked_after_cuda)
            # the child's own copy of this object dies as its interpreter ends (with its received tensors: torch's
            # deleter runs for each, and the pipe ends it was given close), where here the parent's object would
            # keep them: let go of them as it ends
            for end in _connections((self._args, self._kwargs)):
                end.close()
            self._args, self._kwargs = (), {}

        parent = child.parent = rt.current().process
        name = _name(dev, self)
        method = _start_method(self)
        if getattr(self, "_start_method", None) is None:  # (the default context's: its start fixes its method)
            _fix_start_method(dev)
        # a child starts with its parent's method set (spawn's preparation sets it, forced; a fork inherits it)
        dev.start_methods[name] = multiprocessing.get_context(method)
        # (noted once the child used CUDA itself: a forked worker that never does, a DataLoader's, runs on a GPU)
        forked_after_cuda = (
            f"a process started with the fork method after CUDA was in use ({name}, {user_source()}) used CUDA: on "
            "a GPU its first CUDA call fails (\"Cannot re-initialize CUDA in forked subprocess\", or a CUDA "
            "\"initialization error\" for a kernel on a tensor it inherited); start it with get_context(\"spawn\") "
            "(the simulator runs it as spawned)") if rt.memory.issues and method == "fork" else ""
        started = getattr(os.environ, "started", None)  # (the session's ``distributed.RankEnviron``)
        if started is not None:  # its environment: a copy of its parent's as it starts
            started(name)
        child.actor = rt.spawn(name, body)
        dev.sim_processes[child.actor.name] = self
        dev.sim_children.setdefault(parent, []).append(self)
        rt.gpu_replay = False  # (reference.cuda_plain refuses it: the replay line offers no --gpu)
        child.actor.daemon = bool(self.daemon)
        return None

    def sim_join(self: Any, timeout: float | None = None) -> None:
        child = getattr(self, "_simdevice", None)
        if child is None:
            return join(self, timeout)
        rt = _session().runtime
        if timeout is None or timed(lambda: child.actor.state == "done", timeout):
            rt.join(child.actor)  # (once it is done, at once: the join orders what follows after the child)
        return None

    def done(child: _Child, step: str) -> bool:
        """Whether the child is done; asked in a run, a polling host step (a loop that polls it lets it run)."""
        if _in_run():
            return bool(_session().runtime.process_poll(child.actor, step))
        return bool(child.actor.state == "done")

    def sim_is_alive(self: Any) -> bool:
        child = getattr(self, "_simdevice", None)
        if child is None:
            return is_alive(self)
        return not done(child, "Process.is_alive")

    def sim_exitcode(self: Any) -> int | None:
        child = getattr(self, "_simdevice", None)
        if child is None:
            return exitcode.__get__(self)  # type: ignore[no-any-return]
        return child.exitcode if done(child, "Process.exitcode") else None

    def sim_pid(self: Any) -> int | None:
        child = getattr(self, "_simdevice", None)
        if child is None:
            return pid.__get__(self)  # type: ignore[no-any-return]
        return child.actor.order  # type: ignore[no-any-return]  # (a number of its own, as a pid is)

    def refused(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            if getattr(self, "_simdevice", None) is None:
                return original(self, *args, **kwargs)
            raise NotImplementedError(f"Process.{name}() of a simulated process is not simulated")

        call.__name__ = name
        return call

    p.set(base, "start", sim_start)
    p.set(base, "join", sim_join)
    p.set(base, "is_alive", sim_is_alive)
    p.set(base, "exitcode", property(sim_exitcode))
    p.set(base, "pid", property(sim_pid))
    p.set(base, "ident", property(sim_pid))
    for name in ("terminate", "kill", "close"):
        p.set(base, name, refused(name, getattr(base, name)))


def _run_context(dev: Any) -> Any:
    """The context the running actor's process has set as its default (None where it set none yet): the real
    default context's as the run found it for the main process and the ranks (each a process of its own), its
    parent's for a child."""
    process = dev.runtime.current().process
    if process not in dev.start_methods:
        dev.start_methods[process] = vars(multiprocessing.context._default_context)["_actual_context"]
    return dev.start_methods[process]


def _fix_start_method(dev: Any) -> Any:
    """The running process's default context, fixed now where it was not set (as ``DefaultContext.get_context``
    fixes it: ``set_start_method`` without ``force`` raises from then on)."""
    ctx = _run_context(dev)
    if ctx is None:
        ctx = vars(multiprocessing.context._default_context)["_default_context"]  # (the platform's default)
        dev.start_methods[dev.runtime.current().process] = ctx
    return ctx


def _patch_start_method(p: Patches) -> None:
    """``set_start_method``, ``get_start_method`` and ``get_context()`` of the default context (``multiprocessing``'s
    and ``torch.multiprocessing``'s) answer in a run for the running process's own setting, which starts as a new
    process's does and never reaches the real one: a program that calls ``set_start_method("spawn")`` once, as a
    script's main does, runs again in the next run of a search as in a new process (before, the second run raised
    "context has already been set")."""
    default = multiprocessing.context.DefaultContext
    get_context, set_start_method, get_start_method = (default.get_context, default.set_start_method,
                                                       default.get_start_method)

    def sim_get_context(self: Any, method: str | None = None) -> Any:
        if not _in_run() or method is not None:
            return get_context(self, method)
        return _fix_start_method(_session())

    def sim_set_start_method(self: Any, method: str | None, force: bool = False) -> None:
        if not _in_run():
            return set_start_method(self, method, force)
        dev = _session()
        if _run_context(dev) is not None and not force:
            raise RuntimeError("context has already been set")
        dev.start_methods[dev.runtime.current().process] = (
            None if method is None and force else get_context(self, method))
        return None

    def sim_get_start_method(self: Any, allow_none: bool = False) -> str | None:
        if not _in_run():
            return get_start_method(self, allow_none)  # type: ignore[no-any-return]
        dev = _session()
        ctx = _run_context(dev)
        if ctx is None:
            if allow_none:
                return None
            ctx = _fix_start_method(dev)
        return str(ctx._name)

    bound = multiprocessing.context._default_context
    for name, value in (("get_context", sim_get_context), ("set_start_method", sim_set_start_method),
                        ("get_start_method", sim_get_start_method)):
        p.set(default, name, value)
        for m in _modules():
            if name in vars(m):
                p.set(m, name, types.MethodType(value, bound))


def _own_process() -> Any:
    """The simulated process the running actor is, or None (the main process, a rank)."""
    if not _in_run():
        return None
    dev = _session()
    return dev.sim_processes.get(dev.runtime.current().process)


def _patch_identity(p: Patches) -> None:
    """``current_process()``, ``parent_process()``, ``active_children()`` and ``os.getpid()`` answer for the
    simulated process that asks (a child's ``current_process().name`` is its own, not "MainProcess")."""
    process = multiprocessing.process
    current, parent, children, getpid = (process.current_process, process.parent_process, process.active_children,
                                         os.getpid)

    def sim_current_process() -> Any:
        own = _own_process()
        return own if own is not None else current()

    def sim_parent_process() -> Any:
        own = _own_process()
        if own is None:
            return parent()
        dev = _session()
        above = own._simdevice.parent
        return dev.sim_processes.get(above) or current()  # (a child of the main process: the main process's)

    def sim_active_children() -> list[Any]:
        if not _in_run():
            return children()  # type: ignore[no-any-return]
        dev = _session()
        a = dev.runtime.host_step("active_children", poll=True)
        return [q for q in dev.sim_children.get(a.process, []) if q._simdevice.actor.state != "done"]

    def sim_getpid() -> int:
        own = _own_process()
        return getpid() if own is None else int(own.pid)

    for name, value in (("current_process", sim_current_process), ("parent_process", sim_parent_process),
                        ("active_children", sim_active_children)):
        p.set(process, name, value)
        _set_everywhere(p, name, lambda original, method, value=value: staticmethod(value) if method else value)
    p.set(os, "getpid", sim_getpid)


def _set_everywhere(p: Patches, name: str, make: Callable[[Any, bool], Any]) -> None:
    """``name`` on every context and in the modules that bind the default context's: ``make(original, method)``,
    ``method`` True for the contexts' method."""
    ctx = multiprocessing.context.BaseContext
    p.set(ctx, name, make(getattr(ctx, name), True))
    for m in _modules():
        if name in vars(m):
            p.set(m, name, make(vars(m)[name], False))


def _real_primitives() -> tuple[type, ...]:
    import multiprocessing.connection
    import multiprocessing.queues
    import multiprocessing.sharedctypes
    import multiprocessing.synchronize

    return (multiprocessing.queues.Queue, multiprocessing.queues.SimpleQueue, multiprocessing.synchronize.SemLock,
            multiprocessing.synchronize.Event, multiprocessing.synchronize.Condition,
            multiprocessing.synchronize.Barrier, multiprocessing.connection.Connection,
            multiprocessing.sharedctypes.SynchronizedBase)


def _no_real_primitives(args: tuple[Any, ...]) -> None:
    """A simulated process cannot use a real queue, lock or pipe (one made before the run, or by a library that
    makes its own): a blocking call on it would block the whole run, and it orders nothing the simulator sees."""
    found: list[Any] = []
    _reached(args, found, set(), _real_primitives())  # (in a container or an object's attributes too)
    if found:
        y = found[0]
        raise NotImplementedError(
            f"a real {type(y).__module__}.{type(y).__name__} given to a simulated process: the run's "
            "processes share the Queue, SimpleQueue, Event, Value and Lock made in the run")


def timed(done: Callable[[], bool], timeout: float) -> bool:
    """A wait of at most ``timeout`` seconds of virtual time: polls of ``done()`` with sleeps between them until it
    holds or the time is up; whether it holds. (A wait without a timeout blocks instead.)"""
    rt = _session().runtime
    left = max(float(timeout), 0.0) * 1000.0  # units
    while True:
        if done():
            return True
        if left <= 0:
            return False
        # where nothing else can change anything, the rest of the time passes at once (polled every unit, a wait
        # past the stall horizon would look like a deadlock: a poll that nothing answers)
        step = min(_POLL_UNITS, left)
        if rt.execution.alone(rt.current()):
            step = left
            rt.execution.idle_wait(rt.now + int(step * UNIT_NS))
        rt.sleep(step)
        left -= step


# -- queues, events, values, locks ----------------------------------------------------------------------------------


class SimQueue:
    """``multiprocessing.Queue`` in a run (``SimpleQueue`` with ``simple``: pickled in the putting thread)."""

    def __init__(self, maxsize: int = 0, *, simple: bool = False, shared: bool = False) -> None:
        self._dev = _session()
        self._box = Mailbox(maxsize)
        self._simple = simple
        #: a queue between the threads of one process (``queue.Queue``): its items go as they are, not pickled
        self._shared = shared

    def put(self, obj: Any, block: bool = True, timeout: float | None = None) -> None:
        import queue

        dev = self._dev
        if not block:
            timeout = 0.0
        if timeout is not None and self._box.maxsize > 0 and not timed(lambda: not self.full(), timeout):
            raise queue.Full
        a = dev.runtime.current()
        if self._shared:
            dev.runtime.queue_put(self._box, obj)
            return
        # a Queue's feeder thread pickles the item, on the device's default stream (a new thread's current one)
        dev.runtime.queue_put(self._box, _sent(dev, obj, a.current_stream if self._simple else a.default_stream))

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        import queue

        rt = self._dev.runtime
        if not block:
            timeout = 0.0
        if timeout is None:
            got = rt.queue_get(self._box)
        else:
            taken: list[Any] = []

            def took() -> bool:  # (a poll, then the get of what it saw: none where another getter came between)
                if rt.queue_empty(self._box):
                    return False
                item = rt.queue_get(self._box, block=False)
                if item is EMPTY:
                    return False
                taken.append(item)
                return True

            if not timed(took, timeout):
                raise queue.Empty
            got = taken[0]
        return got if self._shared else _received(self._dev, got)

    def put_nowait(self, obj: Any) -> None:
        self.put(obj, False)

    def get_nowait(self) -> Any:
        return self.get(False)

    def empty(self) -> bool:
        return self._dev.runtime.queue_empty(self._box)  # type: ignore[no-any-return]

    def qsize(self) -> int:
        self._dev.runtime.queue_empty(self._box)
        return len(self._box.items)

    def full(self) -> bool:
        self._dev.runtime.host_step("Queue.full", poll=True)
        return self._box.full()

    def close(self) -> None:
        pass

    def join_thread(self) -> None:
        pass

    def cancel_join_thread(self) -> None:
        pass


#: what a closed end of a pipe leaves for the other to receive (its ``recv`` raises ``EOFError``)
_EOF = object()


class _Bytes:
    """What ``send_bytes`` sent: the bytes, which ``recv_bytes`` gives back (``recv`` unpickles them, as a real
    connection's does)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


class _End:
    """One end of a pipe, over all its handles (the processes it was sent to have one each): how many are open."""

    __slots__ = ("open",)

    def __init__(self) -> None:
        self.open = 1


class SimConnection:
    """A handle of one end of ``multiprocessing.Pipe()`` in a run: ``send`` pickles in the sending thread, as a
    ``SimpleQueue``'s put does (a device tensor crosses by CUDA IPC, its event recorded on the sender's current
    stream); ``recv`` waits for the next item, in order, and orders the receiver after its sender. Sent to another
    process, an end crosses as a handle of its own (a duplicated descriptor, which the child's end closes). Once every
    handle of an end is closed, the other end meets an end of file: its ``recv`` raises ``EOFError`` once what was
    sent before is received, and its ``poll`` answers True then. ``Pipe(duplex=False)`` gives a receiving end and a
    sending end."""

    def __init__(self, inbox: Mailbox | None, outbox: Mailbox | None, end: _End | None = None) -> None:
        self._dev = _session()
        self._in, self._out = inbox, outbox
        self._end = end if end is not None else _End()
        self.closed = False

    def duplicate(self) -> SimConnection:
        """Another handle of this end (what a process it is sent to gets)."""
        if self.closed:
            raise OSError("handle is closed")
        self._end.open += 1
        return SimConnection(self._in, self._out, self._end)

    @property
    def readable(self) -> bool:
        return self._in is not None

    @property
    def writable(self) -> bool:
        return self._out is not None

    def _check(self, reading: bool) -> Mailbox:
        if self.closed:
            raise OSError("handle is closed")
        box = self._in if reading else self._out
        if box is None:
            raise OSError("connection is write-only" if reading else "connection is read-only")
        return box

    def send(self, obj: Any) -> None:
        box = self._check(False)
        dev = self._dev
        dev.runtime.queue_put(box, _sent(dev, obj, dev.runtime.current().current_stream))

    def send_bytes(self, buf: Any, offset: int = 0, size: int | None = None) -> None:
        box = self._check(False)
        view = memoryview(buf).cast("B")
        end = len(view) if size is None else offset + size
        if offset < 0 or end > len(view) or end < offset:
            raise ValueError("buffer length < offset + size" if end > len(view) else "offset or size is negative")
        self._dev.runtime.queue_put(box, _Bytes(bytes(view[offset:end])))

    def _next(self) -> Any:
        box = self._check(True)
        rt = self._dev.runtime
        got = rt.queue_get(box)
        if got is _EOF:
            box.items.appendleft((_EOF, rt.current().clock.copy()))  # (every later recv meets it too)
            raise EOFError
        return got

    def recv(self) -> Any:
        got = self._next()
        if isinstance(got, _Bytes):  # (bytes sent as they are: unpickled, as a real connection's recv does)
            import pickle

            return pickle.loads(got.data)
        return _received(self._dev, got)

    def recv_bytes(self, maxlength: int | None = None) -> bytes:
        got = self._next()
        data = got.data if isinstance(got, _Bytes) else ForkingPickler.dumps(_received(self._dev, got))
        if maxlength is not None and len(data) > maxlength:
            raise OSError("bad message length")
        return bytes(data)

    def recv_bytes_into(self, buf: Any, offset: int = 0) -> int:
        data = self.recv_bytes()
        view = memoryview(buf).cast("B")
        if offset + len(data) > len(view):
            raise multiprocessing.BufferTooShort(data)
        view[offset:offset + len(data)] = data
        return len(data)

    def poll(self, timeout: float | None = 0.0) -> bool:
        box = self._check(True)
        rt = self._dev.runtime
        if timeout is None:
            rt.queue_wait(box, "an item on a pipe")
            return True
        return timed(lambda: not rt.queue_empty(box), timeout)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._end.open -= 1
        if not self._end.open and self._out is not None:  # (the other end receives what was sent, then the end)
            self._dev.runtime.queue_put(self._out, _EOF)

    def fileno(self) -> int:
        raise NotImplementedError("a simulated pipe's file descriptor (Connection.fileno: multiprocessing.connection."
                                  "wait, selectors) is not simulated")

    def __enter__(self) -> SimConnection:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _connections(obj: Any) -> list[SimConnection]:
    """The pipe ends in ``obj`` (a process's arguments), through its tuples, lists and dicts."""
    if isinstance(obj, SimConnection):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [c for x in obj for c in _connections(x)]
    if isinstance(obj, dict):
        return [c for x in obj.values() for c in _connections(x)]
    return []


def _pipe(duplex: bool = True) -> tuple[SimConnection, SimConnection]:
    """``multiprocessing.Pipe(duplex)`` in a run: two connected ends."""
    a, b = Mailbox(), Mailbox()
    if duplex:
        return SimConnection(a, b), SimConnection(b, a)
    return SimConnection(a, None), SimConnection(None, a)


class SimEvent:
    """``multiprocessing.Event`` (and ``threading.Event``) in a run. One an earlier run made, kept where a process
    keeps it for its lifetime (a library's class attribute: tqdm's progress monitor's), is in this run a new one,
    clear, as a new process would make it; outside any run (an ``atexit`` handler of that library) it is a plain
    flag, which nothing of the runs can set any more (an untimed wait answers it at once)."""

    def __init__(self) -> None:
        self._dev = _session()
        self._run = self._dev.runtime
        self._cell = SharedCell(False)

    def _here(self) -> bool:
        """Whether a run is going on (and the event is this run's: see the class)."""
        if not _in_run():
            return False
        dev = _session()
        if dev.runtime is not self._run:
            self._dev, self._run, self._cell = dev, dev.runtime, SharedCell(False)
        return True

    def set(self) -> None:
        if not self._here():
            self._cell.value = True
            return
        self._dev.runtime.value_set(self._cell, True, "Event.set")

    def clear(self) -> None:
        if not self._here():
            self._cell.value = False
            return
        self._dev.runtime.value_set(self._cell, False, "Event.clear")

    def is_set(self) -> bool:
        if not self._here():
            return bool(self._cell.value)
        return bool(self._dev.runtime.value_get(self._cell, "Event.is_set"))

    def wait(self, timeout: float | None = None) -> bool:
        if not self._here():
            return bool(self._cell.value)
        if timeout is not None:
            return timed(self.is_set, timeout)
        self._dev.runtime.value_wait(self._cell, bool, "Event.wait", "an event another process sets")
        return True


class SimLock:
    """``multiprocessing.Lock`` in a run. Outside any run (one a module made at its import in a run, used after the
    session by the program, a library or a GPU run in the same process: transformers' logging lock), a real lock of
    its own (:meth:`_outside`)."""

    #: what makes its real lock outside a run (Python's own, never the session's)
    _REAL: Callable[[], Any] = _thread.allocate_lock

    def __init__(self) -> None:
        self._dev = _session()
        self._run = self._dev.runtime
        self._cell = SharedCell(False)
        self._real: Any = None

    def _outside(self) -> Any:
        """Its real lock where no run is going on, else None."""
        return real_outside(self, type(self)._REAL)

    def _here(self) -> None:
        """A lock an earlier run made, kept where a process keeps it for its lifetime (a library's class attribute:
        tqdm's output lock; a module's global made at its import in a run that started again on threads, where the
        first attempt left it held): in this run it is a new one, free, as a new process would make it."""
        dev = _session()
        if dev.runtime is not self._run:
            self._dev, self._run, self._cell = dev, dev.runtime, SharedCell(False)

    def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
        real = self._outside()
        if real is not None:
            return bool(real.acquire(block, -1 if timeout is None or not block else timeout))
        self._here()
        rt = self._dev.runtime
        if block and timeout is None:
            rt.lock_acquire(self._cell)
            return True
        wait = timeout if timeout is not None and block else 0.0
        free = timed(lambda: not rt.value_get(self._cell, "Lock.acquire"), wait)
        if free:
            rt.lock_acquire(self._cell)
        return free

    def held(self, step: str) -> bool:
        """Whether some actor holds it (a polling host step ``step``)."""
        real = self._outside()
        if real is not None:
            return bool(real.locked())
        self._here()
        return bool(self._dev.runtime.value_get(self._cell, step))

    def release(self) -> None:
        real = self._outside()
        if real is not None:
            real.release()
            return
        self._here()
        if not self._cell.value:
            raise ValueError("semaphore or lock released too many times")
        self._dev.runtime.value_set(self._cell, False, "Lock.release")

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


class SimRLock(SimLock):
    """``multiprocessing.RLock`` in a run: a lock its holder may take again, each ``acquire`` matched by a
    ``release`` (tqdm makes one for its bars' output: every program with a progress bar). Taken again by its holder
    it is no step (Python's does not block there); its first ``acquire`` and last ``release`` are a ``Lock``'s."""

    _REAL = _thread.RLock

    def __init__(self) -> None:
        super().__init__()
        self._owner: Any = None
        self._count = 0

    def _here(self) -> None:
        if _session().runtime is not self._run:
            self._owner, self._count = None, 0
        super()._here()

    def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
        if not _in_run():
            return super().acquire(block, timeout)  # (its real lock, taken again by its holder as Python's)
        self._here()
        me = self._dev.runtime.current()
        if self._owner is me:
            self._count += 1
            return True
        if not super().acquire(block, timeout):
            return False
        self._owner, self._count = me, 1
        return True

    def release(self) -> None:
        if not _in_run():
            super().release()
            return
        self._here()
        if self._owner is not self._dev.runtime.current():
            raise AssertionError("attempt to release recursive lock not owned by thread")
        self._count -= 1
        if self._count == 0:
            self._owner = None
            super().release()


class SimSemaphore:
    """``multiprocessing.Semaphore`` (``BoundedSemaphore`` with ``bounded``) in a run: a count each ``acquire`` takes
    one of, waiting while it is 0 (a timeout in virtual time), and each ``release`` gives back, ordering the next
    taker after it (a process that throttles its workers with one); a bounded one's release past its first count
    raises, as Python's does. One an earlier run made and a library kept is a new one in this run, at its first
    count. (``threading``'s semaphores are this one: ``threads.SimSemaphore``.)"""

    #: what a bounded one's release past its first count raises
    _TOO_MANY = "semaphore or lock released too many times"

    def __init__(self, value: int = 1, *, bounded: bool = False) -> None:
        if value < 0:
            raise ValueError("semaphore initial value must be >= 0")
        self._dev = _session()
        self._run = self._dev.runtime
        self._first = value
        self._count = SharedCell(value)
        self._bound = value if bounded else None
        self._real: Any = None
        #: outside any run, what its real one's acquires took and its releases gave back (its count: first - this)
        self._outside_taken = 0

    def _outside(self) -> Any:
        """Outside any run, a real semaphore of its own at its first count (see :class:`SimLock`), else None."""
        return real_outside(self, lambda: (_BOUNDED_SEMAPHORE if self._bound is not None else _SEMAPHORE)(self._first))

    def _here(self) -> None:
        dev = _session()
        if dev.runtime is not self._run:
            self._dev, self._run, self._count = dev, dev.runtime, SharedCell(self._first)

    def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
        real = self._outside()
        if real is not None:
            took = bool(real.acquire(block, timeout if block else None))
            self._outside_taken += took
            return took
        self._here()
        rt = self._dev.runtime
        if block and timeout is None:
            rt.semaphore_acquire(self._count)
            return True
        wait = timeout if timeout is not None and block else 0.0
        if not timed(lambda: rt.value_get(self._count, "Semaphore.acquire") > 0, wait):
            return False
        rt.semaphore_acquire(self._count)
        return True

    def release(self) -> None:
        self.give_back(1)

    def give_back(self, n: int) -> None:
        """``n`` back to the count, in one release step (``threading``'s ``release(n)``)."""
        real = self._outside()
        if real is not None:
            real.release(n)
            self._outside_taken -= n
            return
        self._here()
        if self._bound is not None and self._count.value + n > self._bound:
            raise ValueError(self._TOO_MANY)
        self._dev.runtime.value_set(self._count, self._count.value + n, "Semaphore.release")

    def get_value(self) -> int:
        if self._outside() is not None:
            return self._first - self._outside_taken
        self._here()
        return int(self._dev.runtime.value_get(self._count, "Semaphore.get_value"))

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


class SimValue(SharedValueHandle):
    """``multiprocessing.Value`` in a run: its ``value`` a shared value, with a lock of its own (``lock=True``)."""

    def __init__(self, typecode: Any, *args: Any, lock: Any = True) -> None:
        super().__init__(_session(), typecode, args[0] if args else 0)
        self._lock = lock if isinstance(lock, SimLock) else SimLock() if lock else None

    def get_lock(self) -> SimLock:
        if self._lock is None:
            raise AttributeError("'Synchronized' object has no lock: made with lock=False")
        return self._lock

    def acquire(self, *args: Any) -> bool:
        return self.get_lock().acquire(*args)

    def release(self) -> None:
        self.get_lock().release()

    def __enter__(self) -> bool:
        return self.get_lock().acquire()

    def __exit__(self, *exc: Any) -> None:
        self.get_lock().release()


class SimBarrier:
    """``multiprocessing.Barrier`` in a run: each ``wait`` is a host step; the parties of one round leave it when the
    last arrives, each then ordered after every party's past at its arrival (the round's clock). A party waits for
    the others without polling, or for ``timeout`` seconds of virtual time (then the barrier breaks, as Python's
    does); ``action`` runs in the last party to arrive, before the others leave. Fewer parties than it counts:
    the run's deadlock, as on a machine."""

    def __init__(self, parties: int, action: Callable[[], Any] | None = None, timeout: float | None = None) -> None:
        if parties < 1:
            raise ValueError("parties must be >= 1")
        self._dev = _session()
        self._parties = parties
        self._action = action
        self._timeout = timeout
        self._round = 0  # the round parties arrive in now
        self._waiting = 0  # parties arrived in it
        self._broken = False
        self._broken_rounds: set[int] = set()  # rounds ``reset()`` ended with parties in them
        self._arrivals = SharedCell(None)  # this round's: its clock, the pasts of its arrivals
        self._left: dict[int, SharedCell] = {}  # each completed round's

    @property
    def parties(self) -> int:
        return self._parties

    @property
    def n_waiting(self) -> int:
        self._dev.runtime.host_step("Barrier.n_waiting", poll=True)
        return self._waiting

    @property
    def broken(self) -> bool:
        self._dev.runtime.host_step("Barrier.broken", poll=True)
        return self._broken

    def wait(self, timeout: float | None = None) -> int:
        rt = self._dev.runtime
        a = rt.barrier_arrive(self._arrivals)
        if self._broken:
            raise threading.BrokenBarrierError
        k, index = self._round, self._waiting
        self._waiting += 1
        if self._waiting == self._parties:  # the last: the round ends
            if self._action is not None:
                try:
                    self._action()
                except BaseException:
                    self._break()
                    raise
            self._left[k] = self._arrivals
            self._arrivals = SharedCell(None)
            self._round += 1
            self._waiting = 0
            rt.execution.changed()
        else:
            def left() -> bool:
                return self._round != k or self._broken

            wait = self._timeout if timeout is None else timeout
            if wait is None:
                rt.execution.block(a, f"the other parties of a barrier ({self._waiting} of {self._parties} arrived)",
                                   left)
            elif not timed(left, wait):
                self._break()
            if self._round == k or k in self._broken_rounds:
                raise threading.BrokenBarrierError
        rt.barrier_leave(a, self._left[k])
        return index

    def _break(self) -> None:
        self._broken = True
        self._dev.runtime.execution.changed()

    def abort(self) -> None:
        """The barrier breaks: parties waiting in it, and any that arrive later, raise ``BrokenBarrierError``."""
        self._dev.runtime.host_step("Barrier.abort")
        self._break()

    def reset(self) -> None:
        """Back to its empty state: parties waiting in the round it ends raise ``BrokenBarrierError``."""
        rt = self._dev.runtime
        rt.host_step("Barrier.reset")
        if self._waiting:
            self._broken_rounds.add(self._round)
            self._round += 1
            self._waiting = 0
            self._arrivals = SharedCell(None)
        self._broken = False
        rt.execution.changed()


#: what each simulated primitive's factory makes in a run
_MADE: dict[str, Callable[..., Any]] = {
    "Queue": SimQueue, "SimpleQueue": lambda: SimQueue(simple=True), "Event": SimEvent, "Value": SimValue,
    "Lock": SimLock, "RLock": SimRLock, "Barrier": SimBarrier, "Semaphore": SimSemaphore,
    "BoundedSemaphore": lambda value=1: SimSemaphore(value, bounded=True), "Pipe": _pipe,
}


def _refusal(name: str) -> NotImplementedError:
    return NotImplementedError(
        f"multiprocessing.{name} is not simulated (the run's processes share Queue, SimpleQueue, Pipe, Event, Value, "
        "Lock, RLock, Semaphore, BoundedSemaphore and Barrier)"
    )


def _in_run_instead(name: str, original: Callable[..., Any], method: bool) -> Callable[..., Any]:
    """``original`` (a context's method, ``method``; or ``multiprocessing.<name>``, the default context's, bound at
    import) outside a run; in a run the simulator's primitive, or a refusal."""

    def call(*args: Any, **kwargs: Any) -> Any:
        if not _in_run():
            return original(*args, **kwargs)
        if name in _REFUSED:
            raise _refusal(name)
        return _MADE[name](*(args[1:] if method else args), **kwargs)

    call.__name__ = name
    return call


#: the modules whose ``multiprocessing`` names a session replaces
def _modules() -> list[Any]:
    return [multiprocessing, torch.multiprocessing]


class SpawnContext:
    """What ``torch.multiprocessing.spawn(..., join=False)`` returns in a run (torch's ``ProcessContext``): ``join()``
    waits for every rank (True once all have exited; with ``timeout``, False where some still run after that much
    virtual time), each join ordering the caller after them; ``pids()`` their numbers. What a rank raises is the
    run's host error, where torch's ``join`` raises ``ProcessRaisedException``."""

    def __init__(self, ranks: list[Any]) -> None:
        self._ranks = ranks

    def _done(self) -> bool:
        return all(a.state == "done" for a in self._ranks)

    def join(self, timeout: float | None = None, grace_period: float | None = None) -> bool:
        rt = _session().runtime
        if timeout is not None and not timed(self._done, timeout):
            return False
        rt.join_ranks(self._ranks)
        return True

    def pids(self) -> list[int]:
        return [a.order for a in self._ranks]


def _start_processes(original: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.multiprocessing.start_processes`` (and ``spawn``, which calls it) in a run: ``fn(i, *args)`` on rank
    ``i`` of a new world of ``nprocs`` ranks (``rank0..``, a process and a device each, torch.distributed's default
    group theirs, as ``--world-size N`` makes them: the program's ``init_process_group`` joins it), the caller
    waiting for all of them, as ``join=True`` waits (``join=False``: a :class:`SpawnContext` to join); ``args``
    pickled as a spawned child receives them (a device tensor in them arrives through CUDA IPC). What a rank raises
    is the run's host error, where torch raises it in the parent as ``ProcessRaisedException``. Outside a run,
    torch's."""

    def start_processes(fn: Callable[..., Any], args: tuple[Any, ...] = (), nprocs: int = 1, join: bool = True,
                        daemon: bool = False, start_method: str = "spawn") -> SpawnContext | None:
        if not _in_run():
            return original(fn, args, nprocs, join, daemon, start_method)  # type: ignore[no-any-return]
        dev = _session()
        rt = dev.runtime
        if rt.rank_in_world() is not None or "rank0" in rt.execution.actors:
            raise NotImplementedError("torch.multiprocessing.spawn (or start_processes) of ranks where ranks run "
                                      "already is not simulated: one world per run (check the function that "
                                      "spawns them without --world-size)")
        if nprocs > MAX_WORLD_SIZE:
            raise NotImplementedError(f"torch.multiprocessing.spawn of {nprocs} processes: the simulator runs at "
                                      f"most {MAX_WORLD_SIZE} ranks")
        sent = _sent(dev, tuple(args), rt.current().current_stream)

        def body() -> None:
            fn(rt.rank(), *_received(dev, sent))

        ranks = rt.start_ranks(nprocs, body) if nprocs >= 1 else []  # (torch starts none: its join returns at once)
        context = SpawnContext(ranks)
        if join:
            context.join()
            return None
        rt.gpu_replay = False  # (``reference.cuda_plain`` replays a joined spawn alone)
        return context

    start_processes.__name__ = start_processes.__qualname__ = "start_processes"
    return start_processes


def install(p: Patches) -> None:
    """Put the simulated processes and primitives in place (each falls back to the original outside a run)."""
    _patch_process(p)
    _patch_identity(p)
    _patch_start_method(p)
    for name in (*_MADE, *_REFUSED):
        _set_everywhere(p, name, lambda original, method, name=name: _in_run_instead(name, original, method))
    p.set(os, "_exit", _os_exit(os._exit))
    # (``spawn`` calls it by its module's name for it: a ``spawn`` the program imported by name reaches it too)
    spawning = sys.modules["torch.multiprocessing.spawn"]
    started = _start_processes(spawning.start_processes)
    p.set(spawning, "start_processes", started)
    p.set(torch.multiprocessing, "start_processes", started)
    reductions = torch.multiprocessing.reductions
    p.set(reductions, "reduce_tensor", _reduce_tensor(reductions.reduce_tensor))
    # ``ForkingPickler`` (SGLang's serializer, torch's queues) reduces a tensor by its exact type, which torch
    # registered with its own ``reduce_tensor``: a simulated tensor is reduced by the simulated one (the table is
    # a copy for the session: a type registered meanwhile is forgotten with it)
    reducers = dict(vars(ForkingPickler)["_extra_reducers"])  # (typeshed does not declare it)
    reducers[SimTensor] = lambda t: reductions.reduce_tensor(t)
    p.set(ForkingPickler, "_extra_reducers", reducers)


def patched_owners() -> list[Any]:
    process = multiprocessing.process
    return [process, process.BaseProcess, multiprocessing.context.BaseContext, multiprocessing.context.DefaultContext,
            *_modules(), os, torch.multiprocessing.reductions, ForkingPickler,
            sys.modules["torch.multiprocessing.spawn"]]
