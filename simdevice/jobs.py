"""``simdevice check --jobs N`` and ``simdevice exhaust --jobs N``: work shared out to N worker processes.

``check``: the table's variants searched at once. Each variant is an independent, derandomized Hypothesis search, so
a worker finds what the command's own process finds, provided it runs under the same settings. :class:`Setup`
carries them: the command line's (``--examples``, ``--budget``, ``--db``), the simulator's overridden fields
(``--profile``, ``--max-steps``, ``--device-memory``, ``--no-values``:
:func:`simdevice.runtime.config.overridden`), the working directory and environment (a fork server keeps those it
started with), and the names of the package's modules the command has imported. The last is there because
Hypothesis draws some values from the constants of the local modules loaded in its process
(``hypothesis.internal.conjecture.providers``): a worker that had loaded other modules would draw other
configurations. The command's process loads every such module before its first search (none is imported lazily
during the table, and ``simdevice.cli`` imports this module whether or not it is used), so a worker that imports
the same list draws what the command would.

``exhaust``: the bounded schedules of one target run in workers, :data:`CHUNK` at a time
(:func:`exhaust_in_workers`). A run is deterministic, so the answer is the serial one: the command still names the
first schedule that fails in the serial order, not the first a worker happened to find; it waits for the chunks
before that one, and runs the failing schedule once more itself for its outcome (which need not pickle: it holds
what the user's function returned).

The command hands out one item (a variant, a chunk of schedules) at a time to each worker over its own pipe, so it
always knows what a worker holds: a worker that dies leaves that item without an answer (``check`` reports the
variant as such, the others go on; ``exhaust`` cannot call its target clean, and says which schedules) and is
replaced. Progress comes back over the same pipes and drives the command's bars and lines; :func:`check_in_workers`
reports each event to a :class:`Listener` in the command's process.

Workers start from a fork server that has imported torch and the search once (``spawn`` where the platform has
none; never ``fork``, which would copy the command's threads and torch's state). A worker ignores Ctrl-C (a
terminal sends it to every process of the group: the command answers it) and unwinds its run on SIGTERM, as the
command does (:func:`simdevice.signals.install_worker`); the command stops its workers with SIGTERM, waits for
them, and kills one that does not end.
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import multiprocessing
import os
import signal
import sys
import tempfile
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any, Protocol

import attrs

#: how workers start: the first of these the platform has
START_METHODS = ("forkserver", "spawn")
#: what the fork server imports once, before it forks any worker: :mod:`simdevice.preloaded` imports torch, the
#: simulator, Hypothesis and the search, and freezes what they made
PRELOAD = ["simdevice.preloaded"]
#: seconds a stopped worker has to unwind its run before it is killed
STOP_GRACE_S = 10.0


#: schedules a worker of ``exhaust --jobs`` runs per hand-out: a few milliseconds each, so a chunk is tens of
#: milliseconds, small enough to share the last ones out and to stop soon after a failure, large enough that the
#: pipe's messages cost nothing measurable
CHUNK = 16
#: ``exhaust`` runs fewer schedules than this in its own process, whatever ``--jobs`` says: workers start from a
#: fork server that imports torch and the simulator (seconds of one CPU, begun with the command: ``start_early``).
#: Measured on 2 CPUs (docs/benchmarks.md): 139 schedules took 1.6-2.1 s alone, 2.0 s in two workers; 1,082 took
#: 4.0-4.6 s alone, 3.1-3.4 s in two
PARALLEL_FROM = 300


@attrs.frozen
class Setup:
    """What a worker needs to run as the command's own process would."""

    #: ``check``'s ``--examples`` and ``--budget`` (``exhaust`` leaves these three as they are)
    examples: int = 0
    budget: float | None = None
    #: the example database's directory (``--db``), or None
    db: str | None = None
    #: the SimConfig fields the command runs under (``config.active_overrides``)
    overrides: tuple[tuple[str, Any], ...] = ()
    #: the modules of ``simdevice`` and ``reference`` the command has imported (:func:`loaded_modules`)
    modules: tuple[str, ...] = ()
    #: the command's working directory and environment (a fork server keeps those it started with)
    cwd: str = attrs.field(factory=os.getcwd)
    environ: tuple[tuple[str, str], ...] = attrs.field(factory=lambda: tuple(os.environ.items()))
    #: ``--show-output``: what the program prints goes to the command's stdout (else it is dropped)
    show_output: bool = False


class Listener(Protocol):
    """What the command does with the workers' news, each call in the command's process, in the order it came."""

    def started(self, index: int) -> None: ...

    def stepped(self, index: int, n: int) -> None: ...

    def finished(self, index: int, finding: Any) -> None: ...

    def failed(self, index: int, why: str, detail: str) -> None:
        """The variant has no verdict: ``why`` in a few words, ``detail`` (a traceback, or empty) to show."""


def default_jobs() -> int:
    """The CPUs this process may use (its affinity where the platform says, else the machine's count)."""
    if hasattr(os, "sched_getaffinity"):
        return max(len(os.sched_getaffinity(0)), 1)
    return os.cpu_count() or 1


def loaded_modules() -> tuple[str, ...]:
    """The modules of ``simdevice`` and ``reference`` this process has imported (entry points aside)."""
    return tuple(sorted(name for name in sys.modules.copy()
                        if name.partition(".")[0] in ("simdevice", "reference") and "__main__" not in name))


def context() -> Any:
    """The multiprocessing context workers start from (a fork server with :data:`PRELOAD` imported, or spawn)."""
    method = next(m for m in START_METHODS if m in multiprocessing.get_all_start_methods())
    ctx = multiprocessing.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(PRELOAD)
    return ctx


#: ``check``'s options that take a value (``simdevice.cli``'s parser: tests/property/tool/test_jobs.py keeps the two
#: the same), for :func:`wants_workers`'s reading of the command line
VALUED = ("--budget", "--db", "--device-memory", "--examples", "--jobs", "--max-steps", "--profile", "--program",
          "--world-size")


def start_early(argv: list[str]) -> None:
    """Start the fork server now when ``argv`` (the command's words) may want workers (:func:`wants_workers`): its
    imports (torch, the simulator: seconds) then run on another core while the command's own do."""
    if wants_workers(argv) and "forkserver" in multiprocessing.get_all_start_methods():
        from multiprocessing import forkserver

        context()
        forkserver.ensure_running()


def wants_workers(argv: list[str]) -> bool:
    """Whether the command's words ask for work in more than one worker: ``check``'s table (no TARGET) or
    ``exhaust`` (which uses them for :data:`PARALLEL_FROM` schedules or more), with ``--jobs`` above 1 or not given
    on a machine of more than one CPU. Read from the words alone, before the parser and its imports are there: a
    wrong guess costs a fork server started late or never used, never another result."""
    if argv[:1] not in (["check"], ["exhaust"]):
        return False
    jobs, target = None, False
    words = iter(argv[1:])
    for word in words:
        name, eq, value = word.partition("=")
        if name in VALUED and not eq:
            value = next(words, "")
        if name == "--jobs":
            jobs = value
        elif not word.startswith("-"):
            target = True
    return (argv[0] == "exhaust" or not target) and jobs != "1" and (jobs is not None or default_jobs() > 1)


def check_in_workers(tasks: list[tuple[str, str]], jobs: int, setup: Setup, listener: Listener,
                     order: Sequence[int] | None = None) -> None:
    """Search each ``(program, variant)`` of ``tasks`` in at most ``jobs`` workers, handed out in ``order`` (indices
    into ``tasks``; default: as listed), telling ``listener`` what happens by the variant's index in ``tasks``.
    Returns when every variant has a finding or has failed; on a stop (``KeyboardInterrupt``, SIGTERM's
    :class:`~simdevice.signals.Terminated` among them) the workers are stopped before it propagates, and nothing is
    left running either way."""
    todo = deque(range(len(tasks)) if order is None else order)

    def next_task() -> tuple[Any, ...] | None:
        if not todo:
            return None
        index = todo.popleft()
        return (index, *tasks[index])

    def handle(kind: str, index: int, rest: list[Any]) -> bool:
        if kind == "start":
            listener.started(index)
        elif kind == "step":
            listener.stepped(index, rest[0])
        elif kind == "done":
            listener.finished(index, rest[0])
            return True
        else:  # "error": the search raised
            listener.failed(index, rest[0], rest[1])
            return True
        return False

    _serve("simdevice-check-worker", _work, (setup,), jobs, next_task, handle,
           lambda index, why: listener.failed(index, f"its worker process died ({why})", ""))


def _serve(name: str, work: Callable[..., None], args: tuple[Any, ...], jobs: int,
           next_item: Callable[[], tuple[Any, ...] | None], handle: Callable[[str, int, list[Any]], bool],
           died: Callable[[int, str], None], finished: Callable[[], bool] = lambda: False) -> None:
    """Hand out work to at most ``jobs`` worker processes (named ``name``), each running ``work(conn, *args)``,
    until none is left or ``finished()``: each worker gets ``next_item()`` (an index and what it names; None:
    nothing left, the worker ends) when it starts and whenever ``handle`` answers True to one of its messages
    (``kind, index, *rest``). A worker that dies holding an item is ``died(index, why)``, and another takes its
    place while items are left. Nothing is left running when it returns or raises (a stop: the workers are
    stopped first)."""
    from simdevice.signals import checkpoint

    ctx = context()
    workers: list[_Worker] = []

    def add(item: tuple[Any, ...] | None) -> None:
        if item is not None:
            workers.append(_Worker(ctx, name, work, args))  # listed before it starts: a stop meanwhile still ends it
            workers[-1].start(item)

    try:
        for _ in range(jobs):
            add(next_item())
        while any(w.index is not None for w in workers) and not finished():
            busy = [w for w in workers if w.index is not None]
            ready = set(wait([w.conn for w in busy] + [w.process.sentinel for w in busy], timeout=1.0))
            checkpoint()  # a stop that was swallowed on its way here
            for w in busy:
                if w.conn in ready or w.process.sentinel in ready:
                    for kind, index, *rest in w.receive():
                        if handle(kind, index, rest):
                            w.give(next_item())
                    if w.dead and w.index is not None:
                        index, w.index = w.index, None
                        died(index, _exit_text(w.process.exitcode))
            for w in [w for w in workers if w.dead]:
                workers.remove(w)
                add(next_item())  # a worker died: another takes its place, if anything is left
    finally:
        with _deferred_stops():
            _stop(workers)


class _Worker:
    """One worker process, its end of the pipe, and the index of the item it holds (None: idle)."""

    def __init__(self, ctx: Any, name: str, work: Callable[..., None], args: tuple[Any, ...]) -> None:
        self.conn, self.theirs = ctx.Pipe()
        self.process = ctx.Process(target=work, args=(self.theirs, *args), name=name)
        self.index: int | None = None
        #: it was told to end (no item left)
        self.told = False
        #: the process ended (or its pipe broke): the command no longer talks to it
        self.dead = False

    def start(self, item: tuple[Any, ...]) -> None:
        """Start the process and give it its first item."""
        self.process.start()
        self.theirs.close()  # the worker's end is the worker's: when it ends, this end reads the end of the pipe
        self.give(item)

    def give(self, item: tuple[Any, ...] | None) -> None:
        """Send it an item (its index first), or tell it to end (None)."""
        self.index = item[0] if item is not None else None
        self.told = item is None
        with contextlib.suppress(OSError):  # a dead worker: its sentinel says so next
            self.conn.send(item)

    def receive(self) -> list[tuple[Any, ...]]:
        """Every message waiting from it; a worker that has ended is marked dead (after its last messages)."""
        got = []
        try:
            while self.conn.poll():
                got.append(self.conn.recv())
        except (EOFError, OSError):  # its end of the pipe closed: it has ended, or is ending
            self.conn.close()
        if self.conn.closed or not self.process.is_alive():
            self.process.join()
            self.dead = True
        return got


class WorkerError(Exception):
    """``exhaust --jobs``: a chunk of schedules has no answer (its worker died, or a run raised): the target cannot
    be called clean. ``detail``: a traceback, or empty."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail


def exhaust_in_workers(target: Any, schedules: Iterable[Any], jobs: int, setup: Setup,
                       progress: Callable[[int, bool], None] | None = None) -> tuple[int, Any]:
    """What :func:`simdevice.search.exhaust.exhaust_target` answers for ``target`` (a
    :class:`~simdevice.search.targets.Target`, which the workers find again by its name) over ``schedules``, their
    runs shared out to at most ``jobs`` workers :data:`CHUNK` at a time: how many ran up to the first that failed
    in the order of ``schedules`` (1 for the first) and its outcome, or how many ran and None. ``progress(n,
    clean)`` after each chunk: ``n`` run so far, ``clean``: no failure found yet. :class:`WorkerError` when a chunk
    has no answer; on a stop the workers are stopped before it propagates."""
    source = iter(schedules)
    #: each chunk handed out and not answered yet: its first index (from 0) -> its length
    pending: dict[int, int] = {}
    handed = [0]
    ran = [0]
    #: the first failure found so far: (its index, its schedule)
    first: list[tuple[int, Any]] = []
    broken: list[WorkerError] = []

    def next_chunk() -> tuple[int, list[Any]] | None:
        if first or broken:
            return None  # what is left comes after the failure found (chunks go out in order)
        chunk = list(itertools.islice(source, CHUNK))
        if not chunk:
            return None
        start = handed[0]
        handed[0] += len(chunk)
        pending[start] = len(chunk)
        return start, chunk

    def answered(start: int) -> str:
        """The chunk at ``start`` is no longer pending: the schedules it held, as text."""
        return f"schedules {start + 1}-{start + pending.pop(start)}"

    def handle(kind: str, start: int, rest: list[Any]) -> bool:
        held = answered(start)
        if kind == "done":
            n, failed = rest
            ran[0] += n
            if failed is not None and (not first or start + n - 1 < first[0][0]):
                first[:] = [(start + n - 1, failed)]
            if progress is not None:
                progress(ran[0], not first)
        else:  # "error": a run raised
            broken.append(WorkerError(f"{held}: {rest[0]}", rest[1]))
        return True

    def died(start: int, why: str) -> None:
        broken.append(WorkerError(f"{answered(start)}: their worker process died ({why})"))

    def finished() -> bool:
        # the answer is known when nothing before the first failure is still running
        return bool(broken) or (bool(first) and not any(start < first[0][0] for start in pending))

    _serve("simdevice-exhaust-worker", _exhaust_work, (setup, target.name, getattr(target, "world_size", None)), jobs,
           next_chunk, handle, died, finished)
    if broken:
        raise broken[0]
    if not first:
        return ran[0], None
    index, schedule = first[0]
    # the outcome, run here (a run is deterministic): the worker's holds what the user's function returned
    out = target.run(schedule)
    if not target.failed(out):
        raise WorkerError(f"schedule {index + 1} failed in a worker and not in the command's own run: {schedule}")
    return index + 1, out


def run_chunk(target: Any, chunk: list[Any]) -> tuple[int, Any]:
    """Run the schedules of ``chunk`` on ``target`` in order up to the first that fails: how many ran, and that
    schedule (None: all passed). Plain torch.cuda code: torch stays patched across the chunk's runs."""
    from simdevice.search.targets import kept_patched

    n = 0
    with kept_patched(target):
        for schedule in chunk:
            n += 1
            if target.failed(target.run(schedule)):
                return n, schedule
    return n, None


def _exhaust_work(conn: Connection, setup: Setup, name: str, world_size: int | None = None) -> None:
    """A worker of ``exhaust --jobs``: run the chunks of schedules the command sends, each up to its first failure,
    until it sends None; the answer to a chunk is how many ran and the failing schedule, or None."""
    try:
        prepare(setup)
        from simdevice.runtime.config import overridden
        from simdevice.search.targets import target_of

        target = None
        with overridden(**dict(setup.overrides)), open(os.devnull, "w") as devnull, (
                contextlib.nullcontext() if setup.show_output else contextlib.redirect_stdout(devnull)), (
                contextlib.nullcontext() if setup.show_output else contextlib.redirect_stderr(devnull)):
            while (item := conn.recv()) is not None:
                start, chunk = item
                try:
                    if target is None:
                        target = target_of(name, world_size)
                    n, failed = run_chunk(target, chunk)
                except Exception as e:  # a bug: the command reports the schedules, with the traceback
                    conn.send(("error", start, f"a run raised {type(e).__name__}: {e}", traceback.format_exc()))
                    continue
                conn.send(("done", start, n, failed))
    except (KeyboardInterrupt, EOFError, BrokenPipeError):  # stopped by the command, or the command is gone
        pass


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


def _stop(workers: list[_Worker]) -> None:
    """End every worker: an idle one is told to end; one still searching gets SIGTERM (it unwinds its run, its
    temporary folders removed, and ends); one still there after :data:`STOP_GRACE_S` is killed. What they send
    meanwhile is read and dropped (a worker blocked on a full pipe would not end)."""
    for w in workers:
        if w.process.is_alive():
            if w.index is None:
                if not w.told:
                    with contextlib.suppress(OSError):
                        w.conn.send(None)
            else:
                with contextlib.suppress(OSError, ProcessLookupError):
                    os.kill(w.process.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    left = [w for w in workers if w.process.is_alive()]
    while left and time.monotonic() < deadline:
        ready = wait([w.conn for w in left if not w.conn.closed] + [w.process.sentinel for w in left],
                     timeout=max(deadline - time.monotonic(), 0))
        for w in left:
            if w.conn in ready:
                try:
                    while w.conn.poll():
                        w.conn.recv()
                except (EOFError, OSError):
                    w.conn.close()
        left = [w for w in left if w.process.is_alive()]
    for w in workers:
        if w.process.is_alive():
            w.process.kill()
        if w.process.pid is not None:  # started (a stop can come while it starts)
            w.process.join()
        w.conn.close()  # a worker started unbeknown to the command reads the end of the pipe, and ends
        w.theirs.close()


@contextlib.contextmanager
def _deferred_stops() -> Iterator[None]:
    """While the block runs, a Ctrl-C or SIGTERM is held, and raised after it (a second Ctrl-C while the workers
    are being stopped would leave some running); only in the main thread, where handlers live."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    old = {s: signal.signal(s, lambda signum, frame: held.append(signum)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        for signum in dict.fromkeys(held):
            signal.raise_signal(signum)


def prepare(setup: Setup) -> None:
    """Make this worker process run as the command's own does: its signal handling, working directory,
    environment, one intra-op thread, and the modules it has loaded."""
    from simdevice.signals import install_worker

    install_worker()
    os.chdir(setup.cwd)
    os.environ.clear()
    os.environ.update(setup.environ)
    tempfile.tempdir = None  # found again from the environment (TMPDIR), if the fork server had found it
    import torch

    torch.set_num_threads(1)  # as the command runs (simdevice.cli.main)
    for name in setup.modules:  # what the command had loaded: Hypothesis draws from their constants
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


def _work(conn: Connection, setup: Setup) -> None:
    """A worker's life: search the variants the command sends, one at a time, until it sends None."""
    try:
        prepare(setup)
        from simdevice.programs import REGISTRY
        from simdevice.runtime.config import overridden
        from simdevice.search import check_variant
        from simdevice.search.engine import database

        db = database(setup.db)
        with overridden(**dict(setup.overrides)):
            while (task := conn.recv()) is not None:
                index, program, variant = task
                conn.send(("start", index))
                try:
                    finding = check_variant(REGISTRY[program], variant, setup.examples, setup.budget,
                                            lambda n, i=index: conn.send(("step", i, n)), db)
                except Exception as e:  # a bug: the command reports the variant, with the traceback
                    conn.send(("error", index, f"its search raised {type(e).__name__}: {e}", traceback.format_exc()))
                    continue
                conn.send(("done", index, finding))
    except (KeyboardInterrupt, EOFError, BrokenPipeError):  # stopped by the command, or the command is gone
        pass
