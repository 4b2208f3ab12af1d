"""The torch.cuda façade: what ``torch.cuda``, ``"cuda"`` devices and ``Tensor.cuda()`` are during a session.

Each function here is what a torch.cuda name means on the simulated device of the active session
(:func:`device`): a stream class that is a ``torch.Stream`` (so torch's own ``record_stream`` takes it), named
after where the program made it (``reference.naming``); events; the current-stream context; synchronize;
memory statistics from the caching allocator; a seeded device generator; ``nvtx`` as no-ops. Factories,
``Tensor.to`` and ``Tensor.cuda`` take ``"cuda"``, ``"cuda:0"``, ``torch.device("cuda")`` and device indices and
make simulated tensors. :func:`install` puts them in place for a session.
"""

from __future__ import annotations

import contextlib
import copyreg
import ctypes
import enum
import functools
import logging
import os
import sys
import time
import types
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import attrs
import numpy as np
import torch
import torch.utils.data.dataloader
from torch.optim import optimizer as torch_optimizer
from torch.overrides import _get_current_function_mode_stack
from torch.utils import _device as torch_device
from torch.utils import _foreach_utils as torch_foreach_utils
from torch.utils._mode_utils import no_dispatch

from reference import contract
from reference.naming import StreamNames, creation_site, inside
from simdevice.api import EventHandle, SimDevice, StreamHandle
from simdevice.dispatch import (
    CROSS_SIDE_GRAD,
    META,
    SimStorage,
    SimTensor,
    SimTypedStorage,
    crosses_devices,
    move_in_place,
    register_generator,
    set_data_across,
    storage_copy,
    storage_of,
)
from simdevice.dropin import arrays, autocast
from simdevice.dropin.patches import Patches
from simdevice.runtime.config import SimConfig
from simdevice.runtime.execution import outside_actor
from simdevice.runtime.graphs import SimGraph
from simdevice.runtime.reports import internal_file, user_source
from simdevice.runtime.runtime import op_seed

_HERE = os.path.dirname(os.path.abspath(__file__))
_SIMDEVICE = os.path.dirname(_HERE)
_REFERENCE = os.path.join(os.path.dirname(_SIMDEVICE), "reference")
#: the simulator's and the contract's own files: never where a program made a stream
_INTERNAL = inside(_SIMDEVICE, *(os.path.join(_REFERENCE, f"{m}.py") for m in ("contract", "cuda", "device", "naming")))

_ACTIVE: list[DropInDevice] = []


@functools.lru_cache(maxsize=64)
def _real_sized(config: SimConfig) -> SimConfig:
    """``config`` with ``real_sizes``: the caching allocator's sizes are CUDA's (made once per config: every run of
    a search asks, and a config's ``__init__`` costs a tenth of an empty run)."""
    return config if config.real_sizes else attrs.evolve(config, real_sizes=True)


class DropInDevice(SimDevice):
    """The simulated device of a torch.cuda session: tensors show ``cuda:i``, ``i`` the device their process made
    current (``cuda:0`` where it made none); streams are named by their site."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, shown=torch.device("cuda", 0), **kwargs)
        self.device = self.shown  # type: ignore[misc]
        self._names: dict[str, StreamNames] = {}

    def _build(self) -> None:
        """A new runtime (at the start, and where the run starts again on threads): the streams' names start again
        with it, so that the run on threads names each stream as the first run did."""
        self.config = _real_sized(self.config)  # (plain torch.cuda code: its sizes are the GPU run's)
        super()._build()
        self.show_at(self.current_index)
        #: the device each process made current (``torch.cuda.set_device``), by the process's name: 0 where none
        self.device_indexes: dict[str, int] = {}
        self._names = {}
        #: each process's streams ``torch.cuda.Stream()`` handed out, by (process, priority), and how many it handed
        #: out so far (:meth:`pool_stream`)
        self.stream_pools: dict[tuple[str, int], list[Any]] = {}
        self.stream_turns: dict[tuple[str, int], int] = {}
        #: each clock's reading as the run began (``_virtual_clock``: the run's clocks go on from there in host time)
        self.clock_bases = {name: clock() for name, clock in _REAL_CLOCKS.items()}
        #: NumPy generators the run made unseeded so far (``_default_rng``: the k-th is seeded k)
        self.unseeded_rngs = 0
        #: (receiving actor, storage id) -> the tensor a device tensor from another process was mapped as there
        #: (``processes``: CUDA IPC maps a storage once while the receiver holds it)
        self.ipc_maps: dict[tuple[str, int], Any] = {}
        #: (receiving actor, the sender's segment id) -> how many of the segment's storages are mapped there
        #: (``processes``: torch maps a segment once, by its IPC handle, and unmaps it with its last storage)
        self.ipc_segments: dict[tuple[str, int], Any] = {}
        #: the simulated processes by their actor's name, and each actor's children (``processes``)
        self.sim_processes: dict[str, Any] = {}
        self.sim_children: dict[str, list[Any]] = {}
        #: each process's default context, where it set one in the run or was started with one (``processes``:
        #: ``set_start_method`` in a run never reaches the real one)
        self.start_methods: dict[str, Any] = {}
        #: the actors whose default process group ``destroy_process_group`` destroyed (``distributed``)
        self.groups_destroyed: set[str] = set()
        #: the process groups processes the program started are making by ``init_process_group``, by where they meet
        #: (``distributed``)
        self.rendezvous: dict[str, Any] = {}
        #: how many process groups each actor made with ``new_group``, and those it destroyed since, by (actor, the
        #: group's id) (``distributed``)
        self.groups_made: dict[str, int] = {}
        self.subgroups_destroyed: set[tuple[str, int]] = set()
        #: each process group's backends, by (actor, the group's id), where the program named them
        #: (``init_process_group``, ``new_group``; ``distributed``)
        self.group_backends: dict[tuple[str, int], tuple[str, dict[str, str]]] = {}
        #: torch's ``_coalescing_manager`` blocks of each process (``distributed``): its ``pg_coalesce_state`` (by the
        #: process's name), the launches each block recorded (by (process, the group object's id)), and the works of
        #: a block given a device (by (process, "started", the group object's id))
        self.coalescing: dict[Any, Any] = {}
        #: each process's groups by their name, as torch registers them (``distributed``: ``_resolve_process_group``)
        self.groups_named: dict[tuple[str, str], Any] = {}
        #: the work of each functional collective not yet waited for, by its output's storage (``distributed``:
        #: ``wait_tensor``)
        self.functional_works: dict[int, tuple[Any, Any]] = {}
        #: a number for each process that made a ``DeviceMesh``, its meshes' own (``distributed``)
        self.mesh_owners: dict[str, int] = {}
        #: the interprocess events' CUDA events by their IPC handle (``Event.ipc_handle``)
        self.ipc_events: dict[bytes, Any] = {}
        #: what ``reduce_tensor`` sent and the program pickled itself, by place (``processes``: its bytes name it)
        self.reduced: list[Any] = []
        #: the keys of the stores made in the run, by address (``stores``: each ``TCPStore`` of one host and port,
        #: each ``FileStore`` of one file, shares them)
        self.stores: dict[tuple[Any, ...], Any] = {}
        #: every store made in the run, alive until its end (a ``PrefixStore`` over a store the program does not keep
        #: holds only its C++ half, which calls back into the Python one)
        self.stores_made: list[Any] = []
        #: the host memory ``cudaHostRegister`` pinned in the run, by address: a tensor over its bytes (the
        #: program's to free, as with CUDA; a run's registrations end with it, as a process's do)
        self.registered: dict[int, torch.Tensor] = {}

    def current_index(self) -> int:
        """The index of the device the running process made current (0 where it made none, or outside a run): what
        ``torch.cuda.current_device()`` answers, and the index its tensors show (``set_device(local_rank)`` in each
        rank, as torchrun's scripts do; every rank has the one simulated device, whichever index names it)."""
        a = self.runtime.current_or_none()
        return 0 if a is None else self.device_indexes.get(a.process, 0)

    def make_current(self, index: int) -> None:
        """``torch.cuda.set_device(index)`` in the running process."""
        self.device_indexes[self.runtime.current().process] = index

    def site_named_stream(self) -> Any:
        """A new stream of the current actor, named after the line of the program that made it."""
        rt = self.runtime
        a = rt.current()
        prefix = "" if a.process == "host" else f"{a.process}."
        names = self._names.get(a.process)
        if names is None:
            taken, actors = rt.streams, rt.execution.actors
            # (a stream's name is taken by a stream, or by an actor: a process the program started)
            names = self._names[a.process] = StreamNames(prefix, lambda full: full in taken() or full in actors)
        filename, line, col = creation_site(_INTERNAL)
        full = names.assign(filename, line, col)
        return rt.new_stream(full[len(prefix):], names.sites[full])

    def _pooled_stream(self) -> Any:
        """The stream torch takes from its pool for its own work (a future's callback): the running process's next of
        priority 0, as :class:`Stream` gives it."""
        return Stream.of(self, self.pool_stream(0, lambda: self.runtime.new_stream(None)))

    def pool_stream(self, priority: int, make: Callable[[], Any] | None = None) -> Any:
        """The stream a new ``torch.cuda.Stream(priority=...)`` is in the running process: CUDA's streams come from
        a pool of :data:`STREAMS_PER_POOL` per priority and device, handed out in turn (c10's ``getStreamFromPool``),
        so the 33rd a process makes is its first again, the same stream (its work in that stream's order, its
        handle equal to the first's); each made when its turn first comes, by ``make``, else named after the line
        that asked (torch's own, unnamed on a GPU, are ``s1``, ``s2``, ... as there)."""
        key = (self.runtime.current().process, priority)
        turn = self.stream_turns.get(key, 0)
        self.stream_turns[key] = turn + 1
        pool = self.stream_pools.setdefault(key, [])
        if len(pool) < STREAMS_PER_POOL:
            pool.append(make() if make is not None else self.site_named_stream())
            return pool[-1]
        return pool[turn % STREAMS_PER_POOL]


def activate(dev: DropInDevice) -> None:
    """``dev`` is the session's device from now on (one session at a time)."""
    if _ACTIVE:
        raise RuntimeError("a simdevice.cuda() session is already open (one at a time)")
    _ACTIVE.append(dev)


def deactivate(dev: DropInDevice) -> None:
    if _ACTIVE and _ACTIVE[-1] is dev:
        _ACTIVE.pop()


def session_device() -> DropInDevice:
    """The simulated device of the active session (RuntimeError outside one)."""
    if not _ACTIVE:
        raise RuntimeError("torch.cuda is simulated only inside a simdevice.cuda() session")
    return _ACTIVE[-1]


def in_actor() -> bool:
    return bool(_ACTIVE) and _ACTIVE[-1].runtime.current_or_none() is not None


# -- streams and events -------------------------------------------------------------------------------------


#: the stream priorities a device takes, least first (``torch.cuda.Stream.priority_range()`` on an H200)
_PRIORITIES = (0, -3)
#: the streams of each priority a process's ``torch.cuda.Stream()`` cycles through (c10's ``kStreamsPerPool``)
STREAMS_PER_POOL = 32


class Stream(StreamHandle):
    """``torch.cuda.Stream`` on the simulated device."""

    #: the contexts of the ``with s:`` blocks open on this handle, innermost last
    _entered: list[Any]

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> Stream:
        _check_or_current(device)
        dev = session_device()
        # torch's way back to a stream it made (``Stream(stream_id=s.stream_id, device_index=..., device_type=...)``,
        # as its own ``current_stream`` builds one): that stream, not a new one
        if "stream_id" in kwargs:
            known = dev.runtime.stream_by_id(int(kwargs["stream_id"]))
            if known is not None:
                return Stream.of(dev, known)  # type: ignore[return-value]
        # (kept, as CUDA keeps it, within the device's range; the simulator runs every stream's work as soon as it
        # may, so no priority changes what runs when, but each has its pool)
        least, greatest = _PRIORITIES
        priority = min(least, max(greatest, int(priority)))
        s = StreamHandle.__new__(cls, dev, dev.pool_stream(priority))
        s._priority = priority
        return s  # type: ignore[return-value]

    @staticmethod
    def priority_range() -> tuple[int, int]:
        """(least, greatest) priority, as the H200 gives them."""
        return _PRIORITIES

    def record_event(self, event: contract.Event | None = None) -> contract.Event:
        """``s.record_event()``: a new ``torch.cuda.Event`` (as torch makes one) recorded on ``s``."""
        return super().record_event(event if event is not None else Event())

    @property
    def cuda_stream(self) -> int:
        """The stream's CUDA handle: 0 for a default stream (CUDA's legacy null stream, each actor's own), a
        distinct non-zero number for any other."""
        rt = session_device().runtime
        s = rt.stream_by_id(int(self.stream_id))
        return int(self.stream_id) if s is None else _stream_handle(rt, s)

    @property
    def priority(self) -> int:
        return int(getattr(self, "_priority", 0))

    @property  # type: ignore[override]
    def device(self) -> torch.device:
        return session_device().shown_now()

    def __enter__(self) -> Stream:
        """``with s:``: ``s`` current for the block; the same stream may be entered again inside it (each ``with``
        restores what was current as it began, as torch's stream context keeps a stack of them)."""
        context = _forward_on(session_device(), self)
        context.__enter__()
        entered: list[Any] = self.__dict__.setdefault("_entered", [])
        entered.append(context)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._entered.pop().__exit__(*exc)


class _CudaEvent:
    """The CUDA event behind a ``torch.cuda.Event``: where it was last recorded. An interprocess event and every event
    opened from its handle (``Event.from_ipc_handle``, in any process) share one, as CUDA's IPC events do: what one
    process records is what the others wait for, query and synchronize on (as recorded when they ask)."""

    __slots__ = ("handle", "rec")

    def __init__(self) -> None:
        self.rec: Any = None
        self.handle: bytes | None = None


#: the size of CUDA's ``cudaIpcEventHandle_t``, the ``bytes`` torch's ``ipc_handle()`` gives
_IPC_HANDLE_BYTES = 64


class Event(EventHandle):
    """``torch.cuda.Event`` on the simulated device. An interprocess one (``interprocess=True``) gives an IPC handle
    (``ipc_handle()``: bytes), which another process opens (``Event.from_ipc_handle(device, handle)``) as the same
    CUDA event; torch pickles an event by its handle, so one sent to another process arrives as that event too. A
    plain event has no handle: ``ipc_handle()`` raises CUDA's error, as on a GPU (torch creates the CUDA event with
    the flags it was made with, and ``cudaIpcGetEventHandle`` refuses one without ``cudaEventInterprocess``); nor
    has an event opened from a handle (CUDA exports no imported event), so one cannot be sent on either."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False,
                 external: bool = False) -> None:
        self._cuda = _CudaEvent()
        self.interprocess = interprocess
        self._opened = False  # opened from another event's handle (``from_ipc_handle``): it gives none itself
        # (CUDA refuses the flags as torch creates the event, at its first record or ``ipc_handle()``)
        self._bad_flags = interprocess and enable_timing
        super().__init__(session_device(), enable_timing)

    @property  # type: ignore[override]
    def _rec(self) -> Any:
        return self._cuda.rec

    @_rec.setter
    def _rec(self, rec: Any) -> None:
        self._cuda.rec = rec

    def _created(self) -> None:
        """torch creates the CUDA event at its first record or ``ipc_handle()``; CUDA refuses an interprocess event
        that keeps timing (``cudaEventInterprocess`` needs ``cudaEventDisableTiming``)."""
        if self._bad_flags:
            raise RuntimeError("CUDA error: invalid argument (an interprocess event must be made with "
                               "enable_timing=False: cudaEventInterprocess needs cudaEventDisableTiming)")

    def record(self, stream: contract.Stream | None = None) -> None:
        self._created()
        super().record(stream)

    def ipc_handle(self) -> bytes:
        """The event's IPC handle (64 bytes, as CUDA's), for ``Event.from_ipc_handle`` in another process."""
        self._created()
        if not self.interprocess:
            raise RuntimeError("CUDA error: invalid resource handle (ipc_handle() of a torch.cuda.Event made "
                               "without interprocess=True)")
        if self._opened:  # (on an H100 too: docs/confirmations.md, twenty-eighth run)
            raise RuntimeError("CUDA error: invalid resource handle (ipc_handle() of an event opened from another's "
                               "IPC handle: CUDA gives none for an imported event; pass on the handle received)")
        if self._cuda.handle is None:
            dev = session_device()
            handle = f"simdevice ipc event {len(dev.ipc_events)}".encode().ljust(_IPC_HANDLE_BYTES, b"\0")
            dev.ipc_events[handle] = self._cuda
            self._cuda.handle = handle
        return self._cuda.handle

    @classmethod
    def from_ipc_handle(cls, device: Any, handle: Any) -> Event:
        """The interprocess event ``handle`` names (``cudaIpcOpenEventHandle``): the same CUDA event."""
        cuda = session_device().ipc_events.get(bytes(handle)) if isinstance(handle, (bytes, bytearray)) else None
        if cuda is None:
            raise RuntimeError("CUDA error: invalid resource handle (Event.from_ipc_handle: no interprocess event of "
                               "this run has this handle)")
        opened = cls(interprocess=True)
        opened._cuda = cuda
        opened._opened = True
        return opened


_ORIGINAL_STREAM = torch.Stream
_ORIGINAL_EVENT = torch.Event


def _accelerator_device(device: Any) -> bool:
    """Whether a generic class's ``device`` argument is the accelerator's (None: the current accelerator; a negative
    index raises, as an index past the devices does)."""
    return device is None or on_device(device)


class _GenericStream(metaclass=contract.GenericClass):
    """``torch.Stream(device=None, *, priority=0)``, the device-generic stream (device-agnostic code makes its streams
    so): on the accelerator, a ``torch.cuda.Stream`` of the simulated device; another device's (``"cpu"``) is
    torch's own."""

    _of = (_ORIGINAL_STREAM,)

    def __new__(cls, device: Any = None, *, priority: int = 0, **kwargs: Any) -> Any:
        if not _accelerator_device(device):
            return _ORIGINAL_STREAM(device, priority=priority, **kwargs)
        return Stream(device, priority, **kwargs)


class _GenericEvent(metaclass=contract.GenericClass):
    """``torch.Event(device=None, *, enable_timing=False, blocking=False, interprocess=False)``, the device-generic
    event: on the accelerator, a ``torch.cuda.Event`` of the simulated device (recorded on the current stream where no
    stream is given, as both record); another device's is torch's own."""

    _of = (_ORIGINAL_EVENT, EventHandle)

    def __new__(cls, device: Any = None, *, enable_timing: bool = False, blocking: bool = False,
                interprocess: bool = False) -> Any:
        if not _accelerator_device(device):
            return _ORIGINAL_EVENT(device, enable_timing=enable_timing, blocking=blocking, interprocess=interprocess)
        return Event(enable_timing, blocking, interprocess)


class StreamContext:
    """``torch.cuda.StreamContext(s)`` (what ``torch.cuda.stream(s)`` gives), as torch's (``torch/cuda/__init__.py``):
    entering it keeps the current stream in the object (``src_prev_stream``) and makes ``s`` current
    (``set_stream``); leaving it makes the kept stream current again (``None``: nothing changes). It keeps one: the
    object entered again inside its own block leaves ``s`` current after the outer block too (the inner entry kept
    ``s``), and contexts left in another order than entered (a module's pre-hook entering one, its hook leaving
    it) each make current what was current as it was entered, as on a GPU. (It kept a stack of its blocks, each
    leaving popped the actor's innermost stream: the stream after such a block was another than torch's, and ops
    ran there.)"""

    def __init__(self, stream: contract.Stream | None) -> None:
        self.stream = stream
        self.src_prev_stream: contract.Stream | None = None

    def __enter__(self) -> None:
        if self.stream is None:
            return
        self.src_prev_stream = current_stream()
        set_stream(self.stream)

    def __exit__(self, *exc: Any) -> None:
        if self.stream is None:
            return
        set_stream(self.src_prev_stream)


def stream(stream: contract.Stream | None) -> StreamContext:  # (torch's parameter name: stream=s is called)
    return StreamContext(stream)


@contextlib.contextmanager
def _forward_on(dev: DropInDevice, s: contract.Stream | None) -> Iterator[Any]:
    """``torch.cuda.stream(s)``: ``s`` current for the block, and for the autograd nodes made in it
    (:func:`_mark`)."""
    rt = dev.runtime
    try:
        with dev.stream(s):
            _mark(rt)
            yield s
    finally:
        _mark(rt)


_TAG = "simdevice.stream"
_ACCUMULATE = "AccumulateGrad"


def _mark(rt: Any) -> None:
    """The current actor's current stream changed (a ``torch.cuda.stream`` block began or ended, ``set_stream``, the
    engine's stream guard): the autograd nodes made from the next sequence number on record it as their stream,
    as a GPU's record it in their input metadata (``Node::stream()``), whatever makes them: an op, a custom
    ``autograd.Function.apply``, a module's full backward hooks (:func:`_made_on`). Sequence numbers grow as the
    nodes of a thread are made (the run's actors that share a thread each keep their own record)."""
    a = rt.current()
    marks = a.forward_streams
    nr = torch.autograd._get_sequence_nr()
    s = a.current_stream
    while marks and marks[-1][0] >= nr:  # no node was made under it
        marks.pop()
    if (marks[-1][1] if marks else a.default_stream) is not s:
        marks.append((nr, s))


def _made_on(a: Any, n: Any) -> Any:
    """The stream current on actor ``a`` when it made node ``n`` (:func:`_mark`)."""
    marks = a.forward_streams
    nr = n._sequence_nr()
    lo, hi = 0, len(marks)
    while lo < hi:
        mid = (lo + hi) // 2
        if marks[mid][0] <= nr:
            lo = mid + 1
        else:
            hi = mid
    return marks[lo - 1][1] if lo else a.default_stream


def _engine_entry(original: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.autograd``'s call into the engine (``_engine_run_backward``, what ``backward`` and ``grad`` call once
    the initial gradients are made): where any node of the graph runs on a stream other than the calling one, the
    engine's streams and syncs are modelled (:class:`_Engine`); else the whole backward is the calling stream's.
    Either way it runs as CUDA runs it, on autograd's device thread: what it allocates is outside the caller's
    ``torch_memory_saver`` region (``Runtime.backward_pass``)."""

    @functools.wraps(original)
    def call(t_outputs: Any, *args: Any, **kwargs: Any) -> Any:
        if not in_actor():
            return original(t_outputs, *args, **kwargs)
        rt = session_device().runtime
        inputs = args[3] if len(args) > 3 else kwargs.get("inputs", ())
        accumulate = kwargs.get("accumulate_grad", True)
        engine = _Engine.plan(rt, t_outputs, inputs or (), accumulate)
        if engine is None:
            # every node on the calling stream, none of the program's Python: the engine's guards keep that stream
            # current throughout (a hook's ``set_stream`` there is the device thread's, never the caller's)
            rt.engine_enter(rt.current_stream())
            try:
                with rt.backward_pass():
                    return original(t_outputs, *args, **kwargs)
            finally:
                rt.engine_leave()
                _mark(rt)
        handles = engine.start()
        try:
            with rt.backward_pass():
                return original(t_outputs, *args, **kwargs)
        finally:
            for h in handles:
                h.remove()
            engine.end()

    return call


def _edge(t: Any) -> tuple[Any, int] | None:
    """A root's or an input's gradient edge (node, input number), None where it has none."""
    if isinstance(t, torch.autograd.graph.GradientEdge):
        return t.node, t.output_nr
    if not isinstance(t, torch.Tensor) or not t.requires_grad:
        return None
    if t.grad_fn is not None:
        return t.grad_fn, t.output_nr
    e = torch.autograd.graph.get_gradient_edge(t)
    return e.node, e.output_nr


class _Engine:
    """One backward through autograd's engine, as torch 2.9 to 2.13 runs it on a GPU (engine.cpp
    ``evaluate_function``, input_buffer.cpp ``InputBuffer::add``, ``GraphTask::exec_post_processing``):

    - A node's stream is the stream current when it was made (``Node::stream()``, its input metadata's): the
      stream of the ``torch.cuda.stream(s)`` block, or ``set_stream``'s, it was made in, whatever made it (an op, a
      custom ``autograd.Function.apply``, a module's full backward hooks; :func:`_made_on`). A leaf's
      ``AccumulateGrad`` has the stream current when it was made, by the first forward op that used the leaf (the
      one of least sequence number among its consumers), kept while the node lives.
    - The engine makes a node's stream current (a stream guard) for all of the node: its tensor hooks, pre-hooks,
      backward, post-hooks, and the accumulation of a later producer's gradient into its input buffer. Here the
      stream is made current as the node before it ends, for the node the engine's ready queue gives next (the
      greatest sequence number), so that hooks the program put on it earlier see it too.
    - Producer to consumer: where their streams differ, the consumer's stream waits, before the consumer runs, for
      an event recorded on the producer's stream as the producer ended, and the gradient is ``record_stream``-ed
      onto the consumer's stream; a second producer's gradient is added on the consumer's stream, which waits for
      both first. The roots' gradients come from the calling stream. No other edge: a node does not wait for the
      calling stream, nor the calling stream for a node, until the end.
    - At the end the calling stream waits for each stream that ran a node with no outputs (``AccumulateGrad``) or
      whose gradient ``torch.autograd.grad`` captured (the leaf streams), before the engine's final callbacks."""

    def __init__(self, rt: Any, calling: Any) -> None:
        self.rt, self.calling, self.actor = rt, calling, rt.current()
        self.nodes: list[Any] = []
        self.index: dict[Any, int] = {}
        self.deps: list[int] = []
        self.streams: list[Any] = []
        self.runs: list[bool] = []  # the engine executes the node (else it only captures, or never reaches it)
        self.captures: set[int] = set()
        self.roots: list[tuple[int, int]] = []
        self.ready: list[int] = []
        self.ready_streams: dict[tuple[int, int], Any] = {}
        self.ready_events: dict[tuple[int, int], Any] = {}
        self.switched: int | None = None  # the node whose stream the engine has made current (with its waits)
        self.guarded = False  # a stream of this backward's is current
        self.leaf_streams: list[Any] = []
        self.queued = False

    @classmethod
    def plan(cls, rt: Any, t_outputs: Any, inputs: Any, accumulate: bool) -> _Engine | None:
        e = cls(rt, rt.current_stream())
        roots = [_edge(t) for t in (t_outputs if isinstance(t_outputs, (list, tuple)) else (t_outputs,))]
        parents: dict[int, int] = {}  # an AccumulateGrad's consumer of least sequence number
        for r in roots:
            if r is not None:
                e.roots.append((e._add(r[0]), r[1]))
        i = 0
        while i < len(e.nodes):
            n = e.nodes[i]
            for f, _ in n.next_functions:
                if f is None:
                    continue
                j = e._add(f)
                e.deps[j] += 1
                if type(f).__name__ == _ACCUMULATE:
                    p = parents.get(j)
                    if p is None or n._sequence_nr() < e.nodes[p]._sequence_nr():
                        parents[j] = i
            i += 1
        if len(e.roots) > 1:  # the engine's GraphRoot feeds them
            for r in e.roots:
                e.deps[r[0]] += 1
        e.streams = [e._stream_of(j, parents) for j in range(len(e.nodes))]
        wanted = {e.index[x[0]] for x in (_edge(t) for t in inputs) if x is not None and x[0] in e.index}
        if inputs:
            e._mark_needed(wanted, accumulate)
        else:
            e.runs = [True] * len(e.nodes)
        if all(s is e.calling for s in e.streams) and not any(
                isinstance(n, torch.autograd.function.BackwardCFunction) for n in e.nodes):
            return None  # (a custom Function's backward may change the current stream: the engine's guard puts it back)
        return e

    def _add(self, n: Any) -> int:
        i = self.index.get(n)
        if i is None:
            i = self.index[n] = len(self.nodes)
            self.nodes.append(n)
            self.deps.append(0)
        return i

    def _stream_of(self, j: int, parents: dict[int, int]) -> Any:
        n = self.nodes[j]
        if type(n).__name__ != _ACCUMULATE:
            return _made_on(self.actor, n)
        s = n.metadata.get(_TAG)
        if s is not None:
            return s
        p = parents.get(j)
        s = self._stream_of(p, parents) if p is not None else self.calling
        n.metadata[_TAG] = s  # made then; a later graph that reaches the same node finds it so
        return s

    def _mark_needed(self, wanted: set[int], accumulate: bool) -> None:
        """``inputs=``: the engine runs the nodes on a path to an input. ``backward(inputs=)`` (it accumulates) runs
        each input's own node, an ``AccumulateGrad`` or, for a non-leaf input, its ``grad_fn`` (the engine's
        ``init_to_execute`` sets ``needed_`` on every output edge then; the input's ``retain_grad`` hook writes its
        ``.grad`` as that node starts, and a node that returns gradients is no leaf stream); ``grad()`` captures the
        inputs' gradients at their nodes (a node that captures makes the nodes before it run, as the engine's
        ``should_execute`` is ``needed_ || captures_``)."""
        needed = [False] * len(self.nodes)

        def made(j: int) -> int:  # a node's consumers are made after it; an AccumulateGrad has none to wait for
            n = self.nodes[j]
            return -1 if type(n).__name__ == _ACCUMULATE else int(n._sequence_nr())

        captures = set()
        for j in sorted(range(len(self.nodes)), key=made):
            n = self.nodes[j]
            own = j in wanted and accumulate
            if j in wanted and not own:
                captures.add(j)
            # (the engine's ``should_execute``: a node runs where a node after it runs or captures)
            needed[j] = own or any(
                f is not None and (needed[self.index[f]] or self.index[f] in captures) for f, _ in n.next_functions)
        self.runs = needed
        self.captures = captures

    # -- during the backward ----------------------------------------------------------------------------------

    def start(self) -> list[Any]:
        """Hook the nodes the engine runs; the roots' gradients come from the calling stream (made there)."""
        rec = self.rt.engine_record(self.calling)
        for j, nr in self.roots:
            self.ready_streams[(j, nr)] = self.calling
            self.ready_events[(j, nr)] = rec
        if len(self.roots) == 1:
            self.ready.append(self.roots[0][0])
        else:  # GraphRoot, on the calling stream
            for j, _ in self.roots:
                self.deps[j] -= 1
                if self.deps[j] == 0:
                    self.ready.append(j)
        handles = []
        for j, n in enumerate(self.nodes):
            if not self.runs[j]:
                continue
            handles.append(n.register_prehook(functools.partial(self._pre, j)))
            handles.append(n.register_hook(functools.partial(self._post, j)))
        self._next()
        return handles

    def _switch(self, j: int) -> None:
        """The engine's stream guard for node ``j``: its stream current, and waiting for its gradients."""
        if self.switched == j:
            return
        self._unguard()
        s = self.streams[j]
        self.rt.engine_enter(s)
        _mark(self.rt)  # a node made here (create_graph, a recomputation) is made on it
        self.guarded, self.switched = True, j
        for (c, _), on in list(self.ready_streams.items()):
            if c == j and on is not s:
                self.rt.engine_waits(s, self.ready_events[(c, _)], on)

    def _unguard(self) -> None:
        if self.guarded:
            self.rt.engine_leave()
            _mark(self.rt)
            self.guarded, self.switched = False, None

    def _next(self) -> None:
        """Make current the stream of the node the engine's ready queue gives next (greatest sequence number)."""
        while self.ready:
            j = max(self.ready, key=lambda k: self.nodes[k]._sequence_nr())
            if self.runs[j]:
                self._switch(j)
                return
            self.ready.remove(j)
            if j in self.captures:  # the engine waits for its gradients on its stream and captures them
                self._switch(j)
                self._leaf(self.streams[j])

    def _pre(self, j: int, grad_outputs: Any) -> None:
        if not self.queued:
            self.queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._final)
        if j in self.ready:
            self.ready.remove(j)
        self._switch(j)
        if j in self.captures:  # it runs and captures a gradient: its stream is a leaf stream
            self._leaf(self.streams[j])

    def _post(self, j: int, grad_inputs: Any, grad_outputs: Any) -> None:
        n, s = self.nodes[j], self.streams[j]
        edges = n.next_functions
        if not edges:
            self._leaf(s)
        rec = None
        accumulate_on = None
        for k, (f, nr) in enumerate(edges):
            if f is None:
                continue
            c = self.index[f]
            self.deps[c] -= 1
            if self.deps[c] == 0 and (self.runs[c] or c in self.captures):
                self.ready.append(c)
            g = grad_inputs[k] if k < len(grad_inputs) else None
            if g is None or not (self.runs[c] or c in self.captures):
                continue
            sc, key = self.streams[c], (c, nr)
            if sc is not s and isinstance(g, SimTensor):
                self.rt.record_stream(storage_of(g), sc)
            if key not in self.ready_streams:  # the first producer: the consumer waits for it before it runs
                if sc is not s:
                    rec = self.rt.engine_record(s) if rec is None else rec
                    self.ready_events[key] = rec
                self.ready_streams[key] = s
                continue
            # a later producer: its gradient is added to the buffer's on the consumer's stream, once ready
            if sc is not s:
                rec = self.rt.engine_record(s) if rec is None else rec
                self.rt.engine_waits(sc, rec, s)
            on = self.ready_streams[key]
            if on is not sc:
                self.rt.engine_waits(sc, self.ready_events[key], on)
            self.ready_streams[key] = sc
            accumulate_on = accumulate_on or sc
        self._unguard()
        if accumulate_on is not None:  # the engine's additions come next, on that stream
            self.rt.engine_enter(accumulate_on)
            _mark(self.rt)
            self.guarded = True
        else:
            self._next()

    def _leaf(self, s: Any) -> None:
        if all(x is not s for x in self.leaf_streams):
            self.leaf_streams.append(s)

    def _final(self) -> None:
        """First of the engine's final callbacks: the calling stream current, waiting for the leaf streams."""
        # a captured input made ready by the last node's accumulation into its buffer (no node ran after it, whose
        # guard would have taken it from the ready queue): the engine still captures it on its stream
        self._next()
        self._unguard()
        for s in self.leaf_streams:
            if s is not self.calling:
                self.rt.engine_waits(self.calling, self.rt.engine_record(s), s)
        self.leaf_streams = []

    def end(self) -> None:
        self._unguard()
        if not self.queued:  # no node ran a hook (only captures): the engine still syncs the leaf streams
            self._final()


def _check(device: Any) -> None:
    """A device argument past ``device_count()`` raises CUDA's invalid device ordinal, in each form a device is
    named (:func:`on_device`); the one simulated device stays current (``torch.cuda.set_device``)."""
    on_device(device)


def _index_of(device: Any) -> int | None:
    """The index a device argument names (None: none named, the current device)."""
    if isinstance(device, int) and not isinstance(device, bool):
        return None if device == -1 else device
    if device is None:
        return None
    return _REAL_DEVICE(device).index if isinstance(device, (str, _REAL_DEVICE)) else None


def set_device(device: Any) -> None:
    """``torch.cuda.set_device(i)``: ``i`` current in the running process (checked as a device argument is); the one
    simulated device stays the process's, shown at ``i``."""
    _check_or_current(device)
    index = _index_of(device)
    if index is not None and in_actor():
        session_device().make_current(index)


def current_device() -> int:
    """``torch.cuda.current_device()``: the index the running process made current (0 where it made none)."""
    return session_device().current_index() if _ACTIVE else 0


def _check_or_current(device: Any) -> None:
    """:func:`_check`, but -1 is the current device, as in torch's stream calls (``Stream(device=-1)``,
    ``current_stream(-1)``, ``synchronize(-1)``, ``set_device(-1)``: CUDA's "no device given"), where a factory
    refuses it."""
    if not (isinstance(device, int) and not isinstance(device, bool) and device == -1):
        _check(device)


def current_stream(device: Any = None) -> Stream:
    _check_or_current(device)
    dev = session_device()
    return Stream.of(dev, dev.runtime.current_stream())  # type: ignore[return-value]


def default_stream(device: Any = None) -> Stream:
    _check_or_current(device)
    dev = session_device()
    return Stream.of(dev, dev.runtime.default_stream())  # type: ignore[return-value]


def set_stream(stream: contract.Stream | None) -> None:
    if stream is None:  # (torch: a no-op)
        return
    dev = session_device()
    dev.runtime.set_stream(dev.stream_of(stream))
    _mark(dev.runtime)


def synchronize(device: Any = None) -> None:
    _check_or_current(device)
    session_device().synchronize()


def empty_cache() -> None:
    if in_actor():  # a pool's __del__ may call it from the garbage collector, outside the program
        session_device().empty_cache()


_REAL_SLEEP = time.sleep


def _host_sleep(seconds: float) -> None:
    """``time.sleep`` during a session: in the run's actors, virtual host time (a polling loop that sleeps between
    queries waits as long as on a GPU, in as few polls, and without sleeping for real); elsewhere, a real sleep."""
    if in_actor():
        if not seconds >= 0:  # also NaN
            raise ValueError("sleep length must be non-negative")
        session_device().runtime.host_sleeps(int(seconds * 1e9))
    else:
        _REAL_SLEEP(seconds)


#: the clocks a run reads in host time, and Python's own
_REAL_CLOCKS: dict[str, Callable[[], float | int]] = {
    name: getattr(time, name)
    for name in ("time", "time_ns", "monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns")
}


def _virtual_clock(name: str) -> Callable[[], float | int]:
    """``time.time``, ``monotonic``, ``perf_counter`` (and their ``_ns``) during a session: in the run's actors, the
    clock's reading as the run began plus the actor's host time, which ``time.sleep`` moves as it moves the device's
    (so a loop that sleeps until a deadline, a heartbeat or a save every N seconds sees as much time pass as on a GPU,
    and the same in every run of a schedule); elsewhere, the real clock."""
    real = _REAL_CLOCKS[name]
    ns = name.endswith("_ns")

    def clock() -> float | int:
        if not _ACTIVE:
            return real()
        dev = _ACTIVE[-1]
        a = dev.runtime.current_or_none()
        if a is None:
            return real()
        base: float | int = dev.clock_bases[name]
        return base + a.time if ns else base + a.time / 1e9

    clock.__name__ = clock.__qualname__ = name
    clock.__doc__ = real.__doc__
    return clock


_VIRTUAL_CLOCKS = {name: _virtual_clock(name) for name in _REAL_CLOCKS}


def _sleep(cycles: int) -> None:
    """``torch.cuda._sleep``: the current stream idles for ``cycles`` GPU cycles (1.46 ns each, an H200's)."""
    session_device().runtime.stream_sleep(int(cycles * 1.46))


# -- the device, memory, randomness ------------------------------------------------------------------------


def _total_memory() -> int:
    """The device's memory: ``--device-memory`` (``SimConfig(device_memory=)``) where the run has one, else 80 GiB."""
    capacity = session_device().runtime.device_memory if _ACTIVE else None
    return capacity if capacity is not None else 80 << 30


def _properties(device: Any = None) -> Any:
    _check(device)
    return types.SimpleNamespace(
        name="simdevice (simulated CUDA device)", total_memory=_total_memory(), major=9, minor=0,
        multi_processor_count=132, is_integrated=False, is_multi_gpu_board=False,
    )


#: the version ``torch.cuda.nccl.version()`` answers: the NCCL of the GPU runs in docs/confirmations.md
NCCL_VERSION = (2, 28, 9)
#: what ``torch.version.cuda`` and ``torch.cuda.get_arch_list()`` answer in a session: those of the torch 2.11 CUDA
#: 13.0 build of the GPU runs in docs/confirmations.md (the CPU build answers None and []: a program that checks
#: the CUDA version, ``torch.version.cuda >= "12.1"``, failed on its own comparison, "found")
CUDA_VERSION = "13.0"
CUDA_ARCHES = ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120")


def _nccl_version() -> tuple[int, int, int]:
    """``torch.cuda.nccl.version()`` (the CPU build has no NCCL to ask; torch.distributed's logging of its
    checkpoint calls, ``torch.distributed.checkpoint.save`` among them, asks it where the backend is NCCL)."""
    return NCCL_VERSION


def _capability(device: Any = None) -> tuple[int, int]:
    p = _properties(device)
    return p.major, p.minor


def _own_process() -> str | None:
    """The process whose statistics the caller reads (its host actor: a rank, a spawned process, the host), as each
    process of a GPU has its own caching allocator; None outside the run's actors (all together)."""
    rt = session_device().runtime
    a = rt.current_or_none()
    return a.process if a is not None else None


def _own_stats() -> dict[str, int]:
    return session_device().runtime.memory_stats(_own_process())


def memory_allocated(device: Any = None) -> int:
    _check(device)
    return _own_stats()["allocated"]


def max_memory_allocated(device: Any = None) -> int:
    _check(device)
    return _own_stats()["peak"]


def memory_reserved(device: Any = None) -> int:
    _check(device)
    return _own_stats()["reserved"]


def max_memory_reserved(device: Any = None) -> int:
    _check(device)
    return _own_stats()["reserved_peak"]


#: what NVML's queries answer on the simulated device, which has no sensors: a fixed placeholder (an idle device's
#: zero), the run noting it once; ``device_memory_used`` is the memory the simulated allocator holds
SENSORS_NOTE = ("torch.cuda's NVML queries (utilization, memory_usage, temperature, power_draw, clock_rate) answer 0 "
                "on the simulated device, which has no sensors; device_memory_used answers the memory the simulated "
                "allocator holds")


def _sensor(name: str) -> Callable[..., int]:
    """``torch.cuda.NAME(device=None)``, a query of NVML (``nvidia-ml-py``): 0, noted (:data:`SENSORS_NOTE`). The CPU
    build raised ModuleNotFoundError there, a host error of a program that only logs the number."""

    def query(device: Any = None) -> int:
        _check(device)
        if in_actor():
            session_device().runtime.note(SENSORS_NOTE)
        return memory_reserved() if name == "device_memory_used" else 0

    query.__name__ = name
    return query


_SENSORS = ("utilization", "memory_usage", "temperature", "power_draw", "clock_rate", "device_memory_used")


def reset_peak_memory_stats(device: Any = None) -> None:
    _check(device)
    session_device().runtime.reset_peak_memory_stats(_own_process())


def memory_stats(device: Any = None) -> dict[str, int]:
    """``torch.cuda.memory_stats``: the keys of torch's dict that the simulated allocator counts, for all pools
    together (``.all.``): bytes allocated, active (also the freed blocks held for the streams recorded with them),
    reserved, the live allocations and segments, and the allocations that released the cache to retry or ran out
    of memory."""
    _check(device)
    stats = _own_stats()
    return _Stats({"allocated_bytes.all.current": stats["allocated"], "allocated_bytes.all.peak": stats["peak"],
            "active_bytes.all.current": stats["active"], "active_bytes.all.peak": stats["active_peak"],
            "reserved_bytes.all.current": stats["reserved"], "reserved_bytes.all.peak": stats["reserved_peak"],
            "allocation.all.current": stats["blocks"], "segment.all.current": stats["segments"],
            "num_alloc_retries": stats["alloc_retries"], "num_ooms": stats["ooms"]})


class _Stats(dict):  # type: ignore[type-arg]
    """``memory_stats()``'s dict: a key of torch's that the simulated allocator does not count (per pool, the
    ``requested_bytes``, ``inactive_split``, ...) raises ``NotImplementedError`` (no verdict), where a GPU's dict
    has it: a ``KeyError`` would be blamed on the program."""

    def __missing__(self, key: Any) -> Any:
        raise NotImplementedError(f"torch.cuda.memory_stats()[{key!r}] is not simulated (the simulated allocator "
                                  f"counts {', '.join(self)})")

    def get(self, key: Any, default: Any = None) -> Any:
        return self[key]


def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
    """``torch.cuda.set_per_process_memory_fraction``: the caching allocator's segments may take ``fraction`` of the
    device's memory together; an allocation past it releases the cache, then raises ``torch.OutOfMemoryError``.
    The calling process's own (a rank's, a spawned process's), as on a GPU."""
    _check(device)
    if not isinstance(fraction, float):  # (torch's checks and words)
        raise TypeError("Invalid type for fraction argument, must be `float`")
    if fraction < 0 or fraction > 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    session_device().runtime.memsaver.allocator.fractions[_own_process()] = (fraction, int(fraction * _total_memory()))


def get_per_process_memory_fraction(device: Any = None) -> float:
    _check(device)
    fraction = session_device().runtime.memsaver.allocator.fractions.get(_own_process())
    return 1.0 if fraction is None else fraction[0]


def mem_get_info(device: Any = None) -> tuple[int, int]:
    _check(device)
    total = _total_memory()  # (the device's free memory: every process's segments count, but what a pause released)
    allocator = session_device().runtime.memsaver.allocator
    allocator.collect_frees()
    return max(total - allocator.held(), 0), total


def manual_seed(seed: int) -> None:
    if in_actor():
        session_device().runtime.manual_seed(seed)


#: a new CUDA generator's seed, as torch's (``c10::detail::default_rng_seed_val``)
_DEFAULT_SEED = 67280421310721
_REAL_GENERATOR = torch._C.Generator


def _state(seed: int, drawn: int) -> torch.Tensor:
    """A simulated generator's state as a byte tensor on the host (its seed and how many random ops drew, as CUDA's
    philox state is a seed and an offset): 16 bytes, what ``torch.cuda.get_rng_state()`` gives."""
    return torch.tensor([seed, drawn], dtype=torch.int64, device="cpu").view(torch.uint8)


def _unstate(new_state: Any, who: str) -> tuple[int, int]:
    if not isinstance(new_state, torch.Tensor) or new_state.dtype != torch.uint8 or new_state.numel() != 16:
        raise ValueError(f"{who}: expected a state torch.cuda.get_rng_state() gave (16 bytes)")
    seed, drawn = new_state.detach().cpu().contiguous().view(torch.int64).tolist()
    return int(seed), int(drawn)


def get_rng_state(device: Any = "cuda") -> torch.Tensor:
    """``torch.cuda.get_rng_state``: the simulated generator's state (:func:`_state`), for ``set_rng_state``."""
    return _state(*session_device().runtime.rng_state())


def set_rng_state(new_state: torch.Tensor, device: Any = "cuda") -> None:
    """``torch.cuda.set_rng_state`` with a state ``get_rng_state`` gave (``torch.utils.checkpoint`` restores the
    forward's before it recomputes it, so that a dropout recomputed draws the same mask)."""
    session_device().runtime.set_rng_state(*_unstate(new_state, "set_rng_state"))


def set_rng_state_all(new_states: Any) -> None:
    for state in new_states:  # one device
        set_rng_state(state)


class _CudaGenerator(torch._C.Generator):
    """``torch.Generator(device="cuda")`` in a session (diffusers' ``torch.Generator("cuda").manual_seed(0)``, a
    sampler's own generator): a generator of the simulated device. Its seed (``manual_seed``, ``initial_seed``) and
    state (``get_state`` / ``set_state``: its seed and how many random ops drew, as the device's own) are its own; a
    random op on the device given it (``generator=``) draws from it as the host issues the op, so its numbers depend
    on the generator and the program, never on the timing, and two generators seeded alike draw alike. A host op
    given it raises as on a GPU. It is a CPU ``torch.Generator`` underneath (torch's argument parser takes nothing
    else; ``simdevice.dispatch`` finds it by that generator's address), which nothing draws from."""

    def __new__(cls, device: Any = "cuda") -> _CudaGenerator:
        return super().__new__(cls, "cpu")  # type: ignore[call-arg,no-any-return]

    def __init__(self, device: Any = "cuda") -> None:
        self._seed, self._drawn = _DEFAULT_SEED, 0
        register_generator(self)

    @property  # type: ignore[override]
    def device(self) -> torch.device:
        return _REAL_DEVICE("cuda", 0)

    def next_seed(self) -> int:
        """The seed of the next random op given this generator (``Runtime.next_seed``'s, from this one's state)."""
        self._drawn += 1
        return op_seed(self._seed, self._drawn)

    def manual_seed(self, seed: int) -> _CudaGenerator:
        self._seed, self._drawn = int(seed), 0
        return self

    def initial_seed(self) -> int:
        return self._seed

    def seed(self) -> int:
        """A new seed, taken (a GPU's comes from the OS's entropy; here from this generator's state, so that a run
        stays the same run)."""
        seed = self.next_seed()
        self.manual_seed(seed)
        return seed

    def get_state(self) -> torch.Tensor:
        return _state(self._seed, self._drawn)

    def set_state(self, new_state: torch.Tensor) -> _CudaGenerator:
        self._seed, self._drawn = _unstate(new_state, "Generator.set_state")
        return self

    def __reduce__(self) -> Any:
        return torch.Generator, ("cuda",), (self._seed, self._drawn)

    def __setstate__(self, state: Any) -> None:
        self._seed, self._drawn = state

    def get_offset(self, *args: Any) -> Any:
        raise NotImplementedError("a simulated CUDA generator's philox offset (Generator.get_offset, set_offset): its "
                                  "state is a seed and a count of draws (get_state, set_state)")

    set_offset = get_offset

    def graphsafe_get_state(self, *args: Any) -> Any:
        raise NotImplementedError("a simulated CUDA generator's graph-safe state (graphsafe_get_state, "
                                  "graphsafe_set_state, clone_state) is not simulated: a CUDA graph's random ops draw "
                                  "from the device's generator at each replay")

    graphsafe_set_state = clone_state = graphsafe_get_state


class _DeviceGenerator(_CudaGenerator):
    """``torch.cuda.default_generators[0]``: the simulated device's own generator, as code that keeps CUDA's
    generator calls it (Megatron's RNG tracker sets and reads its state so, where torch has no
    ``_cuda_setRNGState``): its state is ``torch.cuda.get_rng_state()``'s, its seed ``manual_seed``'s, and an op
    given it draws as one given none."""

    def next_seed(self) -> int:
        return session_device().runtime.next_seed()

    def get_state(self) -> torch.Tensor:
        return get_rng_state()

    def set_state(self, new_state: torch.Tensor) -> _DeviceGenerator:
        set_rng_state(new_state)
        return self

    def manual_seed(self, seed: int) -> _DeviceGenerator:
        manual_seed(int(seed))
        return self

    def initial_seed(self) -> int:
        return int(session_device().runtime.initial_seed)

    def seed(self) -> int:  # (torch.cuda.seed(): no new seed here, the run stays deterministic)
        return self.initial_seed()

    def __reduce__(self) -> Any:
        raise TypeError("torch.cuda.default_generators[0] of a simulated run is not pickled (its state is: "
                        "get_state())")


class _GeneratorClass(type):
    """The class of :class:`_Generator`: ``isinstance(g, torch.Generator)`` of any generator is True, and
    ``torch.Generator("cuda")`` makes a :class:`_CudaGenerator`, where the CPU build's C++ fails (``Cannot get CUDA
    generator without ATen_cuda library``)."""

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, _REAL_GENERATOR)

    def __subclasscheck__(cls, sub: Any) -> bool:
        return issubclass(sub, _REAL_GENERATOR)

    def __call__(cls, device: Any = "cpu") -> Any:
        if on_device(device):
            return _CudaGenerator(device)
        return _REAL_GENERATOR(device)


class _Generator(metaclass=_GeneratorClass):
    """``torch.Generator`` in a session: a CUDA device's is the simulated device's (:class:`_CudaGenerator`)."""


_Generator.__name__ = _Generator.__qualname__ = "Generator"
_Generator.__module__ = "torch"
_Generator.__doc__ = _REAL_GENERATOR.__doc__


def set_sync_debug_mode(debug_mode: int | str) -> None:
    """``torch.cuda.set_sync_debug_mode``: its names taken as torch takes them, the mode applied for the rest of the
    run (``Runtime.synchronizing``): 1 warns at each call that synchronizes as ATen's ``memcpy_and_sync`` and
    ``stream_synchronize`` do, 2 raises there."""
    if isinstance(debug_mode, str):
        modes = {"default": 0, "warn": 1, "error": 2}
        if debug_mode not in modes:
            raise RuntimeError("invalid value of debug_mode, expected one of `default`, `warn`, `error`")
        debug_mode = modes[debug_mode]
    session_device().runtime.sync_debug = int(debug_mode)


def get_sync_debug_mode() -> int:
    return session_device().runtime.sync_debug


class _Generators(Sequence[Any]):
    """``torch.cuda.default_generators``: the one simulated device's generator at every index of ``device_count()``
    (Megatron's RNG tracker takes ``default_generators[current_device()]``); past the count, CUDA's invalid ordinal."""

    def __init__(self, generator: Any) -> None:
        self._generator = generator

    def __len__(self) -> int:
        return device_count()

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self._generator for _ in range(len(self))[index]]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("tuple index out of range")
        return self._generator


class _DeviceContext:
    """``torch.cuda.device(i)``: there is one simulated device; an index past ``device_count()`` raises as it is
    entered, as CUDA's does (-1 or None: nothing)."""

    def __init__(self, device: Any) -> None:
        self.device = device

    def __enter__(self) -> None:
        if self.device != -1:
            _check(self.device)
        self._before = current_device()
        if self.device is not None:
            set_device(self.device)
        return None

    def __exit__(self, *exc: Any) -> None:
        set_device(self._before)
        return None


class _DeviceOf(_DeviceContext):
    """``torch.cuda.device_of(obj)``: the device of a tensor or storage current for the block (a host one's: nothing),
    as ``torch.cuda.device`` (torch's own subclasses torch's device, whose ``__enter__`` the CPU build refuses)."""

    def __init__(self, obj: Any) -> None:
        super().__init__(obj.get_device() if obj.is_cuda else -1)


def _size(n: int) -> str:
    """Bytes as torch's summary writes them (its ``_format_size``)."""
    unit, scaled = "B  ", float(n)
    for bigger in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        if scaled < 768 * 1024:
            break
        unit, n, scaled = bigger, n // 1024, scaled / 1024
    return f"{n:6d} {unit}"


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """``torch.cuda.memory_summary``: the statistics the simulated allocator keeps (``memory_stats()``'s), in the
    layout of torch's table, a row per statistic (torch's rows per pool, of the counts it keeps that this does not,
    are left out and said so). A program that logs it runs (before: ``NotImplementedError``, no verdict)."""
    _check(device)
    stats = _own_stats()
    line = "|" + "=" * 75 + "|"
    rule = "|" + "-" * 75 + "|"
    rows = [("Allocated memory", _size(stats["allocated"]), _size(stats["peak"])),
            ("Active memory", _size(stats["active"]), _size(stats["active_peak"])),
            ("GPU reserved memory", _size(stats["reserved"]), _size(stats["reserved_peak"])),
            ("Allocations", f"{stats['blocks']:10d}", ""),
            ("GPU reserved segments", f"{stats['segments']:10d}", "")]
    counts = f"            CUDA OOMs: {stats['ooms']:<13d}|        cudaMalloc retries: {stats['alloc_retries']:<10d}"
    out = [line, "|" + " PyTorch CUDA memory summary, device ID 0 (the simulated device) ".center(75) + "|", rule,
           "|" + counts.ljust(75) + "|", line,
           "|" + "        Metric         | Cur Usage  | Peak Usage |".ljust(75) + "|", rule]
    out += ["|" + f" {name:<22}| {cur:>10} | {peak:>10} |".ljust(75) + "|" for name, cur, peak in rows]
    out += [rule, "|" + " (no per-pool rows, nor totals allocated and freed: not kept here)"
            .ljust(75) + "|", line]
    return "\n".join(out) + "\n"


def _check_option(value: str | None, valid: tuple[str, ...], error: str) -> None:
    if value is not None and value not in valid:
        raise RuntimeError(error)


def _record_memory_history(enabled: str | None = "all", context: str | None = "all", stacks: str = "all",
                           max_entries: int = sys.maxsize, clear_history: bool = False, compile_context: bool = False,
                           global_record_annotations: bool = False, skip_actions: Iterable[str] = ()) -> None:
    """``torch._C._cuda_record_memory_history`` (what ``torch.cuda.memory._record_memory_history`` calls): the
    simulated allocator of the calling process records its actions and where the program made each allocation
    (:class:`simdevice.runtime.allocator.History`), with torch's checks of the options. Its stacks are Python's
    (no C++ frames), whatever ``stacks`` asks."""
    _check_option(enabled, ("state", "all"), "expected state to be 'state', 'all', or None")
    _check_option(context, ("state", "alloc", "all"), "expected context to be 'state', 'alloc', 'all', or None")
    _check_option(stacks, ("python", "all"), "expected stacks to be 'python', or 'all'")
    session_device().runtime.record_memory_history(_own_process(), enabled, context, max_entries, clear_history,
                                                   skip_actions)


def _record_memory_history_legacy(enabled: bool, record_context: bool = True, trace_alloc_max_entries: int = 1,
                                  trace_alloc_record_context: bool = False, record_context_cpp: bool = False,
                                  clear_history: bool = False, *rest: Any) -> None:
    """``torch._C._cuda_record_memory_history_legacy`` (``_record_memory_history(True, ...)``): the same record
    in the old options' terms."""
    skip = rest[2] if len(rest) > 2 and rest[2] is not None else ()
    context = "alloc" if trace_alloc_record_context else "state" if record_context else None
    session_device().runtime.record_memory_history(
        _own_process(), ("all" if trace_alloc_max_entries > 1 else "state") if enabled else None, context,
        trace_alloc_max_entries, clear_history, skip)


def _stream_handle(rt: Any, s: Any) -> int:
    """A simulated stream's CUDA handle (``torch.cuda.Stream.cuda_stream``'s, a snapshot's): 0 for a default stream
    (CUDA's legacy null stream, each actor's own) and for none, its order (its ``stream_id``) for any other."""
    if s is None or any(a.default_stream is s for a in rt.execution.actors.values()):
        return 0
    return int(s.order)


def _memory_snapshot(pool: tuple[int, int, bool] | None = None) -> dict[str, Any]:
    """``torch._C._cuda_memorySnapshot`` (what ``torch.cuda.memory._snapshot``, ``_dump_snapshot`` and
    ``memory_snapshot`` call): the calling process's segments and blocks in torch's form, and what its memory
    history recorded. ``pool``: ``(pool id, include traces)``, the default pool's id ``(0, 0)`` taking every
    segment. A stream is its handle, as ``cuda_stream`` gives it."""
    rt = session_device().runtime
    segments, entries = rt.memory_snapshot(_own_process())
    if pool is not None and tuple(pool[:2]) != (0, 0):
        segments = [seg for seg in segments if seg["segment_pool_id"] == tuple(pool[:2])]
    for seg in segments:  # (made for this snapshot)
        seg["stream"] = _stream_handle(rt, seg["stream"])
    traces = [{**e, "stream": _stream_handle(rt, e["stream"])} for e in entries] if pool is None or pool[2] else []
    return {"segments": segments, "device_traces": [traces]}


def memory_snapshot(mempool_id: tuple[int, int] | None = None, include_traces: bool = True) -> list[dict[str, Any]]:
    """``torch.cuda.memory_snapshot``: :func:`_memory_snapshot`'s segments."""
    pool = (0, 0) if mempool_id is None else tuple(mempool_id)
    return _memory_snapshot((pool[0], pool[1], include_traces))["segments"]  # type: ignore[no-any-return]


def _refused(name: str, message: str) -> type:
    """A class of torch's that a run may not make: making one raises ``NotImplementedError(message)`` (no verdict),
    and ``isinstance`` of anything against it answers False (no object of it exists in a run) where a function in
    its place raised ``TypeError``, a host error of a correct program."""

    def refuse(cls: type, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(message)

    return type(name, (), {"__new__": refuse, "__doc__": message})


# -- CUDA graphs: capture and replay on the simulated device (what they do there: simdevice.runtime.graphs); torch's
# own make_graphed_callables runs on them unchanged ------------------------------------------------------------------


def _graph_ended(rt: weakref.ref[Any], g: SimGraph) -> None:
    """A graph object was dropped: its nodes go, and its hold on its pool (as torch's destructor resets it)."""
    runtime = rt()
    if runtime is not None and g.capture is None:
        runtime.graph_reset(g)


class CUDAGraph:
    """``torch.cuda.CUDAGraph`` on the simulated device: ``capture_begin``/``capture_end`` record what the current
    stream issues, ``replay()`` issues it again on the stream current then, ``pool()`` names its private pool,
    ``reset()`` drops it. ``keep_graph`` and ``instantiate()`` change nothing here (nothing is compiled);
    ``check_input_liveness`` is taken and not used (a replay that reads freed memory is found as any other access of
    it); ``debug_dump`` and the raw CUDA handles are not simulated."""

    def __init__(self, keep_graph: bool = False) -> None:
        rt = session_device().runtime
        self._rt = weakref.ref(rt)
        self._graph = rt.graph_new()
        self.keep_graph = keep_graph
        weakref.finalize(self, _graph_ended, self._rt, self._graph)

    def _runtime(self) -> Any:
        rt = self._rt()
        if rt is None or rt is not session_device().runtime:
            raise RuntimeError("simdevice: a CUDAGraph of another simulated run (a run uses the graphs it made)")
        return rt

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global",
                      check_input_liveness: bool = False) -> None:
        rt = self._runtime()
        rt.capture_begin(self._graph, None if pool is None else tuple(pool), capture_error_mode)
        rt.gpu_replay = False  # (reference.cuda_plain refuses it: the replay line offers no --gpu)

    def capture_end(self) -> None:
        self._runtime().capture_end(self._graph)

    def instantiate(self) -> None:
        if self._graph.nodes is None:
            raise RuntimeError("Called CUDAGraph::instantiate without a preceding successful capture.")

    def replay(self) -> None:
        self._runtime().graph_replay(self._graph)

    def reset(self) -> None:
        self._runtime().graph_reset(self._graph)

    def pool(self) -> tuple[int, int]:
        if self._graph.handle is None:
            raise RuntimeError("Called CUDAGraph::pool() without a preceding successful capture.")
        return self._graph.handle

    def enable_debug_mode(self) -> None:
        pass  # (debug_dump, what it is for, is not simulated)

    def debug_dump(self, debug_path: str) -> None:
        raise NotImplementedError("CUDAGraph.debug_dump is not simulated (no CUDA graph is built to dump)")

    def raw_cuda_graph(self) -> int:
        raise NotImplementedError("CUDAGraph.raw_cuda_graph is not simulated (no cudaGraph_t exists here)")

    def raw_cuda_graph_exec(self) -> int:
        raise NotImplementedError("CUDAGraph.raw_cuda_graph_exec is not simulated (no cudaGraphExec_t exists here)")

    def get_graph_data(self) -> dict[str, Any]:
        raise NotImplementedError("CUDAGraph.get_graph_data is not simulated (no cudaGraph_t exists here)")


class graph:  # noqa: N801 (torch's name)
    """``torch.cuda.graph(cuda_graph, pool=None, stream=None, capture_error_mode="global")``, as torch's: entering it
    synchronizes the device, empties the cache, makes the capture stream current (``stream``, or a side stream torch
    makes once per process) and begins the capture; leaving it ends the capture, then restores the stream (a capture
    that fails to end leaves the capture stream current, as torch's does)."""

    def __init__(self, cuda_graph: CUDAGraph, pool: Any = None, stream: Any = None,
                 capture_error_mode: str = "global", enable_annotations: bool = False,
                 check_input_liveness: bool = False) -> None:
        if enable_annotations:
            raise NotImplementedError("torch.cuda.graph(enable_annotations=True) is not simulated (kernel "
                                      "annotations need CUDA's bindings)")
        if stream is None:
            dev = session_device()
            rt = dev.runtime
            process = rt.current().process
            kept = rt.graphs.default_streams.get(process)
            if kept is None:
                stream = Stream()
                rt.graphs.default_streams[process] = dev.stream_of(stream)
            else:
                stream = Stream.of(dev, kept)
        self.pool: tuple[Any, ...] = () if pool is None else (pool,)
        self.capture_stream = stream
        self.stream_ctx = StreamContext(stream)
        self.cuda_graph = cuda_graph
        self.capture_error_mode = capture_error_mode
        self.check_input_liveness = check_input_liveness

    def __enter__(self) -> None:
        synchronize()
        empty_cache()
        self.stream_ctx.__enter__()
        self.cuda_graph.capture_begin(*self.pool, capture_error_mode=self.capture_error_mode,
                                      check_input_liveness=self.check_input_liveness)

    def __exit__(self, *args: object) -> None:
        self.cuda_graph.capture_end()
        self.stream_ctx.__exit__(*args)


def graph_pool_handle() -> tuple[int, int]:
    """``torch.cuda.graph_pool_handle()``: a new private pool's handle, for graphs that share it."""
    return session_device().runtime.graphs.pool_handle()  # type: ignore[no-any-return]


def is_current_stream_capturing() -> bool:
    """``torch.cuda.is_current_stream_capturing()``: whether the current stream records into a capture."""
    return bool(in_actor() and session_device().runtime.capturing_now())


_GRAPHS_REFUSED = ("torch.accelerator.Graph is not simulated (torch.cuda.CUDAGraph and torch.cuda.graph are: capture "
                   "with those)")


def _no_raw_allocations(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError("torch.cuda.caching_allocator_alloc / caching_allocator_delete are not simulated (a "
                              "raw pointer is no tensor the simulator can follow): allocate tensors instead")


def _mem_pool_ended(rt: weakref.ref[Any], tag: str) -> None:
    runtime = rt()
    if runtime is not None:
        runtime.mem_pool_ended(tag)


class MemPool:
    """``torch.cuda.MemPool()`` on the simulated device: a private pool of the caching allocator (its ``id``, as a CUDA
    graph's ``pool=`` too), which ``use_mem_pool`` routes the current thread's allocations to; no allocation outside
    it takes its blocks, and ``empty_cache`` keeps its segments while the object lives. ``use_on_oom`` is taken (the
    simulated device's capacity is a bound of its own); a pool with its own allocator, or ``no_split``, is not
    simulated."""

    def __init__(self, allocator: Any = None, use_on_oom: bool = False, no_split: bool = False) -> None:
        if allocator is not None:
            raise NotImplementedError("torch.cuda.MemPool(allocator=...) is not simulated (a pluggable allocator's "
                                      "memory is no block of the simulated caching allocator)")
        if no_split:
            raise NotImplementedError("torch.cuda.MemPool(no_split=True) is not simulated (its blocks are split as "
                                      "the caching allocator splits any)")
        rt = session_device().runtime
        self._rt = weakref.ref(rt)
        self._id, self._tag = rt.mem_pool_new()
        self.use_on_oom = use_on_oom
        weakref.finalize(self, _mem_pool_ended, self._rt, self._tag)

    @property
    def id(self) -> tuple[int, int]:
        return self._id

    @property
    def allocator(self) -> None:
        return None

    def use_count(self) -> int:
        """The pool's holders: the object itself, and the graphs captured into it."""
        rt = self._rt()
        return 0 if rt is None else int(rt.graphs.holders.get(self._tag, 0))

    def snapshot(self, include_traces: bool = True) -> list[dict[str, Any]]:
        return memory_snapshot(self.id, include_traces=include_traces)


@contextlib.contextmanager
def use_mem_pool(pool: MemPool, device: Any = None) -> Iterator[None]:
    """``torch.cuda.use_mem_pool(pool)``: the current thread's allocations come from ``pool`` for the block (another
    thread's, and a backward's autograd thread's, do not)."""
    _check_or_current(device)
    if not isinstance(pool, MemPool):
        raise TypeError(f"use_mem_pool: expected a torch.cuda.MemPool, got {type(pool).__name__}")
    with session_device().runtime.mem_pool_routed(pool._tag):
        yield


class _CudaError(enum.IntEnum):
    """``torch.cuda.cudart().cudaError``: the codes its calls here answer."""

    success = 0
    invalid_value = 1
    host_memory_already_registered = 712
    host_memory_not_registered = 713


class _Cudart:
    """``torch.cuda.cudart()`` on the simulated device: ``cudaHostRegister`` and ``cudaHostUnregister`` (host memory
    pinned in place, as offload code pins a buffer it already has: from then on its copies with the device are a
    pinned buffer's, non-blocking ones asynchronous, and ``is_pinned()`` answers True), ``cudaProfilerStart`` and
    ``cudaProfilerStop`` (no-ops, as ``torch.cuda.profiler``'s). Any other of the CUDA runtime's calls is refused: it
    would reach no simulated memory."""

    cudaError = _CudaError  # noqa: N815 (CUDA's name)

    @staticmethod
    def cudaHostRegister(ptr: int, size: int, flags: int) -> _CudaError:
        if not in_actor():
            raise RuntimeError(outside_actor())
        registered = session_device().registered
        if ptr in registered:
            return _CudaError.host_memory_already_registered
        if size <= 0:
            return _CudaError.invalid_value
        rt = session_device().runtime
        bytes_ = (ctypes.c_char * size).from_address(ptr)
        with torch._C._DisableTorchDispatch(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (frombuffer's note that the buffer is not writable-checked)
            alias = torch.frombuffer(bytes_, dtype=torch.uint8)
        # (no host step: a GPU run counts none for it either; it orders nothing of the streams)
        st = rt.register_pinned(alias, rt.current().process)
        st.made = True  # (its bytes hold the program's values)
        registered[ptr] = alias
        return _CudaError.success

    @staticmethod
    def cudaHostUnregister(ptr: int) -> _CudaError:
        if not in_actor():
            raise RuntimeError(outside_actor())
        if session_device().registered.pop(ptr, None) is None:
            return _CudaError.host_memory_not_registered
        session_device().runtime.memory.unregister_pinned(ptr)
        return _CudaError.success

    @staticmethod
    def cudaProfilerStart() -> _CudaError:
        return _CudaError.success

    @staticmethod
    def cudaProfilerStop() -> _CudaError:
        return _CudaError.success

    def __getattr__(self, name: str) -> Any:
        raise NotImplementedError(f"torch.cuda.cudart().{name} is not simulated (the CUDA runtime's own calls reach no "
                                  "simulated memory; cudaHostRegister and cudaHostUnregister are)")


_CUDART = _Cudart()


def _cudart() -> _Cudart:
    """``torch.cuda.cudart()``."""
    return _CUDART


def _unpin_memory(original: Callable[[int], None]) -> Callable[[int], None]:
    """``torch.cuda._pin_memory_utils.unpin_memory``, the finalizer ``torch.distributed.checkpoint``'s staging sets
    on each host storage it pins: it runs when the storage dies, which may be after the run (outside it the CPU build
    has no CUDA runtime to call: an error at whatever Python then ran, a compile's among them). Memory this run
    registered is unregistered as on a GPU; memory a run that is over registered, nothing: its registrations ended
    with it, as a process's do (a storage's finalizer runs before its address can be reused)."""

    @functools.wraps(original)
    def unpin_memory(data_ptr: int) -> None:
        if in_actor() and data_ptr in session_device().registered:
            original(data_ptr)

    return unpin_memory


_NO_EXTERNAL_STREAM = _refused("ExternalStream", "torch.cuda.ExternalStream is not simulated (a stream made outside "
                               "torch): make the stream with torch.cuda.Stream()")


@contextlib.contextmanager
def _nvtx_range(msg: str, *args: Any, **kwargs: Any) -> Iterator[None]:
    """``torch.cuda.nvtx.range``: a context manager, and a decorator (as torch's), marking nothing."""
    yield


_nvtx = types.SimpleNamespace(
    range_push=lambda msg: 0, range_pop=lambda: 0, mark=lambda msg: None, range=_nvtx_range,
    range_start=lambda msg: 0, range_end=lambda range_id: None,
)


def _profiler_init(*args: Any, **kwargs: Any) -> None:
    raise NotImplementedError("torch.cuda.profiler.init is not simulated (it configures CUDA's command-line "
                              "profiler): leave it out, or use torch.cuda.profiler.start and stop")


#: ``torch.cuda.profiler``'s ``start`` and ``stop`` (``cudaProfilerStart``, ``cudaProfilerStop``: where an external
#: profiler captures, nothing the program sees), and so its ``profile()``, which calls them: no-ops. (Its module bound
#: torch's ``cudart`` as torch imported it, which the CPU build has not: they raised an AttributeError, a host error
#: of a program a GPU runs.)
_profiler = types.SimpleNamespace(start=lambda: None, stop=lambda: None, init=_profiler_init)


# -- devices in factories and copies --------------------------------------------------------------------------


def device_count() -> int:
    """``torch.cuda.device_count()``: a device per rank of the world (a machine of N GPUs runs N ranks), one outside
    a world. Every rank's tensors are on the one simulated device, shown at the index its process made current."""
    return max(1, session_device().world_size) if in_actor() else 1


def _ordinal(index: int | None) -> None:
    """A device index past ``device_count()`` fails as CUDA's ``invalid device ordinal`` does."""
    if index is not None and not 0 <= index < device_count():
        raise RuntimeError(f"CUDA error: invalid device ordinal (device {index}; the simulated run has "
                           f"{device_count()}: one per rank, with --world-size N)")


def on_device(d: Any) -> bool:
    """Whether a ``device`` argument names the (simulated) CUDA device: ``"cuda"``, ``"cuda:0"``, an index (one past
    ``device_count()`` raises, as CUDA does)."""
    if isinstance(d, bool):
        return False
    if isinstance(d, int):
        _ordinal(d)
        return True
    if isinstance(d, str):
        if d == "cuda":
            return True
        if d.startswith("cuda:"):
            _ordinal(int(d[5:]) if d[5:].isdigit() else None)
            return True
        return False
    if isinstance(d, torch.device) and d.type == "cuda":
        _ordinal(d.index)
        return True
    return False


def _meta() -> torch.device:
    """What a device argument naming CUDA becomes in a session (the simulator's ops take it from there); from a
    thread the program started, an error: there no actor's dispatch mode would take it, and it would make a meta
    tensor silently."""
    if _ACTIVE and not in_actor():
        raise RuntimeError(outside_actor())
    return META


#: the factories a ``with torch.device(...)`` block or ``torch.set_default_device(...)`` gives its device where the
#: call names none (torch's own list, read before anything is patched: not ``*_like``, which take their input's)
_CONTEXT_FACTORIES = frozenset(
    name for f in torch_device._device_constructors.__wrapped__()
    if getattr(torch, name := getattr(f, "__name__", ""), None) is f)


#: torch's own device class (a session puts :class:`_Device` in its place as ``torch.device``)
_REAL_DEVICE = torch.device


class _DeviceClass(type):
    """The class of :class:`_Device`: ``isinstance(d, torch.device)`` of a device is True, and ``torch.device(0)``
    (an index alone) names the simulated CUDA device, where the CPU build's C++ asks for an accelerator and fails
    (``Cannot access accelerator device when none is available``: no verdict for ``torch.device(local_rank)``,
    a device map of indices)."""

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, _REAL_DEVICE)

    def __subclasscheck__(cls, sub: Any) -> bool:
        return issubclass(sub, _REAL_DEVICE)

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and isinstance(args[0], int) and not isinstance(args[0], bool):
            _ordinal(args[0])
            return _REAL_DEVICE("cuda", args[0])
        return _REAL_DEVICE(*args, **kwargs)


class _Device(metaclass=_DeviceClass):
    """``torch.device`` in a session: makes torch's own devices (``type(torch.device("cuda"))`` is torch's class),
    an index alone being the simulated CUDA device's, as on a GPU."""


_Device.__name__ = _Device.__qualname__ = "device"
_Device.__module__ = "torch"
_Device.__doc__ = _REAL_DEVICE.__doc__


def _reduce_device(d: torch.device) -> tuple[Any, tuple[Any, ...]]:
    """How a device pickles in a session: as torch's own reduction, ``torch.device`` called with its type and index,
    but naming :class:`_Device`, which pickle finds at ``torch.device`` there (it refuses torch's class, which it does
    not find there). The bytes are torch's: a run's ``torch.load`` (``weights_only``, which allows ``torch.device``)
    and one outside the session read them."""
    return _Device, d.__reduce__()[1]


def _pickled_devices(p: Patches) -> None:
    had = copyreg.dispatch_table.get(_REAL_DEVICE)
    copyreg.pickle(_REAL_DEVICE, _reduce_device)

    def back() -> None:
        if had is None:
            copyreg.dispatch_table.pop(_REAL_DEVICE, None)
        else:
            copyreg.dispatch_table[_REAL_DEVICE] = had

    p.on_restore(back)


def _parse_to(original: Callable[..., Any]) -> Callable[..., Any]:
    """``torch._C._nn._parse_to``, what ``module.to(...)`` parses its arguments with: a device index (``model.to(
    local_rank)``) names the simulated CUDA device, where the CPU build's C++ asks for an accelerator and fails."""

    @functools.wraps(original)
    def parse(*args: Any, **kwargs: Any) -> Any:
        if args and isinstance(args[0], int) and not isinstance(args[0], bool):
            _ordinal(args[0])
            args = (_REAL_DEVICE("cuda", args[0]), *args[1:])
        device = kwargs.get("device")
        if isinstance(device, int) and not isinstance(device, bool):
            _ordinal(device)
            kwargs["device"] = _REAL_DEVICE("cuda", device)
        return original(*args, **kwargs)

    return parse


def _context_device() -> torch.device | None:
    """The device a factory gets where the call names none: that of the innermost ``with torch.device(...)`` block
    (torch's ``DeviceContext``, a function mode), else of ``torch.set_default_device(...)``; None where neither
    is. torch's mode would pass it on to the factory itself, but only to the factories it knew before the session
    patched them (so a ``with torch.device("meta")`` block made host tensors), and CUDA as a device the simulator
    takes from here."""
    if torch._C._len_torch_function_stack():
        for mode in reversed(_get_current_function_mode_stack()):
            if isinstance(mode, torch_device.DeviceContext):
                return mode.device  # type: ignore[no-any-return]
    default = getattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context", None)
    return None if default is None else default.device  # type: ignore[no-any-return]


def _program_meta(device: Any) -> bool:
    """Whether a factory's ``device`` is the meta device the program asked for (``device="meta"``, ``with
    torch.device("meta")``: model code made without memory, then ``to_empty(device="cuda")``), which is made a
    meta tensor of torch's, below the dispatch mode: the simulated device's own tensors are meta shells, and the
    mode took such a factory for one of them, made in device memory (``META``, the simulator's own object, still
    is one)."""
    if device is None or device is META or isinstance(device, int):
        return False
    return (device.type if isinstance(device, torch.device) else str(device).split(":")[0]) == "meta"


def _context_on_device() -> bool:
    """Whether the device a factory gets where the call names none is CUDA (:func:`_context_device`)."""
    device = _context_device()
    return device is not None and on_device(device)


def _forget_context_factories() -> None:
    """torch keeps the factories its ``DeviceContext`` acts on as it first found them (a cache): found during a
    session, they would be the session's, and a block run after it, on a GPU, would give its device to none."""
    torch_device._device_constructors.cache_clear()


def _device_of_call(kwargs: dict[str, Any], contextual: bool) -> Any:
    """The device a factory call makes its tensor on: its ``device``, else (``contextual``) the context's
    (:func:`_context_device`), which is written into ``kwargs`` where it is not CUDA (the simulator's own device,
    which the caller puts there as ``META``)."""
    device = kwargs.get("device")
    if device is None and contextual:
        device = _context_device()
        if device is not None and not on_device(device):
            kwargs["device"] = device
    return device


def _as_program_meta(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``fn`` called to make a meta tensor of the program's (:func:`_program_meta`): below the dispatch mode."""
    with torch._C._DisableTorchDispatch():
        return fn(*args, **kwargs)


def _factory(fn: Callable[..., Any]) -> Callable[..., Any]:
    contextual = fn.__name__ in _CONTEXT_FACTORIES

    @functools.wraps(fn)
    def make(*args: Any, **kwargs: Any) -> Any:
        device = _device_of_call(kwargs, contextual)
        if on_device(device):
            kwargs["device"] = _meta()
        elif _program_meta(device):
            return _as_program_meta(fn, args, kwargs)
        return fn(*args, **kwargs)

    return make


def _seen_moving(fn: Callable[..., Any], data: Any) -> bool:
    """Whether a GPU run's dispatch mode sees ``fn`` move ``data`` to the device (an ``_to_copy``): a tensor, a NumPy
    array, an object with ``__cuda_array_interface__`` (and, for ``asarray``, a NumPy scalar, a DLPack capsule or
    a buffer), which torch moves with ``.to()`` through the dispatcher. Python data (a list, a number) it copies
    below the modes (``internal_new_from_data``, torch/csrc/utils/tensor_new.cpp: the Python keys excluded), and
    a GPU run counts no operation."""
    if isinstance(data, (torch.Tensor, np.ndarray)) or hasattr(data, "__cuda_array_interface__"):
        return True
    if fn.__name__ != "asarray":
        return False
    if isinstance(data, np.generic) or type(data).__name__ == "PyCapsule":
        return True
    try:
        memoryview(data)
    except TypeError:
        return False
    return True


def _elements_read(data: Any) -> Any:
    """``data`` (a list or tuple, nested) with each device tensor in it read as the scalar it is, as torch's
    ``recursive_store`` reads each tensor element of a list (``float(t)``: a synchronizing read on a GPU), kept a
    host tensor of its dtype so that the result's dtype is inferred from it as from the device tensor; one of more
    than one element is a host tensor of its shape, whose read raises torch's own error. A simulated tensor is a
    sequence to Python's C API (its class defines ``__getitem__``), where torch's own is not, so torch took it for
    one more level of the list (``len() of a 0-d tensor``: Megatron's ``local_multi_tensor_l2_norm`` failed). The
    same ``data`` where it holds no device tensor."""
    if isinstance(data, SimTensor):
        if data.numel() == 1:
            return torch.tensor(data.item(), dtype=data.dtype)
        return torch.empty(data.shape, dtype=data.dtype)
    if isinstance(data, (list, tuple)):
        read = [_elements_read(d) for d in data]
        if any(a is not b for a, b in zip(read, data, strict=True)):
            return type(data)(read) if isinstance(data, list) else tuple(read)
    return data


def _from_data(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.tensor``, ``as_tensor``, ``asarray``: made on the host, then copied to the device (synchronously,
    from pageable memory, as CUDA does): Python data by a copy no dispatch mode sees (``SimDevice.from_host``),
    the rest by ``.to()``, an operation of the program's on both machines (:func:`_seen_moving`). A device tensor
    among the elements of a list is read as torch reads it (:func:`_elements_read`)."""

    @functools.wraps(fn)
    def make(*args: Any, **kwargs: Any) -> Any:
        if args and isinstance(args[0], (list, tuple)) and in_actor():
            args = (_elements_read(args[0]), *args[1:])
        device = _device_of_call(kwargs, contextual=True)
        if _program_meta(device):
            return _as_program_meta(fn, args, kwargs)
        if not on_device(device):
            if kwargs.get("pin_memory") and in_actor():  # (the CPU build has no pinned allocator: made, then pinned)
                kwargs = {k: v for k, v in kwargs.items() if k != "pin_memory"}
                grad = bool(kwargs.pop("requires_grad", False))
                out = fn(*args, **kwargs).pin_memory()
                return out.requires_grad_() if grad else out
            return fn(*args, **kwargs)
        kwargs = {k: v for k, v in kwargs.items() if k != "device"}
        if args and isinstance(args[0], SimTensor):
            return fn(*args, device=_meta(), **kwargs)
        grad = bool(kwargs.pop("requires_grad", False))
        data = args[0] if args else kwargs.get("data", kwargs.get("obj"))
        out = fn(*args, **kwargs)
        if in_actor() and not _seen_moving(fn, data):
            out = session_device().from_host(out)
        else:
            out = out.to(_meta())
        return out.requires_grad_() if grad else out  # a leaf, as made on the device

    return make


def _tensor_new_tensor(original: Callable[..., Any]) -> Callable[..., Any]:
    """``t.new_tensor(data)``: a tensor of ``data`` on ``t``'s device (or ``device``) with ``t``'s dtype (or
    ``dtype``), made as ``torch.tensor`` makes one there (torch's own builds it below the dispatcher: a meta shell
    here)."""

    @functools.wraps(original)
    def new_tensor(self: torch.Tensor, data: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False,
                   **kwargs: Any) -> Any:
        target = self.device if device is None else device
        if not on_device(target):
            return original(self, data, dtype=dtype, device=device, requires_grad=requires_grad, **kwargs)
        return torch.tensor(data, dtype=dtype or self.dtype, device=target, requires_grad=requires_grad, **kwargs)

    return new_tensor


def _native_dropout(input: Any, p: float, training: bool) -> Any:
    """A dropout of a device tensor, training: one ``native_dropout``, as ATen's ``dropout`` runs on a CUDA tensor
    (``is_fused_kernel_acceptable``: CUDA, ``0 < p < 1``, not empty), where for the simulated tensor, whose shell C++
    sees on the meta device, it took the unfused path (``bernoulli_``, ``div_``, ``mul``): two operations more per
    call, forward and backward, than a GPU counts, so a schedule's delay after a dropout fell on another operation
    in a GPU replay. None where ATen takes the unfused path (or none) on CUDA too."""
    if training and isinstance(input, SimTensor) and 0.0 < p < 1.0 and input.numel() > 0:
        return torch.native_dropout(input, p, True)[0]
    return None


def _functional_dropout(original: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.nn.functional.dropout`` (``nn.Dropout``'s): :func:`_native_dropout` out of place; in place
    (``inplace=True``, ATen's ``dropout_``, unfused on CUDA too) torch's."""

    @functools.wraps(original)
    def dropout(input: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
        out = None if inplace else _native_dropout(input, p, training)
        return original(input, p, training, inplace) if out is None else out

    return dropout


def _torch_dropout(original: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.dropout(input, p, train)``: :func:`_native_dropout`."""

    @functools.wraps(original)
    def dropout(input: Any, p: float, train: bool) -> Any:
        out = _native_dropout(input, p, train)
        return original(input, p, train) if out is None else out

    return dropout


def _default_rng(original: Callable[..., Any]) -> Callable[..., Any]:
    """``np.random.default_rng()`` with no seed, in a run's actors: the k-th the run makes is seeded k, where NumPy
    seeds it from the OS's entropy, so that the same schedule gives the same run (random data, a random order) in a
    search and in its replay (``session.seed_host_generators`` does so for the global generators). A seed given is
    NumPy's to take."""

    @functools.wraps(original)
    def default_rng(seed: Any = None) -> Any:
        if seed is None and in_actor():
            dev = _ACTIVE[-1]
            seed = dev.unseeded_rngs
            dev.unseeded_rngs += 1
        return original(seed)

    return default_rng


def _tensor_legacy_new(original: Callable[..., Any]) -> Callable[..., Any]:
    """``t.new(data)``, torch's legacy constructor given data (a list, a tuple, a NumPy array; not a ``torch.Size``,
    nor sizes, which it takes as a shape): ``t.new_tensor(data)`` (torch's own builds it below the dispatcher: a meta
    shell here, its values lost)."""

    @functools.wraps(original)
    def new(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if (len(args) == 1 and isinstance(args[0], (list, tuple, np.ndarray)) and not isinstance(args[0], torch.Size)
                and set(kwargs) <= {"device"} and on_device(kwargs.get("device", self.device))):
            return self.new_tensor(args[0], device=kwargs.get("device"))
        return original(self, *args, **kwargs)

    return new


_BASE_DATA = torch._C.TensorBase.data


def _host_data_get(self: torch.Tensor) -> torch.Tensor:
    return _BASE_DATA.__get__(self, type(self))  # type: ignore[no-any-return]


def _host_data_set(self: torch.Tensor, value: torch.Tensor) -> None:
    """``p.data = t`` of a host tensor: to a simulated tensor, ``p`` becomes a device tensor on ``t``'s bytes, as
    torch's ``set_data`` moves it on a GPU (:func:`~simdevice.dispatch.set_data_across`; torch refused the
    simulated tensor's type); any other, torch's own."""
    if isinstance(value, SimTensor):
        set_data_across(self, value)
        return
    _BASE_DATA.__set__(self, value)


#: ``Tensor.data`` of the session: a host tensor's ``.data`` set to a simulated one moves it (a simulated tensor's
#: own ``data`` property takes a host tensor likewise)
_HOST_DATA = property(_host_data_get, _host_data_set, doc=_BASE_DATA.__doc__)


def _tensor_to(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        args = tuple(_meta() if on_device(a) and not isinstance(a, torch.dtype) else a for a in args)
        if on_device(kwargs.get("device")):
            kwargs["device"] = _meta()
        if isinstance(self, _LAZY) and (kwargs.get("device") is META or any(a is META for a in args)):
            return _lazy_to_device(original, self, args, kwargs)
        if self.layout is not torch.strided and (kwargs.get("device") is META or any(a is META for a in args)):
            raise NotImplementedError(f"a {self.layout} tensor on the simulated device is not simulated (its "
                                      "tensors are dense): move it there dense (to_dense())")
        return original(self, *args, **kwargs)

    return to


def _tensor_tolist(original: Callable[..., Any]) -> Callable[..., Any]:
    """``t.tolist()``: torch reads a host tensor's bytes in C++, below the dispatcher, so a read of pinned memory a
    non-blocking D2H may still be filling (``ids.to("cpu", non_blocking=True).tolist()`` without a synchronize)
    is checked here, as the host's read (a simulated tensor's own ``tolist`` copies it to the host first). Called by
    torch itself (its text of a tensor, which a failed assertion's explanation asks for after the fact) it is not,
    as a simulated tensor's text read by anything but the program reads nothing."""

    @functools.wraps(original)
    def tolist(self: torch.Tensor) -> Any:
        if _ACTIVE and not isinstance(self, SimTensor) and not internal_file(sys._getframe(1).f_code.co_filename):
            _ACTIVE[-1].runtime.unseen_host_read(self, "tolist", user_source())
        return original(self)

    return tolist


#: where the standard library's ``logging`` lives: a logger formats its message's arguments in its own frames
_LOGGING = os.path.dirname(logging.__file__) + os.sep
#: where pytest's own code lives (its assertion rewriting's ``saferepr``)
_PYTEST = "/_pytest/"


def _printing_line() -> str | None:
    """The program's line that printed a tensor (from its caller's caller on), past torch's frames (``f"{t}"``'s
    ``__format__``) and the ``logging`` module's (a logger formats ``logger.info("loss %s", t)`` itself); None where
    pytest's assertion explanation asks for the text (its ``saferepr``: a failed ``assert``'s message, made after the
    fact, which reads nothing of the program's, as a simulated tensor's text read by anything but the program); None
    too where no frame of the program's is above (the run's report describing a failed ``assert`` whose message is a
    tensor: an actor's stack ends in the simulator's frames)."""
    f = sys._getframe(2)
    n = 0
    while f is not None:
        name = f.f_code.co_filename
        if _PYTEST in name.replace("\\", "/") or name.endswith("reprlib.py"):
            return None
        if not (internal_file(name) or name.startswith(_LOGGING)):
            return user_source(2 + n)
        f = f.f_back  # type: ignore[assignment]
        n += 1
    return None


def _tensor_repr(original: Callable[..., Any]) -> Callable[..., Any]:
    """``print(t)``, ``repr(t)``, ``str(t)`` or ``f"{t}"`` of a host tensor in the program: torch formats its values
    with the dispatch modes turned off (``torch._tensor_str``), so a print of pinned memory a non-blocking D2H may
    still be filling (``print(loss.to("cpu", non_blocking=True))`` without a synchronize: a log line of stale
    values) is checked here, as the host's read of the tensor, at the program's line that printed it (past torch's
    frames, ``f"{t}"``'s ``__format__``, and a logger's), with no host step, as for ``tolist``; outside a run's
    actors nothing is checked. A simulated tensor's own text copies it to the host first (``SimTensor.__repr__``)."""

    @functools.wraps(original)
    def __repr__(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:  # noqa: N807 (the method it stands for)
        if _ACTIVE and not isinstance(self, SimTensor):
            line = _printing_line()
            if line is not None:
                _ACTIVE[-1].runtime.unseen_host_read(self, "print", line)
        return original(self, *args, **kwargs)

    return __repr__


def _tensor_numpy(original: Callable[..., Any]) -> Callable[..., Any]:
    """``t.numpy()`` of pinned memory of the run: a NumPy view whose element reads and writes are checked as the
    host's (:mod:`simdevice.dropin.arrays`), where NumPy reaches the bytes without the dispatcher. Other tensors'
    arrays are NumPy's own."""

    @functools.wraps(original)
    def numpy(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        array = original(self, *args, **kwargs)
        if (_ACTIVE and not isinstance(self, SimTensor) and isinstance(array, np.ndarray)
                and _ACTIVE[-1].runtime.lookup_host(self) is not None):
            return arrays.checked(array, self, _array_access)
        return array

    return numpy


def _array_access(pinned: torch.Tensor, reads: list[torch.Tensor], writes: list[torch.Tensor], op: str) -> None:
    """A NumPy view's access of pinned memory: checked in the session's run, where its bytes are pinned memory of
    the run (also a view an earlier run made of pinned memory the program kept); outside a run, NumPy's own."""
    if _ACTIVE:
        _ACTIVE[-1].runtime.unseen_host_access(pinned, reads, writes, f"numpy {op}", user_source())


def _host_reads_storage(storage: Any) -> None:
    """The host writes ``storage``'s bytes out in C++, below the dispatcher (``torch.save``; ``pickle`` of a tensor
    runs it too): where it is pinned memory of this run, the read is checked now as the host's read of every byte of
    it (torch writes the whole storage, also where a view of it is saved), within the actor's last step (a GPU run
    counts none there either). So an asynchronous checkpoint saved before the non-blocking D2H into its pinned
    snapshot is done is a race (before, no op read the snapshot and the run was clean, or, the values read back,
    wrong with no race to name)."""
    if not _ACTIVE or not isinstance(storage, torch.UntypedStorage) or storage.device.type != "cpu":
        return
    with torch._C._DisableTorchDispatch():  # (made here, not an operation of the program's)
        whole = torch.empty(0, dtype=torch.uint8, device="cpu").set_(storage)
    _ACTIVE[-1].runtime.unseen_host_read(whole, "torch.save", user_source())


def _storage_shared(original: Callable[..., Any]) -> Callable[..., Any]:
    """``share_memory_`` of host memory in a run (``t.share_memory_()``, and torch's own as it sends a host tensor to
    another process): the storage, now in shared memory, is tracked from then on (``Runtime.register_shared``), so
    that one process's host reading it while another's writes it, with nothing ordering them (a queue's message, an
    event), is a race, as an access of pinned memory is."""

    @functools.wraps(original)
    def share_memory_(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        if in_actor() and isinstance(self, torch.UntypedStorage) and self.device.type == "cpu" and self.nbytes():
            rt = session_device().runtime
            rt.register_shared(self, rt.current().process)
        return out

    return share_memory_


def _storage_copy(original: Callable[..., Any]) -> Callable[..., Any]:
    """``copy_`` of a host storage from a simulated device's (``pinned.untyped_storage().copy_(
    p.untyped_storage(), non_blocking=True)``, an offload's D2H by storage), which torch's C method refuses (the
    simulated storage is no ``torch.Storage``): as torch copies storages, a ``copy_`` between byte tensors over
    the two (:func:`~simdevice.dispatch.storage_copy`). Between host storages, torch's own."""

    @functools.wraps(original)
    def copy_(self: Any, src: Any, non_blocking: bool = False) -> Any:
        if isinstance(src, (SimStorage, SimTypedStorage)):
            storage_copy(self, src, non_blocking)
            return self
        return original(self, src, non_blocking)

    return copy_


def _file_writer_record(original: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.save``'s zip writer writing a record: a storage's bytes, read by the host
    (:func:`_host_reads_storage`)."""

    @functools.wraps(original)
    def write_record(self: Any, name: Any, data: Any, *args: Any, **kwargs: Any) -> Any:
        _host_reads_storage(data)
        return original(self, name, data, *args, **kwargs)

    return write_record


def _own_graph_task(original: Callable[[], int]) -> Callable[[], int]:
    """``torch._C._current_graph_task_id()``: the running actor's own graph task. Greenlet actors share the thread,
    where autograd keeps the graph task of a backward another actor is suspended in (FSDP2's ``is_bw()`` read it
    in a rank's forward and skipped the reshard after it: the ranks' collectives then differed)."""

    @functools.wraps(original)
    def current() -> int:
        task = original()
        if task == -1 or not _ACTIVE:
            return task
        return _ACTIVE[-1].runtime.execution.graph_task(task)  # type: ignore[no-any-return]

    return current


def _group_by_shown_device(original: Callable[..., Any]) -> Callable[..., Any]:
    """``torch._C._group_tensors_by_device_and_dtype``, which the foreach and fused paths of the optimizers and of
    ``clip_grad_norm_`` / ``clip_grad_value_`` group their tensors with: C++ keys a simulated tensor by its ``meta``
    shell, so each group is keyed here by the device its tensors show (``cuda:0``), as on a GPU. Keyed ``meta``,
    ``clip_grad_norm_(foreach=True)`` raised "can't use the foreach API on meta tensors", and without ``foreach``
    it took the per-tensor path, other ops than a GPU's (a replay's counts differed)."""

    @functools.wraps(original)
    def group(tensorlistlist: Any, with_indices: bool = False) -> Any:
        grouped = original(tensorlistlist, with_indices)
        if not any(device == META for device, _ in grouped):
            return grouped
        keyed = {}
        for (device, dtype), value in grouped.items():
            first = value[0][0][0]  # (the first list's tensors are never None, as torch requires)
            keyed[first.device if device == META and isinstance(first, SimTensor) else device, dtype] = value
        return keyed

    return group


def _foreach_takes_simulated_tensors(p: Patches) -> None:
    """A simulated tensor is of a type torch's foreach paths take, as ``torch.Tensor`` and ``Parameter`` are (and
    DTensor, which adds itself to the same lists): the optimizers' default (``foreach=None``) and
    ``clip_grad_norm_``'s ask ``type(t) in _foreach_supported_types``, and took the per-tensor path for a simulated
    tensor where a GPU runs the ``_foreach_`` kernels (other ops, other counts for a replay)."""
    for supported in (torch_optimizer._foreach_supported_types, torch_foreach_utils._foreach_supported_types):
        if SimTensor not in supported:
            supported.append(SimTensor)
            p.on_restore(functools.partial(supported.remove, SimTensor))


def _storage_write_file(original: Callable[..., Any]) -> Callable[..., Any]:
    """``storage._write_file``: the legacy format's write of a storage's bytes (``pickle`` of a tensor), read by the
    host (:func:`_host_reads_storage`)."""

    @functools.wraps(original)
    def _write_file(self: Any, *args: Any, **kwargs: Any) -> Any:
        _host_reads_storage(self)
        return original(self, *args, **kwargs)

    return _write_file


#: the attribute ``torch.load`` leaves on a host storage it was asked to put on the device (its device), and the one
#: holding that storage's bytes on the simulated device once a tensor of it is rebuilt
_LOAD_TO, _LOADED = "_simdevice_load_to", "_simdevice_loaded"


def _restore_location(original: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.serialization.default_restore_location``: a storage ``torch.load`` puts on the device (a checkpoint
    saved from a GPU, or ``map_location="cuda"``, a device or a dict naming one) stays the host storage torch read,
    marked for the device (validated as torch validates it: the simulated device count); the tensors rebuilt on it
    are the simulated device's (:func:`_rebuild_tensor`). torch's own would copy the storage with
    ``UntypedStorage.cuda()``, which the CPU build refuses: a correct program's load failed in the run."""

    @functools.wraps(original)
    def default_restore_location(storage: Any, location: str) -> Any:
        if in_actor() and isinstance(storage, torch.UntypedStorage) and str(location).startswith("cuda"):
            device = torch.serialization._validate_device(str(location), "cuda")
            setattr(storage, _LOAD_TO, device)
            return storage
        return original(storage, location)

    return default_restore_location


#: whether ``torch.load`` is calling the program's own ``map_location`` (a function of the storage and its location)
_IN_MAP_LOCATION: list[bool] = []


def _get_restore_location(original: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.serialization._get_restore_location``: a ``map_location`` function of the program's is called with
    :data:`_IN_MAP_LOCATION` set, so that its ``storage.cuda()`` marks the host storage for the device
    (:func:`_storage_cuda`), as :func:`_restore_location` does for a named device."""

    @functools.wraps(original)
    def get(map_location: Any) -> Any:
        restore = original(map_location)
        if not callable(map_location) or isinstance(map_location, (dict, str, bytes)):
            return restore

        def restore_location(storage: Any, location: str) -> Any:
            _IN_MAP_LOCATION.append(True)
            try:
                return restore(storage, location)
            finally:
                _IN_MAP_LOCATION.pop()

        return restore_location

    return get


def _storage_cuda(original: Callable[..., Any]) -> Callable[..., Any]:
    """``UntypedStorage.cuda()`` of a host storage in a ``map_location`` function that ``torch.load`` calls in a run
    (``map_location=lambda storage, loc: storage.cuda()``, an older idiom): the storage marked for the device, as
    :func:`_restore_location` marks it (the CPU build's copy raised "Storage device not recognized: cuda")."""

    @functools.wraps(original)
    def cuda(self: Any, device: Any = None, non_blocking: bool = False) -> Any:
        if _IN_MAP_LOCATION and in_actor() and isinstance(self, torch.UntypedStorage) and self.device.type == "cpu":
            location = "cuda" if device is None else str(torch.device("cuda", device) if isinstance(device, int)
                                                         else device)
            setattr(self, _LOAD_TO, torch.serialization._validate_device(location, "cuda"))
            return self
        return original(self, device, non_blocking)

    return cuda


def _rebuild_tensor(original: Callable[..., Any]) -> Callable[..., Any]:
    """``torch._utils._rebuild_tensor`` (what ``torch.load`` rebuilds each dense tensor with): on a storage marked
    for the device (:func:`_restore_location`), a view of the storage's bytes copied once to the simulated device
    (synchronously, from pageable memory, as ``UntypedStorage.cuda()`` copies it), so the tensors that shared a
    storage in the checkpoint share one on the device too."""

    @functools.wraps(original)
    def rebuild(storage: Any, storage_offset: int, size: Any, stride: Any) -> Any:
        untyped = getattr(storage, "_untyped_storage", None)
        device = getattr(untyped, _LOAD_TO, None) if untyped is not None else None
        if device is None or not in_actor():
            return original(storage, storage_offset, size, stride)
        loaded = getattr(untyped, _LOADED, None)
        if loaded is None:
            host = torch.empty(0, dtype=torch.uint8).set_(untyped)
            loaded = host.to(device)
            setattr(untyped, _LOADED, loaded)
        return loaded.view(storage.dtype).as_strided(size, stride, storage_offset)

    return rebuild


_LAZY = torch.nn.parameter.UninitializedTensorMixin


def _lazy_to_device(original: Callable[..., Any], t: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """An uninitialized parameter or buffer of a lazy module moved to the simulated device (``LazyLinear(4).cuda()``
    before its first forward): its empty placeholder is copied to the device (an operation, as torch's ``to`` of it
    is on a GPU), and it stays uninitialized, the same object, marked to be made on the device when its module first
    infers its shape (:func:`_lazy_materialize`), as on a GPU, where torch makes the parameter on its placeholder's
    device."""
    dtype = kwargs.get("dtype", next((a for a in args if isinstance(a, torch.dtype)), None))
    if dtype is not None and dtype != t.dtype:
        raise NotImplementedError("a lazy module's uninitialized parameter converted to another dtype as it moves to "
                                  "the simulated device is not simulated: move it, then convert it after its first "
                                  "forward")
    with torch._C.DisableTorchFunctionSubclass():
        placeholder = t.data  # (a plain tensor over its bytes: none)
    original(placeholder, *args, **kwargs)
    t._simdevice_on_device = True
    return t


def _lazy_materialize(original: Callable[..., Any]) -> Callable[..., Any]:
    """``UninitializedParameter.materialize`` (a lazy module's first forward) of one moved to the simulated device:
    made there, a device tensor (a ``Parameter`` where the placeholder was one), the same object, as torch's own
    makes it on the placeholder's device; the module's initialization then runs on it."""

    @functools.wraps(original)
    def materialize(self: Any, shape: Any, device: Any = None, dtype: Any = None) -> None:
        if device is not None or not getattr(self, "_simdevice_on_device", False) or not in_actor():
            original(self, shape, device, dtype)
            return
        dtype = dtype if dtype is not None else self.dtype
        made = torch.empty(shape, device=_meta(), dtype=dtype)
        if self.cls_to_become is torch.nn.Parameter:
            made = torch.nn.Parameter(made, requires_grad=self.requires_grad)
        del self._simdevice_on_device
        self.__class__ = self.cls_to_become
        move_in_place(self, made)

    return materialize


def _tensor_cuda(to: Callable[..., Any]) -> Callable[..., Any]:
    def cuda(self: torch.Tensor, device: Any = None, non_blocking: bool = False, **kwargs: Any) -> Any:
        _check(device)  # (an index past the device count raises, as CUDA's invalid device ordinal)
        return to(self, _meta(), non_blocking=non_blocking, **kwargs)

    return cuda


def _given_aliases(fn: Callable[..., Any], hosts: dict[int, torch.Tensor]) -> Callable[..., Any]:
    """``fn`` called with an alias of each host tensor of ``hosts`` (a tensor object of its own on the same bytes,
    of its class, with its ``requires_grad``) in its place: an asynchronous copy ``fn`` issues (``non_blocking``
    from pinned memory) holds what it reads until it runs, and the parameter object itself will have become a
    device tensor by then (:func:`~simdevice.dispatch.move_in_place`). Where ``fn`` gives the alias back (nothing
    to convert) it gives the tensor itself, as torch's would. A tensor given again (a parameter under two names of
    one module) gets what it got the first time, as on a GPU, where it is the converted tensor by then."""
    made: dict[int, Any] = {}

    def given(t: Any) -> Any:
        host = hosts.get(id(t))
        if host is None or host is not t:
            return fn(t)
        if id(host) in made:
            return made[id(host)]
        with no_dispatch():  # (a view of no simulated tensor: no operation of the program's)
            alias = host.detach()
            alias = torch.nn.Parameter(alias, host.requires_grad) if type(host) is torch.nn.Parameter else (
                alias.requires_grad_(host.requires_grad))
        out = fn(alias)
        made[id(host)] = out = host if out is alias else out
        return out

    return given


def _module_apply(original: Callable[..., Any]) -> Callable[..., Any]:
    """``Module._apply`` (what ``module.to``, ``.cuda()``, ``.cpu()``, ``.half()`` and ``to_empty`` call) that keeps
    each parameter object, and its ``grad``'s, where the conversion moved it between the host and the device, as
    torch keeps them on a GPU: there a CPU and a CUDA tensor are of compatible shallow-copy types, so ``_apply``
    sets ``param.data`` (and ``param.grad.data``); here a host tensor and a simulated one are not, and torch would
    make new ``Parameter`` objects, which an optimizer made before the move (or kept across an offload's round
    trip) no longer holds. Torch's own ``_apply`` converts (its copies are the program's operations); this puts
    the old objects back, moved in place (:func:`~simdevice.dispatch.move_in_place`). Buffers are torch's: it
    makes new buffer tensors on a GPU too. With ``torch.__future__``'s overwrite flag set, torch's new objects
    stand, as on a GPU."""

    @functools.wraps(original)
    def _apply(self: torch.nn.Module, fn: Callable[..., Any], recurse: bool = True) -> Any:
        before = [(key, p, p.grad) for key, p in self._parameters.items() if p is not None]
        hosts = {id(t): t for _, p, g in before for t in (p, g)
                 if type(t) in (torch.Tensor, torch.nn.Parameter) and t.device.type == "cpu"}
        out = original(self, _given_aliases(fn, hosts) if hosts else fn, recurse)
        if torch.__future__.get_overwrite_module_params_on_conversion():
            return out
        moved: set[int] = set()
        for key, old, old_grad in before:
            new = self._parameters.get(key)
            if new is None or new is old:
                continue
            if id(old) in moved:  # (under a second name: moved under the first)
                self._parameters[key] = old
                continue
            if not crosses_devices(old, new):
                continue
            moved.add(id(old))
            new_grad = new.grad
            if old_grad is not None:
                old.grad = None
            if new_grad is not None:
                new.grad = None
            move_in_place(old, new)
            if old_grad is not None and new_grad is not None and crosses_devices(old_grad, new_grad):
                move_in_place(old_grad, new_grad)  # (``param.grad.data = ...`` on a GPU: the grad object stays)
                old.grad = old_grad
            else:
                old.grad = new_grad
            self._parameters[key] = old
        return out

    return _apply


def _tensor_new(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def new(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if on_device(kwargs.get("device")):
            kwargs["device"] = _meta()
        return original(self, *args, **kwargs)

    return new


_FACTORIES = (
    "arange", "empty", "empty_like", "empty_permuted", "empty_strided", "eye", "full", "full_like", "linspace",
    "logspace", "normal", "ones", "ones_like", "rand", "rand_like", "randint", "randint_like", "randn",
    "randn_like", "randperm", "range", "scalar_tensor", "tril_indices", "triu_indices", "zeros", "zeros_like",
    "bartlett_window", "blackman_window", "hamming_window", "hann_window", "kaiser_window",
)


class _CudaTensorType:
    """``torch.cuda.FloatTensor`` and its kin, torch's legacy tensor types of the device, which the CPU build cannot
    make (``TypeError: type torch.cuda.FloatTensor not available``: a host error blamed on the program) nor
    recognize (``isinstance(t, torch.cuda.FloatTensor)`` of a device tensor was False). Called, as torch's
    legacy constructor (``legacy_tensor_generic_ctor_new``, torch/csrc/utils/tensor_new.cpp): sizes (ints, a
    ``torch.Size``) make an uninitialized tensor of them, a tensor of this type an alias of it, anything else is
    data, copied to the device as ``torch.tensor`` copies it there; ``isinstance`` asks for a dense device tensor
    of this dtype."""

    is_cuda = True
    is_sparse = False

    def __init__(self, name: str, dtype: torch.dtype) -> None:
        self.__name__ = self.__qualname__ = name
        self.__module__ = "torch.cuda"
        self.dtype = dtype

    def __repr__(self) -> str:
        return f"<class 'torch.cuda.{self.__name__}'>"

    def __instancecheck__(self, obj: Any) -> bool:
        return (isinstance(obj, torch.Tensor) and obj.is_cuda and obj.dtype == self.dtype
                and obj.layout == torch.strided)

    def __call__(self, *args: Any, device: Any = None) -> Any:
        if device is not None and not on_device(device):
            raise RuntimeError(f"legacy constructor expects device type: cuda but device type: "
                               f"{torch.device(device).type} was passed")
        if not args:
            return torch.empty(0, dtype=self.dtype, device="cuda")
        if len(args) == 1 and isinstance(args[0], torch.Tensor):
            if not self.__instancecheck__(args[0]):
                raise TypeError(f"expected {self.__module__}.{self.__name__} (got {args[0].type()})")
            return torch.ops.aten.alias.default(args[0])
        if isinstance(args[0], (torch.UntypedStorage, torch.TypedStorage)):
            raise NotImplementedError(f"torch.cuda.{self.__name__}(storage) is not simulated: make the tensor from "
                                      "sizes or data")
        if len(args) == 1 and isinstance(args[0], torch.Size):
            return torch.empty(args[0], dtype=self.dtype, device="cuda")
        if all(isinstance(a, int) and not isinstance(a, bool) for a in args):
            return torch.empty(args, dtype=self.dtype, device="cuda")
        if len(args) > 1:
            raise TypeError(f"{self.__name__}() takes sizes (ints), a torch.Size, a tensor or data, not "
                            f"{', '.join(type(a).__name__ for a in args)}")
        return torch.tensor(args[0], dtype=self.dtype, device="cuda")


#: ``torch.cuda``'s legacy tensor types, by name (``FloatTensor``), as the session puts them in place
_CUDA_TENSOR_TYPES = {name: _CudaTensorType(name, value.dtype) for name, value in vars(torch.cuda).items()
                      if type(value) is type(torch.FloatTensor)}


def _cuda_tensor_type(t: Any) -> torch.dtype | None:
    """The dtype a legacy device tensor type names (``torch.cuda.HalfTensor``, as the class or its name), else
    None."""
    if isinstance(t, _CudaTensorType):
        return t.dtype
    if isinstance(t, str) and t.startswith("torch.cuda."):
        name = t.removeprefix("torch.cuda.")
        if name.startswith("sparse."):
            raise NotImplementedError(f"{t}: a sparse tensor on the simulated device is not simulated (its tensors "
                                      "are dense)")
        if name not in _CUDA_TENSOR_TYPES:
            raise ValueError(f"invalid type: {t!r}")
        return _CUDA_TENSOR_TYPES[name].dtype
    return None


def _tensor_type(original: Callable[..., Any]) -> Callable[..., Any]:
    """``t.type(torch.cuda.FloatTensor)`` (or its name): ``t`` moved to the device in that dtype, as torch's
    ``dispatch_to`` (``t`` itself where it is one already); other types, and ``t.type()``, torch's own."""

    @functools.wraps(original)
    def type_(self: torch.Tensor, dtype: Any = None, non_blocking: bool = False, **kwargs: Any) -> Any:
        target = _cuda_tensor_type(dtype)
        if target is None:
            return original(self, dtype, non_blocking, **kwargs)
        if isinstance(self, SimTensor) and self.dtype == target and self.layout == torch.strided:
            return self
        return self.to(device="cuda", dtype=target, non_blocking=non_blocking, **kwargs)

    return type_


def _set_default_tensor_type(original: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.set_default_tensor_type(torch.cuda.FloatTensor)`` (deprecated by torch, still found in older code):
    factories that name no device make their tensors on the simulated one, in that dtype, as
    ``torch.set_default_device("cuda")`` with ``set_default_dtype`` does; a host type afterwards puts the host
    back."""

    @functools.wraps(original)
    def set_type(t: Any) -> None:
        target = _cuda_tensor_type(t)
        if target is None:
            if _context_on_device():
                torch.set_default_device(None)
            original(t)
            return
        torch.set_default_dtype(target)
        torch.set_default_device("cuda")

    return set_type


_FROM_DATA = ("tensor", "as_tensor", "asarray")
_NEW = ("new_empty", "new_empty_strided", "new_full", "new_ones", "new_zeros")


def install(p: Patches) -> None:
    """Put the façade in place (``p.restore()`` takes it away)."""
    cuda = torch.cuda
    _forget_context_factories()
    p.on_restore(_forget_context_factories)
    table: dict[str, Any] = {
        "_lazy_init": lambda: None,  # torch's factories call it before dispatch; the simulated device needs none
        "init": lambda: None,
        "is_available": lambda: True,
        "is_initialized": lambda: True,
        "device_count": device_count,
        "current_device": current_device,
        "set_device": set_device,
        "get_device_name": lambda device=None: _properties(device).name,
        "get_device_properties": _properties,
        "get_device_capability": _capability,
        "Stream": Stream,
        "Event": Event,
        "stream": stream,
        "StreamContext": StreamContext,
        "current_stream": current_stream,
        "default_stream": default_stream,
        "set_stream": set_stream,
        "synchronize": synchronize,
        "empty_cache": empty_cache,
        "memory_allocated": memory_allocated,
        "max_memory_allocated": max_memory_allocated,
        "memory_reserved": memory_reserved,
        "max_memory_reserved": max_memory_reserved,
        "reset_peak_memory_stats": reset_peak_memory_stats,
        "reset_max_memory_allocated": reset_peak_memory_stats,
        "reset_max_memory_cached": reset_peak_memory_stats,
        "mem_get_info": mem_get_info,
        "set_per_process_memory_fraction": set_per_process_memory_fraction,
        "get_per_process_memory_fraction": get_per_process_memory_fraction,
        "memory_stats": memory_stats,
        "memory_summary": memory_summary,
        "memory_snapshot": memory_snapshot,
        "get_allocator_backend": lambda: "native",  # the simulated allocator is CUDA's caching one
        "memory_cached": memory_reserved,  # (torch's deprecated names for these two)
        "max_memory_cached": max_memory_reserved,
        "ipc_collect": lambda: None,  # no process holds this device's memory through an IPC handle to let go of
        "manual_seed": manual_seed,
        "manual_seed_all": manual_seed,
        "get_rng_state": get_rng_state,
        "set_rng_state": set_rng_state,
        "get_rng_state_all": lambda: [get_rng_state()],
        "set_rng_state_all": set_rng_state_all,
        "initial_seed": lambda: session_device().runtime.initial_seed,
        # torch reads the flag itself where it asks whether CUDA is in use (torch.utils.checkpoint keeps the device
        # generator's state for a recomputation only then)
        "_initialized": True,
        "seed": lambda: None,
        "seed_all": lambda: None,
        "device": _DeviceContext,
        "device_of": _DeviceOf,
        "is_current_stream_capturing": is_current_stream_capturing,
        "graph": graph,
        "CUDAGraph": CUDAGraph,
        "graph_pool_handle": graph_pool_handle,
        "caching_allocator_alloc": _no_raw_allocations,
        "caching_allocator_delete": _no_raw_allocations,
        "ExternalStream": _NO_EXTERNAL_STREAM,
        "MemPool": MemPool,
        "use_mem_pool": use_mem_pool,
        "cudart": _cudart,
        "_sleep": _sleep,
        "default_generators": _Generators(_DeviceGenerator()),  # (made per session: registered while it lives)
        "set_sync_debug_mode": set_sync_debug_mode,
        "get_sync_debug_mode": get_sync_debug_mode,
    }
    table.update({name: _sensor(name) for name in _SENSORS if hasattr(cuda, name)})
    for name, value in table.items():
        p.set(cuda, name, value)
    # where torch.cuda's memory, graph and stream names are defined: code that calls them there
    # (``torch.cuda.memory.memory_stats``, ``torch.cuda.graphs.is_current_stream_capturing``,
    # ``torch.cuda.streams.Stream()``, ``isinstance(s, torch.cuda.streams.Stream)``), and torch's own aliases that
    # call them by their module's names, get the simulated device's too
    for module in (torch.cuda.memory, torch.cuda.graphs, torch.cuda.streams, torch.cuda.random):
        for name, value in table.items():
            if callable(getattr(module, name, None)):
                p.set(module, name, value)
    for name in ("range_push", "range_pop", "mark", "range", "range_start", "range_end"):
        p.set(cuda.nvtx, name, getattr(_nvtx, name))
    for name in ("start", "stop", "init"):
        p.set(cuda.profiler, name, getattr(_profiler, name))
    p.set(cuda.nccl, "version", _nccl_version)
    p.set(torch.version, "cuda", CUDA_VERSION)
    p.set(cuda, "get_arch_list", lambda: list(CUDA_ARCHES))
    _install_accelerator(p)
    _install_wrapper_subclasses(p)
    for name in _FACTORIES:
        if hasattr(torch, name):
            p.set(torch, name, _wrapped(torch, name, _factory))
    for name in _FROM_DATA:
        if hasattr(torch, name):
            p.set(torch, name, _wrapped(torch, name, _from_data))
    to = _wrapped(torch.Tensor, "to", _tensor_to)
    p.set(torch.Tensor, "to", to)
    p.set(torch.Tensor, "cuda", _tensor_cuda(to))
    p.set(_LAZY, "materialize", _wrapped(_LAZY, "materialize", _lazy_materialize))
    p.set(torch.nn.Module, "_apply", _wrapped(torch.nn.Module, "_apply", _module_apply))
    p.set(torch.Tensor, "tolist", _wrapped(torch.Tensor, "tolist", _tensor_tolist))
    p.set(torch.Tensor, "__repr__", _wrapped(torch.Tensor, "__repr__", _tensor_repr))
    p.set(torch.Tensor, "numpy", _wrapped(torch.Tensor, "numpy", _tensor_numpy))
    p.set(torch._C.PyTorchFileWriter, "write_record",
          _wrapped(torch._C.PyTorchFileWriter, "write_record", _file_writer_record))
    p.set(torch.UntypedStorage, "_write_file", _wrapped(torch.UntypedStorage, "_write_file", _storage_write_file))
    p.set(torch.serialization, "default_restore_location",
          _wrapped(torch.serialization, "default_restore_location", _restore_location))
    p.set(torch._utils, "_rebuild_tensor", _wrapped(torch._utils, "_rebuild_tensor", _rebuild_tensor))
    p.set(torch.serialization, "_get_restore_location",
          _wrapped(torch.serialization, "_get_restore_location", _get_restore_location))
    p.set(torch.UntypedStorage, "cuda", _wrapped(torch.UntypedStorage, "cuda", _storage_cuda))
    p.set(torch.UntypedStorage, "share_memory_", _wrapped(torch.UntypedStorage, "share_memory_", _storage_shared))
    p.set(torch.UntypedStorage, "copy_", _wrapped(torch.UntypedStorage, "copy_", _storage_copy))
    p.set(torch._C, "_group_tensors_by_device_and_dtype",
          _wrapped(torch._C, "_group_tensors_by_device_and_dtype", _group_by_shown_device))
    # (absent from the CPU build: set for the session, taken away after it)
    p.set(torch._C, "_current_graph_task_id", _wrapped(torch._C, "_current_graph_task_id", _own_graph_task))
    p.set(torch._C, "_cuda_record_memory_history", _record_memory_history)
    p.set(torch._C, "_cuda_record_memory_history_legacy", _record_memory_history_legacy)
    p.set(torch._C, "_cuda_memorySnapshot", _memory_snapshot)
    _foreach_takes_simulated_tensors(p)
    for name in _NEW:
        p.set(torch.Tensor, name, _wrapped(torch.Tensor, name, _tensor_new))
    p.set(torch.Tensor, "new_tensor", _wrapped(torch.Tensor, "new_tensor", _tensor_new_tensor))
    p.set(torch.Tensor, "new", _wrapped(torch.Tensor, "new", _tensor_legacy_new))
    for name, kind in _CUDA_TENSOR_TYPES.items():
        p.set(cuda, name, kind)
    p.set(torch.Tensor, "type", _wrapped(torch.Tensor, "type", _tensor_type))
    p.set(torch.Tensor, "data", _HOST_DATA)
    p.set(torch.Tensor, "grad", CROSS_SIDE_GRAD)
    p.set(torch, "device", _Device)
    pin_utils = sys.modules.get("torch.cuda._pin_memory_utils")  # (imported with torch.distributed.checkpoint)
    if pin_utils is not None:
        p.set(pin_utils, "unpin_memory", _unpin_memory(pin_utils.unpin_memory))
    p.set(torch, "Generator", _Generator)
    _pickled_devices(p)
    p.set(torch._C._nn, "_parse_to", _wrapped(torch._C._nn, "_parse_to", _parse_to))
    p.set(torch, "set_default_tensor_type", _wrapped(torch, "set_default_tensor_type", _set_default_tensor_type))
    p.set(time, "sleep", _host_sleep)
    p.set(np.random, "default_rng", _wrapped(np.random, "default_rng", _default_rng))
    p.set(torch.nn.functional, "dropout", _wrapped(torch.nn.functional, "dropout", _functional_dropout))
    p.set(torch, "dropout", _wrapped(torch, "dropout", _torch_dropout))
    for name, clock in _VIRTUAL_CLOCKS.items():
        p.set(time, name, clock)
    p.set(torch.autograd, "_engine_run_backward", _wrapped(torch.autograd, "_engine_run_backward", _engine_entry))
    kernels = autocast.Kernels()
    p.set(torch, "set_autocast_enabled", autocast.set_enabled(torch.set_autocast_enabled, kernels))
    p.set(torch, "clear_autocast_cache", autocast.clear(torch.clear_autocast_cache))
    p.on_restore(kernels.remove)
    _eager_compiled(p)
    p.set(torch, "compile", _compile(torch.compile, p))  # (made for this session's patches, not kept)
    for name in ("export", "draft_export"):
        p.set(torch.export, name, _wrapped(torch.export, name, _export_refused))


def _export_refused(original: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.export.export`` (and ``draft_export``) of a module or inputs on the simulated device, in a run: refused
    (``NotImplementedError``, no verdict). Its tracing makes fake CUDA tensors whose device guard the CPU build does
    not have: the process aborted in C++ (``getDeviceGuardImpl``), with no report. On the host it is torch's."""

    @functools.wraps(original)
    def export(mod: Any, args: Any = (), kwargs: Any = None, *rest: Any, **options: Any) -> Any:
        if in_actor():
            held = [*torch.utils._pytree.tree_leaves((args, kwargs))]
            if isinstance(mod, torch.nn.Module):
                held += [*mod.parameters(), *mod.buffers()]
            if any(isinstance(t, SimTensor) for t in held):
                raise NotImplementedError(f"torch.export.{original.__name__} of the simulated device's tensors is "
                                          "not simulated (its tracing makes CUDA tensors of its own): export the "
                                          "module on the host, or outside the run")
        return original(mod, args, kwargs, *rest, **options)

    return export


class _DeviceIndex:
    """``torch.accelerator.device_index(i)``: the one simulated device current in the block (an index past
    ``device_count()`` raises CUDA's invalid device ordinal; None: no change)."""

    def __init__(self, device: int | None, /) -> None:
        self.idx = device

    def __enter__(self) -> None:
        if self.idx is not None:
            _check_or_current(self.idx)

    def __exit__(self, *exc: object) -> None:
        pass


#: ``torch.Tensor._make_wrapper_subclass`` as torch defines it
_MAKE_WRAPPER = torch._C.TensorBase._make_wrapper_subclass
#: the C++ side's answer to ``t.device`` (and to ``is_cuda``, ``is_meta``, ``get_device()``) of any tensor
_CXX_DEVICE = torch._C.TensorBase.device


def _shown_device(t: torch.Tensor) -> torch.device:
    """``t.device`` of an instance of a program's tensor subclass this session showed
    (:func:`_install_wrapper_subclasses`): the device it was made for, where it was made for the simulated one;
    else torch's."""
    shown = t.__dict__.get("_simdevice_shown") if hasattr(t, "__dict__") else None
    return shown if shown is not None else _CXX_DEVICE.__get__(t)


def _shown_index(t: torch.Tensor) -> int:
    """``t.get_device()`` of such an instance: -1 on the host or meta device, else the device's index."""
    device = _shown_device(t)
    return -1 if device.type in ("cpu", "meta") else device.index or 0


def _install_wrapper_subclasses(p: Patches) -> None:
    """A program's or a library's wrapper tensor subclass made for the simulated device
    (``torch.Tensor._make_wrapper_subclass(cls, ..., device=inner.device)``, as torchao's quantized tensors,
    ``torch.nested``'s jagged tensors or a float8 training tensor make theirs over the device tensors they hold) is
    made on the meta device, as a simulated tensor is, and shows the device it was made for: ``t.device``,
    ``is_cuda``, ``is_meta`` and ``get_device()`` of its class answer so for the session. Made on a CUDA device,
    torch's C++ side would ask a CPU build for CUDA's device guard where autograd runs the tensor's backward: the
    process aborts ("PyTorch is not linked with support for cuda devices"). Its ops reach its own
    ``__torch_dispatch__`` first (the simulator's mode declines them) and those it makes on the tensors it wraps
    are simulated."""
    shown: set[type] = set()
    p.on_restore(shown.clear)

    def show(cls: type) -> None:
        shown.add(cls)
        answers = {
            "device": property(_shown_device),
            "is_cuda": property(lambda t: _shown_device(t).type == "cuda"),
            "is_meta": property(lambda t: _shown_device(t).type == "meta"),
            "get_device": _shown_index,
        }
        for name, answer in answers.items():
            if name not in vars(cls):  # (a class that answers itself keeps its answer)
                p.set(cls, name, answer)

    def make_wrapper_subclass(cls: Any, size: Any, *args: Any, **kwargs: Any) -> Any:
        device = kwargs.get("device")
        if device is None or cls is SimTensor or torch.device(device).type != "cuda":
            return _MAKE_WRAPPER(cls, size, *args, **kwargs)
        kwargs["device"] = META
        made = _MAKE_WRAPPER(cls, size, *args, **kwargs)
        made._simdevice_shown = torch.device(device)
        if cls not in shown:
            show(cls)
        return made

    p.set(torch.Tensor, "_make_wrapper_subclass", staticmethod(make_wrapper_subclass))


def _install_accelerator(p: Patches) -> None:
    """``torch.accelerator`` and the device-generic ``torch.Stream`` and ``torch.Event``: the simulated CUDA device is
    the accelerator (device-agnostic code, and torch's own ``DataLoader(pin_memory=True)``, which pins its batches
    only where it finds one), and each call is ``torch.cuda``'s simulated one."""
    acc = torch.accelerator
    table: dict[str, Any] = {
        "is_available": lambda: True,
        "current_accelerator": lambda check_available=False: torch.device("cuda"),
        "device_count": device_count,
        "current_device_index": current_device,
        "current_device_idx": current_device,
        "set_device_index": set_device,
        "set_device_idx": set_device,
        "device_index": _DeviceIndex,
        "current_stream": lambda device=None, /: current_stream(device),
        "set_stream": set_stream,
        "synchronize": lambda device=None, /: synchronize(device),
        "empty_cache": empty_cache,
        "empty_host_cache": lambda: None,  # (pinned memory is not pooled here)
        "memory_allocated": lambda device=None, /: memory_allocated(device),
        "max_memory_allocated": lambda device=None, /: max_memory_allocated(device),
        "memory_reserved": lambda device=None, /: memory_reserved(device),
        "max_memory_reserved": lambda device=None, /: max_memory_reserved(device),
        "reset_peak_memory_stats": lambda device=None, /: reset_peak_memory_stats(device),
        "memory_stats": lambda device=None, /: memory_stats(device),
        "get_memory_info": lambda device=None, /: mem_get_info(device),
        "Graph": _refused("Graph", _GRAPHS_REFUSED),
    }
    for name, value in table.items():
        if hasattr(acc, name):
            p.set(acc, name, value)
    for module in (getattr(acc, "memory", None), getattr(acc, "graphs", None)):
        for name, value in table.items():
            if module is not None and callable(getattr(module, name, None)):
                p.set(module, name, value)
    # (torch's own code asks the C++ side, which on a CPU build answers the CPU: FSDP2's default mesh,
    # ``distributed_c10d``'s default device)
    p.set(torch._C, "_get_accelerator", lambda check=False: torch.device("cuda"))
    supported = _wrapped(torch.autograd, "_supported_activities", _profiler_activities)
    p.set(torch.autograd, "_supported_activities", supported)
    p.set(torch.autograd.profiler, "_supported_activities", supported)
    p.set(torch.autograd.profiler.profile, "__init__", _wrapped(torch.autograd.profiler.profile, "__init__",
                                                                 _profile_without_cuda_events))
    p.set(torch.autograd.profiler, "emit_nvtx", _EmitNvtx)
    p.set(torch, "Stream", _GenericStream)
    p.set(torch, "Event", _GenericEvent)
    p.set(torch, "get_device_module", _device_module(torch.get_device_module))
    _pin_on_the_iterating_thread(p)


PROFILER_NOTE = ("the profiler's CUDA activity (torch.profiler, torch.autograd.profiler) records no device activity on "
                 "the simulated device (no kernel or copy events, no device times); its CPU activity is recorded, "
                 "and leaving the profiler synchronizes the device, as on a GPU")


def _profiler_activities(original: Callable[[], Any]) -> Callable[[], Any]:
    """``torch.autograd._supported_activities()`` (``torch.profiler.supported_activities()``, which the profiler asks
    before it profiles CUDA): CUDA's among them, as on a GPU machine, noted. On the CPU build the profiler fell back
    to timing each op with CUDA events, which failed with a warning and a C++ stack trace per op, and made a run
    tens of times slower."""

    @functools.wraps(original)
    def supported() -> Any:
        if in_actor():
            session_device().runtime.note(PROFILER_NOTE)
        return original() | {torch.profiler.ProfilerActivity.CUDA}

    return supported


def _profile_without_cuda_events(original: Callable[..., None]) -> Callable[..., None]:
    """``torch.autograd.profiler.profile(use_device="cuda")`` without kineto (its default, ``use_kineto=False``), in a
    run: it profiles the CPU alone, noted. torch's fallback times each op with CUDA events, which on the CPU build
    failed with a warning and a C++ stack trace per op. Leaving it still synchronizes the device, as
    ``use_device="cuda"`` asks."""

    @functools.wraps(original)
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        state = torch._C._profiler.ProfilerState
        if getattr(self, "profiler_kind", None) == state.KINETO_GPU_FALLBACK and in_actor():
            self.profiler_kind = state.KINETO
            session_device().runtime.note(PROFILER_NOTE)

    return init


class _EmitNvtx:
    """``torch.autograd.profiler.emit_nvtx(enabled=True, record_shapes=False)`` in a run: no NVTX range is emitted
    (``nvtx`` does nothing on the simulated device), and entering and leaving it synchronize the device, as torch's
    does. The CPU build refused it ("PyTorch was compiled without CUDA"): a correct program's host error."""

    def __init__(self, enabled: bool = True, record_shapes: bool = False) -> None:
        self.enabled = enabled
        self.entered = False
        self.record_shapes = record_shapes

    def __enter__(self) -> _EmitNvtx | None:
        if not self.enabled:
            return None
        if self.entered:
            raise RuntimeError("NVTX annotation context manager is not reentrant")
        self.entered = True
        synchronize()
        if in_actor():
            session_device().runtime.note(EMIT_NVTX_NOTE)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.enabled:
            synchronize()


EMIT_NVTX_NOTE = ("torch.autograd.profiler.emit_nvtx emits no NVTX range on the simulated device; entering and "
                  "leaving it synchronize the device, as on a GPU")


def _device_module(original: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.get_device_module()``: with no device, the current accelerator's module, ``torch.cuda`` (torch asks
    its C++ side, which on the CPU build answers ``torch.cpu``, whose ``synchronize`` and streams do nothing)."""

    @functools.wraps(original)
    def get_device_module(device: Any = None) -> Any:
        return torch.cuda if device is None else original(device)

    return get_device_module


def _pin_on_the_iterating_thread(p: Patches) -> None:
    """A ``DataLoader`` with worker processes and ``pin_memory=True`` pins each batch on a thread torch starts for
    itself (``pt_data_pin``), which the simulator does not run (its queue and event are Python's own): here the
    iterating thread pins each batch as it takes it from the workers, as the loader without workers pins it. Each
    batch is new pinned memory either way, handed over once pinned, so no copy of the program's sees it earlier."""
    it = torch.utils.data.dataloader._MultiProcessingDataLoaderIter
    init, process = it.__init__, it._process_data

    @functools.wraps(init)
    def init_pinning_here(self: Any, loader: Any) -> None:
        if not (loader.pin_memory and in_actor()):
            init(self, loader)
            return
        loader.pin_memory = False  # (no pinning thread started: its queue is the workers' own)
        try:
            init(self, loader)
        finally:
            loader.pin_memory = True
        self._simdevice_pin = True

    @functools.wraps(process)
    def _process_data(self: Any, data: Any, worker_idx: int) -> Any:
        data = process(self, data, worker_idx)
        if getattr(self, "_simdevice_pin", False):
            data = torch.utils.data._utils.pin_memory.pin_memory(data, "cuda")
        return data

    p.set(it, "__init__", init_pinning_here)
    p.set(it, "_process_data", _process_data)


COMPILE_NOTE = ("torch.compile ran its function eagerly on the simulated device (the same operations unfused, on the "
                "same streams, reading and writing the same tensors; a GPU runs its compiled kernels there), and "
                "replay --gpu runs it eagerly too, so that both count the same operations")


def _eager_compiled(p: Patches) -> None:
    """A function ``torch.compile`` made, called in a run, runs eagerly (Dynamo's ``force_eager`` stance: the
    original function, uncompiled), and the run notes it (:data:`COMPILE_NOTE`); also one compiled before the
    session. Where Dynamo chooses how to run the call (``_callback_from_stance``, asked by every compiled function's
    call), once Dynamo is loaded. Compiled, Dynamo would trace the simulator's own code and inductor's kernels would
    run outside the simulated device."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    if eval_frame is None or getattr(eval_frame._callback_from_stance, "_simdevice", False):
        return
    original = eval_frame._callback_from_stance

    def callback_from_stance(callback: Any) -> Any:
        chosen = original(callback)
        if chosen not in (None, False) and in_actor():
            session_device().runtime.note(COMPILE_NOTE)
            return None  # (no frame callback: the function runs as written)
        return chosen

    callback_from_stance._simdevice = True  # type: ignore[attr-defined]
    p.set(eval_frame, "_callback_from_stance", callback_from_stance)


def _compile(original: Callable[..., Any], p: Patches) -> Callable[..., Any]:
    """``torch.compile`` during a session: torch's (which loads Dynamo), with the eager run of
    :func:`_eager_compiled` in place."""

    @functools.wraps(original)
    def compile(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        _eager_compiled(p)
        return out

    return compile


#: (owner, name) -> (the original a wrapper was made for, the wrapper): made once, remade if the original changed
_WRAPPERS: dict[tuple[int, str], tuple[Any, Any]] = {}


def _wrapped(owner: Any, name: str, make: Callable[[Any], Any]) -> Any:
    original = getattr(owner, name)
    known = _WRAPPERS.get((id(owner), name))
    if known is not None and known[0] is original:
        return known[1]
    wrapper = make(original)
    _WRAPPERS[id(owner), name] = (original, wrapper)
    return wrapper


#: what a session patches, for the test that checks they come back as they were
def patched_owners() -> list[Any]:
    return [torch, torch.accelerator, torch.accelerator.memory, torch.accelerator.graphs, torch.cuda,
            torch.cuda.memory, torch.cuda.graphs, torch.cuda.streams, torch.cuda.random, torch.cuda.nvtx,
            torch.cuda.profiler, torch.cuda.nccl, torch.Tensor, torch.multiprocessing, time, torch.amp, torch.cuda.amp,
            torch.autograd, torch.autograd.profiler, torch.autograd.profiler.profile, torch._C.PyTorchFileWriter,
            torch.UntypedStorage, np.random, torch._C, torch.nn.functional,
            torch.nn.Module, torch.utils.data.dataloader._MultiProcessingDataLoaderIter, _LAZY, torch._C._nn,
            torch.version, torch.serialization, torch._utils, torch.export]
