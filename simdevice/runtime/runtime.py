"""The simulated device's model of one run: what every façade method calls, one method each.

A :class:`Runtime` owns the parts of one run (execution in virtual time,
memory with its shadow, the caching allocator and memory saver, the
collectives, the report sink) and offers the operations a program can make,
in the model's own words: a host step, an operation enqueued on a stream, a
wait, a record, a blocking host read, an allocation. It knows nothing of
``torch.cuda``'s names or of dispatch modes: ``simdevice.api.SimDevice`` (the
device contract) and ``simdevice.dispatch`` (tensors) translate into it.
Every happens-before edge it makes is a call into :mod:`simdevice.runtime.sync`.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import functools
import gc
import os
import platform
import sys
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import attrs
import torch

from simdevice.runtime import sync
from simdevice.runtime.allocator import Segment
from simdevice.runtime.clock import VectorClock
from simdevice.runtime.collectives import Collectives, Gather, Splits
from simdevice.runtime.config import UNIT_NS, SimConfig
from simdevice.runtime.execution import POLLS, Delays, Execution, HostActor
from simdevice.runtime.graphs import (
    CAPTURED_EVENT,
    INVALIDATED,
    ISOLATION,
    MODES,
    UNJOINED,
    UNSUPPORTED,
    Capture,
    Graphs,
    Node,
    SimGraph,
    Sleep,
    Wait,
    cuda_error,
)
from simdevice.runtime.memory import Accessor, Memory, Ref, Storage
from simdevice.runtime.memory import nbytes as span_bytes
from simdevice.runtime.memsaver import LibraryFixes, SimMemorySaver
from simdevice.runtime.reports import Race, ReportSink, forget_sources, user_depth, user_source
from simdevice.runtime.streams import EventRecord, SimStream, StreamOp
from simdevice.runtime.tls import NeedsThreads


@attrs.frozen
class Options:
    """How the simulated device is built, beyond its cost model."""

    #: the simulated memory-saver library (a GPU run gets whatever torch_memory_saver is installed)
    library: LibraryFixes = attrs.field(factory=LibraryFixes)
    #: the caching allocator's reuse choice: an offset into the best-fit order of fitting free blocks
    alloc_pick: int = 0
    #: the device's random number generator starts from this seed (``torch.cuda.manual_seed`` sets it)
    seed: int = 0
    #: synchronizations the simulator adds to the program (a suggested fix, checked without editing the code)
    edges: tuple[sync.Edge, ...] = ()


# The three blocks below are classes, not ``contextlib.contextmanager`` generators: every run enters each, and a
# generator's block costs about 9,000 instructions more (with the others, a tenth of an empty run).


class collector_paused:  # noqa: N801 (a block, named as the functions that make one are)
    """Python's cycle collector does not run during a simulated run (an explicit ``gc.collect()`` of the program
    still does); what a run leaves to it is collected after the run, as Python goes on.

    Determinism: where an automatic collection lands depends on everything the process allocated before the run (a
    search's earlier runs, Hypothesis), so a tensor held in a reference cycle would be freed, its block handed on,
    at another step of the same schedule in a replay. Never collected during a run, it is freed at the same step
    (none) every time. Speed: a run makes many objects that outlive a young collection (accesses in the shadow, the
    trace), which brought full collections over every object of torch and the search, a seventh of a run's time."""

    __slots__ = ("_enabled",)

    def __enter__(self) -> None:
        self._enabled = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc: object) -> None:
        if self._enabled:
            gc.enable()


#: what a get that does not block returns where the queue had no item at its step (:meth:`Runtime.queue_get`)
EMPTY: Any = object()

#: what c10's ``warn_or_error_on_sync`` says under ``torch.cuda.set_sync_debug_mode``
SYNCHRONIZING = "called a synchronizing CUDA operation"
#: streams made at one line that got no operation, each named in a note of its own; more are one note
IDLE_NAMED = 4

#: glibc's ``mallopt`` parameters (malloc.h) and the values its own dynamic thresholds settle at on a 64-bit
#: machine (``DEFAULT_MMAP_THRESHOLD_MAX``, and twice that for the trim threshold)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD, _TRIM_THRESHOLD = 32 << 20, 64 << 20


@functools.cache
def host_memory_kept() -> bool:
    """Host memory a run frees serves the next run's allocations without new pages, once per process (True where the
    C library took the setting: glibc's).

    A run's device memory, pinned buffers and copies are CPU memory: a segment of 1 MiB, a D2H's host output.
    glibc's malloc serves an allocation that large with a fresh ``mmap``, unmapped again at its ``free``, and gives
    back the heap's free top beyond 128 KiB, so that each run's first write of each page is a page fault, the kernel
    zeroing the page: 1,680 faults a run of ``param_readiness/FIXED``, about a tenth of its time
    (docs/benchmarks.md). The thresholds are set to the values glibc's own dynamic thresholds settle at in a
    process that has freed a 32 MiB block (mmap from 32 MiB, trim beyond 64 MiB), which they do not reach here:
    freed memory is kept in the heap, at most the trim threshold of it unused at the top. Nothing a run computes
    depends on it: fresh device and pinned memory is poisoned whichever pages it gets."""
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD))


class assert_explanations_plain:  # noqa: N801
    """During a run, a failing ``assert`` that pytest rewrote (one in a test module) says pytest's plain message, the
    operands' short reprs, without pytest's comparison hook (``pytest_assertrepr_compare``), which diffs them.

    A search fails the program's assert at schedule after schedule, and the hook's diff of each is work no report
    shows: ``assert x.cpu().tolist() == [1.0] * 1024`` took pytest's ndiff hours per failure where pytest does not
    truncate (its CI mode, when the ``CI`` variable is set), and a test that searched such a program never ended.
    The hook is pytest's module global ``_pytest.assertion.util._reprcompare`` (set for the test being run); outside
    pytest there is none, and after the run it is back."""

    __slots__ = ("_saved", "_util")

    def __enter__(self) -> None:
        util = self._util = sys.modules.get("_pytest.assertion.util")
        saved = self._saved = getattr(util, "_reprcompare", None)
        if saved is not None:
            util._reprcompare = None  # type: ignore[union-attr]

    def __exit__(self, *exc: object) -> None:
        if self._saved is not None:
            self._util._reprcompare = self._saved  # type: ignore[union-attr]


class cpu_generator_kept:  # noqa: N801
    """A run draws its host random numbers (``torch.randn`` on the CPU, a module's initial weights) from the CPU
    generator as it stood when the run began, and leaves it so: every run of a search, and the replay of one in a
    new process, draws the same numbers. Without it each run went on from where the one before left the generator,
    so a schedule's verdict could depend on the runs before it. (A ``with simdevice.cuda():`` block, the caller's
    own code run once where it stands, draws from the generator as that code would.)"""

    __slots__ = ("state",)

    def __enter__(self) -> None:
        #: the generator's state as the run began (each actor's own generator starts from it: ``Execution.rng_start``)
        self.state = torch.default_generator.get_state()

    def __exit__(self, *exc: object) -> None:
        torch.default_generator.set_state(self.state)


def _no_more_actors() -> contextlib.AbstractContextManager[Any]:
    raise RuntimeError("the run is over: no actor starts any more")


#: edges inserted into every run made inside :func:`inserted` (beside each run's ``Options.edges``)
_INSERTED: contextvars.ContextVar[tuple[sync.Edge, ...]] = contextvars.ContextVar("inserted_edges", default=())


@contextlib.contextmanager
def inserted(edges: tuple[sync.Edge, ...] | list[sync.Edge]) -> Iterator[None]:
    """Every simulated run made inside the block gets ``edges`` inserted: how a suggested fix is checked against
    any target (a user's function, a built-in program) without a way to pass it options."""
    token = _INSERTED.set(tuple(edges))
    try:
        yield
    finally:
        _INSERTED.reset(token)


def inserted_edges() -> tuple[sync.Edge, ...]:
    """The edges :func:`inserted` adds to runs made now (a cache of runs must not serve one made without them;
    while :func:`counted` records, the no-op :data:`COUNTING` is among them: a cached run recorded nothing)."""
    edges = _INSERTED.get()
    return (*edges, COUNTING) if _COUNTED.get() is not None else edges


@attrs.define
class Occurrences:
    """Where each access of a run was issued: its operation's site and occurrence there (the k-th operation issued
    at that site, from 0, in program order), by the access's ``seq``: what a forward edge's offset is taken from."""

    by_seq: dict[int, tuple[sync.Site, int]] = attrs.field(factory=dict)

    def of(self, seq: int) -> tuple[sync.Site, int] | None:
        return self.by_seq.get(seq)


#: an edge between sites no run has: inserting it changes nothing (what :func:`inserted_edges` adds while counting)
COUNTING = sync.Edge(sync.Site("", ""), sync.Site("", ""))
_COUNTED: contextvars.ContextVar[Occurrences | None] = contextvars.ContextVar("counted_occurrences", default=None)


@contextlib.contextmanager
def counted() -> Iterator[Occurrences]:
    """Every simulated run made inside the block records its accesses' sites and occurrences (the last run's
    are kept): the same run, recorded, since nothing else changes."""
    occ = Occurrences()
    token = _COUNTED.set(occ)
    try:
        yield occ
    finally:
        _COUNTED.reset(token)


#: a forward edge's awaited operation: its site and occurrence
_Key = tuple[sync.Site, int]


@attrs.define
class _Held:
    """An operation issued on a held stream: its accesses wait, with its clock as of its issue, for the awaited
    operations to be issued."""

    op: StreamOp
    who: Accessor
    reads: list[Ref]
    writes: list[Ref]
    needs: frozenset[_Key]
    site: sync.Site
    k: int
    record: Callable[[], EventRecord]


class SharedCell:
    """A value shared between simulated processes, and the clock of its writers."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.clock = VectorClock()


class Mailbox:
    """A queue between simulated processes; every item carries the clock of its ``put``. With a ``maxsize``, a put
    waits for room, and is ordered after the gets that made it (``multiprocessing``'s bounded semaphore: each get
    releases a slot that a put acquires)."""

    def __init__(self, maxsize: int = 0) -> None:
        self.items: deque[tuple[Any, VectorClock]] = deque()
        self.maxsize = maxsize
        #: the gets' clocks: a put of a bounded queue is ordered after them
        self.room = VectorClock()

    def full(self) -> bool:
        return 0 < self.maxsize <= len(self.items)


def _host_side(a: HostActor) -> str:
    """Where a host step of ``a`` is: ``host``, or ``thread`` for a thread the program started (its process is the
    one its name is prefixed by, as a stream's is: ``writer`` is the main process's, ``rank1.writer`` rank 1's)."""
    return "host" if a.process == a.name else "thread"



def op_seed(seed: int, drawn: int) -> int:
    """The seed of the ``drawn``-th random op (from 1) of a generator seeded ``seed``: its own generator's, so that
    its numbers depend on the seed and its place in the issue order alone."""
    return (seed * 1_000_003 + drawn) % (1 << 63)

class Runtime:
    """One run of the simulated device."""

    def __init__(
        self,
        config: SimConfig,
        delays: Delays,
        options: Options,
        enter: Callable[[], contextlib.AbstractContextManager[Any]],
        choices: Delays = lambda allocator: {},
    ) -> None:
        self.config = config
        self._choices = choices
        #: per allocator (``alloc``, ``rank1.alloc``): allocations so far, the schedule's choices, those made
        self._allocs: dict[str, int] = {}
        self._picks: dict[str, dict[int, int]] = {}
        self._picked: set[tuple[str, int]] = set()
        #: the working directory as the run starts: report lines name files relative to it, and a program's
        #: ``os.chdir`` is undone at the run's end (a process's own on a GPU; the command's next run, and the files
        #: it writes where the user named them, start from here)
        self.cwd = forget_sources()
        self.reports = ReportSink()
        self.memory = Memory(self.reports)
        self.memory.in_flight.values = config.values
        self.execution = Execution(config, delays, self.memory, self.reports)
        self.memsaver = SimMemorySaver(self.execution, self.memory, options.library, options.alloc_pick,
                                       unmap=self.host_unmap)
        self.collectives = Collectives(self.execution, self.memory)
        #: CUDA graphs: their captures, private pools and replays (``simdevice.runtime.graphs``); the allocator's
        #: ``empty_cache`` keeps the pools a graph holds
        self.graphs = Graphs()
        self.memsaver.allocator.kept_pools = self.graphs.holders
        self.memsaver.foreign = self.graphs.pools
        self.memsaver.allocator.pool_ids = self.graphs.ids
        #: entered in every host actor's thread (the dispatch mode that turns tensor ops into calls here)
        self._enter = enter
        self._ran = False
        #: stream name -> where the program made it
        self._sites: dict[str, str] = {}
        #: the device RNG of each actor (by name: each rank and process has its own, as each process has its own
        #: CUDA generator), from the run's seed: its seed and the random ops it issued (each gets a seed of its own)
        self._seed = options.seed
        self._rng: dict[str, tuple[int, int]] = {}
        #: inserted edges by the site that waits; the sites backward edges wait for; their latest operation's record
        self._waits_at: dict[sync.Site, list[sync.Edge]] = {}
        edges = (*options.edges, *_INSERTED.get())
        for e in edges:
            self._waits_at.setdefault(e.before, []).append(e)
        self._waited_for = {e.after for e in edges if not e.forward}
        self._edges = edges
        #: the inserted edges' sites that issued an operation (an edge whose site issued none matched nothing)
        self._edge_sites_seen: set[sync.Site] = set()
        #: what the program used that the simulator runs otherwise than a GPU, said once each in the run's notes
        self._said: list[str] = []
        #: the streams torch took from its pool for its own work alone (``collect_all``'s callbacks): no note where
        #: they got no operation, as the program made none of them
        self._torch_streams: set[str] = set()
        #: actors that let go of a received storage (a CUDA IPC mapping) since their last step: what their host
        #: waits for at the next one, or as the process ends (``ipc_unmapped``)
        self._closing: dict[str, list[EventRecord]] = {}
        self._latest: dict[sync.Site, Callable[[], EventRecord]] = {}
        #: forward edges: the sites whose operations are counted (all of them while counting), the count so far
        self._counted = _COUNTED.get()
        self._awaited = {e.after for e in edges if e.forward}
        self._tracked = self._awaited | {e.before for e in edges if e.forward}
        self._occurrences: dict[sync.Site, int] = {}
        #: awaited operations issued so far (their record); per held stream, what its operations wait for; the
        #: operations held, in issue order; events recorded on held streams, with what they wait for
        self._issued: dict[_Key, Callable[[], EventRecord]] = {}
        self._pending: dict[str, frozenset[_Key]] = {}
        self._held: list[_Held] = []
        self._held_records: dict[int, tuple[EventRecord, frozenset[_Key]]] = {}
        self._releasing = False
        #: "stream#index" -> (the line that issued it, bytes it reads and writes): for timelines
        self.op_sites: dict[str, tuple[str, int]] = {}
        #: each host access of memory the device also reaches: its ``seq`` -> (actor, the time of its host step, its
        #: line, how many operations were issued before it); a report of it names no step: the timeline finds it so
        self.host_accesses: dict[int, tuple[str, int, str, int]] = {}
        #: whether ``replay --gpu`` can run what this run ran (False once the program started a process of the
        #: drop-in's ``multiprocessing``, whose steps a GPU replay does not count)
        self.gpu_replay = True
        #: ``torch.cuda.set_sync_debug_mode``'s mode in the run (0; 1: warn; 2: error): what a call that makes the
        #: host wait as CUDA's ``memcpy_and_sync`` or ``stream_synchronize`` does first (:meth:`synchronizing`)
        self.sync_debug = 0

    # -- running -----------------------------------------------------------------------------------
    def run(self, body: Callable[[], Any]) -> Any:
        """Run ``body`` as host actor ``host`` (and whatever it spawns) to the end; return its result."""
        if self._ran:
            raise RuntimeError("a SimDevice runs one program; make a new one per run")
        self._ran = True
        ex = self.execution
        main = ex.new_actor("host", None)
        ex.start_actor(main, body, self._enter)
        host_memory_kept()
        # One intra-op thread: the simulated tensors are small, and each actor thread would otherwise bring an
        # OpenMP team of its own that spins against the others (measured: 3 ms vs 236 ms per run on 2 busy cores).
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            kept = cpu_generator_kept()
            with ex.unraisable_reported(), ex.program_threads_checked(self.memory.lookup), collector_paused(), \
                    assert_explanations_plain(), kept:
                ex.rng_start = kept.state
                try:
                    ex.begin()
                    ex.finished.wait()
                except BaseException:  # interrupted (Ctrl-C): the actors unwind before it goes on
                    ex.interrupt()
                    raise
                ex.join_threads()
        finally:
            torch.set_num_threads(threads)
            self._ended()
            self.cwd_restored()
        if ex.needs_threads is not None:
            raise NeedsThreads(ex.needs_threads)  # the caller runs the program again on threads (SimDevice.run)
        return main.result

    def cwd_restored(self) -> None:
        """The working directory the run started in, again, where the program changed it (``os.chdir``)."""
        try:
            here = os.getcwd()
        except OSError:  # (the program went to a folder it then removed)
            here = None
        if here != self.cwd:
            with contextlib.suppress(OSError):  # (or removed the one the run started in: nowhere to go back to)
                os.chdir(self.cwd)

    def _ended(self) -> None:
        """The run is over: no actor starts any more, so what an actor enters (the façade's, which holds the façade,
        which holds this runtime) is let go, and the memory saver's hold on this runtime; the run's objects then die
        by reference counting when it is dropped."""
        self._enter = _no_more_actors
        self.memsaver.unmap = None  # (a method of this runtime: the memory saver's model no longer holds it)
        self.execution.over = True
        self.execution.modules_back()

    @contextlib.contextmanager
    def here(self) -> Iterator[HostActor]:
        """Run the block in the calling thread as host actor ``host`` (what it spawns runs on threads of its
        own); at its end the run goes on until everything is done. What the block raises is reported."""
        if self._ran:
            raise RuntimeError("a SimDevice runs one program; make a new one per run")
        self._ran = True
        ex = self.execution
        ex.on_threads()  # the block runs where it is, on the calling thread: the actors it spawns get threads
        main = ex.new_actor("host", None)
        host_memory_kept()
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        ex.adopt(main)
        error: BaseException | None = None
        try:
            with ex.unraisable_reported(), ex.program_threads_checked(self.memory.lookup), collector_paused():
                try:
                    with self._enter():
                        yield main
                except BaseException as e:  # the program's own error (or the end of the run): reported, not raised
                    error = e
                finally:
                    ex.leave(main, error)
                    ex.join_threads()
        finally:
            torch.set_num_threads(threads)
            self._ended()
            self.cwd_restored()
        if isinstance(error, (KeyboardInterrupt, SystemExit)):
            raise error

    def current(self) -> HostActor:
        return self.execution.current()

    def current_or_none(self) -> HostActor | None:
        return self.execution.current_or_none()

    def host_step(self, desc: str, poll: bool = False, engine: bool = False) -> HostActor:
        """One host step of the current actor (``poll``: a query or a sleep, see ``HostActor.count``; ``engine``:
        an operation autograd's engine issued, see ``SimConfig.engine_step_ns``)."""
        a = self.execution.host_step(desc, poll, engine)
        allocator = self.memsaver.allocator
        if allocator.has_pending:  # the program dropped tensors since its last step: their frees come first
            allocator.collect_frees()
        if self._closing:
            self._dropped_waits(a)
        return a

    def _dropped_waits(self, a: HostActor) -> None:
        """What ``a``'s host waited for where it let go of received storages (``ipc_unmapped``): the drop blocked
        the host where it came, before this step, or before the process ended."""
        recs = self._closing.pop(a.process, None)
        if recs:
            names = ", ".join(dict.fromkeys(r.stream.name for r in recs))
            self._host_waits(a, recs, f"stream(s) {names} to finish (a received tensor let go)")

    @property
    def in_engine(self) -> bool:
        """Whether the device is applying its own work (a stream operation's effect), not running the program."""
        return self.execution.in_engine

    @property
    def now(self) -> int:
        return self.execution.now

    @property
    def trace(self) -> list[tuple[int, str, str]]:
        return self.execution.trace

    def op_counts(self) -> dict[str, int]:
        return self.execution.op_counts()

    def unfired(self, delays: Iterable[Any] = (), choices: Iterable[Any] = ()) -> tuple[str, ...]:
        """Delays whose operation never came, and choices whose allocation never came; of the schedule's
        ``delays`` and ``choices`` (``Delay``, ``Choice``), those for an actor, stream or allocator the run never
        made (``worker2`` of a run with one worker) never came either."""
        # (each list only where there is something to look at: an empty comprehension is a call, and every run asks)
        never = [f"{name}#{k}~{p}" for name, picks in self._picks.items() for k, p in picks.items()
                 if (name, k) not in self._picked] if self._picks else []
        ex = self.execution
        if delays:
            never += [str(d) for d in delays if d.actor not in ex.actors and d.actor not in ex.streams]
        if choices:
            never += [str(c) for c in choices if c.actor not in self._picks]
        return tuple(sorted([*ex.unfired(), *never]))

    def streams(self) -> dict[str, SimStream]:
        return dict(self.execution.streams)

    def site_of(self, stream: str) -> str | None:
        return self._sites.get(stream)

    def note(self, text: str) -> None:
        """A note for the run's output (once however often it is said)."""
        if text not in self._said:
            self._said.append(text)

    def notes(self) -> tuple[str, ...]:
        """What could make a clean run mean less than it seems: with several streams, a stream the program made
        that got no operation, or whose operations touched no memory any other stream or the host touched."""
        out = [*self._said, *self.memsaver.discarded, *self._free_notes()]
        for e in self._edges:
            unseen = [site for site in (e.after, e.before) if site not in self._edge_sites_seen]
            if unseen:
                out.insert(0, f"inserted edge {e} matched no operation at {' nor at '.join(map(str, unseen))}: "
                              "no operation of that actor was issued at that line, so the edge did nothing")
        if not self.config.values:
            out.insert(0, "race-only (--no-values): no value was computed, so the program's value checks were "
                          "skipped and each host read of device memory got a placeholder (True for a truth value, "
                          "0 for a number, zeros for .cpu()), and pinned memory a copy filled kept its host "
                          "values: a host error raised by the program's own check of a value it read back may come "
                          "from those, not from a race (take such checks out for a race-only search); races and "
                          "stale reads are found as with values")
        made = [s for s in self.execution.streams.values() if not s.name.endswith(("default", "nccl"))]
        if not made:
            return tuple(out)
        touched = self.memory.touched
        # (a stream in a race did touch what another did: a block handed on by a free is another storage, the same
        # bytes)
        raced = {x.actor for r in self.reports.items if isinstance(r, Race) for x in (r.current, r.previous)}
        # the streams that got no operation, by the line that made them: a note each, or one for a line's many (a
        # stream per layer, most never used), in the place of its first
        idle: dict[str | None, list[str]] = {}
        notes: list[str | tuple[str | None, list[str]]] = []
        for s in made:
            site = self._sites.get(s.name)
            where = f" (made at {site})" if site is not None else ""
            if s.ops == 0:
                # (one that ordered a collective was used; one that captured a CUDA graph issued the graph's work)
                if (s.name not in self.collectives.called_under and s.name not in self.graphs.captured_on
                        and s.name not in self._torch_streams):
                    if site not in idle:
                        notes.append((site, idle.setdefault(site, [])))
                    idle[site].append(s.name)
                continue
            mine = touched.get(s.name, set())
            others = set().union(*(v for k, v in touched.items() if k != s.name))
            if not mine & others and s.name not in raced:
                notes.append(f"stream {s.name}{where} touched no memory that another stream or the host touched: "
                             "nothing it did could race")
        for note in notes:
            if isinstance(note, str):
                out.append(note)
                continue
            site, names = note
            if len(names) > IDLE_NAMED:
                made_at = f", made at {site}" if site is not None else ""
                out.append(f"{len(names)} streams{made_at} ({names[0]}, {names[1]}, ..., {names[-1]}) got no "
                           "operation: nothing ran on them to race")
            else:
                where = f" (made at {site})" if site is not None else ""
                out += [f"stream {name}{where} got no operation: nothing ran on it to race" for name in names]
        return tuple(out)

    def _free_notes(self, most: int = 4) -> list[str]:
        """Frees another stream's access was not ordered before, that no reuse turned into a race here."""
        if not self.memory.unordered_frees:
            return []
        raced = {r.freed for r in self.reports.items if isinstance(r, Race) and r.freed is not None}
        latent = [f for f in self.memory.unordered_frees if f.free not in raced]
        out = [f"{f} (no reuse raced with it in this run)" for f in latent[:most]]
        if len(latent) > most:
            out.append(f"... and {len(latent) - most} more such frees")
        return out

    # -- streams and events -------------------------------------------------------------------------
    def new_stream(self, name: str | None, site: str | None = None) -> SimStream:
        """A stream of the current actor; an unnamed one is ``s1``, ``s2``, ... (counting only unnamed streams,
        skipping names taken), as ``CudaDevice`` names them. ``site``: where the program made it (for reports)."""
        a = self.current()
        ex = self.execution
        if site is not None:
            self._sites[(a.process + "." if a.process != "host" else "") + (name or "")] = site
        if name is None:
            while True:
                a.unnamed += 1
                name = f"s{a.unnamed}"
                full = name if a.name == "host" else f"{a.name}.{name}"
                if full not in ex.streams and full not in ex.actors:
                    break
        return ex.new_stream(a, name)

    def stream_by_id(self, sid: int) -> SimStream | None:
        """The stream a ``torch.Stream`` made for one of this run's streams stands for (by its ``stream_id``)."""
        return self.execution.stream_by_order(sid)

    @contextlib.contextmanager
    def on_stream(self, s: SimStream) -> Iterator[None]:
        """Make ``s`` the current actor's current stream for the duration."""
        a = self.current()
        a.stream_stack.append(s)
        try:
            yield
        finally:
            a.stream_stack.pop()

    def current_stream(self) -> SimStream:
        return self.current().current_stream

    @contextlib.contextmanager
    def backward_pass(self) -> Iterator[None]:
        """The current actor runs a backward pass until the context ends (``torch.autograd``'s call into the engine):
        on CUDA its nodes run on autograd's device thread, whose allocations no region of the caller's routes."""
        with self.memsaver.backward(self.current()):
            yield

    def engine_enter(self, s: SimStream) -> None:
        """Autograd's engine makes ``s`` current while it runs a node (its stream guard), until
        :meth:`engine_leave`: the node's hooks, its backward ops, and the accumulation of gradients into a buffer."""
        self.current().stream_stack.append(s)

    def engine_leave(self) -> None:
        """The engine's stream guard ends: the stream current before it is current again."""
        a = self.current()
        if a.stream_stack:
            a.stream_stack.pop()

    def engine_record(self, s: SimStream) -> EventRecord:
        """An event autograd's engine records on ``s`` (no host step, nothing a GPU run counts)."""
        return self._record(s)

    def engine_waits(self, s: SimStream, rec: EventRecord, on: SimStream) -> None:
        """``s`` waits for an event the engine recorded on ``on`` (no host step, nothing a GPU run counts)."""
        if s is not on:
            self._stream_waits(s, rec, f"stream {on.name} (backward)")

    def set_stream(self, s: SimStream) -> None:
        """``torch.cuda.set_stream``: ``s`` is current until changed (or until an enclosing stream context ends)."""
        a = self.current()
        if a.stream_stack:
            a.stream_stack[-1] = s
        else:
            a.stream_stack.append(s)

    def stream_sleep(self, ns: int) -> None:
        """``torch.cuda._sleep``: the current stream idles ``ns`` (no counted operation nor host step: CUDA counts
        neither, it is no aten op)."""
        a = self.current()
        s = a.current_stream
        if s.capture is not None:  # (a kernel of the graph's: each replay sleeps)
            s.capture.nodes.append(Sleep(s.name, ns))
            self.graphs.captured_on.add(s.name)
            return
        sync.issue(a, s)
        self.execution.enqueue(s, StreamOp(s, f"sleep ({ns} ns)", -1, max(ns, 1)))

    def memory_stats(self, process: str | None = None) -> dict[str, int]:
        """Allocated (live blocks), its peak, and reserved (segments) bytes, as torch's caching allocator counts them
        for the same program: its own bytes (``byte_scale`` scales what they cost, not what they are), a block no
        longer allocated from the moment its last tensor dies (``record_stream`` holds it back from reuse only).
        ``process``: that process's own (a host actor's name), as each process of a GPU has its own allocator."""
        allocator = self.memsaver.allocator
        allocator.collect_frees()
        return allocator.stats(process)

    def reset_peak_memory_stats(self, process: str | None = None) -> None:
        self.memsaver.allocator.reset_peaks(process)

    def record_memory_history(self, process: str | None, enabled: str | None, context: str | None,
                              max_entries: int, clear: bool, skip: Iterable[str]) -> None:
        """``torch.cuda.memory._record_memory_history`` of ``process`` (:meth:`CachingAllocator.record_history`):
        its entries' times are virtual."""
        self.memsaver.allocator.record_history(process, enabled, context, max_entries, clear, skip,
                                               lambda: self.execution.now)

    def memory_snapshot(self, process: str | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """``torch.cuda.memory._snapshot()`` of ``process``: its segments and its memory history's entries
        (:meth:`CachingAllocator.snapshot`)."""
        return self.memsaver.allocator.snapshot(process)

    @property
    def device_memory(self) -> int | None:
        """The simulated device's capacity in bytes (``--device-memory``; None: no bound)."""
        return self.memsaver.allocator.capacity

    def default_stream(self) -> SimStream:
        a = self.current()
        assert a.default_stream is not None
        return a.default_stream

    def _stream_waits(self, s: SimStream, rec: EventRecord | None, what: str) -> None:
        if rec is None:  # waiting on a never-recorded event is a no-op, as in CUDA
            return
        self._wait_on(s, rec, what)

    def stream_wait_event(self, s: SimStream, rec: EventRecord | None) -> None:
        self.host_step(f"{s.name}.wait_event")
        if rec is not None and (rec.capture is not None or s.capture is not None):
            self._capture_waits(s, rec)
            return
        self._stream_waits(s, rec, "event")

    def stream_wait_stream(self, s: SimStream, other: SimStream) -> None:
        self.host_step(f"{s.name}.wait_stream({other.name})")
        rec = self._record(other)
        if other.capture is not None:
            other.capture.mark(rec, other)
        if rec.capture is not None or s.capture is not None:
            self._capture_waits(s, rec)
            return
        self._stream_waits(s, rec, f"stream {other.name}")

    def _capture_waits(self, s: SimStream, rec: EventRecord) -> None:
        """``s`` waits for ``rec`` where either is in a CUDA graph capture. A stream outside any capture that waits
        for a point of one joins it (CUDA's fork); a capturing stream that waits for a point of its own capture is
        ordered after it by the replay's order (the origin's wait for a joined stream is CUDA's join, which the
        capture's end asks for); a capturing stream that waits for work outside its capture is CUDA's error."""
        mark = rec.capture
        cap = s.capture
        if mark is None:
            assert cap is not None
            raise cap.fail(ISOLATION + f" (stream {s.name}, capturing, waited for stream {rec.stream.name}'s work "
                                       "outside the capture)")
        owner, name, count, seen = mark
        if owner.graph.capture is not owner:
            raise cuda_error(CAPTURED_EVENT + f" (a wait on an event recorded in {owner.graph.label}'s capture, "
                                              "which has ended)")
        if cap is None:
            s.capture = cap = owner
            owner.streams.append(s)
            owner.counts.setdefault(s.name, 0)
        elif cap is not owner:
            raise cap.fail(ISOLATION + f" (stream {s.name} waited for an event of another graph's capture)")
        covers = cap.covers.setdefault(s.name, {})
        for k, v in seen.items():
            covers[k] = max(covers.get(k, -1), v)
        covers[name] = max(covers.get(name, -1), count)
        if name != s.name:  # (a dependency between two of the graph's branches, made again at each replay)
            cap.nodes.append(Wait(s.name, name))

    def _host_waits(self, a: HostActor, recs: list[EventRecord], desc: str) -> None:
        # (one record's own method where there is one: the predicate is asked at every completion while blocked)
        self.execution.block(a, desc, recs[0].done if len(recs) == 1 else lambda: all(r.done() for r in recs))
        for r in recs:
            sync.host_observes(a, r)

    def synchronizing(self) -> None:
        """Under ``torch.cuda.set_sync_debug_mode``, a call about to make the host wait as c10's ``memcpy_and_sync``
        or ``stream_synchronize`` does (a blocking copy across host and device, a value read on the host, an op that
        needs its output's size, ``Stream.synchronize()``) warns, or raises before it waits, as c10's
        ``warn_or_error_on_sync``; ``torch.cuda.synchronize()``, an event's ``synchronize()``, a non-blocking copy into
        pageable memory and the collectives do not ask (torch: "not all synchronizing operations will trigger")."""
        if self.sync_debug == 2:
            raise RuntimeError(SYNCHRONIZING)
        if self.sync_debug == 1:
            warnings.warn(SYNCHRONIZING, UserWarning, stacklevel=user_depth())

    def stream_synchronize(self, s: SimStream) -> None:
        self.synchronizing()
        a = self.host_step(f"{s.name}.synchronize")
        if s.capture is not None:
            raise s.capture.fail(UNSUPPORTED + f" (stream {s.name}.synchronize())")
        self._host_waits(a, [self._record(s)], f"stream(s) {s.name} to finish")

    def stream_query(self, s: SimStream) -> bool:
        a = self.host_step(f"{s.name}.query", poll=True)
        if s.capture is not None:
            raise s.capture.fail(UNSUPPORTED + f" (stream {s.name}.query())")
        if s.idle():
            sync.host_observes(a, sync.record(s))
            return True
        return False

    def synchronize(self) -> None:
        self._device_waits(self.host_step("synchronize"))

    def _device_waits(self, a: HostActor, why: str = "") -> None:
        """Host ``a`` waits for every stream of its process (the whole device, as its process sees it)."""
        if self.graphs.active:
            cap = self.graphs.capturing(a.process)
            if cap is not None:  # (any thread's, in any capture mode: refused, and the capture invalidated)
                raise cap.fail(UNSUPPORTED + f" (the device synchronized{why} during {cap.graph.label}'s capture on "
                                             f"stream {cap.origin.name})")
        names = ", ".join(s.name for s in a.streams)
        self._host_waits(a, [self._record(s) for s in a.streams], f"stream(s) {names} to finish{why}")

    def event_record(self, s: SimStream | None, timing: bool = False) -> EventRecord:
        a = self.host_step("event.record")
        rec = self._record(s if s is not None else a.current_stream)
        if rec.stream.capture is not None:
            rec.stream.capture.mark(rec, rec.stream)
        if timing:  # the event's time: now, if the stream is past this point; else when it gets past it
            if rec.done():
                rec.stamped = self.now
            else:
                rec.stream.done_at.setdefault(rec.position, None)
        self.execution.progress()
        return rec

    def elapsed_ms(self, start: EventRecord | None, end: EventRecord | None) -> float:
        """``start.elapsed_time(end)``: virtual milliseconds between the two records' completions."""
        self.host_step("event.elapsed_time")
        _not_captured(start, "elapsed_time")
        _not_captured(end, "elapsed_time")
        if start is None or end is None:
            raise RuntimeError("elapsed_time: both events must be recorded first")
        t0, t1 = start.time_ns(), end.time_ns()
        if t0 is None or t1 is None:
            raise RuntimeError("elapsed_time: an event has not completed yet (synchronize on it first)")
        return (t1 - t0) / UNIT_NS

    def event_query(self, rec: EventRecord | None) -> bool:
        a = self.host_step("event.query", poll=True)
        _not_captured(rec, "query")
        if rec is None:
            return True
        if rec.done():
            sync.host_observes(a, rec)
            return True
        return False

    def event_synchronize(self, rec: EventRecord | None) -> None:
        a = self.host_step("event.synchronize")
        _not_captured(rec, "synchronize")
        if rec is not None:
            self._host_waits(a, [rec], f"an event on stream {rec.stream.name} (item {rec.position})")

    # -- memory and stream operations ------------------------------------------------------------------
    def allocate(
        self, like: torch.Tensor, actor: HostActor
    ) -> tuple[torch.Tensor, Storage, bool, torch.Tensor | None]:
        """Device memory shaped like ``like`` from the caching allocator, for the actor's current stream: (the
        CPU bytes, their storage, whether the bytes are fresh, i.e. never handed out before, and the bytes once more
        as a queued operation holds them, ``Storage.alias``, where the allocator made that at no cost; else None)."""
        ms = self.memsaver
        if not like.untyped_storage().nbytes():  # no bytes: no block, and no choice of one for a schedule to make
            got = ms.allocator.malloc(like, None)
            return got.data, self.memory.register(got.data, "device", actor.process), got.fresh, None
        name = "alloc" if actor.name == "host" else f"{actor.name}.alloc"
        k = self._allocs.get(name, 0)
        self._allocs[name] = k + 1
        picks = self._picks.get(name)
        if picks is None:
            picks = self._picks[name] = self._choices(name)
        pick = picks.get(k)
        if pick is not None:
            self._picked.add((name, k))
        # (the region the allocating thread is in: another thread's region() routes none of this one's allocations)
        thread = ms.thread_of(actor)
        cap = actor.current_stream.capture
        if cap is not None:  # (a capturing stream's allocations come from its graph's private pool)
            got = ms.allocator.malloc(like, cap.graph.pool, actor.current_stream, actor, pick)
        else:
            got = ms.allocator.malloc(like, ms.pool_of(thread), actor.current_stream, actor, pick,
                                      ms.backup_of(thread))
        block = got.block
        assert block is not None
        seg = block.segment
        st = self.memory.register(None, "device", actor.process, seg.shadow, block.offset, seg.array(), got.need,
                                  seg.address + block.offset)
        ms.allocated(block, st)
        return got.data, st, got.fresh, got.alias

    def _rng_owner(self) -> str:
        """Whose generator a random op draws from: the current actor's (each rank and process is a process of its
        own, with its own CUDA generator), so that what one rank draws never moves another's numbers."""
        a = self.execution.current_or_none()
        return a.process if a is not None else ""

    def next_seed(self) -> int:
        """The seed of the next random op: each gets its own, in the order the actor issues them, so a random op's
        values depend on the base seed and the program, never on the timing (nor on another rank's draws)."""
        owner = self._rng_owner()
        seed, drawn = self._rng.get(owner, (self._seed, 0))
        self._rng[owner] = (seed, drawn + 1)
        return op_seed(seed, drawn + 1)

    def manual_seed(self, seed: int) -> None:
        """``torch.cuda.manual_seed``: the current actor's random ops from here draw from ``seed``."""
        self.set_rng_state(seed, 0)

    def rng_state(self) -> tuple[int, int]:
        """The current actor's device generator's state (``torch.cuda.get_rng_state``): its seed and how many random
        ops drew."""
        return self._rng.get(self._rng_owner(), (self._seed, 0))

    def set_rng_state(self, seed: int, drawn: int) -> None:
        """``torch.cuda.set_rng_state``: the random ops from here draw as they did after ``drawn`` ops from ``seed``
        (a recomputation under the state kept before its forward draws the forward's numbers)."""
        self._rng[self._rng_owner()] = (int(seed), int(drawn))

    @property
    def initial_seed(self) -> int:
        return self.rng_state()[0]

    def release(self, st: Storage, source: str) -> None:
        """``t.untyped_storage().resize_(0)``: the allocation's block is freed now, as if its tensors died (a
        stream-ordered free: ``record_stream`` defers its reuse); an operation issued later on any of its tensors
        is an illegal access; one issued before still reads the block. (No host step: on CUDA it is no aten op,
        nothing counts it.)"""
        self.current()
        if st.released is not None:
            return
        self.memsaver.allocator.release(st)
        self.memsaver.allocator.collect_frees()
        self.memory.release(st, f"which untyped_storage().resize_(0) at {source} released")

    def record_stream(self, st: Storage, s: SimStream, source: str | None = None) -> None:
        """``t.record_stream(s)``: the allocation's block is not reused before ``s`` reaches the point of its free.
        Of a tensor another process sent (CUDA IPC), nothing: torch's caching allocator skips a pointer it did not
        allocate (``recordStream``), and the sender's block is kept by its reference count instead. ``source``: the
        program's line that called it (where the program did): one naming the stream the tensor was allocated on,
        which torch's allocator ignores, is noted."""
        a = self.current_or_none()
        if a is not None and st.kind == "device" and st.process != a.process:
            return
        allocator = self.memsaver.allocator
        if source is not None and allocator.allocated_on(st) is s:
            self.note(f"record_stream({s.name}) at {source} does nothing: the tensor was allocated on {s.name}, "
                      "whose own order holds its block (torch's allocator ignores a use on the allocating stream); "
                      "to keep the block from reuse until another stream is done with it, name that stream")
        allocator.record_stream(st, s)

    def register_pinned(self, data: torch.Tensor, actor: str) -> Storage:
        return self.memory.register(data, "pinned", actor)

    def lookup_pinned(self, t: torch.Tensor) -> Storage | None:
        return self.memory.lookup(t)

    def lookup_host(self, t: torch.Tensor) -> Storage | None:
        """Host memory the simulator tracks accesses of: pinned memory, or pageable memory shared between processes
        (its copies are pageable ones: :meth:`lookup_pinned` says which)."""
        return self.memory.lookup_host(t)

    def register_shared(self, storage: torch.UntypedStorage, actor: str) -> None:
        """``storage`` (host memory) was moved into shared memory (``share_memory_``, or torch sending it to another
        process): tracked from now on, as two processes' hosts may reach it with nothing of the device between."""
        with torch._C._DisableTorchDispatch():  # (made here, not an operation of the program's)
            whole = torch.empty(0, dtype=torch.uint8, device="cpu").set_(storage)
        if self.memory.lookup_host(whole) is None:
            self.memory.register_shared(whole, actor)

    def enqueue(
        self,
        a: HostActor,
        s: SimStream,
        desc: str,
        duration: int,
        reads: list[Ref],
        writes: list[Ref],
        source: str,
        start: Callable[[], Any] | None = None,
        finish: Callable[[], None] | None = None,
        sweeps: bool = False,
        record: bool = True,
        nbytes: int = -1,
        again: Callable[[], tuple[Any, Any]] | None = None,
    ) -> tuple[int, EventRecord | None]:
        """Enqueue one counted operation of ``a`` (its host step taken) on ``s``: its index, and a record of it
        (None when ``record`` is False: the caller waits for nothing, and no inserted edge needs it).
        ``sweeps``: a copy that reads its source at its completion (``Memory.start``); ``nbytes``: the bytes
        ``reads`` and ``writes`` span, where the caller knows them (-1: counted here). On a stream capturing a CUDA
        graph, the operation is recorded in the graph instead (its index there, no record): ``again`` gives a fresh
        ``start`` and ``finish`` of it for each replay."""
        if s.capture is not None:
            return self._captured(s.capture, s, Node(desc, duration, reads, writes, source, sweeps, nbytes, again),
                                  record, start is not None or finish is not None), None
        at = self._occurrence(s.name, source) if self._counted is not None or self._tracked else None
        if self._waits_at:
            self._inserted_waits(a, s, source, at)
        epoch = sync.issue(a, s)
        index = s.ops
        s.ops += 1
        needs = self._pending.get(s.name) if self._pending else None
        mark = self.memory.issues
        issued = None
        if needs is None:
            issued = self.memory.issue(Accessor(s.name, epoch, s.clock, desc, index, source), reads, writes)
        op = StreamOp(s, f"{desc} #{index}", index, duration, start, finish, issued=issued)
        op.sweeps = sweeps
        op.source = source
        spans = nbytes if nbytes >= 0 else span_bytes(reads) + span_bytes(writes)
        self.op_sites[f"{s.name}#{index}"] = (source, spans)
        self.execution.enqueue(s, op)
        rec = self._record(s) if record or self._waited_for or at is not None or needs is not None else None
        if self._waited_for:
            self._issued_at(s.name, source, lambda: rec)  # type: ignore[arg-type,return-value]
        if needs is None:
            if at is not None:
                self._issued_now(at, lambda: rec, mark)  # type: ignore[arg-type,return-value]
        else:  # held by a forward edge: its accesses are issued once what the stream waits for is
            site, k = at if at is not None else (sync.Site(s.name, source), -1)
            who = Accessor(s.name, epoch, sync.held_clock(s), desc, index, source)
            self._held.append(_Held(op, who, reads, writes, needs, site, k, lambda: rec))  # type: ignore[arg-type,return-value]
        return index, rec

    # -- CUDA graphs ------------------------------------------------------------------------------------------
    def _captured(self, cap: Capture, s: SimStream, node: Node, waits: bool, computes: bool) -> int:
        """An operation issued on a stream of capture ``cap``, recorded as a node of its graph."""
        if waits:  # the host would wait for it: a sync with a capturing stream
            raise cap.fail(UNSUPPORTED + f" ({node.desc} on stream {s.name} makes the host wait for it)")
        if computes and node.again is None:
            raise NotImplementedError(f"{node.desc} in a CUDA graph capture is not simulated")
        # (a graph holds no tensor of the program's: what its nodes touch is kept by aliases of the bytes, which keep
        # no block allocated, so that the program's del frees it as on a GPU and a replay then reaches a freed block)
        node.reads = [(st, st.alias(t)) if st.kind == "device" else (st, t) for st, t in node.reads]
        node.writes = [(st, st.alias(t)) if st.kind == "device" else (st, t) for st, t in node.writes]
        # (what outside the graphs' pools it touches: a block of a graph's pool freed is the graph's still, and no
        # allocation outside a capture takes it)
        allocator = self.memsaver.allocator
        node.held = [st for st, _ in (*node.reads, *node.writes)
                     if (seg := allocator.segment_of(st)) is not None and seg.pool not in self.graphs.pools]
        self.graphs.captured_on.add(s.name)
        return cap.add(s, node)

    def graph_new(self) -> SimGraph:
        return self.graphs.new()

    def capturing_now(self) -> bool:
        """``torch.cuda.is_current_stream_capturing()``."""
        return self.current().current_stream.capture is not None

    def capture_begin(self, g: SimGraph, pool: tuple[int, int] | None, mode: str) -> None:
        """``g.capture_begin(pool, capture_error_mode=mode)``: what the current stream issues from now is recorded
        into ``g`` (its allocations from ``pool``, shared, or a pool of ``g``'s own)."""
        a = self.host_step("CUDAGraph.capture_begin")
        if mode not in MODES:
            raise RuntimeError(f"Unknown capture_error_mode {mode!r}: expected one of {', '.join(MODES)}")
        if g.nodes is not None or g.capture is not None:
            raise RuntimeError("This CUDAGraph instance already owns a captured graph. To capture a new graph, "
                               "create a new instance.")
        s = a.current_stream
        if s is a.default_stream:
            raise RuntimeError("CUDA graphs must be captured on a non-default stream. (However, after capture, it's "
                               "ok to replay them on the default stream.)")
        if s.capture is not None:
            raise s.capture.fail(UNSUPPORTED + f" (a capture began on stream {s.name}, already capturing)")
        g.handle, g.pool = self.graphs.pool_for(pool)
        self.graphs.hold(g.pool)
        cap = Capture(g, s, a.process)
        g.capture = s.capture = cap
        self.graphs.active.append(cap)

    def capture_end(self, g: SimGraph) -> None:
        """``g.capture_end()``: the capture ends (on the stream it began on), its nodes are ``g``'s."""
        a = self.host_step("CUDAGraph.capture_end")
        cap = g.capture
        if cap is None:
            raise RuntimeError("CUDAGraph::capture_end called without a capture underway (capture_begin first)")
        if a.current_stream is not cap.origin:
            raise RuntimeError("Capture must end on the same stream it began on.")
        for t in cap.streams:
            t.capture = None
        self.graphs.active.remove(cap)
        g.capture = None
        if cap.invalid is not None:
            raise cuda_error(INVALIDATED + f" ({cap.invalid})")
        covered = cap.covers.get(cap.origin.name, {})
        unjoined = [t.name for t in cap.streams[1:] if covered.get(t.name, -1) < cap.counts.get(t.name, 0)]
        if unjoined:
            raise cuda_error(UNJOINED + f" (stream(s) {', '.join(unjoined)}: stream {cap.origin.name} did not wait "
                                        "for their last work in the capture)")
        g.nodes = cap.nodes
        g.origin = cap.origin.name
        if not any(isinstance(n, (Node, Sleep)) for n in g.nodes):  # (a wait makes no node of its own)
            warnings.warn("The CUDA Graph is empty. This usually means that the graph was attempted to be captured on "
                          "wrong device or stream.", UserWarning, stacklevel=user_depth())

    def graph_replay(self, g: SimGraph) -> None:
        """``g.replay()``: its nodes issued in the order they were captured, each at the replay's line: the capture
        stream's on the current stream, another captured stream's (a branch) on a stream of the graph's own, with the
        waits between them the capture made (so that two branches run side by side where the capture let them)."""
        a = self.host_step("CUDAGraph.replay")
        if g.nodes is None:
            raise RuntimeError("Called CUDAGraph::replay without a preceding successful capture.")
        s = a.current_stream
        if s.capture is not None:
            raise NotImplementedError("a CUDA graph replayed inside another's capture (a child graph) is not "
                                      "simulated")
        # (each node issued where the program replays the graph, named with the line that captured it: the place a
        # wait before it goes is before the replay)
        here = user_source()
        allocator = self.memsaver.allocator
        allocator.collect_frees()
        for node in g.nodes:
            if isinstance(node, Wait):
                waiter, on = self._branch(a, g, node.stream, s), self._branch(a, g, node.on, s)
                self._wait_on(waiter, self._record(on), f"stream {on.name} ({g.label}'s captured wait)")
                continue
            if isinstance(node, Sleep):
                t = self._branch(a, g, node.stream, s)
                sync.issue(a, t)
                self.execution.enqueue(t, StreamOp(t, f"sleep ({node.ns} ns, {g.label})", -1, max(node.ns, 1)))
                continue
            for st in node.held:
                if st.released is None and allocator.segment_of(st) is None:
                    # (its block went back to the allocator: the replay reaches what the block holds now)
                    self.memory.release(st, f"freed after {g.label} was captured (a CUDA graph holds no tensor: "
                                            "the program must keep alive what a graph reads and writes while it "
                                            "replays it)")
            start, finish = node.again() if node.again is not None else (None, None)
            self.enqueue(a, self._branch(a, g, node.stream, s), f"{node.desc} ({g.label}, captured at {node.source})",
                         node.duration, node.reads, node.writes, here, start=start, finish=finish, sweeps=node.sweeps,
                         record=False, nbytes=node.nbytes)

    def _branch(self, a: HostActor, g: SimGraph, name: str, s: SimStream) -> SimStream:
        """The stream the nodes captured on stream ``name`` replay on: ``s`` (the replay's) for the capture stream's,
        a stream of ``g``'s own for another's (made once, named after the graph and the captured stream:
        ``graph1-side``)."""
        if name == g.origin:
            return s
        t = g.branches.get(name)
        if t is None:
            t = g.branches[name] = self.execution.new_stream(a, f"{g.label}-{name.rsplit('.', 1)[-1]}")
        return t

    def graph_reset(self, g: SimGraph) -> None:
        """``g.reset()`` (or the graph's end): its nodes dropped, its hold on its pool let go."""
        if g.capture is not None:
            raise RuntimeError("CUDAGraph::reset during its capture (end the capture first)")
        g.nodes = None
        if g.pool is not None:
            self.graphs.let_go(g.pool)
            g.pool = None

    def mem_pool_new(self) -> tuple[tuple[int, int], str]:
        """``torch.cuda.MemPool()``: a private pool's id and tag, held while the pool object lives."""
        handle, tag = self.graphs.pool_for(self.graphs.pool_handle())
        self.graphs.hold(tag)
        return handle, tag

    def mem_pool_routed(self, tag: str) -> contextlib.AbstractContextManager[None]:
        """``torch.cuda.use_mem_pool(pool)``: the current thread's allocations come from ``tag``'s pool for the
        block (a capture's from its graph's still)."""
        return self.memsaver.routed(tag)

    def mem_pool_ended(self, tag: str) -> None:
        """A ``MemPool`` object was dropped: its hold on its pool let go (``empty_cache`` gives its free segments
        back once no graph holds it either)."""
        self.graphs.let_go(tag)

    def _not_capturing(self, what: str) -> None:
        if self.current().current_stream.capture is not None:
            raise NotImplementedError(f"{what} in a CUDA graph capture is not simulated")

    # -- inserted edges ------------------------------------------------------------------------------
    def _issued_at(self, actor: str, source: str, record: Callable[[], EventRecord]) -> None:
        """An operation issued at a site a backward inserted edge waits for: later waits are on this one."""
        if self._waited_for:
            site = sync.Site(actor, source)
            if site in self._waited_for:
                self._latest[site] = record
                self._edge_sites_seen.add(site)

    def _occurrence(self, actor: str, source: str) -> _Key | None:
        """The site of an operation about to be issued and its occurrence there (the k-th issued at that site),
        where a forward edge names the site or the run is counted; else None."""
        if self._counted is None and not self._tracked:
            return None
        site = sync.Site(actor, source)
        if self._counted is None and site not in self._tracked:
            return None
        k = self._occurrences.get(site, 0)
        self._occurrences[site] = k + 1
        if site in self._tracked:
            self._edge_sites_seen.add(site)
        return site, k

    def _issued_now(self, at: _Key | None, record: Callable[[], EventRecord], mark: int) -> None:
        """The operation ``at`` made its accesses (``memory.issues`` was ``mark`` before them): a counted run notes
        their site; a forward edge waiting for it is released."""
        if at is None:
            return
        if self._counted is not None:
            for seq in range(mark + 1, self.memory.issues + 1):
                self._counted.by_seq[seq] = at
        if at[0] in self._awaited:
            self._issued[at] = record
            self._release()
            self.execution.changed()  # a host blocked on it may go on
            # and a stream held at a marker for it: an awaited host access is done at once, with no completion on
            # any stream to move the held one on
            self.execution.kick_all()

    def _record(self, s: SimStream) -> EventRecord:
        """``sync.record(s)``; on a stream held by a forward edge, the record is released with it."""
        rec = sync.record(s)
        needs = self._pending.get(s.name) if self._pending else None
        if needs is not None:
            self._held_records[id(rec)] = (rec, needs)
        return rec

    def _inherit(self, s: SimStream, rec: EventRecord) -> None:
        """``s`` waits for an event recorded on a held stream: it is held with it (what it issues from now is after
        the operations that stream waits for)."""
        held = self._held_records.get(id(rec))
        if held is not None and held[0] is rec:
            self._pending[s.name] = self._pending.get(s.name, frozenset()) | held[1]

    def _wait_on(self, s: SimStream, rec: EventRecord, what: str) -> None:
        if self._held_records:
            self._inherit(s, rec)
        self.execution.enqueue(s, sync.stream_waits(s, rec, what))

    def _release(self) -> None:
        """Awaited operations were issued: every held stream, event and operation whose awaited operations are all
        issued now is ordered after them, and the held operations make their accesses, in issue order (one may be
        awaited in turn)."""
        if self._releasing:
            return
        self._releasing = True
        try:
            while True:
                issued = self._issued
                for name, needs in list(self._pending.items()):
                    if needs <= issued.keys():
                        sync.released(self.execution.streams[name].clock, [issued[n]() for n in needs])
                        del self._pending[name]
                for key, (rec, needs) in list(self._held_records.items()):
                    if needs <= issued.keys():
                        sync.released(rec.clock, [issued[n]() for n in needs])
                        del self._held_records[key]
                ready = next((h for h in self._held if h.needs <= issued.keys()), None)
                if ready is None:
                    return
                self._held.remove(ready)
                sync.released(ready.who.clock, [issued[n]() for n in ready.needs])
                mark = self.memory.issues
                ready.op.issued = self.memory.issue(ready.who, ready.reads, ready.writes)
                self._issued_now((ready.site, ready.k) if ready.k >= 0 else None, ready.record, mark)
        finally:
            self._releasing = False

    def _inserted_waits(self, a: HostActor, s: SimStream | None, source: str, at: _Key | None,
                        collective: bool = False) -> None:
        """The inserted edges into the operation about to be issued at ``source`` on ``s`` (None: a host step of
        ``a``; ``collective``: ``s`` is the communication stream of a collective): its stream waits for (or its host
        synchronizes on) the latest operation at each backward edge's start, and the matching operation at each
        forward edge's."""
        waiter = sync.Site(s.name if s is not None else a.name, source)
        if waiter in self._waits_at:
            self._edge_sites_seen.add(waiter)
        for e in self._waits_at.get(waiter, ()):
            if e.forward:
                if at is not None:
                    self._forward_wait(a, s, e, at[1] + e.offset, collective)
                continue
            latest = self._latest.get(e.after)
            if latest is None:
                continue
            rec = latest()
            if s is not None:
                self._wait_on(s, rec, f"inserted edge from {e.after}")
            else:
                self._inserted_host_wait(a, [rec], f"inserted edge from {e.after}")

    def _inserted_host_wait(self, a: HostActor, recs: list[EventRecord], what: str) -> None:
        """A host step waits for an inserted edge's operations: where it had to wait, the trace says when the wait
        ended (the step's line is at its start, and what it reads, it reads then)."""
        before = self.now
        self._host_waits(a, recs, what)
        if self.now > before:
            self.trace.append((self.now, a.name, f"waited for {what}"))

    def _collective_waits(self, a: HostActor, source: str, comm: SimStream | None = None,
                          group: int = 0) -> _Key | None:
        """The inserted edges into a collective about to be issued at ``source`` (on ``comm``, by default the
        stream of the actor's process group ``group``); its site and occurrence."""
        if not (self._waits_at or self._tracked or self._counted is not None):
            return None
        comm = comm if comm is not None else self.collectives.comm_stream(a, group)
        at = self._occurrence(comm.name, source)
        if self._waits_at:
            self._inserted_waits(a, comm, source, at, collective=True)
        return at

    def _forward_wait(self, a: HostActor, s: SimStream | None, e: sync.Edge, j: int, collective: bool) -> None:
        """A forward edge into the operation about to be issued: it waits for the ``j``-th operation at
        ``e.after`` (none: no wait). Issued already: as a backward edge's wait on it. Not yet: a stream is held
        until it is issued and passes once it is done; a host step's host blocks until then; a collective's
        host blocks until it is issued (the collective makes its accesses when called), its stream then waits."""
        if j < 0:
            return
        key = (e.after, j)
        what = f"inserted forward edge from {e.after} (its operation {j})"
        got = self._issued.get(key)
        if got is None and (s is None or collective):
            self.execution.block(a, f"{what} to be issued", lambda: key in self._issued)
            got = self._issued.get(key)
        if s is None:
            self._inserted_host_wait(a, [got()] if got is not None else [], what)
            return
        if got is not None:
            self._wait_on(s, got(), what)
            return
        self._pending[s.name] = self._pending.get(s.name, frozenset()) | {key}

        def ready() -> bool:
            r = self._issued.get(key)
            return r is not None and r().done()

        self.execution.enqueue(s, sync.forward_marker(s, what, ready))

    def device_writes(self, s: SimStream, desc: str, index: int, writes: list[Ref], source: str) -> None:
        """Stream ``s`` writes ``writes`` now, as part of its operation ``index`` (the output of an op whose size
        the host had to wait for: the host already synchronized with it)."""
        epoch = sync.device_op(s)
        issued = self.memory.issue(Accessor(s.name, epoch, s.clock, desc, index, source), [], writes)
        self.memory.start(issued, self.now)
        self.memory.finish(issued)

    def unseen_copy(self, a: HostActor, s: SimStream, desc: str, writes: list[Ref], source: str) -> None:
        """A blocking copy from pageable host memory onto ``s`` that torch makes below the dispatch modes (Python
        data put on the device: ``torch.tensor(data, device="cuda")``, a list used as an index), so a GPU run's mode
        sees none: no step and no operation of ``a`` or ``s`` is counted, as none is there. As CUDA makes it
        (``memcpy_and_sync``): the host waits for everything ``s`` was given so far, ``s`` writes ``writes``
        (ordered after the host's past), and the host sees it done. An inserted edge into its line (a fix that
        orders the copy after another stream's operation) makes ``s`` wait first, as a counted operation's does."""
        self.synchronizing()
        if self._waits_at:
            self._inserted_waits(a, s, source, None)
        self._host_waits(a, [self._record(s)], f"stream {s.name} to take {desc} (a blocking copy)")
        epoch = sync.issue(a, s)
        issued = self.memory.issue(Accessor(s.name, epoch, s.clock, desc, -1, source), [], writes)
        self.memory.start(issued, self.now)
        self.memory.finish(issued)
        sync.host_observes(a, sync.record(s))

    def host_waits_for(self, a: HostActor, rec: EventRecord, desc: str) -> None:
        """The host needs what the operation recorded at ``rec`` produced (``.item()``, a blocking copy)."""
        self._host_waits(a, [rec], desc)

    def host_waits_for_stream(self, a: HostActor, s: SimStream, desc: str) -> None:
        """Within an operation it is issuing (its host step taken), the host waits for everything ``s`` was given so
        far: a blocking copy ATen makes inside an op (``memcpy_and_sync``), as a host index is moved to the device."""
        if s.capture is not None:
            raise s.capture.fail(UNSUPPORTED + f" ({desc})")
        self.synchronizing()
        self._host_waits(a, [self._record(s)], desc)

    def host_access(self, a: HostActor, op: str, reads: list[Ref], writes: list[Ref], source: str,
                    step: bool = True) -> None:
        """A host step of ``a`` reads and writes host memory the device also reaches (pinned buffers), now.
        ``step`` False: an access within the actor's last step, with no step of its own (pageable memory shared
        between processes, a read below the dispatcher): it takes an epoch of its own first, newer than any the
        actor published (a ``Queue.put`` of that step releases the clock before it: the access comes after)."""
        if not step:
            sync.access_within_step(a, a.name)
        at = self._occurrence(a.name, source)
        if self._waits_at:
            self._inserted_waits(a, None, source, at)
        who = Accessor(a.name, a.clock.get(a.name), a.clock, op, -1, source, _host_side(a))
        mark = self.memory.issues
        issued = self.memory.issue(who, reads, writes)
        self.host_accesses[self.memory.issues] = (a.name, self.now, source, len(self.op_sites))
        self.memory.start(issued, self.now)
        self.memory.finish(issued)
        self.execution.progress()
        if at is not None or self._waited_for:
            rec = sync.host_record(a, a.current_stream)  # (a handshake's start: the host past this access)
            if self._waited_for:
                self._issued_at(a.name, source, lambda: rec)
            self._issued_now(at, lambda: rec, mark)

    def unseen_host_read(self, t: torch.Tensor, op: str, source: str) -> None:
        """The current actor's host reads host tensor ``t``'s bytes where no aten op does (``tolist()`` reads them
        in C++, below the dispatcher): where ``t`` is pinned memory of this run, the read is checked as a host
        access now, within the actor's last step (no step of its own: a GPU run counts none there either)."""
        self.unseen_host_access(t, [t], [], op, source)

    def unseen_host_access(self, t: torch.Tensor, reads: list[torch.Tensor], writes: list[torch.Tensor], op: str,
                           source: str) -> None:
        """As :meth:`unseen_host_read`, for reads and writes of some of the bytes of ``t``'s storage: ``reads``
        and ``writes`` are tensors over them (a NumPy view's element accesses)."""
        a = self.current_or_none()
        if a is None or self.execution.in_engine:
            return
        st = self.lookup_host(t)
        if st is not None:
            self.host_access(a, op, [(st, x) for x in reads], [(st, x) for x in writes], source, step=False)

    def host_unmap(self, a: HostActor, op: str, segments: list[Segment], source: str) -> None:
        """A host step of ``a`` (a memory-saver pause) unmaps ``segments`` now: an access of them a stream issued
        before it, not ordered before it, races with it (:meth:`Memory.issue_unmap`). Inserted edges into it wait
        first, as into any host access: a fix that makes the host wait for the stream before the pause is checked
        so."""
        at = self._occurrence(a.name, source)
        if self._waits_at:
            self._inserted_waits(a, None, source, at)
        who = Accessor(a.name, a.clock.get(a.name), a.clock, op, -1, source, _host_side(a))
        mark = self.memory.issues
        self.memory.issue_unmap(who, [(seg.label, seg.shadow, seg.nbytes) for seg in segments])
        self.host_accesses[self.memory.issues] = (a.name, self.now, source, len(self.op_sites))
        if at is not None:
            rec = sync.host_record(a, a.current_stream)
            self._issued_now(at, lambda: rec, mark)

    def device_side(self) -> contextlib.AbstractContextManager[None]:
        """The device's own work on bytes (a stream operation's effect): no access of the program."""
        return self.execution.device_side()

    def empty_cache(self) -> None:
        """``torch.cuda.empty_cache()``: the allocator's entirely free segments of the host's process given back.
        Giving one back is ``cudaFree``, which waits for the whole device first (an implicit synchronization: on an
        H100 a stalled D2H had always landed when the host read it after such an ``empty_cache``, and never where
        none was given back, docs/confirmations.md, thirty-sixth run): the host waits for every stream of its
        process then."""
        a = self.host_step("empty_cache")
        if self.memsaver.empty_cache(a):
            self._device_waits(a, " (empty_cache gave a segment back: cudaFree)")

    # -- host actors, shared values, queues ----------------------------------------------------------------
    def spawn(self, name: str, body: Callable[[], Any], thread: bool = False) -> HostActor:
        """``Process.start``: a new host actor of its own process, after the parent's step that started it;
        ``thread``: ``Thread.start``, a new host actor of the parent's process."""
        ex = self.execution
        parent = self.host_step(f"{'Thread' if thread else 'Process'}.start({name})")
        child = ex.new_actor(name, parent, process=not thread, thread=thread)

        def process() -> Any:
            out = body()
            # the process ends after what its host blocked on as it let go of received storages last (torch's
            # deleter synchronizes): a join of it is ordered after that too (a thread's process goes on)
            if not thread:
                self._dropped_waits(child)
            return out

        ex.start_actor(child, process, self._enter)
        ex.progress()
        return child

    def join(self, child: HostActor) -> None:
        what = "Process" if child.process == child.name else "Thread"
        a = self.host_step(f"{what}.join({child.name})")
        self.execution.block(a, f"{what.lower()} {child.name} to exit", lambda: child.state == "done")
        sync.observe(a, child)

    def value_get(self, cell: SharedCell, step: str = "Value.get") -> Any:
        a = self.host_step(step, poll=True)
        sync.observe(a, cell)
        return cell.value

    def value_set(self, cell: SharedCell, value: Any, step: str = "Value.set") -> None:
        a = self.host_step(step)
        sync.publish(cell, a)
        if value != cell.value:
            cell.value = value
            self.execution.changed()

    def value_update(self, cell: SharedCell, update: Callable[[Any], Any], step: str) -> Any:
        """A read-modify-write of the value in one host step (a store's ``add``, ``compare_set``): ordered after its
        writers and before its later readers; the new value."""
        a = self.host_step(step)
        sync.observe(a, cell)
        sync.publish(cell, a)
        value = update(cell.value)
        if value != cell.value:
            cell.value = value
            self.execution.changed()
        return value

    def value_wait(self, cell: SharedCell, until: Callable[[Any], bool], step: str, desc: str) -> None:
        """Block until ``until(cell.value)`` (``multiprocessing.Event.wait``): a host step ``step``, then a wait
        for ``desc``, after which the actor is ordered after the value's writers."""
        a = self.host_step(step)
        self.execution.block(a, desc, lambda: until(cell.value))
        sync.observe(a, cell)

    def lock_acquire(self, cell: SharedCell) -> None:
        """``multiprocessing.Lock.acquire``: wait until the lock is free and take it, ordered after its last
        release (:meth:`value_set` of False releases it). Of the processes waiting when it is released, one takes
        it; the others wait again."""
        a = self.host_step("Lock.acquire")
        while cell.value:
            self.execution.block(a, "a lock another process holds", lambda: not cell.value)
        sync.observe(a, cell)
        cell.value = True

    def semaphore_acquire(self, cell: SharedCell) -> None:
        """``threading.Semaphore.acquire``: wait until the count is above 0 and take one, ordered after the releases
        so far (:meth:`value_set` of a greater count releases). Of the actors waiting when one is released, one
        takes it; the others wait again."""
        a = self.host_step("Semaphore.acquire")
        while cell.value <= 0:
            self.execution.block(a, "a semaphore's count to rise above 0", lambda: cell.value > 0)
        sync.observe(a, cell)
        cell.value -= 1

    def barrier_arrive(self, arrivals: SharedCell) -> HostActor:
        """``multiprocessing.Barrier.wait``'s host step: the arriving actor's past joins the round's (``arrivals``),
        which every party is ordered after as it leaves (:meth:`barrier_leave`)."""
        a = self.host_step("Barrier.wait")
        sync.publish(arrivals, a)
        return a

    def barrier_leave(self, a: HostActor, arrivals: SharedCell) -> None:
        """``a`` leaves a completed round of a barrier: ordered after every party's arrival in it."""
        sync.observe(a, arrivals)

    def process_poll(self, child: HostActor, step: str) -> bool:
        """``Process.is_alive()`` / ``exitcode`` in a run: a polling host step (the child may run meanwhile);
        whether ``child`` is done, after which the caller is ordered after it."""
        a = self.host_step(step, poll=True)
        if child.state != "done":
            return False
        sync.observe(a, child)
        return True

    # -- CUDA IPC: device tensors sent to another process ----------------------------------------------------------
    def ipc_sent(self, s: SimStream) -> EventRecord:
        """A device tensor pickled for another process (``Queue.put``, a process's arguments): torch records an
        interprocess event on ``s`` then (``CudaIPCSentData``). Part of the step that sends it: no step of its own."""
        return self._record(s)

    def ipc_mapped(self, rec: EventRecord) -> None:
        """A device tensor received from another process, its memory mapped here for the first time: the
        receiving actor's current stream waits for the sender's event (``cudaStreamWaitEvent`` in
        ``_new_shared_cuda``). Part of the step that receives it."""
        self._wait_on(self.current().current_stream, rec, "the IPC event of a received tensor")

    def ipc_segment(self, st: Any) -> Any:
        """The sender's segment of device storage ``st`` (what one CUDA IPC handle maps), or None."""
        return self.memsaver.allocator.segment_of(st)

    def ipc_unmapped(self, st: Any, closes: bool = False) -> None:
        """The receiving actor let go of its last tensor of ``st``, a device storage another process sent it: torch's
        deleter synchronizes the receiver's current stream before it releases the sender's block (the reference
        count the sender's allocator reads before it reuses the block), so the block's free waits for that stream
        as it stands now, and so does the receiver's host (``cudaStreamSynchronize`` blocks it). ``closes``: no
        tensor of the sender's segment is left in the receiver, so the deleter unmaps it first
        (``cudaIpcCloseMemHandle``), which waits for every stream of the receiver, the host blocked till then (0.1 ms
        against 100 ms on an H100, docs/confirmations.md): the free waits for them all, and so does the receiver's
        host. The host's wait comes at its next step, or as its process ends where none comes (a join of the
        process is ordered after it). Part of the step that dropped the tensor: no step of its own."""
        a = self.current_or_none()
        if a is None:
            return
        allocator = self.memsaver.allocator
        if not closes:
            rec = self._record(a.current_stream)
            allocator.released_by(st, rec)
            self._closing.setdefault(a.process, []).append(rec)  # (``cudaStreamSynchronize``: the host waits for it)
            return
        streams = a.streams if a.current_stream in a.streams else [*a.streams, a.current_stream]
        recs = [self._record(s) for s in streams]
        for rec in recs:
            allocator.released_by(st, rec)
        self._closing.setdefault(a.process, []).extend(recs)

    def queue_put(self, box: Mailbox, item: Any) -> None:
        a = self.host_step("Queue.put")
        if box.maxsize:
            while box.full():
                self.execution.block(a, "room on a bounded queue", lambda: not box.full())
            sync.observe(a, box.room)
        box.items.append((item, sync.snapshot(a)))
        self.execution.changed()

    def queue_get(self, box: Mailbox, block: bool = True) -> Any:
        """The next item of ``box``, in one step; where it has none, a blocking get waits for one, another returns
        :data:`EMPTY` (a timed get's try: another getter may have taken the item its poll saw)."""
        a = self.host_step("Queue.get")
        if not block and not box.items:
            return EMPTY
        while not box.items:  # (another getter woken with it may have taken the item first: wait again)
            self.execution.block(a, "an item on a queue", lambda: bool(box.items))
        item, clock = box.items.popleft()
        sync.observe(a, clock)
        if box.maxsize:
            box.room.join(a.clock)
        self.execution.changed()
        return item

    def queue_wait(self, box: Mailbox, what: str) -> None:
        """A blocking wait, in one step, until ``box`` has an item, taking none (a pipe's ``poll()`` without a
        timeout)."""
        a = self.host_step("Queue.poll")
        while not box.items:
            self.execution.block(a, what, lambda: bool(box.items))

    def queue_empty(self, box: Mailbox) -> bool:
        self.host_step("Queue.empty", poll=True)
        return not box.items

    def host_sleeps(self, ns: int) -> None:
        """The current actor's host sleeps ``ns`` (``time.sleep`` in a drop-in program): virtual time it spends,
        no step of its own (nothing a GPU run counts), so its next step comes that much later. A measured step's
        cost holds its sleeps already. The device and the other actors go on meanwhile (``Execution.sleep_until``):
        an allocation after the sleep finds the streams where they are when it wakes, not where they were at the
        actor's last step (a block held for a recorded stream that finished during the sleep is handed out again,
        as on an H100)."""
        a = self.current()
        if not a.traced:
            a.time += ns
        self.execution.sleep_until(a, a.time)
        # a loop that sleeps and takes no step (``while True: time.sleep(1)``) never gives another actor a turn,
        # nor meets the step bound or the stall horizon: every so many sleeps, one is a polling step
        steps = self.execution.host_steps
        mark, n = a.sleeps
        a.sleeps = (steps, n + 1 if mark == steps else 1)
        if a.sleeps[1] > POLLS:
            self.host_step("time.sleep", poll=True)

    def sleep(self, units: float) -> None:
        if not units >= 0:  # also NaN
            raise ValueError(f"sleep({units}): a sleep must be >= 0 units")
        self.host_step(f"sleep({units})", poll=True)
        self.host_sleeps(int(units * UNIT_NS))

    # -- collectives ----------------------------------------------------------------------------------------
    def rank(self) -> int:
        a = self.current_or_none()
        return 0 if a is None else self.collectives.world_of(a.process)[1]

    def world_size(self) -> int:
        a = self.current_or_none()
        return 1 if a is None else self.collectives.world_of(a.process)[0].size

    def rank_in_world(self) -> tuple[int, int] | None:
        """The current actor's rank and its world's size, where it is a rank of a world :meth:`spawn_ranks` made
        (None: no actor runs, or it is no rank: a world of its own)."""
        a = self.current_or_none()
        got = None if a is None else self.collectives.rank_of(a.process)
        return None if got is None else (got[1], got[0].size)

    def new_group(self, gid: int, members: tuple[int, ...]) -> None:
        """The current actor made process group ``gid`` of ``members`` (global ranks in group-rank order;
        :meth:`Collectives.new_group`): no host step, as ``new_group`` queues nothing on a stream."""
        self.collectives.new_group(self.current(), gid, members)

    def spawn_ranks(self, world_size: int, body: Callable[[], Any]) -> list[Any]:
        """Run ``body`` on actors ``rank0..`` of a new world; wait for all of them; return their results."""
        ranks = self.start_ranks(world_size, body)
        self.join_ranks(ranks)
        return [a.result for a in ranks]

    def start_ranks(self, world_size: int, body: Callable[[], Any]) -> list[HostActor]:
        """Start ``body`` on actors ``rank0..`` of a new world, the current actor going on (:meth:`join_ranks`
        waits for them)."""
        if world_size < 1:
            raise ValueError(f"spawn_ranks: world_size must be >= 1, got {world_size}")
        ex = self.execution
        parent = self.host_step(f"spawn_ranks({world_size})")
        if "rank0" in ex.actors:
            raise RuntimeError("spawn_ranks: one world per simulated run (actors rank0.. already exist)")
        ranks = [ex.new_actor(f"rank{r}", parent) for r in range(world_size)]
        self.collectives.new_world(ranks)
        for a in ranks:
            ex.start_actor(a, body, self._enter)
        ex.progress()
        return ranks

    def join_ranks(self, ranks: list[HostActor]) -> None:
        """The current actor waits for every actor of ``ranks`` to exit, and is ordered after each."""
        parent = self.current()
        self.execution.block(parent, f"ranks 0..{len(ranks) - 1} to exit",
                             lambda: all(a.state == "done" for a in ranks))
        for a in ranks:
            sync.observe(parent, a)

    def all_gather(self, out: Ref, inp: Ref, source: str, group: int = 0) -> Gather:
        """An all-gather of ``inp`` into ``out`` in the current actor's process group ``group`` (0: its world)."""
        self._not_capturing("all_gather_into_tensor")
        a = self.host_step("all_gather_into_tensor")
        at = self._collective_waits(a, source, group=group)
        mark = self.memory.issues
        g = self.collectives.all_gather(a, out, inp, source, group)
        self._kept_for([out, inp], g.rec.stream)
        self._issued_at(g.rec.stream.name, source, g.record)
        self._issued_now(at, g.record, mark)
        self._collective_site(g, source, [out, inp])
        if not a.traced:  # the rest of the issuing call, after its kernel is enqueued (in a measured step's cost)
            a.time += self.config.collective_host_ns
        return g

    def _collective_site(self, g: Gather, source: str, refs: list[Ref]) -> None:
        """A collective's counted operation (its send) for timelines: its line and the bytes it moves."""
        comm = g.rec.stream
        self.op_sites[f"{comm.name}#{comm.ops - 1}"] = (source, span_bytes(refs))

    def _kept_for(self, refs: list[Ref], comm: SimStream) -> None:
        """As ProcessGroupNCCL does (it records a collective's tensors on its stream ``comm``, or stashes them in the
        work): their blocks are not handed out again before the collective is done, even if the program drops
        them."""
        for st, _ in refs:
            self.record_stream(st, comm)

    def collective(
        self,
        kind: str,
        outs: list[Ref],
        ins: list[Ref],
        combine: Callable[[int, list[torch.Tensor]], list[torch.Tensor]],
        source: str,
        splits: Splits | None = None,
        group: int = 0,
    ) -> Gather:
        """Any collective of the current actor's world (``all_reduce``, ``broadcast``, ``barrier``, ...), in its
        process group ``group`` (0: the world itself): its send reads ``ins``, its receive writes ``outs`` with
        ``combine`` (:meth:`Collectives.collective`; ``splits``: what this rank sends to and receives from each peer,
        where the ranks exchange different amounts)."""
        self._not_capturing(kind)
        a = self.host_step(kind)
        at = self._collective_waits(a, source, group=group)
        mark = self.memory.issues
        g = self.collectives.collective(a, kind, outs, ins, combine, source, splits, group)
        self._kept_for([*outs, *ins], g.rec.stream)
        self._issued_at(g.rec.stream.name, source, g.record)
        self._issued_now(at, g.record, mark)
        self._collective_site(g, source, [*outs, *ins])
        if not a.traced:
            a.time += self.config.collective_host_ns
        return g

    def point_to_point(self, ops: list[tuple[int, Ref, bool]], batch: bool, source: str, group: int = 0) -> Gather:
        """Sends and receives (``(peer, tensor, is_send)``) of the current actor in its process group ``group``: one
        call (``send``, ``isend``, ``recv``, ``irecv``: one op) on the stream of its pair of ranks, or a
        ``batch_isend_irecv`` (``batch``) on the group's collectives' stream, as one NCCL group
        (:meth:`Collectives.point_to_point`)."""
        self._not_capturing("a point-to-point operation")
        a = self.host_step("batch_isend_irecv" if batch else ("send" if ops[0][2] else "recv"))
        c = self.collectives
        comm = c.comm_stream(a, group) if batch else c.p2p_stream(a, ops[0][0], group)
        at = self._collective_waits(a, source, comm)
        mark = self.memory.issues
        g = self.collectives.point_to_point(a, comm, ops, source, batch, group)
        refs = [ref for _, ref, _ in ops]
        self._kept_for(refs, comm)
        self._issued_at(comm.name, source, g.record)
        self._issued_now(at, g.record, mark)
        self._collective_site(g, source, refs)
        if not a.traced:
            a.time += self.config.collective_host_ns
        return g

    def exchange_objects(self, obj: Any, kind: str = "all_gather_object", group: int = 0) -> list[Any]:
        """``all_gather_object`` (or another object collective, ``kind``) in process group ``group``: the host blocks
        until every rank gave its object, and until the work each rank's current stream was given before its call is
        done (torch runs it as NCCL collectives, whose stream waits for the caller's current stream, and reads the
        sizes and objects back on the host, which waits for them)."""
        a = self.host_step(kind)
        return self.collectives.exchange_objects(a, obj, kind, group, self._record(a.current_stream))

    def host_collective(self, sent: Callable[[], Any], kind: str, group: int = 0) -> list[Any]:
        """A collective of host memory (gloo's, ``kind``) in process group ``group``: one host step, in which
        ``sent()`` makes what this rank gives (reading its host tensors as the step's), then the host blocks until
        every rank gave its part, and is ordered after all of them; what each gave, in rank order."""
        a = self.host_step(kind)
        return self.collectives.exchange_objects(a, sent(), kind, group)

    def work_wait_host(self, work: Gather) -> None:
        """The host waits for a collective it issued to complete (``barrier``): part of that call's host step."""
        a = self.current()
        self._host_waits(a, [work.record()], f"collective {work.collective.seq} to complete")

    def work_wait(self, work: Gather, barrier: bool = False) -> None:
        """``Work.wait()``: the caller's current stream waits for the collective. An async barrier's work also asks
        whether the barrier is done, in the same host step (ProcessGroupNCCL's ``WorkNCCL::wait``: ``isBarrierOp_ &&
        !isCompleted()``): not done, the host blocks until the current stream has done all it was given (the barrier,
        and whatever the program queued on it after the call); done, the host has seen it done and goes on, and
        what the stream was given after the call may still be running."""
        a = self.host_step("work.wait")
        # wait: the caller's stream must not read the output before the receive landed
        self._stream_waits(a.current_stream, work.record(), "collective")
        if barrier:
            if work.rec.done():
                sync.host_observes(a, work.record())  # (the query that found it done)
                return
            s = a.current_stream
            self._host_waits(a, [self._record(s)], f"stream(s) {s.name} to finish")

    def future_done(self, s: SimStream) -> EventRecord:
        """What a future ``then`` made waits for: the callback's work on ``s``, recorded in ``then``'s host step."""
        return self._record(s)

    def future_wait(self, rec: EventRecord | None) -> None:
        """A future's ``wait()`` (one made by ``then``): the caller's current stream waits for what ``rec`` marks
        (None: a future of no device, ``collect_all``'s, where it waits for nothing)."""
        a = self.host_step("future.wait")
        if rec is not None:
            self._stream_waits(a.current_stream, rec, "future")

    def futures_collected(self, waits: list[tuple[SimStream, EventRecord]]) -> None:
        """``torch.futures.collect_all`` of done futures, one host step: each ``(s, rec)``, a stream torch took from
        its pool for one future's callback, waits for what ``rec`` marks (the host does not)."""
        self.host_step("futures.collect_all")
        for s, rec in waits:
            self._stream_waits(s, rec, "future")
            self._torch_streams.add(s.name)

    def work_is_completed(self, work: Gather) -> bool:
        a = self.host_step("work.is_completed", poll=True)
        if work.rec.done():
            sync.host_observes(a, work.record())
            return True
        return False


def _not_captured(rec: EventRecord | None, what: str) -> None:
    """An event's ``query``, ``synchronize`` or ``elapsed_time``: CUDA's error where it was last recorded in a capture
    (it stands for no work that runs; the capture underway is invalidated)."""
    if rec is not None and rec.capture is not None:
        cap = rec.capture[0]
        message = CAPTURED_EVENT + f" (event.{what}() of an event recorded in {cap.graph.label}'s capture)"
        raise cap.fail(message) if cap.graph.capture is cap else cuda_error(message)
