"""``SimDevice``: the device contract (``reference.contract``) on the simulator. Thin; mirrors ``torch.cuda``.

``SimDevice(schedule).run(program, *args)`` runs ``program(dev, *args)`` as the
host actor ``host`` in virtual time and returns a :class:`reference.contract.Run`
whose ``reports`` hold what went wrong (races, stale reads, deadlocks,
illegal accesses, host errors). The same schedule gives the same run.

Every method here is one call into :class:`simdevice.runtime.Runtime`; the
handles hold the runtime's objects and refuse another device's handles.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import attrs
import torch

from reference import contract
from reference.contract import MemorySaver, Run
from reference.schedule import Delay, Schedule, ScheduleError
from simdevice.dispatch import META, Dispatcher, SimMode, ref_of, storage_of
from simdevice.runtime import Options, Runtime, SimConfig
from simdevice.runtime.collectives import Gather, in_memory_order
from simdevice.runtime.config import UNIT_NS, with_overrides
from simdevice.runtime.execution import EARLIER_RUN, HostActor
from simdevice.runtime.memsaver import SimMemorySaver
from simdevice.runtime.reports import user_source
from simdevice.runtime.runtime import Mailbox, SharedCell
from simdevice.runtime.streams import EventRecord, SimStream
from simdevice.runtime.tls import NeedsThreads
from simdevice.signals import checkpoint, delivered

#: the device type a simulated stream reports to torch (its tensors report ``meta`` too), as torch numbers it
_META_TYPE = torch.Stream(device="meta").device_type


class StreamHandle(torch.Stream):
    """A simulated stream handle (``torch.cuda.Stream``). It is a ``torch.Stream`` (device ``meta``, its
    ``stream_id`` the runtime's number for it), so torch's own ``t.record_stream(s)`` accepts it."""

    _dev: SimDevice
    _s: SimStream

    def __new__(cls, dev: SimDevice, s: SimStream) -> StreamHandle:
        h: StreamHandle = super().__new__(cls, stream_id=s.order, device_index=0, device_type=_META_TYPE)
        h._dev, h._s = dev, s
        return h

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass  # made in __new__ (a subclass may take torch.cuda.Stream's arguments)

    @classmethod
    def of(cls, dev: SimDevice, s: SimStream) -> StreamHandle:
        """A handle of this class for an existing stream."""
        return StreamHandle.__new__(cls, dev, s)

    @property
    def name(self) -> str:
        return str(self._s.name)

    def wait_event(self, event: contract.Event) -> None:
        self._dev.runtime.stream_wait_event(self._s, self._dev.record_of(event))

    def wait_stream(self, stream: contract.Stream) -> None:
        self._dev.runtime.stream_wait_stream(self._s, self._dev.stream_of(stream))

    def synchronize(self) -> None:
        self._dev.runtime.stream_synchronize(self._s)

    def query(self) -> bool:
        return bool(self._dev.runtime.stream_query(self._s))

    def record_event(self, event: contract.Event | None = None) -> contract.Event:
        event = event or EventHandle(self._dev)
        event.record(self)
        return event

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StreamHandle) and other._s is self._s

    def __hash__(self) -> int:
        return id(self._s)

    def __repr__(self) -> str:
        return f"<simulated stream {self.name}>"


class EventHandle:
    """A simulated event (``torch.cuda.Event``)."""

    def __init__(self, dev: SimDevice, enable_timing: bool = False) -> None:
        self._dev = dev
        self._timing = enable_timing
        self._rec: EventRecord | None = None

    def record(self, stream: contract.Stream | None = None) -> None:
        dev = self._dev
        self._rec = dev.runtime.event_record(dev.stream_of(stream) if stream is not None else None, self._timing)

    def elapsed_time(self, end_event: contract.Event) -> float:
        """Milliseconds of virtual time from this event's completion to ``end_event``'s."""
        end = self._dev.event_of(end_event)
        if not (self._timing and end._timing):
            raise RuntimeError("elapsed_time: both events must be created with enable_timing=True")
        return self._dev.runtime.elapsed_ms(self._rec, end._rec)

    def wait(self, stream: contract.Stream | None = None) -> None:
        (stream or self._dev.current_stream()).wait_event(self)

    def query(self) -> bool:
        return self._dev.runtime.event_query(self._rec)

    def synchronize(self) -> None:
        self._dev.runtime.event_synchronize(self._rec)


class SharedValueHandle:
    """A value shared between simulated processes (``multiprocessing.Value``)."""

    def __init__(self, dev: SimDevice, typecode: str, init: Any) -> None:
        self._dev = dev
        self.typecode = typecode
        self._cell = SharedCell(init)

    @property
    def value(self) -> Any:
        return self._dev.runtime.value_get(self._cell)

    @value.setter
    def value(self, v: Any) -> None:
        self._dev.runtime.value_set(self._cell, v)


class SharedQueueHandle:
    """A queue between simulated processes (``multiprocessing.Queue``)."""

    def __init__(self, dev: SimDevice) -> None:
        self._dev = dev
        self._box = Mailbox()

    def put(self, item: Any) -> None:
        self._dev.runtime.queue_put(self._box, item)

    def get(self, timeout: float | None = None) -> Any:
        return self._dev.runtime.queue_get(self._box)

    def empty(self) -> bool:
        return self._dev.runtime.queue_empty(self._box)


class ProcessHandle:
    """A spawned simulated process: a host actor with its own streams (``mp.Process``)."""

    def __init__(self, dev: SimDevice, target: Callable[..., Any], args: tuple[Any, ...], name: str) -> None:
        self._dev, self._target, self._args, self.name = dev, target, args, name
        self._actor: HostActor | None = None

    def start(self) -> None:
        dev = self._dev
        self._actor = dev.runtime.spawn(self.name, lambda: self._target(dev, *self._args))

    def join(self, timeout: float | None = None) -> None:
        if self._actor is None:
            raise RuntimeError(f"process {self.name!r} joined before start()")
        self._dev.runtime.join(self._actor)

    def is_alive(self) -> bool:
        return self._actor is not None and self._actor.state != "done"

    @property
    def exitcode(self) -> int | None:
        return 0 if self._actor is not None and self._actor.state == "done" else None


#: torch's class of a collective's handle, where this torch has ``torch.distributed`` (code tests
#: ``isinstance(work, dist.Work)`` before it waits: FSDP2's copy-out of an ``unshard(async_op=True)``)
_WORK: type = torch.distributed.Work if torch.distributed.is_available() else object


class SimWork(_WORK):  # type: ignore[misc, valid-type]
    """The handle of an async collective (``torch.distributed.Work``, an instance of torch's class)."""

    def __init__(self, dev: SimDevice, gather: Gather, tensors: tuple[torch.Tensor, ...] = (),
                 barrier: bool = False, outputs: int = 1) -> None:
        super().__init__()
        self._dev, self._gather = dev, gather
        #: the collective's output tensors, the first ``outputs`` of ``tensors`` (the value of its future)
        self._outputs = list(tensors[:outputs]) if not barrier else []
        #: a barrier's work: its ``wait()`` also blocks the host until the current stream is done where the barrier
        #: is not done by then (``Runtime.work_wait``); its ``synchronize()`` is any work's (a stream wait alone)
        self._barrier = barrier
        #: the tensors the collective reads and writes, held while the handle lives, as ProcessGroupNCCL's work holds
        #: them (its outputs, its inputs stashed for the allocator): a gradient an autograd hook hands to an async
        #: collective and returns has a second reference, so autograd copies it into ``.grad`` rather than taking it
        self._tensors = tensors

    def wait(self, timeout: Any = None) -> bool:
        """NCCL's ``Work.wait``: the current stream waits for the collective; with a ``timeout`` the host also blocks
        until it completed (as ProcessGroupNCCL does for a timed wait). True, as torch returns."""
        self._dev.runtime.work_wait(self._gather, self._barrier)
        if timeout is not None and timeout.total_seconds() > 0:
            self._dev.runtime.work_wait_host(self._gather)
        return True

    def is_completed(self) -> bool:
        return self._dev.runtime.work_is_completed(self._gather)

    def synchronize(self) -> None:
        """NCCL's ``Work.synchronize``: the current stream waits for the collective (a barrier's too: the host
        does not block, as it may in ``wait()``)."""
        self._dev.runtime.work_wait(self._gather)

    def result(self) -> list[torch.Tensor]:
        """NCCL's ``Work.result()``: the collective's output tensors, with no wait."""
        return self._outputs

    def get_future(self) -> SimWorkFuture:
        """NCCL's ``Work.get_future()``: a future completed as the collective was issued (ProcessGroupNCCL marks it
        so at once, its CUDA events on the collective's stream), whose value is the collective's output tensors."""
        return SimWorkFuture(self._dev, self._outputs, lambda: self._dev.runtime.work_wait(self._gather),
                             marks=self._gather.record)


def _not_simulated(kind: str, name: str, instead: str) -> Callable[..., Any]:
    def refused(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{kind}.{name} is not simulated ({instead})")

    refused.__name__ = name
    return refused


def refuse_the_rest(base: type, kind: str, instead: str) -> Callable[[type], type]:
    """A class decorator: the class, a simulated ``base`` (torch's ``Work``, ``ProcessGroup``), with what else that
    class offers raising NotImplementedError naming it (``Work.exception is not simulated (INSTEAD)``): the run
    gives no verdict rather than the answer of torch's C++ class for an object it never made."""

    def refuse(cls: type) -> type:
        for name in dir(base):
            if not name.startswith("_") and not any(name in vars(c) for c in cls.__mro__ if c not in base.__mro__):
                setattr(cls, name, _not_simulated(kind, name, instead))
        return cls

    return refuse


refuse_the_rest(_WORK, "Work", "wait(), synchronize(), is_completed(), result() and get_future() on the work "
                "are")(SimWork)


class SimWorkFuture:
    """A ``torch.futures.Future`` of CUDA tensors as a collective's work gives it (``Work.get_future()``), or as
    :meth:`then` makes it: done from the start, holding tensors some stream may still be writing. ``wait()`` makes
    the current stream wait for that stream (the host does not block) and gives the value; ``value()`` gives it with
    no wait; ``then(fn)`` calls ``fn(future)`` at once on the host, with a new stream current that waits for the
    writing stream first (torch takes one from its pool), and gives a future of what ``fn`` returned, written on
    that stream (what ``fn`` raised is raised by its ``wait()`` and ``value()``). ``torch.futures.collect_all`` and
    ``wait_all`` of such futures: :meth:`collected`. Its other methods are not simulated. ``marks``: what the
    future's waiters wait for (None: a future of no device, whose ``wait()`` makes no stream wait)."""

    def __init__(self, dev: SimDevice, value: Any, waits: Callable[[], None],
                 error: BaseException | None = None, marks: Callable[[], EventRecord] | None = None) -> None:
        self._dev, self._value, self._waits, self._error, self._marks = dev, value, waits, error, marks

    @staticmethod
    def collected(futures: list[SimWorkFuture]) -> SimWorkFuture:
        """``torch.futures.collect_all(futures)``: one host step. Each future is done, so torch runs its callback at
        once (``invokeCallback``), on a stream it takes from its pool for the future's device, made to wait for the
        future's work and to hold its tensors: no stream of the program's waits, nor the host. The collected future
        is one of no device, done, whose value is ``futures``: its ``wait()`` (a host step) makes no stream wait
        (``wait_all`` then waits on each), and raises the first error of theirs."""
        dev = futures[0]._dev
        rt = dev.runtime
        pooled = [(f, dev.stream_of(dev._pooled_stream()), f._marks) for f in futures if f._marks is not None]
        rt.futures_collected([(s, marks()) for _, s, marks in pooled])
        for f, s, _ in pooled:
            with rt.on_stream(s):
                f._held_by_current()
        error = next((f._error for f in futures if f._error is not None), None)
        return SimWorkFuture(dev, list(futures), lambda: rt.future_wait(None), error)

    def done(self) -> bool:
        return True

    def wait(self) -> Any:
        if self._error is not None:
            raise self._error
        self._waits()
        self._held_by_current()
        return self._value

    def _held_by_current(self) -> None:
        """The value's device tensors recorded on the current stream, which now reads them: their blocks are not
        handed on before it is past this point, as torch's future records them where it synchronizes a stream with
        itself (``synchronizeWithCurrentStreams``: ``recordDataPtrOnStream``)."""
        rt = self._dev.runtime
        s = rt.current().current_stream
        values = self._value if isinstance(self._value, (list, tuple)) else [self._value]
        for t in values:
            if isinstance(t, torch.Tensor) and t.device.type != "cpu":
                rt.record_stream(storage_of(t), s)

    def value(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._value

    def then(self, callback: Callable[[SimWorkFuture], Any]) -> SimWorkFuture:
        dev = self._dev
        if self._marks is None:  # (a future of no device: its callback takes no stream, and its child has none)
            self._waits()
            result, error = self._called(callback)
            return SimWorkFuture(dev, result, lambda: dev.runtime.future_wait(None), error)
        s = dev._pooled_stream()
        with dev.stream(s):
            self._waits()  # (the callback's stream after what fills the value)
            self._held_by_current()
            result, error = self._called(callback)
            # (recorded within then's host step, as torch records it in then's C++)
            done = dev.runtime.future_done(dev.runtime.current().current_stream)
        return SimWorkFuture(dev, result, lambda: dev.runtime.future_wait(done), error, marks=lambda: done)

    def _called(self, callback: Callable[[SimWorkFuture], Any]) -> tuple[Any, BaseException | None]:
        """What ``callback(self)`` returned, or what it raised as the child future holds it (in torch's words)."""
        try:
            return callback(self), None
        except Exception as e:
            return None, RuntimeError(f"Got the following error when running the callback: {type(e).__name__}: {e}")

    def add_done_callback(self, callback: Callable[[SimWorkFuture], None]) -> None:
        self.then(callback)

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("_") and hasattr(torch.futures.Future, name):
            raise NotImplementedError(f"Future.{name} of a collective's work is not simulated (done(), wait(), "
                                      "value(), then() and add_done_callback() are)")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


class MemorySaverHandle:
    """``torch_memory_saver`` on the simulated device's caching allocator."""

    def __init__(self, model: SimMemorySaver) -> None:
        self.model = model

    def region(
        self, tag: str = "default", enable_cpu_backup: bool = False, enable_disk_backup: bool = False,
        cpu_backup_backend: str | None = None,
    ) -> contextlib.AbstractContextManager[Any]:
        return self.model.region(tag, enable_cpu_backup, enable_disk_backup, cpu_backup_backend)

    def cuda_graph(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("torch_memory_saver's cuda_graph() is not simulated (CUDA graphs are not)")

    @property
    def enabled(self) -> bool:
        return True  # as the library answers

    def get_cpu_backup(self, x: Any, zero_copy: bool = False) -> Any:
        raise NotImplementedError("torch_memory_saver's get_cpu_backup() is not simulated")

    @property
    def retain_cpu_backup(self) -> bool:
        raise NotImplementedError("torch_memory_saver's retain_cpu_backup is not simulated")

    @retain_cpu_backup.setter
    def retain_cpu_backup(self, value: bool) -> None:
        raise NotImplementedError("torch_memory_saver's retain_cpu_backup is not simulated")

    @property
    def memory_margin_bytes(self) -> int:
        raise NotImplementedError("Only setter is supported")  # the library's own answer

    @memory_margin_bytes.setter
    def memory_margin_bytes(self, value: int) -> None:
        raise NotImplementedError("torch_memory_saver's memory_margin_bytes (an OOM margin) is not simulated")

    def set_disk_backup_dir(self, path: str) -> None:
        pass  # where the backup's files go: the simulated backup keeps the bytes itself

    def disable(self) -> contextlib.AbstractContextManager[Any]:
        return self.model.disable()

    def pause(self, tag: str | None = None) -> None:
        self.model.pause(tag)

    def resume(self, tag: str | None = None) -> None:
        self.model.resume(tag)


def _no_delays(actor: str) -> dict[int, int]:
    return {}



def as_schedule(schedule: Schedule | str | None) -> Schedule | None:
    """A schedule from a schedule line, or from delays alone (``"side#0+3,host#2+1"``); ScheduleError if it is
    neither."""
    if schedule is None or isinstance(schedule, Schedule):
        return schedule
    if not isinstance(schedule, str):
        raise TypeError(f"a schedule is a Schedule or its line (a str), got {type(schedule).__name__}")
    try:
        return Schedule.parse(schedule)
    except ScheduleError as first:
        try:
            items = [x for x in schedule.split(",") if x.strip()]
            return Schedule("session", "run", (), [Delay.parse(x) for x in items])
        except ScheduleError as delays:
            if "#" in schedule and "/" not in schedule and ":" not in schedule:
                raise delays from None  # delays alone, one of them malformed: say which
            raise first from None


def _refuse(dev: SimDevice, handle: Any, kind: type, what: str) -> NoReturn:
    """Refuse ``handle`` where a ``what`` of ``dev``'s was expected: one of an earlier run (the program kept it, in an
    object or in a module the target's own is not: each run is a process of its own, whose streams are made in
    it) gives no verdict, as does a call on one of ``dev``'s own once its run is over; anything else is a
    ``TypeError``."""
    if dev.runtime.execution.over:  # the handle whose method this is belongs to a run that is over
        raise RuntimeError(EARLIER_RUN)
    if isinstance(handle, kind):
        raise RuntimeError(f"simdevice: expected {what} of this SimDevice, got {handle!r}, made by an earlier run: "
                           "the program keeps it across runs (in an object, a class or another module; the target's "
                           "own module starts afresh at each run); make it in the run, as each process does")
    raise TypeError(f"expected {what} of this SimDevice, got {handle!r}")


class SimDevice:
    """The device contract on a deterministic simulated device."""

    device = META  # (the simulator's one meta device object: a session's factories tell it from a program's)

    def __init__(
        self,
        schedule: Schedule | str | None = None,
        config: SimConfig | None = None,
        options: Options | None = None,
        *,
        shown: torch.device | None = None,
    ) -> None:
        #: its schedule (a line, or delays alone, parsed: ``as_schedule``)
        self.schedule = as_schedule(schedule)
        self.config = with_overrides(config)
        if self.schedule is not None:
            self.config = self.config.for_program(self.schedule.program)
        self._options = options or Options()
        #: the device simulated tensors show to Python code (``meta``; ``cuda:0`` under the torch.cuda drop-in)
        self.shown = shown or META
        self._build()

    def _build(self) -> None:
        s = self.schedule
        delays = s.delays_for if s is not None else _no_delays
        choices = s.choices_for if s is not None else _no_delays
        #: the model of this run (tests and tools read its allocator, streams and trace)
        self.runtime = Runtime(self.config, delays, self._options, self._enter, choices)
        self._dispatcher = Dispatcher(self.runtime, self.shown)
        self._memory_saver = MemorySaverHandle(self.runtime.memsaver)

    # -- running -------------------------------------------------------------------------
    def _enter(self) -> SimMode:
        return SimMode(self._dispatcher)

    def run(self, program: Callable[..., Any], *args: Any) -> Run:
        """Run ``program(dev, *args)`` as host actor ``host``; a SimDevice runs one program once."""
        checkpoint()  # a Ctrl-C that was raised and lost on its way (simdevice.signals) stops the command here
        try:
            try:
                result = self.runtime.run(lambda: program(self, *args))
            except NeedsThreads:
                # the actors met torch state one thread cannot hold for two of them (simdevice.runtime.tls): the
                # same run again from its start, each actor on a thread of its own (what the program did outside
                # the simulated device before that point, it does twice)
                self.config = attrs.evolve(self.config, actors="thread")
                self._build()
                result = self.runtime.run(lambda: program(self, *args))
        except KeyboardInterrupt:
            delivered()  # the stop goes on to the caller, as raised
            raise
        checkpoint()  # a stop lost during the run (cut short in a callback, the run may show what it never did)
        return self.outcome(result)

    def show_at(self, index_of: Callable[[], int]) -> None:
        """The simulated tensors show the device at the index ``index_of()`` answers as they are asked (the drop-in:
        the running process's current device, ``torch.cuda.set_device``)."""
        self._dispatcher.index_of = index_of

    def shown_now(self) -> torch.device:
        """The device the simulated tensors show to the running process."""
        return self._dispatcher.shown_now()

    @contextlib.contextmanager
    def here(self) -> Iterator[None]:
        """Run the block in the calling thread as host actor ``host`` (see ``Runtime.here``); ``outcome()`` after."""
        with self.runtime.here():
            yield

    def outcome(self, result: Any) -> Run:
        """The run's :class:`Run`, once it is over."""
        rt = self.runtime
        s = self.schedule
        unfired = rt.unfired(s.delays, s.choices) if s is not None else rt.unfired()
        return Run(result=result, reports=tuple(rt.reports.items), op_counts=rt.op_counts(), unfired=unfired,
                   notes=rt.notes(), trace=tuple(rt.trace), sites=dict(rt.op_sites), gpu=rt.gpu_replay,
                   host_accesses=dict(rt.host_accesses))

    @property
    def trace(self) -> list[tuple[int, str, str]]:
        """Every host step and stream operation of the run, in virtual-time order."""
        return self.runtime.trace

    @property
    def now_units(self) -> float:
        return self.runtime.now / UNIT_NS

    def from_host(self, host: torch.Tensor) -> torch.Tensor:
        """``host``'s values on this device as torch puts Python data there (``torch.tensor(data, device=...)``):
        a blocking copy on the current actor's current stream that no dispatch mode sees, so no step or operation is
        counted (``Dispatcher.from_host``)."""
        return self._dispatcher.from_host(host, self.runtime.current())

    # -- this device's handles -------------------------------------------------------------
    def stream_of(self, s: contract.Stream) -> SimStream:
        """The runtime stream behind a handle of this device (TypeError for anything else)."""
        if not isinstance(s, StreamHandle) or s._dev is not self:
            _refuse(self, s, StreamHandle, "a stream")
        stream: SimStream = s._s
        return stream

    def event_of(self, e: contract.Event) -> EventHandle:
        """An event of this device (TypeError for anything else)."""
        if not isinstance(e, EventHandle) or e._dev is not self:
            _refuse(self, e, EventHandle, "an event")
        return e

    def record_of(self, e: contract.Event) -> EventRecord | None:
        """Where an event of this device was last recorded (None: never)."""
        return self.event_of(e)._rec

    # -- streams and events ----------------------------------------------------------------
    def Stream(self, name: str | None = None, priority: int = 0) -> StreamHandle:
        """A new stream (``priority`` is accepted as ``torch.cuda.Stream`` accepts it; the simulator has one
        priority)."""
        return StreamHandle(self, self.runtime.new_stream(name))

    def Event(self, enable_timing: bool = False) -> EventHandle:
        return EventHandle(self, enable_timing)

    def _pooled_stream(self) -> StreamHandle:
        """A stream torch takes for its own work (a future's callback, ``getStreamFromGlobalPool``): a new one here;
        the drop-in's comes from the process's pool, as on a GPU."""
        return self.Stream()

    @contextlib.contextmanager
    def stream(self, s: contract.Stream | None) -> Iterator[contract.Stream | None]:
        """Make ``s`` current for the block; ``stream(None)`` changes nothing, as in torch."""
        if s is None:
            yield None
            return
        with self.runtime.on_stream(self.stream_of(s)):
            yield s

    def current_stream(self) -> StreamHandle:
        return StreamHandle(self, self.runtime.current_stream())

    def default_stream(self) -> StreamHandle:
        return StreamHandle(self, self.runtime.default_stream())

    def synchronize(self) -> None:
        self.runtime.synchronize()

    # -- host actors ---------------------------------------------------------------------------
    def Process(
        self, target: Callable[..., Any], args: tuple[Any, ...] = (), name: str = "worker"
    ) -> ProcessHandle:
        return ProcessHandle(self, target, args, name)

    def Value(self, typecode: str, init: Any) -> SharedValueHandle:
        return SharedValueHandle(self, typecode, init)

    def Queue(self) -> SharedQueueHandle:
        return SharedQueueHandle(self)

    def sleep(self, units: float) -> None:
        self.runtime.sleep(units)

    def empty_cache(self) -> None:
        """Release the caching allocator's free segments (``torch.cuda.empty_cache``)."""
        self.runtime.empty_cache()

    @property
    def memory_saver(self) -> MemorySaver:
        return self._memory_saver

    # -- collectives ------------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self.runtime.rank()

    @property
    def world_size(self) -> int:
        return self.runtime.world_size()

    def spawn_ranks(self, fn: Callable[..., Any], world_size: int, args: tuple[Any, ...] = ()) -> list[Any]:
        """Run ``fn(dev, *args)`` as host actors ``rank0..``, one process group; return their results."""
        return self.runtime.spawn_ranks(world_size, lambda: fn(self, *args))

    def all_gather_into_tensor(self, output: torch.Tensor, input: torch.Tensor, async_op: bool = True) -> Any:
        """A :class:`SimWork` when ``async_op``, else None (``reference.contract.Device`` types it per form)."""
        out, inp = output.view(-1), in_memory_order(input)
        # aliases: the collective in flight does not keep its tensors allocated; its work handle does while it lives,
        # as NCCL's does (SimWork)
        gather = self.runtime.all_gather(ref_of(out), ref_of(inp), user_source())
        work = SimWork(self, gather, (output, input))
        if not async_op:
            work.wait()
            return None
        return work
