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
import functools
import os
import sys
import time
import types
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import torch
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack
from torch.utils import _device as torch_device

from reference import contract
from reference.naming import StreamNames, creation_site, inside
from simdevice.api import EventHandle, SimDevice, StreamHandle
from simdevice.dispatch import SimTensor
from simdevice.dropin.patches import Patches
from simdevice.runtime.config import SimConfig
from simdevice.runtime.execution import outside_actor

META = torch.device("meta")
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
    """The simulated device of a torch.cuda session: tensors show ``cuda:0``; streams are named by their site."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, shown=torch.device("cuda", 0), **kwargs)
        self.device = self.shown  # type: ignore[misc]
        self._names: dict[str, StreamNames] = {}

    def _build(self) -> None:
        """A new runtime (at the start, and where the run starts again on threads): the streams' names start again
        with it, so that the run on threads names each stream as the first run did."""
        self.config = _real_sized(self.config)  # (plain torch.cuda code: its sizes are the GPU run's)
        super()._build()
        self._names = {}
        #: (receiving actor, storage id) -> the tensor a device tensor from another process was mapped as there
        #: (``processes``: CUDA IPC maps a storage once while the receiver holds it)
        self.ipc_maps: dict[tuple[str, int], Any] = {}
        #: the simulated processes by their actor's name, and each actor's children (``processes``)
        self.sim_processes: dict[str, Any] = {}
        self.sim_children: dict[str, list[Any]] = {}
        #: the actors whose default process group ``destroy_process_group`` destroyed (``distributed``)
        self.groups_destroyed: set[str] = set()

    def site_named_stream(self) -> Any:
        """A new stream of the current actor, named after the line of the program that made it."""
        rt = self.runtime
        a = rt.current()
        prefix = "" if a.name == "host" else f"{a.name}."
        names = self._names.get(a.name)
        if names is None:
            taken, actors = rt.streams, rt.execution.actors
            # (a stream's name is taken by a stream, or by an actor: a process the program started)
            names = self._names[a.name] = StreamNames(prefix, lambda full: full in taken() or full in actors)
        filename, line = creation_site(_INTERNAL)
        full = names.assign(filename, line)
        return rt.new_stream(full[len(prefix):], names.sites[full])


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


class Stream(StreamHandle):
    """``torch.cuda.Stream`` on the simulated device."""

    #: the contexts of the ``with s:`` blocks open on this handle, innermost last
    _entered: list[Any]

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> Stream:
        _check(device)
        dev = session_device()
        s = StreamHandle.__new__(cls, dev, dev.site_named_stream())
        # (kept, as CUDA keeps it, within the device's range; the simulator runs every stream's work as soon as it
        # may, so no priority changes what runs when)
        least, greatest = _PRIORITIES
        s._priority = min(least, max(greatest, int(priority)))
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
        if s is not None and any(a.default_stream is s for a in rt.execution.actors.values()):
            return 0
        return int(self.stream_id)

    @property
    def priority(self) -> int:
        return int(getattr(self, "_priority", 0))

    @property  # type: ignore[override]
    def device(self) -> torch.device:
        return session_device().shown

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


class Event(EventHandle):
    """``torch.cuda.Event`` on the simulated device."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        if interprocess:
            raise NotImplementedError("interprocess events are not simulated")
        super().__init__(session_device(), enable_timing)

    def ipc_handle(self) -> Any:
        raise NotImplementedError("interprocess events are not simulated")


class StreamContext:
    """``torch.cuda.StreamContext(s)`` (what ``torch.cuda.stream(s)`` gives): ``s`` current within each ``with``
    of it, the stream before restored after; the same object may be entered again (``None``: nothing changes)."""

    def __init__(self, stream: contract.Stream | None) -> None:
        self.stream = stream
        self._entered: list[contextlib.AbstractContextManager[Any]] = []

    def __enter__(self) -> None:
        context = _forward_on(session_device(), self.stream)
        context.__enter__()
        self._entered.append(context)

    def __exit__(self, *exc: Any) -> None:
        self._entered.pop().__exit__(*exc)


def stream(s: contract.Stream | None) -> StreamContext:
    return StreamContext(s)


@contextlib.contextmanager
def _forward_on(dev: DropInDevice, s: contract.Stream | None) -> Iterator[Any]:
    """``torch.cuda.stream(s)``: ``s`` current for the block; on a stream other than the actor's default, the
    autograd nodes the block's ops make are tagged to run their backward on ``s`` (:class:`_ForwardStream`)."""
    rt = dev.runtime
    outer = rt.current_stream()
    with dev.stream(s):
        if s is None or rt.current_stream() is rt.default_stream():
            yield s
            return
        blocks = rt.current().side_blocks
        blocks.append((rt.current_stream(), outer))
        try:
            with _ForwardStream(rt, rt.current_stream()):
                yield s
        finally:
            blocks.pop()


_TAG = "simdevice.stream"
#: a tagged node's metadata: what starts it on its stream (whichever of its hooks comes first)
_ENTER = "simdevice.enter"


class _ForwardStream(TorchFunctionMode):
    """Tags each autograd node an op makes under a side stream with that stream, and hooks it so that backward runs
    it there (``Runtime.backward_on``), as PyTorch runs each backward op on its forward op's stream. The nodes made
    by the call are those reachable from its outputs' ``grad_fn`` made after every node it was given (sequence
    numbers grow as nodes are made); ``AccumulateGrad`` is no forward op's, and runs where backward runs."""

    def __init__(self, rt: Any, s: Any) -> None:
        super().__init__()
        self.rt, self.s = rt, s

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        floor = -1
        for x in (*args, *(kwargs or {}).values()):
            for t in x if isinstance(x, (list, tuple)) else (x,):
                if isinstance(t, torch.Tensor) and t.grad_fn is not None:
                    floor = max(floor, t.grad_fn._sequence_nr())
        out = func(*args, **(kwargs or {}))
        if torch.is_grad_enabled():
            for t in out if isinstance(out, (list, tuple)) else (out,):
                if isinstance(t, torch.Tensor) and t.grad_fn is not None:
                    self._tag(t.grad_fn, floor)
                    enter = t.grad_fn.metadata.get(_ENTER)
                    if enter is not None:
                        # a hook the program puts on this output (``t.register_hook``) runs before the node's own
                        # pre-hooks: on its node's stream all the same, as the engine switches streams first
                        t.register_hook(enter)
        return out

    def _tag(self, node: Any, floor: int) -> None:
        todo = [node]
        while todo:
            n = todo.pop()
            if n is None or _TAG in n.metadata or n._sequence_nr() <= floor or type(n).__name__ == "AccumulateGrad":
                continue
            n.metadata[_TAG] = self.s
            rt, s = self.rt, self.s
            box: list[Any] = []

            def enter(*_: Any, rt: Any = rt, s: Any = s, box: list[Any] = box) -> None:
                """The node starts on ``s`` (once, whichever of its hooks comes first)."""
                if not box:
                    box.append(rt.backward_on(s))

            def after(grad_inputs: Any, grad_outputs: Any, rt: Any = rt, s: Any = s, box: list[Any] = box) -> None:
                if box:
                    rt.backward_off(s, box.pop())

            n.register_prehook(enter)
            n.register_hook(after)
            n.metadata[_ENTER] = enter
            todo += [f for f, _ in n.next_functions]


def _autograd_entry(original: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.autograd.backward`` or ``grad`` (what ``Tensor.backward`` calls) inside a side stream's block: the
    graph's nodes made outside any such block (:class:`_ForwardStream` tagged none of them) run on the stream
    current outside the blocks (the default stream, or the one ``set_stream`` made current), their forward ops'
    stream, as PyTorch's engine runs them, and not on the calling stream; so does each leaf's ``AccumulateGrad``
    that only such nodes feed (the engine runs it on the stream current as the forward made it). The hooks that
    move them are taken off when the call ends. Called outside any block, they run on the calling stream, which is
    that stream already."""

    @functools.wraps(original)
    def call(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        if not in_actor():
            return original(tensors, *args, **kwargs)
        rt = session_device().runtime
        blocks = rt.current().side_blocks
        if not blocks or blocks[-1][0] is not rt.current_stream() or blocks[0][1] is blocks[-1][0]:
            return original(tensors, *args, **kwargs)  # (set_stream made another stream current in the block)
        handles = _run_untagged_on(rt, blocks[0][1], tensors)
        try:
            return original(tensors, *args, **kwargs)
        finally:
            for h in handles:
                h.remove()

    return call


def _run_untagged_on(rt: Any, base: Any, tensors: Any) -> list[Any]:
    """Hook the untagged nodes reachable from ``tensors``' ``grad_fn`` to run on ``base``; the handles."""
    roots = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
    todo = [t.grad_fn for t in roots if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    seen: set[Any] = set()
    fed_by_side: set[Any] = set()  # the AccumulateGrad nodes a side stream's node feeds
    nodes: list[Any] = []
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        nodes.append(n)
        tagged = _TAG in n.metadata
        for f, _ in n.next_functions:
            if f is None:
                continue
            if tagged and type(f).__name__ == "AccumulateGrad":
                fed_by_side.add(f)
            todo.append(f)
    handles = []
    for n in nodes:
        if _TAG in n.metadata or n in fed_by_side:
            continue
        box: list[Any] = []

        def enter(*_: Any, box: list[Any] = box) -> None:
            if not box:
                box.append(rt.backward_on(base))

        def after(*_: Any, box: list[Any] = box) -> None:
            if box:
                rt.backward_off(base, box.pop())

        handles.append(n.register_prehook(enter))
        handles.append(n.register_hook(after))
    return handles


def _check(device: Any) -> None:
    """A device argument past ``device_count()`` raises CUDA's invalid device ordinal, in each form a device is
    named (:func:`on_device`); the one simulated device stays current (``torch.cuda.set_device``)."""
    on_device(device)


def current_stream(device: Any = None) -> Stream:
    _check(device)
    dev = session_device()
    return Stream.of(dev, dev.runtime.current_stream())  # type: ignore[return-value]


def default_stream(device: Any = None) -> Stream:
    _check(device)
    dev = session_device()
    return Stream.of(dev, dev.runtime.default_stream())  # type: ignore[return-value]


def set_stream(s: contract.Stream | None) -> None:
    if s is None:  # (torch: a no-op)
        return
    dev = session_device()
    dev.runtime.set_stream(dev.stream_of(s))


def synchronize(device: Any = None) -> None:
    _check(device)
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


def _capability(device: Any = None) -> tuple[int, int]:
    p = _properties(device)
    return p.major, p.minor


def _own_process() -> str | None:
    """The process whose statistics the caller reads (its host actor: a rank, a spawned process, the host), as each
    process of a GPU has its own caching allocator; None outside the run's actors (all together)."""
    rt = session_device().runtime
    a = rt.current_or_none()
    return a.name if a is not None else None


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


def get_rng_state(device: Any = "cuda") -> torch.Tensor:
    """``torch.cuda.get_rng_state``: the simulated generator's state as a byte tensor on the host (its seed and the
    count of random ops drawn so far, as CUDA's philox state is a seed and an offset), for ``set_rng_state``."""
    seed, drawn = session_device().runtime.rng_state()
    return torch.tensor([seed, drawn], dtype=torch.int64, device="cpu").view(torch.uint8)


def set_rng_state(new_state: torch.Tensor, device: Any = "cuda") -> None:
    """``torch.cuda.set_rng_state`` with a state ``get_rng_state`` gave (``torch.utils.checkpoint`` restores the
    forward's before it recomputes it, so that a dropout recomputed draws the same mask)."""
    if not isinstance(new_state, torch.Tensor) or new_state.dtype != torch.uint8 or new_state.numel() != 16:
        raise ValueError("set_rng_state: expected a state torch.cuda.get_rng_state() gave (16 bytes)")
    seed, drawn = new_state.detach().cpu().contiguous().view(torch.int64).tolist()
    session_device().runtime.set_rng_state(seed, drawn)


def set_rng_state_all(new_states: Any) -> None:
    for state in new_states:  # one device
        set_rng_state(state)


class _DeviceContext:
    """``torch.cuda.device(i)``: there is one simulated device; an index past ``device_count()`` raises as it is
    entered, as CUDA's does (-1 or None: nothing)."""

    def __init__(self, device: Any) -> None:
        self.device = device

    def __enter__(self) -> None:
        if self.device != -1:
            _check(self.device)
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


class _DeviceOf(_DeviceContext):
    """``torch.cuda.device_of(obj)``: the device of a tensor or storage current for the block (a host one's: nothing),
    as ``torch.cuda.device`` (torch's own subclasses torch's device, whose ``__enter__`` the CPU build refuses)."""

    def __init__(self, obj: Any) -> None:
        super().__init__(obj.get_device() if obj.is_cuda else -1)


def _no_summary(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError("torch.cuda.memory_summary is not simulated (it reads allocator statistics the "
                              "simulated allocator does not keep): memory_stats() has those it keeps")


def _no_snapshot(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError("torch.cuda.memory_snapshot is not simulated (the simulated allocator keeps no "
                              "per-segment record of CUDA's form): memory_stats() has the statistics it keeps")


def _no_graphs(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError("CUDA graphs are not simulated (capture and replay run no operation here)")


def _no_raw_allocations(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError("torch.cuda.caching_allocator_alloc / caching_allocator_delete are not simulated (a "
                              "raw pointer is no tensor the simulator can follow): allocate tensors instead")


def _no_mem_pools(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError("torch.cuda.MemPool / use_mem_pool are not simulated (the simulated caching allocator "
                              "has no private pools): allocate from the ordinary pool")


def _no_cudart(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError("torch.cuda.cudart() is not simulated (the CUDA runtime's own calls, "
                              "cudaHostRegister among them, reach no simulated memory): pin with pin_memory()")


def _no_external_streams(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError("torch.cuda.ExternalStream is not simulated (a stream made outside torch): make the "
                              "stream with torch.cuda.Stream()")


@contextlib.contextmanager
def _nvtx_range(msg: str, *args: Any, **kwargs: Any) -> Iterator[None]:
    """``torch.cuda.nvtx.range``: a context manager, and a decorator (as torch's), marking nothing."""
    yield


_nvtx = types.SimpleNamespace(
    range_push=lambda msg: 0, range_pop=lambda: 0, mark=lambda msg: None, range=_nvtx_range,
    range_start=lambda msg: 0, range_end=lambda range_id: None,
)


# -- devices in factories and copies --------------------------------------------------------------------------


def device_count() -> int:
    """``torch.cuda.device_count()``: a device per rank of the world (a machine of N GPUs runs N ranks), one outside
    a world. Every rank's tensors are on the one simulated device, shown as ``cuda:0``."""
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


def _context_on_device() -> bool:
    """Whether the device a factory gets where the call names none is CUDA: that of the innermost ``with
    torch.device("cuda")`` block (torch's ``DeviceContext``, a function mode), else of
    ``torch.set_default_device("cuda")``. torch's mode would pass it on to the factory itself, but only to the
    factories it knew before the session patched them, and as a device the simulator takes from here."""
    if torch._C._len_torch_function_stack():
        for mode in reversed(_get_current_function_mode_stack()):
            if isinstance(mode, torch_device.DeviceContext):
                return on_device(mode.device)
    default = getattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context", None)
    return default is not None and on_device(default.device)


def _forget_context_factories() -> None:
    """torch keeps the factories its ``DeviceContext`` acts on as it first found them (a cache): found during a
    session, they would be the session's, and a block run after it, on a GPU, would give its device to none."""
    torch_device._device_constructors.cache_clear()


def _factory(fn: Callable[..., Any]) -> Callable[..., Any]:
    contextual = fn.__name__ in _CONTEXT_FACTORIES

    @functools.wraps(fn)
    def make(*args: Any, **kwargs: Any) -> Any:
        device = kwargs.get("device")
        if on_device(device) or (device is None and contextual and _context_on_device()):
            kwargs["device"] = _meta()
        return fn(*args, **kwargs)

    return make


def _from_data(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.tensor``, ``as_tensor``, ``asarray``: made on the host, then copied to the device (synchronously,
    from pageable memory, as CUDA does)."""

    @functools.wraps(fn)
    def make(*args: Any, **kwargs: Any) -> Any:
        device = kwargs.get("device")
        if not on_device(device) and not (device is None and _context_on_device()):
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
        out = fn(*args, **kwargs).to(_meta())
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


def _tensor_to(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        args = tuple(_meta() if on_device(a) and not isinstance(a, torch.dtype) else a for a in args)
        if on_device(kwargs.get("device")):
            kwargs["device"] = _meta()
        if self.layout is not torch.strided and (kwargs.get("device") is META or any(a is META for a in args)):
            raise NotImplementedError(f"a {self.layout} tensor on the simulated device is not simulated (its "
                                      "tensors are dense): move it there dense (to_dense())")
        return original(self, *args, **kwargs)

    return to


def _tensor_cuda(to: Callable[..., Any]) -> Callable[..., Any]:
    def cuda(self: torch.Tensor, device: Any = None, non_blocking: bool = False, **kwargs: Any) -> Any:
        _check(device)  # (an index past the device count raises, as CUDA's invalid device ordinal)
        return to(self, _meta(), non_blocking=non_blocking, **kwargs)

    return cuda


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
        "current_device": lambda: 0,
        "set_device": _check,
        "get_device_name": lambda d=None: _properties(d).name,
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
        "memory_summary": _no_summary,
        "memory_snapshot": _no_snapshot,
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
        "is_current_stream_capturing": lambda: False,
        "graph": _no_graphs,
        "CUDAGraph": _no_graphs,
        "caching_allocator_alloc": _no_raw_allocations,
        "caching_allocator_delete": _no_raw_allocations,
        "ExternalStream": _no_external_streams,
        "MemPool": _no_mem_pools,
        "use_mem_pool": _no_mem_pools,
        "cudart": _no_cudart,
        "_sleep": _sleep,
    }
    for name, value in table.items():
        p.set(cuda, name, value)
    # where torch.cuda's memory functions are defined: code that calls them there (``torch.cuda.memory.memory_stats``),
    # and torch's own aliases that call them by their module's names, get the simulated device's too
    for name, value in table.items():
        if callable(getattr(torch.cuda.memory, name, None)):
            p.set(torch.cuda.memory, name, value)
    for name in ("range_push", "range_pop", "mark", "range", "range_start", "range_end"):
        p.set(cuda.nvtx, name, getattr(_nvtx, name))
    for name in _FACTORIES:
        if hasattr(torch, name):
            p.set(torch, name, _wrapped(torch, name, _factory))
    for name in _FROM_DATA:
        if hasattr(torch, name):
            p.set(torch, name, _wrapped(torch, name, _from_data))
    to = _wrapped(torch.Tensor, "to", _tensor_to)
    p.set(torch.Tensor, "to", to)
    p.set(torch.Tensor, "cuda", _tensor_cuda(to))
    for name in _NEW:
        p.set(torch.Tensor, name, _wrapped(torch.Tensor, name, _tensor_new))
    p.set(torch.Tensor, "new_tensor", _wrapped(torch.Tensor, "new_tensor", _tensor_new_tensor))
    p.set(time, "sleep", _host_sleep)
    for name in ("backward", "grad"):
        p.set(torch.autograd, name, _wrapped(torch.autograd, name, _autograd_entry))
    amp = _wrapped(torch.amp, "autocast", _autocast)
    p.set(torch, "autocast", amp)
    p.set(torch.amp, "autocast", amp)

    def cuda_autocast(enabled: bool = True, dtype: torch.dtype = torch.float16, cache_enabled: bool = True) -> Any:
        """``torch.cuda.amp.autocast``: ``torch.autocast("cuda", ...)`` (torch's class warns when subclassed)."""
        return amp("cuda", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)

    p.set(torch.cuda.amp, "autocast", cuda_autocast)
    for name in ("spawn", "start_processes"):
        if hasattr(torch.multiprocessing, name):
            p.set(torch.multiprocessing, name, _no_processes(name))
    _refuse_compiled(p)
    p.set(torch, "compile", _compile(torch.compile, p))  # (made for this session's patches, not kept)


COMPILE_REFUSED = ("torch.compile is not simulated (a compiled function's kernels would run outside the simulated "
                   "device, and its tracing would trace the simulator): run the function uncompiled here")


def _refuse_compiled(p: Patches) -> None:
    """A function ``torch.compile`` made, called in a run, raises ``NotImplementedError`` (no verdict), also one
    compiled before the session: where Dynamo chooses how to run the call (``_callback_from_stance``, asked by every
    compiled function's call), once Dynamo is loaded. A call Dynamo runs uncompiled anyway (``torch._dynamo.disable``,
    the ``force_eager`` stance) goes on."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    if eval_frame is None or getattr(eval_frame._callback_from_stance, "_simdevice", False):
        return
    original = eval_frame._callback_from_stance

    def callback_from_stance(callback: Any) -> Any:
        chosen = original(callback)
        if chosen not in (None, False) and in_actor():
            raise NotImplementedError(COMPILE_REFUSED)
        return chosen

    callback_from_stance._simdevice = True  # type: ignore[attr-defined]
    p.set(eval_frame, "_callback_from_stance", callback_from_stance)


def _compile(original: Callable[..., Any], p: Patches) -> Callable[..., Any]:
    """``torch.compile`` during a session: torch's (which loads Dynamo), with the refusal of
    :func:`_refuse_compiled` in place."""

    @functools.wraps(original)
    def compile(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        _refuse_compiled(p)
        return out

    return compile


AUTOCAST_NOTE = ("autocast('cuda') is not applied on the simulated device: its ops ran in the dtypes they were "
                  "given (float32 where a GPU computes in reduced precision), so their values and sizes are "
                  "float32's; the synchronization is judged as on a GPU")


def _autocast(original: type) -> type:
    """``torch.autocast`` that notes, in a run, that CUDA autocast is not applied (the simulated device's tensors
    carry no CUDA dispatch keys for it to act on)."""

    class autocast(original):  # type: ignore[valid-type,misc]  # noqa: N801 (torch's name)
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            device_type = kwargs.get("device_type", args[0] if args else "cuda")
            enabled = kwargs.get("enabled", args[2] if len(args) > 2 else True)
            if device_type == "cuda" and enabled and in_actor():
                session_device().runtime.note(AUTOCAST_NOTE)
            super().__init__(*args, **kwargs)

    autocast.__qualname__ = original.__qualname__
    autocast.__module__ = original.__module__
    return autocast


def _no_processes(name: str) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"torch.multiprocessing.{name} is not simulated (a child process would not run on the simulated "
            "device): run the function on ranks instead, with world_size=N or --world-size N"
        )

    call.__name__ = name
    return call


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
    return [torch, torch.cuda, torch.cuda.memory, torch.cuda.nvtx, torch.Tensor, torch.multiprocessing, time, torch.amp,
            torch.cuda.amp, torch.autograd]
