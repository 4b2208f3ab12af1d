"""The virtual-time loop: host actors, streams, delays, deadlock detection.

Host actors run one at a time: greenlets on the thread that started the
run (``SimConfig.actors``, the default), or Python threads (a run made with
``threads``, a program run as a ``with`` block, and a greenlet run that meets
torch state one thread cannot hold for two actors, which starts again on
threads: :mod:`simdevice.runtime.tls`). An actor runs its own code until it
makes a device call (a *host step*); there it hands the scheduler a step at
its virtual time and the scheduler processes everything that happens earlier
(stream operations starting and completing, other actors' steps) in
virtual-time order, ties broken by a fixed rule (completions, then starts,
then host steps; then actor creation order). Streams have no threads:
whichever actor holds control runs their operations inline, so a switch is
paid only when the running host actor changes. Both ways give the same run:
only how control passes differs.

A schedule's delay on a host actor postpones its k-th counted step; on a
stream, the start of its k-th counted operation. A host actor's consecutive
polls (queries and sleeps) are one counted step, its first
(:meth:`HostActor.count`), so a polling loop counts the same however long it
polls. No wall clock and no random state: one schedule gives one run.

When no actor can move (all blocked, nothing in flight), or when nothing but
polling has happened for ``SimConfig.stall_horizon_ns`` past the last thing due (a stall or an operation in
flight postpones it) and over more than ``POLLS`` host steps (one long sleep is no polling), the run ends with a
:class:`~simdevice.runtime.reports.Deadlock` naming what each actor waits for;
the actors' threads are unwound with :class:`SimAbort`, so a test never hangs.

This module orders *time*; what is ordered *before what* (vector clocks) is
:mod:`simdevice.runtime.sync`'s business.
"""

from __future__ import annotations

import contextlib
import heapq
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from simdevice.runtime import sync, tls
from simdevice.runtime.clock import VectorClock
from simdevice.runtime.config import UNIT_NS, SimConfig
from simdevice.runtime.memory import Memory
from simdevice.runtime.process_state import ProcessState
from simdevice.runtime.reports import Deadlock, HostError, ReportSink, StepLimit, describe, error_source, exit_succeeded
from simdevice.runtime.streams import SimStream, StreamOp
from simdevice.runtime.tls import NeedsThreads
from simdevice.signals import HOLDING, is_stop, raise_held

try:
    from greenlet import getcurrent as _getcurrent  # type: ignore[import-untyped]
    from greenlet import greenlet as _greenlet  # type: ignore[import-untyped]
except ImportError:  # pragma: no cover - greenlet is a dependency; without it every run is on threads
    _greenlet = None

#: torch's guard that turns off Python dispatch (modes and subclasses) for the calls made inside it
_NO_PYTHON_DISPATCH = torch._C._DisableTorchDispatch

#: per actor: {operation index: units}
Delays = Callable[[str], dict[int, int]]

_COMPLETE, _START, _HOST = 0, 1, 2
#: what a greenlet is switched to with when its turn comes (a finished child's next actor is anything else)
_RESUMED = object()
#: host steps without progress past the stall horizon that make a deadlock (a poll loop, not one long wait)
POLLS = 64


def _whole(move: Callable[..., Any], *args: Any) -> Any:
    """``move(*args)``, one of :mod:`tls`'s moves of torch's per-thread state, never cut halfway by a Ctrl-C or
    SIGTERM (it is held for the next safe point: :func:`simdevice.signals.raise_held`)."""
    HOLDING[0] += 1
    try:
        return move(*args)
    finally:
        HOLDING[0] -= 1


class SimAbort(BaseException):
    """Raised inside actor threads to unwind them when the run ends early."""


class _Finished:
    """A greenlet run's ``Execution.finished``: the run's own thread runs the whole run (``Execution.begin``), so
    the run is finished before anything waits for it (a ``threading.Event``, for a run on threads, is about 22,000
    instructions to make, a twenty-fifth of an empty run)."""

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set

    def wait(self) -> None:
        assert self._set, "a greenlet run waited for its end before it ended"


#: a greenlet run's actors' ``sem``, never used (``HostActor.sem``; typed as the semaphore a run on threads has)
_NO_SEMAPHORE: Any = None

#: modules whose names a distributed library binds per process (its process groups, its RNG tracker, its counters:
#: ``parallel_state.initialize_model_parallel()`` asserts the groups are not made yet), which each simulated process
#: has its own bindings of (:meth:`Execution.own_generator`); the processes share one interpreter
PROCESS_MODULES = (
    "megatron.core.parallel_state", "megatron.core.tensor_parallel.random", "megatron.core.num_microbatches_calculator",
    "megatron.core.global_vars", "megatron.training.global_vars", "apex.transformer.parallel_state",
    "deepspeed.utils.groups", "fairscale.nn.model_parallel.initialize", "vllm.distributed.parallel_state",
    "sglang.srt.distributed.parallel_state",
    # torch's own: Distributed Checkpoint's saving process (``AsyncCheckpointerType.PROCESS``), one per process
    "torch.distributed.checkpoint._async_process_executor",
)


#: the other module-level state each simulated process has its own of, in the modules that use torch (the globals a
#: module's functions rebind, the class attributes they assign, their default arguments' contents:
#: :mod:`simdevice.runtime.process_state`)
PROCESS_STATE = ProcessState(PROCESS_MODULES)


def process_modules() -> list[tuple[str, Any]]:
    """The :data:`PROCESS_MODULES` imported so far."""
    return [(name, m) for name in PROCESS_MODULES if (m := sys.modules.get(name)) is not None]


#: each of :data:`PROCESS_MODULES`' bindings as this interpreter first saw them (at the start of the first run after
#: its import, or at the first turn of a second process in a run it was imported in): what a process of a run starts
#: from, as a fresh process imports the library afresh, whatever earlier runs of one process bound there
_FIRST_SEEN: dict[str, tuple[Any, dict[str, Any]]] = {}


def _seen(name: str, m: Any) -> dict[str, Any]:
    first = _FIRST_SEEN.get(name)
    if first is None or first[0] is not m:  # (a module imported again, reloaded: seen afresh)
        first = _FIRST_SEEN[name] = (m, dict(vars(m)))
    return first[1]


class HostActor:
    """A host thread of one simulated process (the trainer, a worker, a rank)."""

    def __init__(self, name: str, order: int, delays: dict[int, int]) -> None:
        self.name = name
        #: the process it runs in: its own name, or for a thread the program started (``threading.Thread``), its
        #: process's; what is a process's (its streams, allocator, pinned memory, rank) is that process's
        self.process = name
        self.order = order
        #: its turn, handed to its thread (``Execution.new_actor`` makes it for a run on threads: a greenlet run's
        #: actors take turns by switching; a semaphore is about 22,000 instructions to make, a twenty-fifth of an
        #: empty run)
        self.sem: threading.Semaphore = _NO_SEMAPHORE
        self.thread: threading.Thread | None = None
        #: the actor's greenlet (a greenlet run), and its torch state while it is not running
        self.glet: Any = None
        self.hold: tls.Hold = None
        #: when it last stopped (a greenlet run unwinds the last stopped first)
        self.stopped = 0
        #: its CPU generator's state while another actor holds the generator (``Execution.own_generator``)
        self.rng_state: torch.Tensor | None = None
        #: its process's bindings of each of :data:`PROCESS_MODULES` while another process runs
        self.modules: dict[str, dict[str, Any]] = {}
        #: its process's module-level state while another process runs (:data:`PROCESS_STATE`)
        self.module_state: list[Any] = []
        #: whether its process has more than one host thread (it is a thread the program started, or started one):
        #: what one thread frees another may take (``CachingAllocator.dropped``)
        self.threaded = False
        #: its ``threading.local`` values while another actor of a greenlet run holds the thread
        #: (``Execution.own_locals``)
        self.locals: dict[str, Any] = {}
        self.time = 0
        #: counted host steps so far (a schedule's index of the next one)
        self.steps = 0
        #: whether the last host step was a poll (a query or a sleep): a poll after it is not counted
        self.polling = False
        self.state = "new"
        self.wait_desc = ""
        self.wait_pred: Callable[[], bool] | None = None
        self.last_step = "start"
        self.clock = VectorClock()
        self.delays = delays
        self.fired: set[int] = set()
        #: each counted step's measured cost (``SimConfig.host_trace``), or None; whether the last step's cost
        #: came from it (then it already holds the host's time until the next step, whatever the step did)
        self.trace: tuple[int, ...] | None = None
        self.traced = False
        #: what one of its steps costs (``host_step_ns``, or ``spawned_host_step_ns`` for a spawned process)
        self.step_ns = 0
        self.default_stream: SimStream | None = None
        self.stream_stack: list[SimStream] = []
        #: the drop-in's record of its current stream by autograd sequence number: (the first sequence number a node
        #: made on the stream gets, the stream), ascending; before the first, its default stream
        #: (``dropin.facade._Engine``: a node's backward runs on the stream current when it was made)
        self.forward_streams: list[tuple[int, SimStream]] = []
        self.streams: list[SimStream] = []
        #: unnamed streams made so far (they are called s1, s2, ...)
        self.unnamed = 0
        self.result: Any = None
        #: a daemonic process or thread (``daemon=True``): it ends with the run's other actors
        self.daemon = False
        #: sleeps it took since the run's host step count was ``sleeps[0]`` (:meth:`Runtime.host_sleeps`)
        self.sleeps = (-1, 0)

    def count(self, poll: bool) -> int | None:
        """Count one host step; its index, or None where it is not counted. ``poll``: a step that only observes
        (a query: a shared value read, ``Queue.empty``, an event's or a stream's ``query``, ``is_completed``) or
        a sleep. Consecutive polls count as one operation, the first: a poll right after a poll has no index
        (and no delay); any other step counts, and the next poll counts again. The same rule as
        ``reference.cuda._Counter.next``, so a schedule's index names the same step on both machines."""
        if poll and self.polling:
            return None
        self.polling = poll
        self.steps += 1
        return self.steps - 1

    @property
    def current_stream(self) -> SimStream:
        assert self.default_stream is not None
        return self.stream_stack[-1] if self.stream_stack else self.default_stream

    def __repr__(self) -> str:
        return f"<actor {self.name}>"



#: ``Thread.start`` as threading defines it: the run's own actor threads start with it, unchecked
_THREAD_START = threading.Thread.start


def start_own_thread(thread: threading.Thread) -> None:
    """Start a thread of the simulator's own: never taken for one the program started (a run patches
    ``Thread.start`` to mark those)."""
    _THREAD_START(thread)


class _ProgramThread(TorchDispatchMode):
    """The mode a thread the program starts during a run runs under: the simulator does not order that thread's host
    accesses against the streams, so an op of it on memory the run owns (pinned) is refused with the reason, where
    it would otherwise go unchecked. (An op on a device tensor is refused by the tensor itself.)"""

    def __init__(self, owned: Callable[[torch.Tensor], Any], live: list[bool]) -> None:
        super().__init__()
        self.owned, self.live = owned, live

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if self.live[0]:
            for x in (*args, *kwargs.values()):
                for t in x if isinstance(x, (list, tuple)) else (x,):
                    if isinstance(t, torch.Tensor) and self.owned(t) is not None:
                        raise RuntimeError(outside_actor())
        return func(*args, **kwargs)


class _UnraisableReported:
    """``Execution.unraisable_reported``'s block (a class: a ``contextlib.contextmanager`` costs each run about 9,000
    instructions more)."""

    __slots__ = ("_ex", "_previous", "_previous_thread_hook")

    def __init__(self, ex: Execution) -> None:
        self._ex = ex

    def __enter__(self) -> None:
        ex = self._ex
        previous = self._previous = sys.unraisablehook

        def hook(u: Any) -> None:
            a = ex.current_or_none()
            if isinstance(u.exc_value, SimAbort):
                return  # the run is ending: what a finalizer was doing then stops there, as the actors do
            if a is None or u.exc_value is None or isinstance(u.exc_value, KeyboardInterrupt):
                # no actor's (a stop, which lands in an actor's greenlet, is the command's: signals.py keeps it)
                previous(u)
                return
            where = getattr(u.object, "__qualname__", None) or type(u.object).__name__
            e = u.exc_value
            ex.reports.add(
                HostError(a.name, f"{describe(e)} (in {where}, where Python ignores it)", error_source(e))
            )

        previous_thread_hook = self._previous_thread_hook = threading.excepthook

        def thread_hook(args: Any) -> None:
            # a thread the program started (no actor: the run's actors are its processes and ranks) raised, which
            # Python would only print: a host error of the run, named after the thread
            if args.exc_type is SystemExit or ex.current_or_none() is not None:
                previous_thread_hook(args)
                return
            name = args.thread.name if args.thread is not None else "?"
            e = args.exc_value
            ex.reports.add(HostError(f"thread {name}", describe(e) if e is not None else args.exc_type.__name__,
                                     error_source(e) if e is not None else "?"))

        sys.unraisablehook = hook
        threading.excepthook = thread_hook

    def __exit__(self, *exc: object) -> None:
        sys.unraisablehook = self._previous
        threading.excepthook = self._previous_thread_hook


#: the drop-in's, while a session is installed: given a thread the program starts in a run, starts it as a host
#: actor of the run and says True, or says False (a thread the simulator does not run: see :class:`_ProgramThread`)
thread_actor: Callable[[threading.Thread], bool] | None = None


class _ThreadsChecked:
    """``Execution.program_threads_checked``'s block (a class, as :class:`_UnraisableReported`)."""

    __slots__ = ("_live", "_owned")

    def __init__(self, owned: Callable[[torch.Tensor], Any]) -> None:
        self._owned = owned
        self._live = [True]

    def __enter__(self) -> None:
        owned, live = self._owned, self._live

        def start(thread: threading.Thread) -> None:
            if thread_actor is not None and thread_actor(thread):
                return
            body = thread.run

            def checked() -> None:
                with _ProgramThread(owned, live):
                    body()

            thread.run = checked  # type: ignore[method-assign]
            _THREAD_START(thread)

        threading.Thread.start = start  # type: ignore[method-assign,assignment]

    def __exit__(self, *exc: object) -> None:
        self._live[0] = False
        threading.Thread.start = _THREAD_START  # type: ignore[method-assign]


def outside_actor() -> str:
    """Why a simulated device call from outside the run's actors fails: from a thread the program started, or from
    no run at all."""
    if threading.current_thread() is not threading.main_thread():
        return (f"simdevice: the simulated device was used from a thread the program started "
                f"({threading.current_thread().name}) that the simulator does not run: it runs the threads the "
                "program's own code starts (threading.Thread, its ThreadPoolExecutor's workers), not those the "
                "standard library or torch starts for itself (a pool made inside torch): do this work in a "
                "threading.Thread of the program's, or on the function's own thread")
    return "simulated device call outside a simulated host actor (use SimDevice.run)"


#: why a stream, event or tensor of a run that is over cannot be used (no verdict: ``explain`` reads the prefix)
EARLIER_RUN = ("simdevice: a stream, event or tensor made by an earlier run was used: the program keeps it across "
               "runs (in an object, a class or another module; the target's own module starts afresh at each run); "
               "make it in the run, as each process does")

class Execution:
    """Virtual time, the host actors and the streams of one run."""

    def __init__(self, config: SimConfig, delays: Delays, memory: Memory, reports: ReportSink) -> None:
        self.config = config
        self._delays = delays
        #: the run is over: what its actors made (streams, events, tensors) belongs to an earlier run from now on
        self.over = False
        self.now = 0
        self._heap: list[tuple[int, int, int, int, Any]] = []
        self._seq = 0
        self.actors: dict[str, HostActor] = {}
        self.streams: dict[str, SimStream] = {}
        self._by_order: dict[int, SimStream] = {}
        self.memory = memory
        self.reports = reports
        self.blocked: list[HostActor] = []
        self.trace: list[tuple[int, str, str]] = []
        #: actors as greenlets on the thread that starts the run (else threads); the running one
        self.greenlets = config.actors == "greenlet" and _greenlet is not None
        #: set when the run is over (:meth:`on_threads` makes it an event the threads wait for)
        self.finished: threading.Event | _Finished = _Finished() if self.greenlets else threading.Event()
        self.aborting = False
        self._lock = threading.Lock()
        self._live = 0
        self.last_progress = 0
        #: host steps since the last progress: a deadlock is polling, so it takes more than ``POLLS`` of them
        self.steps_since_progress = 0
        #: timed waits that passed their whole time alone (:meth:`idle_wait`) since the last progress
        self.idle_waits = 0
        self.host_steps = 0
        self._local = threading.local()
        #: True while stream operations are applied (their aten calls are not the program's)
        self.in_engine = False
        self._cur: HostActor | None = None
        self._hub: Any = None
        #: the greenlet run is going; torch.ops calls are counted in it (``tls.count_op_calls``: two actors or more)
        self._greenlet_run = self._counting = False
        self._thread = threading.get_ident()
        self._switches = 0
        self._engine = tls.EngineWatch()
        #: why a greenlet run must start again on threads; an interrupt that reached an actor's greenlet
        self.needs_threads: str | None = None
        self._interrupt: BaseException | None = None
        self._traces = dict(config.host_trace)
        self._starts = dict(config.host_starts)
        #: the actor (a process's: a thread draws from its process's) whose state torch's CPU generator holds
        self._rng_owner: HostActor | None = None
        #: the actor whose ``threading.local`` values the run's thread holds (a greenlet run; None before its first)
        self._locals_owner: HostActor | None = None
        self._first: HostActor | None = None
        #: the CPU generator's state as the run began (the runtime's, where it keeps the generator; else taken at the
        #: first actor's start)
        self.rng_start: torch.Tensor | None = None
        #: whether a second process has had the :data:`PROCESS_MODULES` (:meth:`modules_back`)
        self.modules_moved = False
        for name, m in process_modules():
            _seen(name, m)
        PROCESS_STATE.tracked()  # (the modules imported since the last run: their state as the run finds it)
        PROCESS_STATE.begin()

    def on_threads(self) -> None:
        """The run's actors are threads (before any is made): a program run as a ``with`` block
        (``Runtime.here``) runs where it is, on the calling thread, and the actors it spawns get threads."""
        assert not self.actors
        self.greenlets = False
        self.finished = threading.Event()

    @contextlib.contextmanager
    def device_side(self) -> Iterator[None]:
        """Work the device does on its own bytes (a stream operation's effect, an unmap): no access of the program.
        Its aten calls, on plain CPU tensors, skip Python dispatch (the dispatch mode would only let them through)."""
        prev, self.in_engine = self.in_engine, True
        try:
            with _NO_PYTHON_DISPATCH():
                yield
        finally:
            self.in_engine = prev

    # -- actors and streams ------------------------------------------------------
    def graph_task(self, task: int) -> int:
        """What ``torch._C._current_graph_task_id()`` answers the running actor where the thread is inside ``task``:
        in a greenlet run, not another actor's, suspended inside its backward (:meth:`tls.EngineWatch.seen_by`)."""
        if not self.greenlets or task == -1:
            return task
        return self._engine.seen_by(self.current_or_none(), task)

    def current(self) -> HostActor:
        # (current_or_none, inline: one comes with every host step)
        if self.greenlets:
            a = self._cur if threading.get_ident() == self._thread else None
        else:
            a = getattr(self._local, "actor", None)
        if a is None:
            raise RuntimeError(EARLIER_RUN if self.over else outside_actor())
        return a

    def current_or_none(self) -> HostActor | None:
        if self.greenlets:
            # another thread (one the program started) is no actor, as it is not on threads
            return self._cur if threading.get_ident() == self._thread else None
        return getattr(self._local, "actor", None)

    def new_stream(self, actor: HostActor, name: str) -> SimStream:
        full = name if actor.process == "host" else f"{actor.process}.{name}"
        if full in self.streams or full in self.actors:
            raise ValueError(f"a stream or actor named {full!r} already exists")
        s = SimStream(full, actor.process, len(self.streams) + len(self.actors) + 1)
        s.delays = self._delays(full)
        self.streams[full] = s
        self._by_order[s.order] = s
        actor.streams.append(s)
        return s

    def stream_by_order(self, order: int) -> SimStream | None:
        return self._by_order.get(order)

    def new_actor(self, name: str, parent: HostActor | None, process: bool = False,
                  thread: bool = False) -> HostActor:
        """A host actor; ``parent``: the actor whose step started it; ``process``: a spawned process of its own
        (``Process``), with the start and the pace of one where the config has them (``spawn_start_ns``,
        ``spawned_host_step_ns``); ``thread``: a thread of ``parent``'s process (``threading.Thread``), which
        shares its streams (a new thread's current stream is the device's default stream) and its pace."""
        if name in self.actors or name in self.streams:
            raise ValueError(f"an actor or stream named {name!r} already exists")
        a = HostActor(name, len(self.streams) + len(self.actors) + 1, self._delays(name))
        if not self.greenlets:
            a.sem = threading.Semaphore(0)
        self.actors[name] = a
        a.trace = self._traces.get(name)
        a.step_ns = (process and self.config.spawned_host_step_ns) or self.config.host_step_ns
        if thread and parent is not None:
            owner = self.actors[parent.process]
            owner.threaded = a.threaded = True
            a.process, a.step_ns = owner.name, parent.step_ns
            a.default_stream, a.streams = owner.default_stream, owner.streams  # (one list: the process's streams)
        else:
            a.default_stream = self.new_stream(a, "default")
        if parent is not None:
            sync.spawned(parent, a)
            start = self._starts.get(name) or (self.config.spawn_start_ns if process else 0)
            a.time = self.now + (start or parent.step_ns)
            if start:  # a start measured or profiled: the parent polling for it meanwhile is waiting, no deadlock
                self.waiting_until(a.time)
        return a

    def start_actor(self, a: HostActor, body: Callable[[], Any], enter: Callable[[], Any]) -> None:
        """Create ``a``'s greenlet or thread; it runs ``body`` once the scheduler gives it its first turn."""
        if self.greenlets:
            self._start_greenlet(a, body, enter)
            return

        def main() -> None:
            a.sem.acquire()
            self._local.actor = a
            try:
                self._body(a, body, enter)
            finally:
                self._exit(a)

        a.state = "ready"
        a.thread = threading.Thread(target=main, name=f"sim-{a.name}", daemon=True)
        with self._lock:
            self._live += 1
        self._push(a.time, _HOST, a.order, a)
        _THREAD_START(a.thread)  # the run's own thread: not one the program started

    def _start_greenlet(self, a: HostActor, body: Callable[[], Any], enter: Callable[[], Any]) -> None:
        if self._hub is None:
            self._hub = _getcurrent()  # the run's own greenlet: every actor's parent, which unwinds them
        if self._greenlet_run and not self._counting:  # a second actor: one may stop inside an op call for another
            self._counting = True
            tls.count_op_calls()

        def main(_: Any) -> HostActor | None:
            # a fresh actor starts with a fresh thread's torch state: the greenlet that stopped took its own off
            a.hold = _whole(tls.hold)
            self._body(a, body, enter)
            _whole(tls.release, a.hold)
            return self._exit(a)

        a.state = "ready"
        a.glet = _greenlet(main, parent=self._hub)
        self._live += 1
        self._push(a.time, _HOST, a.order, a)

    def _body(self, a: HostActor, body: Callable[[], Any], enter: Callable[[], Any]) -> None:
        """Run actor ``a``'s code to its end; what it raises ends the run (its own error, reported)."""
        try:
            if self.aborting:
                raise SimAbort
            self.own_generator(a)
            if self.greenlets:
                self.own_locals(a)
            with enter():
                a.state = "running"
                a.result = body()
        except SimAbort:
            pass
        except NeedsThreads as e:  # a greenlet run's: it starts again on threads
            self.needs_threads = self.needs_threads or str(e)
            self._abort()
        except SystemExit as e:
            # ``sys.exit()``, ``sys.exit(0)``: a script's main that ends so has succeeded, as ``python SCRIPT`` does;
            # a thread the program started ends quietly at any ``SystemExit``, as Python's threads do
            if a.process == a.name and not exit_succeeded(e):
                self.reports.add(HostError(a.name, describe(e), error_source(e)))
                self._abort()
        except BaseException as e:
            if self.greenlets and isinstance(e, KeyboardInterrupt) and is_stop(e):
                # Ctrl-C or SIGTERM (signals.py) lands in whichever greenlet runs: the run's, as on threads, where
                # it reaches the starting thread alone
                self._interrupt = self._interrupt or e
            else:  # the program's own error: report it, end the run
                self.reports.add(HostError(a.name, describe(e), error_source(e)))
            self._abort()

    def own_generator(self, a: HostActor) -> None:
        """Actor ``a`` goes on: torch's CPU generator (host random numbers: ``torch.randn`` on the CPU, a module's
        initial weights) holds ``a``'s own state, as each process of a real world has a generator of its own. The
        actor that held it keeps where it stopped; an actor's first turn starts from the generator as the run
        found it, as each process starts from the same default seed, so ranks seeded alike (or not at all) draw
        alike whatever the schedule. Before, the actors shared one generator: a rank's draws moved another's
        numbers, so seeded ranks built different weights once their draws interleaved. A thread the program started
        shares its process's. So do the :data:`PROCESS_MODULES`' bindings: the run's first process has them as the
        run found them, every other starts from them as this interpreter first saw them (a fresh process's), and
        each keeps its own (a rank's ``initialize_model_parallel()`` is not another's)."""
        a = self.actors.get(a.process, a)  # (a thread the program started draws from its process's)
        owner = self._rng_owner
        if owner is a:
            return
        gen = torch.default_generator
        if owner is None:  # the run's first actor: the generator is as the run found it
            if self.rng_start is None:
                self.rng_start = gen.get_state()
        else:
            owner.rng_state = gen.get_state()
            state = a.rng_state if a.rng_state is not None else self.rng_start
            assert state is not None
            gen.set_state(state)
            self._own_modules(owner, a)
        self._rng_owner = a

    def _own_modules(self, owner: HostActor, a: HostActor) -> None:
        """Process ``a`` goes on after ``owner``'s: each of :data:`PROCESS_MODULES` holds ``a``'s bindings (the
        same dict, its contents changed: the module's functions read their globals from it)."""
        for name, m in process_modules():
            d = vars(m)
            start = _seen(name, m)  # (imported in the run: as first seen)
            owner.modules[name] = dict(d)
            mine = a.modules.get(name, start)
            d.clear()
            d.update(mine)
            self.modules_moved = True
        if PROCESS_STATE.tracked():
            PROCESS_STATE.move(owner.module_state, a.module_state)
            self.modules_moved = True

    def modules_back(self) -> None:
        """The run is over: the :data:`PROCESS_MODULES` hold the run's first process's bindings (the caller's, which
        in a run of ranks bound nothing: the next run's ranks start from them as fresh processes do), where another
        process had them last."""
        first = next(iter(self.actors.values()), None)
        if self.modules_moved and first is not None and self._rng_owner is not None and self._rng_owner is not first:
            self._own_modules(self._rng_owner, first)

    def own_locals(self, a: HostActor) -> None:
        """Actor ``a`` of a greenlet run goes on: the thread holds its ``threading.local`` values (the program's, a
        library's), as a thread of its own would: a thread the program started sees its own, not its starter's. The
        run's first actor has the values of the thread that started the run; every other starts with none. The
        actor that held them keeps them until its next turn (:func:`tls.take_locals`)."""
        owner = self._locals_owner
        if owner is a:
            return
        if owner is None:  # the run's first actor: the thread's values are its own
            self._locals_owner = self._first = a
            return
        owner.locals = tls.take_locals()
        tls.put_locals(a.locals)
        a.locals = {}
        self._locals_owner = a

    def locals_back(self) -> None:
        """The run's greenlets are done: the thread holds its own ``threading.local`` values again (its first
        actor's)."""
        if self._first is not None:
            self.own_locals(self._first)

    def generator_back(self) -> None:
        """The run is over: torch's CPU generator holds the run's first actor's state again (the caller's code, for
        a program run as a ``with`` block, goes on from its own draws)."""
        first = next(iter(self.actors.values()), None)
        if first is not None and self._rng_owner is not None and self._rng_owner is not first:
            self.own_generator(first)

    def adopt(self, a: HostActor) -> None:
        """The calling thread is actor ``a`` from now on, and has the first turn (``start_actor`` without a new
        thread: a program written as a ``with`` block runs where it is)."""
        self._local.actor = a
        assert not self.greenlets, "a program run as a with block has its actors on threads"
        a.thread = threading.current_thread()
        a.state = "running"
        self.own_generator(a)
        with self._lock:
            self._live += 1

    def leave(self, a: HostActor, error: BaseException | None) -> None:
        """The adopted actor ``a`` is done (``error``: what its code raised): the rest of the run goes on to its
        end, then the calling thread is no actor any more."""
        if isinstance(error, (KeyboardInterrupt, SystemExit)):
            self._abort()  # the run ends here, unreported; the caller raises it again
        elif error is not None and not isinstance(error, SimAbort):
            self.reports.add(HostError(a.name, describe(error), error_source(error)))
            self._abort()
        self._exit(a)
        self.finished.wait()
        self.generator_back()
        self._local.actor = None

    def _exit(self, a: HostActor) -> HostActor | None:
        """``a`` is done; on threads, hand the next actor its turn; in a greenlet run, return it (its greenlet's
        result, which goes to the run's greenlet)."""
        a.state = "done"
        with self._lock:
            self._live -= 1
            last = self._live == 0
        if self.aborting:
            if last:
                self.finished.set()
            return None
        self.progress()
        self._wake_blocked()
        if self.greenlets:
            return self._next()
        self._dispatch()
        return None

    # -- the event heap -------------------------------------------------------------
    def _push(self, t: int, prio: int, order: int, obj: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, prio, order, self._seq, obj))

    def _process_stream_events(self, prio: int, s: SimStream) -> bool:
        """Run one stream event, then those that follow it at the top of the heap, up to the next host turn (or
        none left); False when an operation raised (reported, and the run is ending)."""
        # Stream work is the device's, not a host step: its aten calls on the CPU bytes skip the dispatch mode (as
        # device_side, inline, and once for a run of events: two come with every operation)
        heap = self._heap
        failed: tuple[SimStream, Exception] | None = None
        prev, self.in_engine = self.in_engine, True
        try:
            with _NO_PYTHON_DISPATCH():
                while True:
                    try:
                        self._stream_event(prio, s)
                    except SimAbort:
                        raise
                    except Exception as e:  # the op itself failed (a dtype, a shape): the run's error, never a hang
                        failed = s, e
                        break
                    if not heap or heap[0][1] == _HOST:
                        break
                    t, prio, _, _, s = heapq.heappop(heap)  # (_pop, inline)
                    self.now = t
        finally:
            self.in_engine = prev
        if failed is not None:
            s, e = failed
            op = s.running or (s.queue[0] if s.queue else None)
            what = f" in {op.desc}" if op is not None else ""
            self.reports.add(HostError(f"stream {s.name}", f"{describe(e)}{what}",
                                       error_source(e, op.source if op is not None else None)))
            self._abort()
            return False
        return True

    def _stream_event(self, prio: int, s: SimStream) -> None:
        # two of these come with every operation: waiting_until, _push and progress are inline
        now = self.now
        memory = self.memory
        if prio == _START:
            op = s.queue[0]
            s.running = op
            end = now + op.duration
            memory.start(op.issued, now, end, op.sweeps)
            if op.start is not None:
                in_flight = memory.in_flight
                in_flight.starting = op.issued
                try:
                    op.start()
                finally:
                    in_flight.starting = None
            self.trace.append((now, s.name, "start " + op.desc))
            if end > self.last_progress:
                self.last_progress = end
            self._seq += 1
            heapq.heappush(self._heap, (end, _COMPLETE, s.order, self._seq, s))
        else:
            op = s.queue.popleft()
            memory.finish(op.issued)
            try:
                if op.finish is not None:
                    op.finish()  # may raise (the op's own error, named by s.running)
            finally:
                memory.in_flight.landing = None
            s.running = None
            s.complete_one(now)
            s.busy = False
            self.trace.append((now, s.name, "done " + op.desc))
            if now > self.last_progress:
                self.last_progress = now
            self.steps_since_progress = self.idle_waits = 0
            if self.blocked:
                self._wake_blocked()
            self.kick_all()

    def _pop(self) -> tuple[int, Any] | None:
        if not self._heap:
            return None
        t, prio, _, _, obj = heapq.heappop(self._heap)
        self.now = t
        return prio, obj

    def _next(self) -> HostActor | None:
        """Run events until some actor's turn comes: that actor (or None: the run is over or ending)."""
        while True:
            ev = self._pop()
            if ev is None:
                if any(a.state != "done" for a in self.actors.values()):
                    self._deadlock()
                elif any(s.queue for s in self.streams.values()):
                    # every host is done, and work is left on a stream that nothing can ever release (a collective
                    # a rank never joined, a wait for what never comes): on a GPU the process never finishes
                    self._deadlock("the run ended with stream work that can never run")
                else:
                    self.finished.set()
                return None
            prio, obj = ev
            if prio == _HOST:
                return obj  # type: ignore[no-any-return]
            if not self._process_stream_events(prio, obj):
                return None

    def _dispatch(self) -> None:
        """On threads: run events until some actor's turn comes and hand it control (or end the run)."""
        nxt = self._next()
        if nxt is not None:
            nxt.sem.release()

    def _wait_turn(self, a: HostActor) -> None:
        if self.aborting:
            raise SimAbort
        while True:
            ev = self._pop()
            if ev is None:
                self._deadlock()
                raise SimAbort
            prio, obj = ev
            if prio == _HOST:
                if obj is not a:
                    if self.greenlets:
                        self._switch(a, obj)
                    else:
                        obj.sem.release()
                        a.sem.acquire()
                if self.aborting:
                    raise SimAbort
                if self._rng_owner is not a:  # (own_generator's test, inline: it comes with every host step)
                    self.own_generator(a)
                if self._locals_owner is not a and self.greenlets:
                    self.own_locals(a)
                return
            if not self._process_stream_events(prio, obj):
                raise SimAbort

    # -- greenlets ------------------------------------------------------------------------------------
    def _switch(self, a: HostActor, to: HostActor) -> None:
        """Actor ``a`` stops, ``to`` goes on; returns when ``a``'s turn comes again (or the run unwinds it)."""
        try:
            self._engine.leaving(a)  # raises NeedsThreads before anything moved
            inside = tls.in_op_call()
            if inside is not None:
                raise NeedsThreads(inside)
        except NeedsThreads as e:
            # the run starts again on threads whatever the program makes of the error on its way out (a finally
            # that takes a lock, DeepSpeed's backward, met SimAbort and put it in this one's place)
            self.needs_threads = self.needs_threads or str(e)
            self._abort()
            raise
        holding = HOLDING  # (_whole, inline: two of these come with every switch)
        holding[0] += 1
        try:
            state = tls.take(a.hold)
        finally:
            holding[0] -= 1
        self._switches += 1
        a.stopped = self._switches
        try:
            self._hand(to, a)
        finally:
            holding[0] += 1
            try:
                a.hold = tls.put(state)
            finally:
                holding[0] -= 1
            self._cur = a
        raise_held()  # a stop that came while the state moved: here, where this actor's is whole again

    def _hand(self, to: HostActor | None, me: HostActor | None) -> None:
        """Give control to ``to``; come back when ``me``'s turn comes (``me`` None: the run's greenlet, which a
        finished actor's greenlet returns to with the next actor, until there is none)."""
        while to is not None and to is not me:
            self._cur = to
            nxt = to.glet.switch(_RESUMED)
            if nxt is _RESUMED:
                return  # someone gave ``me`` its turn
            to = nxt  # an actor ended (only the run's greenlet hears of it): the next one it named
        self._cur = me

    def _run_greenlets(self) -> None:
        """The run's greenlet: run the actors to the end, then unwind those an early end left stopped (the last
        stopped first: an actor stopped inside a backward nests in the engine's state as it does on its stack)."""
        # the caller's torch state is not the actors' (a thread of theirs would not have it)
        mine, fresh = _whole(tls.leave_caller)
        try:
            self._greenlet_run = True  # (the run begins with its one host actor: ranks and processes start in it)
            self._hand(self._next(), None)
        finally:
            self._greenlet_run = False
            if self.aborting:
                self._unwind()
            self.locals_back()
            if self._counting:
                self._counting = False
                tls.uncount_op_calls()
            _whole(tls.back_to_caller, mine, fresh)
        if self._interrupt is not None:
            raise self._interrupt
        raise_held()

    def _unwind(self) -> None:
        while True:
            stopped = [a for a in self.actors.values() if a.state != "done" and a.glet is not None]
            if not stopped:
                break
            a = max(stopped, key=lambda x: (bool(x.glet), x.stopped))
            if not a.glet:  # never started: nothing of it ran
                a.glet = None
                a.state = "done"
                self._live -= 1
                continue
            self._cur = a
            self.own_locals(a)
            a.glet.switch(_RESUMED)  # it raises SimAbort where it stopped, unwinds, and ends
        self._cur = None
        self.finished.set()

    def unraisable_reported(self) -> _UnraisableReported:
        """While the run goes on, an exception Python would only print and ignore (raised in a ``__del__`` or a
        weakref callback of an actor, or in a thread the program started) is a host error of the run: never
        swallowed."""
        return _UnraisableReported(self)

    def program_threads_checked(self, owned: Callable[[torch.Tensor], Any]) -> _ThreadsChecked:
        """While the run goes on, a thread the program starts runs under :class:`_ProgramThread`: its ops on memory
        ``owned`` names (the run's pinned memory) are an error naming the thread, not unchecked host accesses."""
        return _ThreadsChecked(owned)

    def begin(self) -> None:
        """Called by the thread that starts a run: give the first actor its turn (a greenlet run: run it all)."""
        if self.greenlets:
            self._run_greenlets()
        else:
            self._dispatch()

    def join_threads(self) -> None:
        if self.greenlets:
            return
        me = threading.current_thread()
        for a in self.actors.values():
            if a.thread is not None and a.thread is not me:
                a.thread.join()

    def interrupt(self) -> None:
        """The thread that started the run was interrupted (Ctrl-C, a signal's exception): end the run and let
        every actor's thread unwind (its ``finally`` blocks run) before the interrupt goes on, so that no thread is
        left inside torch when the interpreter exits. An actor running code that never reaches the device is
        waited for; a second interrupt stops the wait."""
        self._abort()
        if self.greenlets:
            if _getcurrent() is self._hub:
                self._unwind()
            return
        self.join_threads()

    # -- host steps --------------------------------------------------------------------
    def host_step(self, desc: str, poll: bool = False, engine: bool = False) -> HostActor:
        """One host step of the current actor at its virtual time (after its delay, if any). ``poll``: a query or
        a sleep (:meth:`HostActor.count`); one that is not counted is a step all the same (its host time, a
        scheduling point, the trace, the step limit, the deadlock horizon), with no delay. ``engine``: issued by
        autograd's engine, so it comes ``engine_step_ns`` after the actor's last step rather than ``host_step_ns``
        (where the config sets one)."""
        a = self.current()
        if self.aborting:
            raise SimAbort
        if a.daemon and all(b.daemon for b in self.actors.values() if b.state != "done"):
            # a daemon still running when every other actor is done ends with them, as its parent's exit
            # terminates a daemonic process and the interpreter's end a daemon thread: the run ends here
            self._abort()
            raise SimAbort
        k = a.count(poll)
        self.host_steps += 1
        ready = a.time
        if engine and self.config.engine_step_ns and not a.traced:
            # a.time is the last step's time plus its step (the actor ran nothing else since, nor did anyone)
            ready = max(self.now, ready - a.step_ns + self.config.engine_step_ns)
        delay = 0
        if k is not None and k in a.delays:
            delay = a.delays[k] * UNIT_NS
            a.fired.add(k)
            self.trace.append((max(ready, self.now), a.name, f"stall {a.delays[k]} units before #{k}"))
            self.waiting_until(ready + delay)
        t = ready + delay
        top = self._heap[0] if self._heap else None
        # (``top[:3] > (t, _HOST, a.order)``, without the two tuples: the time alone decides most steps)
        if top is None or top[0] > t or (top[0] == t and (top[1] > _HOST or (top[1] == _HOST and top[2] > a.order))):
            self.now = t  # nothing comes before this step: its turn, without a trip through the heap
        else:
            self._push(t, _HOST, a.order, a)
            self._wait_turn(a)
        cost = a.step_ns
        if a.trace is not None:
            a.traced = k is not None and k < len(a.trace)
            if a.traced:
                cost = a.trace[k]  # type: ignore[index]
        a.time = self.now + cost
        a.last_step = desc
        sync.host_step(a, a.name)
        self.trace.append((self.now, a.name, desc))
        if self.host_steps > self.config.max_host_steps:
            if self._only_polling():
                # the bound cut a poll loop short of the stall horizon (a busy poll's steps take no sleep): nothing
                # it polls can change, so it is the deadlock the horizon would have found
                self._deadlock(f"only polling for {self.steps_since_progress} host steps, with nothing due")
            else:
                self.reports.add(StepLimit(self.config.max_host_steps, self.now))
                self._abort()
            raise SimAbort
        self.steps_since_progress += 1
        if self.now - self.last_progress > self.config.stall_horizon_ns and self.steps_since_progress > POLLS:
            self._deadlock()
            raise SimAbort
        return a

    def block(self, a: HostActor, desc: str, pred: Callable[[], bool]) -> None:
        """Block actor ``a`` (inside its step) until ``pred()`` holds."""
        if pred():
            return
        a.state = "blocked"
        a.wait_desc = desc
        a.wait_pred = pred
        self.blocked.append(a)
        self._wait_turn(a)
        a.state = "running"
        # a measured step's cost holds its wait: the host went on then, or now where the wait ended later here
        a.time = max(a.time, self.now) if a.traced else self.now + a.step_ns

    def _wake_blocked(self) -> None:
        if not self.blocked:
            return
        for a in list(self.blocked):
            assert a.wait_pred is not None
            if a.wait_pred():
                self.blocked.remove(a)
                a.wait_pred = None
                a.state = "ready"
                self._push(self.now, _HOST, a.order, a)

    def progress(self) -> None:
        """Note that something other than polling happened (for the stall horizon)."""
        self.last_progress = max(self.last_progress, self.now)
        self.steps_since_progress = self.idle_waits = 0

    def sleep_until(self, a: HostActor, t: int) -> None:
        """Actor ``a`` sleeps until ``t`` (``time.sleep``), taking no step: the device and the other actors go on
        meanwhile, as they go on while a host sleeps on a GPU, so what ``a`` does before its next step (an
        allocation, whose allocator asks which recorded streams are done) sees them as of ``t``. Its next step, due
        at ``t`` or later, comes where it would have come."""
        if self.aborting:
            raise SimAbort
        # (no progress of its own: a loop that only sleeps and polls is still a deadlock at the stall horizon)
        top = self._heap[0] if self._heap else None
        if top is None or top[0] > t or (top[0] == t and (top[1] > _HOST or (top[1] == _HOST and top[2] > a.order))):
            self.now = max(self.now, t)  # nothing comes before it wakes
        else:
            self._push(t, _HOST, a.order, a)
            self._wait_turn(a)

    def waiting_until(self, t: int) -> None:
        """Something will happen at ``t`` (a stall or a sleep ends, an operation completes): polling until then is
        waiting for it, not a deadlock, however long the stall."""
        self.last_progress = max(self.last_progress, t)

    def changed(self) -> None:
        """Shared state changed: blocked actors may move now."""
        self.progress()
        self._wake_blocked()

    # -- streams ------------------------------------------------------------------------
    def enqueue(self, s: SimStream, op: StreamOp) -> None:
        s.queue.append(op)
        s.enqueued += 1
        op.position = s.enqueued
        if self.now > self.last_progress:  # progress(), inline: one comes with every op
            self.last_progress = self.now
        self.steps_since_progress = self.idle_waits = 0
        if self._advance(s):  # kick(s)
            self.kick_all()

    def _advance(self, s: SimStream) -> bool:
        """Pass the ready markers at the front of ``s`` and start its next operation; whether a marker passed."""
        passed = False
        while not s.busy and s.queue:
            op = s.queue[0]
            if op.ready is not None:
                if not op.ready():
                    return passed
                s.queue.popleft()
                s.complete_one(self.now)
                passed = True
                self.trace.append((self.now, s.name, f"pass {op.desc}"))
                self._wake_blocked()
                continue
            delay = 0
            if op.index in s.delays and op.index not in s.fired:
                s.fired.add(op.index)
                delay = s.delays[op.index] * UNIT_NS
                self.trace.append((self.now, s.name, f"stall {s.delays[op.index]} units before #{op.index}"))
                self.waiting_until(self.now + delay)
            s.busy = True
            self._push(self.now + delay, _START, s.order, s)
        return passed

    def kick_all(self) -> None:
        """Every stream whose front item became ready moves: repeated until none does (a marker passing on one
        stream can release a marker on any other, whatever their creation order)."""
        moved = True
        while moved:
            moved = False
            for s in self.streams.values():
                # what _advance looks at first, without the call for an idle stream or one held at a marker that is
                # not ready yet (a stream waiting for another's event is asked at every completion)
                if not s.busy and s.queue:
                    ready = s.queue[0].ready
                    if ready is None or ready():
                        moved |= self._advance(s)

    # -- ending a run early ----------------------------------------------------------------
    def _waits(self) -> tuple[tuple[str, str], ...]:
        waits = []
        for a in self.actors.values():
            if a.state == "blocked":
                waits.append((a.name, a.wait_desc))
            elif a.state != "done":
                waits.append((a.name, f"nothing it can see change (polling; last step: {a.last_step})"))
        for s in self.streams.values():
            if s.queue and not s.busy and s.queue[0].ready is not None:
                waits.append((f"stream {s.name}", s.queue[0].desc))
        return tuple(waits)

    def alone(self, a: HostActor) -> bool:
        """Whether nothing but ``a`` can change anything now: no operation, stall or step is due, and every other
        actor is done or blocked (until ``a`` does something). A timed wait then passes its whole time at once."""
        return not self._heap and all(b is a or b.state in ("done", "blocked") for b in self.actors.values())

    def idle_wait(self, until: int) -> None:
        """A timed wait passes its whole time at once, alone (:meth:`alone`): the time it waits is waiting, not a
        poll nobody answers, unless more than ``POLLS`` such waits came without progress (a loop of timed waits
        for what can never come is a deadlock, as a polling loop is)."""
        self.idle_waits += 1
        if self.idle_waits <= POLLS:
            self.waiting_until(until)

    def _only_polling(self) -> bool:
        """Whether the run is stuck polling: more than ``POLLS`` host steps without progress, nothing due after now
        (no stall, sleep or operation in flight ends later), and every live actor blocked or polling (one that
        computes on the host may still change something)."""
        return (self.steps_since_progress > POLLS and self.now >= self.last_progress
                and all(a.state in ("done", "blocked") or (a.polling and a.state != "new")
                        for a in self.actors.values()))

    def _deadlock(self, why: str | None = None) -> None:
        live = [a for a in self.actors.values() if a.state != "done"]
        if live and all(a.daemon for a in live):
            # only daemonic processes are left, waiting: as their parent's exit terminates them, the run ends here
            self._abort()
            return
        self.reports.add(Deadlock(waits=self._waits(), time_ns=self.now, reason=why or ""))
        self._abort()

    def _abort(self) -> None:
        if self.aborting:
            return
        self.aborting = True
        me = self.current_or_none()
        for a in self.actors.values():
            if a is not me and a.state != "done" and a.thread is not None and not self.greenlets:
                a.sem.release()
        with self._lock:
            if self._live == 0:
                self.finished.set()

    # -- results ----------------------------------------------------------------------------
    def unfired(self) -> tuple[str, ...]:
        out = []
        for name, a in self.actors.items():
            if a.delays:  # (an empty comprehension is a call: every run asks, of each actor and stream)
                out += [f"{name}#{k}+{u}" for k, u in a.delays.items() if k not in a.fired]
        for name, s in self.streams.items():
            if s.delays:
                out += [f"{name}#{k}+{u}" for k, u in s.delays.items() if k not in s.fired]
        return tuple(sorted(out))

    def op_counts(self) -> dict[str, int]:
        counts = {name: a.steps for name, a in self.actors.items()}
        counts.update({name: s.ops for name, s in self.streams.items()})
        return counts
