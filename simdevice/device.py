"""``SimDevice``: the device contract on the simulator. Thin; mirrors ``torch.cuda``.

``SimDevice(schedule).run(program, *args)`` runs ``program(dev, *args)`` as the
host actor ``host`` in virtual time and returns a :class:`reference.device.Run`
whose ``reports`` hold what went wrong (races, stale reads, deadlocks,
illegal accesses, host errors). The same schedule gives the same run.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import torch

from reference.device import Run
from reference.schedule import Schedule
from simdevice.clock import VectorClock
from simdevice.collectives import SimWork, World, all_gather_into_tensor, rank_of, spawn_ranks, world_size_of
from simdevice.config import UNIT_NS, SimConfig
from simdevice.memsaver import SimMemorySaver
from simdevice.scheduler import HostActor, Scheduler
from simdevice.streams import EventRecord, SimStream, StreamOp
from simdevice.tensor import SimMode, TensorOps


class StreamHandle:
    """A simulated stream handle (``torch.cuda.Stream``)."""

    def __init__(self, dev: SimDevice, s: SimStream) -> None:
        self._dev, self._s = dev, s

    @property
    def name(self) -> str:
        return self._s.name

    def wait_event(self, event: EventHandle) -> None:
        self._dev._sched.host_step(f"{self.name}.wait_event")
        self._dev._wait_marker(self._s, event._rec, "event")

    def wait_stream(self, stream: StreamHandle) -> None:
        sched = self._dev._sched
        sched.host_step(f"{self.name}.wait_stream({stream.name})")
        o = stream._s
        self._dev._wait_marker(self._s, EventRecord(o, o.enqueued, o.clock.copy()), f"stream {o.name}")

    def synchronize(self) -> None:
        a = self._dev._sched.host_step(f"{self.name}.synchronize")
        self._dev._sync_streams(a, [self._s])

    def query(self) -> bool:
        a = self._dev._sched.host_step(f"{self.name}.query")
        if self._s.idle():
            a.clock.join(self._s.clock)
            return True
        return False

    def record_event(self, event: EventHandle | None = None) -> EventHandle:
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

    def __init__(self, dev: SimDevice) -> None:
        self._dev = dev
        self._rec: EventRecord | None = None

    def record(self, stream: StreamHandle | None = None) -> None:
        sched = self._dev._sched
        a = sched.host_step("event.record")
        s = stream._s if stream is not None else a.current_stream
        self._rec = EventRecord(s, s.enqueued, s.clock.copy())
        sched.progress()

    def wait(self, stream: StreamHandle | None = None) -> None:
        (stream or self._dev.current_stream()).wait_event(self)

    def query(self) -> bool:
        a = self._dev._sched.host_step("event.query")
        if self._rec is None or self._rec.done():
            if self._rec is not None:
                a.clock.join(self._rec.clock)
            return True
        return False

    def synchronize(self) -> None:
        sched = self._dev._sched
        a = sched.host_step("event.synchronize")
        rec = self._rec
        if rec is not None:
            sched.block(a, f"an event on stream {rec.stream.name} (item {rec.position})", rec.done)
            a.clock.join(rec.clock)


class SharedValue:
    """A value shared between simulated processes (``multiprocessing.Value``)."""

    def __init__(self, dev: SimDevice, typecode: str, init: Any) -> None:
        self._dev = dev
        self.typecode = typecode
        self._value = init
        self._clock = VectorClock()

    @property
    def value(self) -> Any:
        a = self._dev._sched.host_step("Value.get")
        a.clock.join(self._clock)
        return self._value

    @value.setter
    def value(self, v: Any) -> None:
        sched = self._dev._sched
        a = sched.host_step("Value.set")
        self._clock.join(a.clock)
        if v != self._value:
            self._value = v
            sched.changed()


class SharedQueue:
    """A queue between simulated processes (``multiprocessing.Queue``); items carry clocks."""

    def __init__(self, dev: SimDevice) -> None:
        self._dev = dev
        self._items: deque[tuple[Any, VectorClock]] = deque()

    def put(self, item: Any) -> None:
        sched = self._dev._sched
        a = sched.host_step("Queue.put")
        self._items.append((item, a.clock.copy()))
        sched.changed()

    def get(self, timeout: float | None = None) -> Any:
        sched = self._dev._sched
        a = sched.host_step("Queue.get")
        sched.block(a, "an item on a queue", lambda: bool(self._items))
        item, clock = self._items.popleft()
        a.clock.join(clock)
        sched.changed()
        return item

    def empty(self) -> bool:
        self._dev._sched.host_step("Queue.empty")
        return not self._items


class ProcessHandle:
    """A spawned simulated process: a host actor with its own streams (``mp.Process``)."""

    def __init__(self, dev: SimDevice, target: Callable[..., Any], args: tuple[Any, ...], name: str) -> None:
        self._dev, self._target, self._args, self.name = dev, target, args, name
        self._actor: HostActor | None = None

    def start(self) -> None:
        dev = self._dev
        parent = dev._sched.host_step(f"Process.start({self.name})")
        self._actor = dev._sched.new_actor(self.name, parent)
        dev._sched.start_actor(self._actor, lambda: self._target(dev, *self._args), dev._enter)
        dev._sched.progress()

    def join(self, timeout: float | None = None) -> None:
        sched = self._dev._sched
        a = sched.host_step(f"Process.join({self.name})")
        child = self._actor
        if child is None:
            raise RuntimeError(f"process {self.name!r} joined before start()")
        sched.block(a, f"process {self.name} to exit", lambda: child.state == "done")
        a.clock.join(child.clock)

    def is_alive(self) -> bool:
        return self._actor is not None and self._actor.state != "done"

    @property
    def exitcode(self) -> int | None:
        return 0 if self._actor is not None and self._actor.state == "done" else None


class SimDevice:
    """The device contract on a deterministic simulated device."""

    device = torch.device("meta")

    def __init__(self, schedule: Schedule | None = None, config: SimConfig | None = None) -> None:
        self.schedule = schedule
        self.config = config or SimConfig()
        self._sched = Scheduler(self.config, schedule)
        self._ops = TensorOps(self._sched)
        self.memory_saver = SimMemorySaver(self)
        #: rank actors (and solo actors) -> their process group (see simdevice.collectives)
        self._worlds: dict[str, World] = {}
        self._ran = False

    # -- running -------------------------------------------------------------------------
    @contextlib.contextmanager
    def _enter(self) -> Iterator[None]:
        with SimMode(self._ops):
            yield

    def run(self, program: Callable[..., Any], *args: Any) -> Run:
        """Run ``program(dev, *args)`` as host actor ``host``; a SimDevice runs one program once."""
        if self._ran:
            raise RuntimeError("a SimDevice runs one program; make a new one per run")
        self._ran = True
        sched = self._sched
        main = sched.new_actor("host", None)
        sched.start_actor(main, lambda: program(self, *args), self._enter)
        # One intra-op thread: the simulated tensors are small, and each actor thread would otherwise bring an
        # OpenMP team of its own that spins against the others (measured: 3 ms vs 236 ms per run on 2 busy cores).
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            sched.begin()
            sched.finished.wait()
            for a in sched.actors.values():
                if a.thread is not None:
                    a.thread.join()
        finally:
            torch.set_num_threads(threads)
        return Run(
            result=main.result,
            reports=tuple(sched.memory.reports),
            op_counts=sched.op_counts(),
            unfired=sched.unfired(),
        )

    @property
    def trace(self) -> list[tuple[int, str, str]]:
        """Every host step and stream operation of the run, in virtual-time order."""
        return self._sched.trace

    @property
    def now_units(self) -> float:
        return self._sched.now / UNIT_NS

    # -- streams and events ----------------------------------------------------------------
    def Stream(self, name: str | None = None) -> StreamHandle:
        a = self._sched.current()
        return StreamHandle(self, self._sched.new_stream(a, name or f"s{len(a.streams)}"))

    def Event(self) -> EventHandle:
        return EventHandle(self)

    @contextlib.contextmanager
    def stream(self, s: StreamHandle) -> Iterator[StreamHandle]:
        a = self._sched.current()
        a.stream_stack.append(s._s)
        try:
            yield s
        finally:
            a.stream_stack.pop()

    def current_stream(self) -> StreamHandle:
        return StreamHandle(self, self._sched.current().current_stream)

    def default_stream(self) -> StreamHandle:
        a = self._sched.current()
        assert a.default_stream is not None
        return StreamHandle(self, a.default_stream)

    def synchronize(self) -> None:
        a = self._sched.host_step("synchronize")
        self._sync_streams(a, list(a.streams))

    def _sync_streams(self, a: HostActor, streams: list[SimStream]) -> None:
        targets = [(s, s.enqueued, s.clock.copy()) for s in streams]
        names = ", ".join(s.name for s in streams)
        self._sched.block(
            a, f"stream(s) {names} to finish", lambda: all(s.completed >= pos for s, pos, _ in targets)
        )
        for _, _, clock in targets:
            a.clock.join(clock)

    def _wait_marker(self, s: SimStream, rec: EventRecord | None, what: str) -> None:
        if rec is None:  # waiting on a never-recorded event is a no-op, as in CUDA
            return
        s.clock.join(rec.clock)
        marker = StreamOp(
            s, f"{what} recorded on stream {rec.stream.name} (item {rec.position})", -1, 0, ready=rec.done
        )
        self._sched.enqueue(s, marker)

    # -- host actors ---------------------------------------------------------------------------
    def Process(self, target: Callable[..., Any], args: tuple[Any, ...] = (), name: str = "worker") -> ProcessHandle:
        return ProcessHandle(self, target, args, name)

    def Value(self, typecode: str, init: Any) -> SharedValue:
        return SharedValue(self, typecode, init)

    def Queue(self) -> SharedQueue:
        return SharedQueue(self)

    def sleep(self, units: float) -> None:
        a = self._sched.host_step(f"sleep({units})")
        a.time += int(units * UNIT_NS)

    def empty_cache(self) -> None:
        """Release the caching allocator's free segments (``torch.cuda.empty_cache``)."""
        self._sched.host_step("empty_cache")
        self.memory_saver.empty_cache()

    # -- collectives ------------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return rank_of(self)

    @property
    def world_size(self) -> int:
        return world_size_of(self)

    def spawn_ranks(self, fn: Callable[..., Any], world_size: int, args: tuple[Any, ...] = ()) -> list[Any]:
        """Run ``fn(dev, *args)`` as host actors ``rank0..``, one process group; return their results."""
        return spawn_ranks(self, fn, world_size, args)

    def all_gather_into_tensor(
        self, output: torch.Tensor, input: torch.Tensor, async_op: bool = True
    ) -> SimWork | None:
        return all_gather_into_tensor(self, output, input, async_op)
