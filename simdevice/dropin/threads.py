"""``threading`` in a torch.cuda session: the threads a program starts are host actors of its process.

A thread the program's own code starts inside a run (``threading.Thread``, or a subclass with its own ``run``)
becomes a host actor of the process that started it: its steps are scheduled and delayed as any actor's, in its
own program order, and it shares that process's streams, caching allocator, pinned memory and rank; its current
stream starts as the device's default stream, as a new thread's does in torch, whatever stream the starting thread
is inside. It is named in a schedule by the name the program gave it, else by its target's name (``writer``), else
``thread``; ``-2``, ``-3``, ... for a second and third of one name, and prefixed as a process's streams are by a
process other than the host (``rank1.writer``). ``join`` (with a timeout, in virtual time) and ``is_alive`` answer
for it; what it raises is a host error of the run (Python would print it and go on). Its ``threading.local`` values
are its own (``Execution.own_locals``), as a thread's of its own are.

The run's actors take turns on one machine thread, so a thread waiting on one of Python's own primitives for
another would wait for good: ``threading.Event``, ``Lock``, ``RLock``, ``Condition``, ``Semaphore``,
``BoundedSemaphore`` and ``Barrier`` and ``queue.Queue`` and ``SimpleQueue`` made by the program in a run are the
simulator's (each set, wait, notify, acquire, release, put and get a host step that orders the waiter after the one
it waited for; a wait that can never end is a deadlock, not a hang); ``LifoQueue`` and ``PriorityQueue`` made there
raise
``NotImplementedError``, so the program gets no verdict rather than a hang. A ``concurrent.futures``
``ThreadPoolExecutor`` the program makes is the simulator's too (:class:`SimThreadPoolExecutor`): its workers are
threads of the program's (``pool_0``, ``pool_1``, ... or named by ``thread_name_prefix``), its futures wait as the
primitives do. Made by the program, an installed package's code among it, through any name: one bound at import,
before the session, too (:func:`_made_by_class`); so is asyncio's default executor, whose workers run the program's
functions (``run_in_executor(None, fn)``, ``asyncio.to_thread``), and an asyncio event loop's wait on its selector
polls in virtual time meanwhile. What else the standard library or torch makes for itself stays Python's, and so do
the threads it starts (the workers of a pool torch makes: their use of the device is refused,
naming the thread). A primitive made
before the run is Python's own too: one thread holding it across a device call while another waits for it would
hang the run, so make them in the function.

A replay on a GPU is not offered for a run with threads (their steps are not counted there).
"""

from __future__ import annotations

import _thread
import concurrent.futures
import concurrent.futures._base
import concurrent.futures.thread
import os
import queue
import re
import selectors
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reference.naming import in_standard_library
from reference.schedule import is_actor_name
from simdevice.dropin import processes
from simdevice.dropin.patches import Patches
from simdevice.runtime import execution
from simdevice.runtime.reports import internal_file
from simdevice.runtime.runtime import SharedCell

_OWN = str(Path(__file__).resolve().parents[1]) + os.sep
#: Python's name for a thread it named itself (``Thread-3``, ``Thread-3 (writer)``): counted over the interpreter's
#: life, so not one a schedule can name
_DEFAULT_NAME = re.compile(r"Thread-\d+( \(.*\))?")
#: torch's own code whose threads and pools do the program's work, so are the program's: Distributed Checkpoint's
#: (``async_save`` stages and writes on a ``ThreadPoolExecutor`` it makes, ``FileSystemWriter(thread_count=...)``
#: writes the files on threads it starts)
#: asyncio's event loop, which makes its default executor (``loop.run_in_executor(None, fn)``: its workers run the
#: program's fn) and waits on its selector (``BaseSelectorEventLoop._run_once``)
_EVENT_LOOP = os.path.join("asyncio", "base_events.py")
_PROGRAM_WORK = (os.path.join("torch", "distributed", "checkpoint") + os.sep, _EVENT_LOOP)


def _session() -> Any:
    from simdevice.dropin import facade  # (facade imports this module's installer)

    return facade.session_device()


def _in_run() -> bool:
    from simdevice.dropin import facade

    return facade.in_actor()


def _by_program(skip: int, through_start: bool = False) -> bool:
    """Whether the caller ``skip`` frames up is the program's code, not the standard library's, torch's or the
    simulator's own (which makes a semaphore per actor on threads). ``through_start``: the caller of
    ``Thread.start``, past the simulator's frames that patch it and ``threading``'s (a subclass's ``start`` that
    calls its base's)."""
    f: Any = sys._getframe(skip + 1)
    while through_start and f is not None and (f.f_code.co_filename.startswith(_OWN)
                                               or f.f_code.co_filename.endswith(f"{os.sep}threading.py")):
        f = f.f_back
    if f is None:
        return False
    filename = f.f_code.co_filename
    if any(d in filename for d in _PROGRAM_WORK):
        return True
    return not filename.startswith(_OWN) and not internal_file(filename) and not in_standard_library(filename)


def _name(rt: Any, thread: threading.Thread) -> str:
    parent = rt.current().process
    prefix = "" if parent == "host" else f"{parent}."
    given = str(thread.name)
    if _DEFAULT_NAME.fullmatch(given) or not is_actor_name(given):
        target = getattr(thread, "_target", None)
        base = getattr(target, "__name__", "") if target is not None else ""
        if not is_actor_name(base):
            base = "thread"
    else:
        base = given
    taken = set(rt.execution.actors) | set(rt.streams())
    name, k = prefix + base, 1
    while name in taken:
        k += 1
        name = f"{prefix}{base}-{k}"
    return name


class _Started:
    """What a simulated thread's ``Thread`` object holds: its actor."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor


def _start(thread: threading.Thread) -> bool:
    """``Thread.start`` in a run (``execution.thread_actor``): a thread the program started becomes a host actor of
    its process; True when it did."""
    if not _in_run() or not _by_program(1, through_start=True):
        return False
    if getattr(thread, "_simdevice", None) is not None:
        raise RuntimeError("threads can only be started once")
    rt = _session().runtime
    name = _name(rt, thread)
    actor = rt.spawn(name, thread.run, thread=True)
    actor.daemon = bool(thread.daemon)
    thread._simdevice = _Started(actor)  # type: ignore[attr-defined]
    rt.gpu_replay = False  # (reference.cuda_plain refuses it: the replay line offers no --gpu)
    return True


def _patch_thread(p: Patches) -> None:
    base = threading.Thread
    join, is_alive = base.join, base.is_alive

    def sim_join(self: Any, timeout: float | None = None) -> None:
        started = getattr(self, "_simdevice", None)
        if started is None:
            return join(self, timeout)
        if not _in_run():
            return None  # (its run is over, and the thread with it)
        rt = _session().runtime
        if rt.current().name == started.actor.name:
            raise RuntimeError("cannot join current thread")
        if timeout is None or processes.timed(lambda: started.actor.state == "done", timeout):
            rt.join(started.actor)
        return None

    def sim_is_alive(self: Any) -> bool:
        started = getattr(self, "_simdevice", None)
        if started is None:
            return is_alive(self)
        if _in_run():
            return not _session().runtime.process_poll(started.actor, "Thread.is_alive")
        return bool(started.actor.state != "done")

    p.set(base, "join", sim_join)
    p.set(base, "is_alive", sim_is_alive)
    p.set(execution, "thread_actor", _start)


class SimRLock:
    """``threading.RLock`` in a run: a lock its holder may take again (each take released once)."""

    def __init__(self) -> None:
        self._lock = processes.SimLock()
        self._owner: str | None = None
        self._count = 0
        self._real: Any = None

    def _outside(self) -> Any:
        """Outside any run, a real ``RLock`` of its own (see :class:`processes.SimLock`), else None."""
        return processes.real_outside(self, _thread.RLock)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        real = self._outside()
        if real is not None:
            return bool(real.acquire(blocking, -1 if timeout is None else timeout))
        me = _session().runtime.current().name
        if self._owner == me:
            self._count += 1
            return True
        if not self._lock.acquire(blocking, None if timeout is None or timeout < 0 else timeout):
            return False
        self._owner, self._count = me, 1
        return True

    def release(self) -> None:
        real = self._outside()
        if real is not None:
            real.release()
            return
        if self._owner != _session().runtime.current().name:
            raise RuntimeError("cannot release un-acquired lock")
        self._count -= 1
        if self._count == 0:
            self._owner = None
            self._lock.release()

    def owned(self) -> bool:
        """Whether the running actor holds it (a ``Condition``'s check)."""
        return bool(self._owner == _session().runtime.current().name)

    def release_all(self) -> int:
        """Let go of every take (a ``Condition``'s wait); how many there were."""
        depth, self._count, self._owner = self._count, 0, None
        self._lock.release()
        return depth

    def acquire_again(self, depth: int) -> None:
        """Take it again as many times as :meth:`release_all` let go of."""
        self.acquire()
        self._count = depth

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


class SimThreadLock(processes.SimLock):
    """``threading.Lock`` in a run: ``acquire(blocking, timeout)`` as Python spells it, and ``locked()`` (a poll)."""

    def acquire(self, blocking: bool = True, timeout: float | None = -1) -> bool:  # type: ignore[override]
        return super().acquire(blocking, None if timeout is None or timeout < 0 else timeout)

    def locked(self) -> bool:
        return self.held("Lock.locked")


class SimSemaphore(processes.SimSemaphore):
    """``threading.Semaphore`` (``BoundedSemaphore`` with ``bounded``) in a run: ``multiprocessing``'s
    (:class:`processes.SimSemaphore`) with ``threading``'s spellings (``blocking``, ``release(n)``, its error). One
    kept across runs keeps its count (only a process's own are made anew)."""

    _TOO_MANY = "Semaphore released too many times"

    def _here(self) -> None:
        self._dev = _session()

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:  # type: ignore[override]
        return super().acquire(blocking, timeout)

    def release(self, n: int = 1) -> None:  # type: ignore[override]
        if n < 1:
            raise ValueError("n must be one or more")
        self.give_back(n)


class SimCondition:
    """``threading.Condition`` in a run, over a simulated lock (an ``RLock`` of its own by default): ``wait``
    releases the lock, waits to be notified (a timeout in virtual time) and takes the lock again, ordered after the
    notifier; ``notify(n)`` wakes the ``n`` longest waiting, ``notify_all`` every one; ``wait_for`` waits until its
    predicate holds. A waiter that nothing notifies waits for good: the run's deadlock."""

    def __init__(self, lock: Any = None) -> None:
        self._lock: Any = lock if lock is not None else SimRLock()
        self._waiters: list[SharedCell] = []

    def acquire(self, *args: Any) -> bool:
        return bool(self._lock.acquire(*args))

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is not None and not self._held():
            return  # (a wait cut short as the run ended let the lock go)
        self.release()

    def _held(self) -> bool:
        owned = getattr(self._lock, "owned", None)
        return bool(owned()) if owned is not None else bool(self._lock.held("Condition.wait"))

    def wait(self, timeout: float | None = None) -> bool:
        if not self._held():
            raise RuntimeError("cannot wait on un-acquired lock")
        rt = _session().runtime
        woken = SharedCell(False)
        self._waiters.append(woken)
        depth = self._lock.release_all() if isinstance(self._lock, SimRLock) else self._lock.release()
        try:
            if timeout is None:
                rt.value_wait(woken, bool, "Condition.wait", "a notify of a condition")
                got = True
            else:
                got = processes.timed(lambda: bool(rt.value_get(woken, "Condition.wait")), timeout)
        finally:
            if woken in self._waiters:
                self._waiters.remove(woken)
        # (not where the wait was cut short, the run ending: the lock stays let go, and __exit__ knows it)
        if isinstance(self._lock, SimRLock):
            self._lock.acquire_again(depth)
        else:
            self._lock.acquire()
        return got

    def wait_for(self, predicate: Callable[[], Any], timeout: float | None = None) -> Any:
        result = predicate()
        while not result:
            if not self.wait(timeout) and timeout is not None:
                return predicate()
            result = predicate()
        return result

    def notify(self, n: int = 1) -> None:
        if not self._held():
            raise RuntimeError("cannot notify on un-acquired lock")
        rt = _session().runtime
        for woken in self._waiters[:n]:
            self._waiters.remove(woken)
            rt.value_set(woken, True, "Condition.notify")

    def notify_all(self) -> None:
        self.notify(len(self._waiters))


class SimThreadQueue(processes.SimQueue):
    """``queue.Queue`` (and ``SimpleQueue``) in a run: items go as they are, and ``task_done``/``join`` count the
    items put and not yet done."""

    def __init__(self, maxsize: int = 0) -> None:
        super().__init__(maxsize, shared=True)
        self._unfinished = SharedCell(0)

    def put(self, obj: Any, block: bool = True, timeout: float | None = None) -> None:
        super().put(obj, block, timeout)
        self._unfinished.value += 1  # (within the put's step)

    def task_done(self) -> None:
        cell = self._unfinished
        if cell.value <= 0:
            raise ValueError("task_done() called too many times")
        _session().runtime.value_set(cell, cell.value - 1, "Queue.task_done")

    def join(self) -> None:
        _session().runtime.value_wait(self._unfinished, lambda v: v == 0, "Queue.join",
                                     "every item put on a queue to be done")


class SimFuture(concurrent.futures.Future):  # type: ignore[type-arg]
    """A simulated pool's ``Future``, a ``concurrent.futures.Future`` (``isinstance`` holds, through a name a library
    bound before the session too): ``result()`` and ``exception()`` wait for the task (a host step that orders the
    waiter after it; a timeout in virtual time raises ``TimeoutError``), ``done()`` polls; what the task raised is
    raised by ``result()``, as Python's does. ``concurrent.futures.wait`` and ``as_completed`` take it (their waiter
    is made of simulated primitives: :func:`_install_waiters`). It cannot be cancelled once submitted (the pool's
    worker may have it)."""

    def __init__(self) -> None:
        super().__init__()  # (Python's state, which wait and as_completed read under its own lock)
        self._done = SharedCell(False)
        self._result: Any = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[Any], Any]] = []

    def finish(self, result: Any, error: BaseException | None) -> None:
        """The worker's end of the task: its result or its error, then the waiters of ``wait`` and ``as_completed``
        and the callbacks, in the worker."""
        self._result, self._error = result, error
        self._exception = error
        _session().runtime.value_set(self._done, True, "Future.set_result")
        self._state = _FINISHED
        for waiter in list(self._waiters):
            if error is None:
                waiter.add_result(self)
            else:
                waiter.add_exception(self)
        for fn in self._callbacks:
            fn(self)

    def done(self) -> bool:
        return bool(_session().runtime.value_get(self._done, "Future.done"))

    def running(self) -> bool:
        return not self.done()

    def cancelled(self) -> bool:
        return False

    def cancel(self) -> bool:
        return False

    def _wait(self, timeout: float | None) -> None:
        if timeout is not None:
            if not processes.timed(self.done, timeout):
                raise TimeoutError
            return
        _session().runtime.value_wait(self._done, bool, "Future.result", "a pool's task to finish")

    def result(self, timeout: float | None = None) -> Any:
        self._wait(timeout)
        if self._error is not None:
            raise self._error
        return self._result

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._wait(timeout)
        return self._error

    def add_done_callback(self, fn: Callable[[Any], Any]) -> None:
        if self._done.value:
            fn(self)
        else:
            self._callbacks.append(fn)


class SimThreadPoolExecutor:
    """``concurrent.futures.ThreadPoolExecutor`` made by the program in a run: its workers are threads of the
    program's (host actors of its process, named ``THREAD_NAME_PREFIX_0``, ``_1``, ..., ``pool_0`` without a prefix),
    one started at each ``submit`` up to ``max_workers``, taking the tasks in order from a simulated queue; a task's
    future is a :class:`SimFuture`. ``shutdown(wait=True)`` (and the ``with`` block's end) joins them."""

    def __init__(self, max_workers: int | None = None, thread_name_prefix: str = "",
                 initializer: Callable[..., Any] | None = None, initargs: tuple[Any, ...] = ()) -> None:
        if max_workers is not None and max_workers <= 0:
            raise ValueError("max_workers must be greater than 0")
        self._max = max_workers if max_workers is not None else min(32, (os.cpu_count() or 1) + 4)
        self._prefix = thread_name_prefix if is_actor_name(thread_name_prefix) else "pool"
        self._initializer, self._initargs = initializer, initargs
        self._tasks = SimThreadQueue()
        self._workers: list[threading.Thread] = []
        self._shut = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> SimFuture:
        if self._shut:
            raise RuntimeError("cannot schedule new futures after shutdown")
        future = SimFuture()
        self._tasks.put((future, fn, args, kwargs))
        if len(self._workers) < self._max:
            worker = threading.Thread(target=self._work, name=f"{self._prefix}_{len(self._workers)}")
            self._workers.append(worker)
            worker.start()
        return future

    def _work(self) -> None:
        if self._initializer is not None:
            self._initializer(*self._initargs)
        while True:
            task = self._tasks.get()
            if task is None:
                self._tasks.put(None)  # (for the next worker, as Python's pool wakes them)
                return
            future, fn, args, kwargs = task
            try:
                result = fn(*args, **kwargs)
            except BaseException as e:  # (the task's error is its future's, raised by result())
                future.finish(None, e)
            else:
                future.finish(result, None)

    def map(self, fn: Callable[..., Any], *iterables: Any, timeout: float | None = None,
            chunksize: int = 1) -> Any:
        futures = [self.submit(fn, *args) for args in zip(*iterables, strict=False)]
        return (f.result(timeout) for f in futures)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if not self._shut:
            self._shut = True
            self._tasks.put(None)
        if wait:
            for worker in self._workers:
                worker.join()

    def __enter__(self) -> SimThreadPoolExecutor:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown(wait=True)


_FINISHED = concurrent.futures._base.FINISHED
#: Python's ``concurrent.futures._base._create_and_install_waiters``, as imported
_INSTALL_WAITERS = concurrent.futures._base._create_and_install_waiters  # type: ignore[attr-defined]


def _install_waiters(fs: Any, return_when: str) -> Any:
    """``concurrent.futures``' waiter for ``wait`` and ``as_completed`` (which look it up at each call, so a name
    of theirs a library bound before the session takes it too): over a simulated pool's futures in a run, its event
    and lock are the simulator's, so that the waiter's wait lets the workers run and is ordered after the one that
    finished (Python's untimed wait would stop every actor of the run)."""
    waiter = _INSTALL_WAITERS(fs, return_when)
    if _in_run() and any(isinstance(f, SimFuture) or isinstance(f._condition, SimCondition) for f in fs):
        waiter.event = processes.SimEvent()
        if hasattr(waiter, "lock"):
            waiter.lock = SimThreadLock()
    return waiter


#: what a run makes in place of each primitive, when the program makes it (the standard library's own stay Python's)
_MADE: dict[tuple[Any, str], Callable[..., Any]] = {
    (threading, "Event"): processes.SimEvent,
    (threading, "Lock"): SimThreadLock,
    (threading, "RLock"): SimRLock,
    (threading, "Barrier"): processes.SimBarrier,
    (threading, "Condition"): SimCondition,
    (threading, "Semaphore"): SimSemaphore,
    (threading, "BoundedSemaphore"): lambda value=1: SimSemaphore(value, bounded=True),
    (queue, "Queue"): SimThreadQueue,
    (queue, "SimpleQueue"): SimThreadQueue,
    (concurrent.futures.thread, "ThreadPoolExecutor"): SimThreadPoolExecutor,
}
_REFUSED = ((queue, "LifoQueue"), (queue, "PriorityQueue"))
#: CPython's flags of a class made at run time (``Py_TPFLAGS_HEAPTYPE``) and of one whose attributes cannot be set
#: (``Py_TPFLAGS_IMMUTABLETYPE``: a C extension's, ``_queue.SimpleQueue``): a class statement's has the first alone
_HEAP_TYPE, _SETTABLE = 1 << 9, (1 << 9) | (1 << 8)
#: those of them that are Python's classes (not ``Lock``, ``RLock`` and ``SimpleQueue``, made in C): each made by the
#: program in a run is the simulator's through any name of it (:func:`_made_by_class`)
_CLASSES = tuple(getattr(m, n) for m, n in (*_MADE, *_REFUSED)
                 if isinstance(getattr(m, n), type) and getattr(m, n).__flags__ & _SETTABLE == _HEAP_TYPE)


def _instead(module: Any, name: str) -> Callable[..., Any]:
    """What makes the simulator's ``module.name`` in a run (``NotImplementedError`` for one that is refused)."""
    made = _MADE.get((module, name))
    if made is None:
        raise NotImplementedError(
            f"{module.__name__}.{name} made in a run is not simulated (the run's threads share threading's "
            "Event, Lock, RLock, Condition, Semaphore, BoundedSemaphore and Barrier and queue's Queue and "
            "SimpleQueue)")
    return made


def _in_run_instead(module: Any, name: str, original: Any) -> Any:
    """``original`` where a run is not going on or the standard library calls it; in a run, for the program, the
    simulator's primitive or a refusal. A class stays a class (a subclass of it made meanwhile is the original's)."""

    def instead() -> Any:
        return _instead(module, name)

    if isinstance(original, type):
        def new(cls: type, *args: Any, **kwargs: Any) -> Any:
            if cls is replaced and _in_run() and _by_program(1):
                return instead()(*args, **kwargs)
            base_new: Any = original.__new__
            return object.__new__(cls) if base_new is object.__new__ else base_new(cls)

        replaced: Any = type(name, (original,), {"__new__": new, "__module__": original.__module__,
                                                 "__qualname__": original.__qualname__,
                                                 "__doc__": original.__doc__})
        return replaced

    def call(*args: Any, **kwargs: Any) -> Any:
        if _in_run() and _by_program(1):
            return instead()(*args, **kwargs)
        return original(*args, **kwargs)

    call.__name__ = name
    return call


#: Python's own ``Event.wait``, as imported
_EVENT_WAIT = threading.Event.wait


def _event_wait(self: threading.Event, timeout: float | None = None) -> bool:
    """A timed ``wait`` of Python's own ``threading.Event`` (made before the run, or by a library through a name it
    bound before the session: tqdm's progress monitor waits on one between its refreshes) by an actor of a run: a
    poll in virtual time, as ``timed`` polls. The run's actors take turns on one thread, so Python's wait would stop
    them all for its timeout, in real time. Untimed (a real thread's start, which that thread answers), and outside
    an actor, Python's own."""
    if timeout is None or self.is_set() or not _in_run():
        return _EVENT_WAIT(self, timeout)
    return processes.timed(self.is_set, timeout)


#: Python's ``concurrent.futures.Future.__init__``, as imported
_FUTURE_INIT = concurrent.futures.Future.__init__


def _future_init(self: concurrent.futures.Future, *args: Any, **kwargs: Any) -> None:  # type: ignore[type-arg]
    """A ``concurrent.futures.Future`` the program makes itself in a run (Distributed Checkpoint's ``async_save``
    returns one it completes from its staging pool's callback): its condition is the simulator's, so that an untimed
    ``result()`` waits in the run for the actor that sets it (Python's would stop every actor) and is ordered after
    it. One made by a library's pool that the simulator does not run keeps Python's."""
    _FUTURE_INIT(self, *args, **kwargs)
    if type(self) is concurrent.futures.Future and _in_run() and _by_program(1):
        self._condition = SimCondition()  # type: ignore[assignment]


def _made_by_class(p: Patches, module: Any, name: str) -> None:
    """The class ``module.name`` itself (a Python class, not a subclass) made by the program in a run is the
    simulator's primitive (or a refusal), whatever name it is called by: a library binds ``from concurrent.futures
    import ThreadPoolExecutor`` or ``from threading import Event`` at import, before the session, and its pool's
    workers would be threads the simulator does not run (transformers loads weights so in ``from_pretrained(
    device_map=...)``), an untimed wait on its event would stop every actor. The object made takes the simulated
    one's class and state in its ``__init__`` (``__new__`` set on a class of the standard library could not be put
    back: CPython keeps the slot it made). A subclass is made as it is."""
    cls = getattr(module, name)
    init = cls.__init__  # (its own, or what it inherits: LifoQueue's is Queue's)

    def init_in_run(self: Any, *args: Any, **kwargs: Any) -> None:
        if type(self) is cls and _in_run() and _by_program(1):
            made = _instead(module, name)(*args, **kwargs)
            self.__class__ = type(made)
            self.__dict__ = made.__dict__
            return
        init(self, *args, **kwargs)

    init_in_run.__name__ = init_in_run.__qualname__ = "__init__"
    p.set(cls, "__init__", init_in_run)


#: each selector class's own ``select``, as imported
_SELECTS = {cls: cls.select for cls in (getattr(selectors, n, None) for n in (
    "SelectSelector", "PollSelector", "EpollSelector", "DevpollSelector", "KqueueSelector")) if cls is not None}
#: the virtual seconds an untimed select waits in one call before it answers nothing (its caller, an event loop,
#: asks again: a loop nothing ever wakes runs into the run's step limit)
_UNTIMED_SELECT_S = 60.0


def _select_in_run(original: Callable[..., Any]) -> Callable[..., Any]:
    def select(self: Any, timeout: float | None = None) -> Any:
        """An asyncio event loop's wait (for a worker of its executor, a timer) by an actor of a run: polls in
        virtual time, so that the run's other actors go on meanwhile (the worker that will wake the loop is one of
        them, on the same machine thread). Another caller's (``subprocess``' wait for a real child's output), and
        any outside an actor, is Python's own."""
        if (not _in_run() or (timeout is not None and timeout <= 0)
                or not sys._getframe(1).f_code.co_filename.endswith(_EVENT_LOOP)):
            return original(self, timeout)
        ready: list[Any] = []

        def poll() -> bool:
            ready[:] = original(self, 0)
            return bool(ready)

        processes.timed(poll, _UNTIMED_SELECT_S if timeout is None else timeout)
        return ready

    select.__name__ = select.__qualname__ = "select"
    return select


def install(p: Patches) -> None:
    """Put the simulated threads and primitives in place (each falls back to the original outside a run)."""
    _patch_thread(p)
    for cls, original in _SELECTS.items():
        p.set(cls, "select", _select_in_run(original))
    p.set(threading.Event, "wait", _event_wait)
    for module, name in (*_MADE, *_REFUSED):
        if getattr(module, name) in _CLASSES:
            _made_by_class(p, module, name)  # (before the module's name is replaced: the class itself)
        p.set(module, name, _in_run_instead(module, name, getattr(module, name)))
    p.set(concurrent.futures._base, "_create_and_install_waiters", _install_waiters)
    p.set(concurrent.futures.Future, "__init__", _future_init)
    # (``concurrent.futures`` gives its executors through a module ``__getattr__``: its own name, set for a while)
    p.set(concurrent.futures, "ThreadPoolExecutor", concurrent.futures.thread.ThreadPoolExecutor)


def patched_owners() -> list[Any]:
    return [threading, threading.Thread, threading.Event, queue, execution, concurrent.futures, *_SELECTS,
            concurrent.futures.thread, concurrent.futures._base, concurrent.futures.Future, *_CLASSES]
