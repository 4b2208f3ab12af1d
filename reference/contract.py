"""The device contract: what a mechanism in ``reference/`` may use, with names that mirror ``torch.cuda``.

A mechanism is ordinary PyTorch code plus one ``dev: Device`` object whose
names mirror ``torch.cuda`` (and, for what one process's streams cannot
express, ``torch.multiprocessing``, ``torch.distributed`` and
``torch_memory_saver``):

====================================  ======================================
contract                              on CUDA (``reference.cuda``)
====================================  ======================================
``dev.device``                        ``torch.device("cuda")``
``dev.Stream(name=, priority=)``      ``torch.cuda.Stream(priority=)``; a
                                      ``torch.Stream`` on both backends, so
                                      ``t.record_stream(s)`` takes it
``dev.Event(enable_timing=)``         ``torch.cuda.Event()``
``dev.stream(s)``                     ``torch.cuda.stream(s)``
``dev.current_stream()``              ``torch.cuda.current_stream()``
``dev.default_stream()``              ``torch.cuda.default_stream()``
``dev.synchronize()``                 ``torch.cuda.synchronize()``
``s.wait_event(e)``, ``s.wait_stream(o)``, ``s.synchronize()``, ``s.query()``
``e.record(s=None)``, ``e.wait(s=None)``, ``e.query()``, ``e.synchronize()``,
``e.elapsed_time(end)`` (virtual milliseconds on the simulator)
``dev.Process(target, args, name=)``  ``torch.multiprocessing`` (spawn); the
                                      child runs ``target(dev, *args)``;
                                      device tensors in ``args`` travel by
                                      CUDA IPC
``dev.Value(typecode, init)``         ``ctx.Value`` (``.value``)
``dev.Queue()``                       ``ctx.Queue`` (``put``/``get``)
``dev.sleep(units)``                  ``time.sleep`` (1 unit = 1 ms)
``dev.empty_cache()``                 ``torch.cuda.empty_cache()``
``dev.all_gather_into_tensor(...)``   ``torch.distributed`` (NCCL); returns
                                      a work handle with ``wait()``
``dev.spawn_ranks(fn, world_size)``   one NCCL process per GPU
``dev.memory_saver``                  ``torch_memory_saver``: ``region()``,
                                      ``pause()``, ``resume()``, ``disable()``
                                      (process-wide under
                                      ``TMS_INIT_ENABLE=1``)
====================================  ======================================

Tensors are made with ``device=dev.device`` and ``pin_memory=True`` and
copied with ``t.copy_(src, non_blocking=True)``; nothing else changes
between backends, and a mechanism never asks which one it runs on. Both
``simdevice.SimDevice`` and ``reference.cuda.CudaDevice`` provide every
protocol below (mypy checks it where a harness passes either as a
``Device``; ``tests/property/tool/test_contract.py`` checks the parameters).

Schedules (``reference.schedule``) are realized by counting operations per
actor the same way on both backends: :func:`op_kind` decides which aten ops
are stream operations (a kernel or a copy; views and bare allocations are
not), and every contract call that can block, publish or observe is a host
step. Consecutive polls of an actor (host steps that only observe: a
``SharedValue`` read, ``SharedQueue.empty``, ``Event.query``,
``Stream.query``, ``Work.is_completed``; and ``Device.sleep``) count as one
operation, the first, so a polling loop counts the same however long it
polls; any other counted step of the actor ends the poll.
``Process.is_alive`` is no host step on either backend.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable
from typing import Any, Literal, Protocol, TypeAlias, overload

import attrs
import torch

aten = torch.ops.aten

OpKind = Literal["view", "alloc", "meta", "op"]

#: Allocation without a kernel: no stream operation on either backend.
_ALLOC_OPS = frozenset(
    {
        aten.empty.memory_format,
        aten.empty_strided.default,
        aten.empty_like.default,
        aten.new_empty.default,
        aten.new_empty_strided.default,
    }
)
#: Bookkeeping calls that launch nothing.
_META_OPS = frozenset(
    {
        aten.record_stream.default,
        aten.is_pinned.default,
        aten._pin_memory.default,
        aten.set_.default,
        aten.set_.source_Storage,
        aten.set_.source_Storage_storage_offset,
        aten.set_.source_Tensor,
        aten.set_.source_Tensor_storage_offset,
        # a new shape within the storage's bytes, or memory for an empty one: no kernel
        aten.resize_.default,
        aten.resize_as_.default,
        # in-place views: the tensor's own shape and strides changed, no kernel
        aten.squeeze_.default,
        aten.squeeze_.dim,
        aten.squeeze_.dims,
        aten.unsqueeze_.default,
        aten.t_.default,
        aten.transpose_.default,
        aten.swapdims_.default,
        aten.swapaxes_.default,
        aten.as_strided_.default,
        # what a tensor's metadata answers, read by no kernel (another tensor's, a host one's, compared)
        aten.is_same_size.default,
        aten.is_set_to.default,
        aten.dense_dim.default,
        aten.sparse_dim.default,
    }
)


def poison(t: torch.Tensor) -> None:
    """Fill memory nobody wrote with values a reader cannot mistake for data (NaN, or the integer maximum): the
    simulator does so for fresh memory, ``CudaDevice`` for every uninitialized allocation of plain code."""
    if t.numel() == 0 or t.is_quantized:  # (quantized values have no number of their own to fill with)
        return
    if t.dtype.is_floating_point or t.dtype.is_complex:
        t.fill_(math.nan)
    elif t.dtype == torch.bool:
        t.fill_(True)
    elif _largest(t.dtype) is not None:
        t.fill_(_largest(t.dtype))
    # (a dtype of raw bits has no number to fill it with: left as it is)


@functools.cache
def _largest(dtype: torch.dtype) -> int | None:
    """An integer dtype's largest value; None for one ``torch.iinfo`` does not take (``bits8``)."""
    try:
        return int(torch.iinfo(dtype).max)
    except TypeError:
        return None


@functools.cache
def torchrun_variables(rank: int, world_size: int) -> dict[str, str]:
    """What torchrun (``torch.distributed.run``) sets in the environment of each process it starts, on one node: the
    rank's own on both backends (the simulator's ranks read them, a GPU run's rank processes have them)."""
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size), "GROUP_RANK": "0", "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


class GenericClass(type):
    """The metaclass of a stand-in for torch's device-generic ``torch.Stream`` or ``torch.Event`` (a factory of the
    device's own class): any instance of the classes in ``_of`` is an instance of it, and any subclass of them a
    subclass, as of torch's own class (a CUDA stream is a ``torch.Stream`` on a GPU)."""

    _of: tuple[type, ...]

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, cls._of)

    def __subclasscheck__(cls, sub: Any) -> bool:
        return isinstance(sub, type) and issubclass(sub, cls._of)


def op_kind(func: torch._ops.OpOverload) -> OpKind:
    """How an aten op counts: a view, a bare allocation, bookkeeping, or a stream op."""
    if func in _ALLOC_OPS:
        return "alloc"
    if func in _META_OPS:
        return "meta"
    returns = func._schema.returns
    if returns and returns[0].alias_info is not None and not returns[0].alias_info.is_write:
        return "view"
    return "op"


@functools.cache
def dispatches_itself(cls: type) -> bool:
    """Whether a tensor class among an op's argument types takes the op itself: a wrapper subclass's own
    ``__torch_dispatch__`` (a float8 weight, a nested tensor, DTensor), where torch's ``Tensor``, ``Parameter``,
    ``UninitializedParameter`` have the disabled one. A dispatch mode declines such an op, as torch's modes do, and
    sees the ops the subclass runs on the tensors it wraps."""
    return getattr(cls, "__torch_dispatch__", None) is not torch._C._disabled_torch_dispatch_impl


# ---------------------------------------------------------------------------
# The contract, as protocols: mechanisms type ``dev: Device``.


class Event(Protocol):
    """``torch.cuda.Event``."""

    def record(self, stream: Stream | None = None) -> None: ...
    def wait(self, stream: Stream | None = None) -> None: ...
    def query(self) -> bool: ...
    def synchronize(self) -> None: ...
    def elapsed_time(self, end_event: Event) -> float: ...


class Stream(Protocol):
    """``torch.cuda.Stream``, with the name schedules call it by."""

    @property
    def name(self) -> str: ...
    def wait_event(self, event: Event) -> None: ...
    def wait_stream(self, stream: Stream) -> None: ...
    def synchronize(self) -> None: ...
    def query(self) -> bool: ...
    def record_event(self, event: Event | None = None) -> Event: ...


class Work(Protocol):
    """The handle of an async collective (``torch.distributed.Work``)."""

    def wait(self, timeout: Any = None) -> bool: ...
    def is_completed(self) -> bool: ...


class SharedValue(Protocol):
    """``multiprocessing.Value``: ``.value`` reads and writes are host steps."""

    @property
    def value(self) -> Any: ...
    @value.setter
    def value(self, v: Any) -> None: ...


class SharedQueue(Protocol):
    """``multiprocessing.Queue``."""

    def put(self, item: Any) -> None: ...
    def get(self, timeout: float | None = None) -> Any: ...
    def empty(self) -> bool: ...


class Process(Protocol):
    """A spawned worker process (``torch.multiprocessing``)."""

    def start(self) -> None: ...
    def join(self, timeout: float | None = None) -> None: ...
    def is_alive(self) -> bool: ...
    @property
    def exitcode(self) -> int | None: ...


class MemorySaver(Protocol):
    """``torch_memory_saver``: pausable memory regions."""

    def region(
        self, tag: str = "default", enable_cpu_backup: bool = False, enable_disk_backup: bool = False,
        cpu_backup_backend: str | None = None,
    ) -> contextlib.AbstractContextManager[Any]: ...
    def disable(self) -> contextlib.AbstractContextManager[Any]: ...
    def pause(self, tag: str | None = None) -> None: ...
    def resume(self, tag: str | None = None) -> None: ...


# the Device protocol's methods are named after the classes they make; refer to the protocols by these names there
_Stream: TypeAlias = Stream
_Event: TypeAlias = Event
_Process: TypeAlias = Process


class Device(Protocol):
    """What a mechanism may use. ``SimDevice`` and ``CudaDevice`` both provide it."""

    device: torch.device

    def Stream(self, name: str | None = None, priority: int = 0) -> _Stream: ...
    def Event(self, enable_timing: bool = False) -> _Event: ...
    def stream(self, s: _Stream | None) -> contextlib.AbstractContextManager[Any]: ...
    def current_stream(self) -> _Stream: ...
    def default_stream(self) -> _Stream: ...
    def synchronize(self) -> None: ...
    def Process(self, target: Callable[..., Any], args: tuple[Any, ...] = (), name: str = "worker") -> _Process: ...
    def Value(self, typecode: str, init: Any) -> SharedValue: ...
    def Queue(self) -> SharedQueue: ...
    def sleep(self, units: float) -> None: ...
    def empty_cache(self) -> None: ...
    @overload
    def all_gather_into_tensor(
        self, output: torch.Tensor, input: torch.Tensor, async_op: Literal[True] = True
    ) -> Work: ...
    @overload
    def all_gather_into_tensor(self, output: torch.Tensor, input: torch.Tensor, async_op: Literal[False]) -> None: ...
    @overload
    def all_gather_into_tensor(self, output: torch.Tensor, input: torch.Tensor, async_op: bool) -> Work | None: ...
    def all_gather_into_tensor(
        self, output: torch.Tensor, input: torch.Tensor, async_op: bool = True
    ) -> Work | None: ...
    def spawn_ranks(self, fn: Callable[..., Any], world_size: int, args: tuple[Any, ...] = ()) -> list[Any]: ...
    def run(self, program: Callable[..., Any], *args: Any) -> Run: ...

    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def memory_saver(self) -> MemorySaver: ...


@attrs.frozen
class Run:
    """What one run of a program produced: its return value and the backend's reports."""

    result: Any
    reports: tuple[Any, ...] = ()
    #: operations counted per actor, as the schedule counts them
    op_counts: dict[str, int] = attrs.field(factory=dict)
    #: delays of the schedule that never fired (their operation never came)
    unfired: tuple[str, ...] = ()
    #: what the run says about itself that is no failure (e.g. a stream that got no operation)
    notes: tuple[str, ...] = ()
    #: every host step and stream operation, in time order: (time in ns, actor, what); empty where none is kept
    trace: tuple[tuple[int, str, str], ...] = ()
    #: each counted stream operation's line and bytes moved: ``"actor#index"`` -> ``(source, nbytes)`` (simulator)
    sites: dict[str, tuple[str, int]] = attrs.field(factory=dict)
    #: whether ``simdevice replay --gpu`` can run the schedule (False: the program started processes, which a GPU
    #: replay does not count yet)
    gpu: bool = True
    #: each host step's access of memory the device also reaches (pinned buffers): the access's ``seq`` ->
    #: ``(actor, time in ns, source, operations issued before it)`` (simulator): where a race with the host happened
    host_accesses: dict[int, tuple[str, int, str, int]] = attrs.field(factory=dict)
