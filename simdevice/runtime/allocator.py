"""The caching allocator of the simulated device: pools, stream-ordered segments, blocks, reuse.

Every device tensor comes from it. It follows PyTorch's CUDA caching
allocator closely enough for its hazards to appear as they do on a GPU:

- A *pool* per memory-saver region tag (``"train"``), plus the ordinary pool
  (tag ``None``) used outside any region and inside ``disable()``.
- A *segment* is one underlying device allocation (one ``cudaMalloc``, one
  memory-saver handle), made for the stream that was current when it was
  needed: its blocks are only ever handed out to allocations on that stream.
  Sizes scale like the real allocator's, in simulated bytes (one simulated
  byte stands for ``SimConfig.byte_scale`` real ones): requests up to 1 KiB
  share 2 KiB "small" segments, requests below 10 KiB get a 20 KiB segment,
  larger ones are rounded up to 2 KiB; blocks are multiples of 64 bytes. A
  program whose sizes are its own (``SimConfig.real_sizes``: plain torch.cuda
  code) gets CUDA's sizes themselves: 512-byte blocks, requests up to 1 MiB
  from 2 MiB segments, below 10 MiB a 20 MiB one, larger rounded to 2 MiB. A fresh segment is poisoned where it is
  first handed out; a reused block keeps its last owner's bytes, as on a GPU.
- A *block* is a piece of a segment. A request takes a free block of its pool
  and stream (same small/large kind) that fits, splitting off the rest; a
  freed block goes back to the free list and merges with free neighbours. The
  choice among the fitting blocks is best fit, offset by the allocation's
  *pick* (a schedule choice, or the run's default: reuse can be adversarial).
- Stream order: when the program drops a tensor, its block is free as of the
  allocating stream's position then (the free is an access of that stream:
  another stream still reading the block is a race, see
  :meth:`~simdevice.runtime.memory.Memory.issue_free`) and reusable at once
  by the next allocation on that stream. Streams named with
  ``record_stream`` defer that: the block comes back only once each of them
  has reached the point where it was freed, and the allocation that sees it
  back is ordered after them (it queried their events, as PyTorch does).
  The host that takes a freed block again is ordered after its free: after
  the freeing host's past and those events, whichever thread of the process
  freed it or saw it back (CUDA's allocator hands blocks on under its lock).
- The allocator knows nothing of pausing: free blocks of a paused segment
  stay on the free list and can be handed out. Such a block is unmapped from
  birth (``Storage.unmapped``), so its first use is an illegal access.
- ``empty_cache()`` releases segments that are entirely free (the memory saver
  then frees their handle: see :mod:`simdevice.runtime.memsaver`). First, as
  CUDA's ``synchronize_and_free_events``, the host waits for every stream
  recorded with a freed block to get past its free, and the block comes back:
  so does the release an allocation past the device's memory makes before it
  gives up.

A device tensor's bytes are a CPU alias of its block (``torch.from_numpy`` of a
NumPy view of the segment's bytes), with a storage of its own: when the program drops the
last tensor or view of an allocation, a ``weakref`` callback returns the block,
as ``del t`` does with the caching allocator. The storage record kept by
:class:`~simdevice.runtime.memory.Memory` is a second alias, so it does not keep the
block alive. Segments' CPU bytes are never given back during a run, so no alias
ever dangles.
"""

from __future__ import annotations

import bisect
import mmap
import sys
import weakref
from collections.abc import Callable, Iterable
from types import MethodType
from typing import Any

import numpy as np
import torch

from simdevice.runtime import sync
from simdevice.runtime.clock import VectorClock
from simdevice.runtime.execution import HostActor
from simdevice.runtime.memory import Accessor, Memory, Shadow, Storage, bytes_at
from simdevice.runtime.reports import own_file, user_source
from simdevice.runtime.streams import EventRecord, SimStream

PoolTag = str | None

#: requests up to this many simulated bytes come from small segments (1 MiB on a GPU)
SMALL_REQUEST = 1024
SMALL_SEGMENT = 2048
#: requests below this get a LARGE_SEGMENT (10 MiB and 20 MiB on a GPU)
MIN_LARGE_ALLOC = 10 * 1024
LARGE_SEGMENT = 20 * 1024
ROUND_LARGE = 2048
#: block sizes are multiples of this
ROUND = 64


def _size(nbytes: int) -> str:
    """Bytes as a person reads them (1.5 GiB)."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            value = nbytes / (1 << shift)
            return f"{value:.3g} {unit}" if value < 1000 else f"{value:,.0f} {unit}"
    return f"{nbytes} bytes"


def _round_up(n: int, k: int) -> int:
    return (n + k - 1) // k * k


#: CUDA's own sizes are these times 1024 (``kSmallSize``, ``kSmallBuffer``, ``kMinLargeAlloc``, ``kLargeBuffer``,
#: ``kRoundLarge``), and its blocks are multiples of 512 bytes (``kMinBlockSize``)
REAL = 1024
REAL_ROUND = 512


def segment_size(nbytes: int, scale: int = 1) -> int:
    """The size of the segment the caching allocator makes for a request it cannot serve from cache (``scale``:
    :data:`REAL` for CUDA's own sizes)."""
    if nbytes <= SMALL_REQUEST * scale:
        return SMALL_SEGMENT * scale
    if nbytes < MIN_LARGE_ALLOC * scale:
        return LARGE_SEGMENT * scale
    return _round_up(nbytes, ROUND_LARGE * scale)


class Block:
    __slots__ = ("_segment", "after", "frames", "free", "freed_at", "fresh", "gen", "held", "key", "nbytes", "offset",
                 "requested", "sid", "storage", "uses")

    def __init__(self, segment: Segment, offset: int, nbytes: int, fresh: bool = True) -> None:
        # its segment holds it (Segment.blocks); a weak reference back, so that a run's allocator dies by reference
        # counting when the run is dropped (a cycle here kept every shadow and access of the run for the collector)
        self._segment = weakref.ref(segment)
        #: its segment's id and (pool, small or large, stream, backed up), fixed for its life: which free list it
        #: goes on
        self.sid = segment.id
        self.key: tuple[PoolTag, bool, SimStream | None, bool] = (
            segment.pool, segment.small, segment.stream, segment.backup)
        self.offset, self.nbytes = offset, nbytes
        self.free = True
        #: never handed out since its segment was made: its bytes are whatever cudaMalloc gave (poisoned)
        self.fresh = fresh
        self.storage: Storage | None = None
        #: streams other than the segment's that used it (``record_stream``)
        self.uses: list[SimStream] = []
        #: where other processes' streams were as they let go of their CUDA IPC mapping of it
        #: (:meth:`CachingAllocator.released_by`)
        self.held: list[EventRecord] = []
        #: how many times it was handed out: a finalizer of an earlier owner must not free a later one
        self.gen = 0
        #: while free, what a host that takes it is ordered after (None: nothing yet): the past of the host that
        #: freed it, and the events of its recorded streams that let it back, which another thread of the process
        #: taking it is ordered after as well (CUDA's allocator hands a block on under its lock)
        self.after: VectorClock | None = None
        #: the bytes its allocation asked for, and where the program made it (while a memory history records
        #: tracebacks: :class:`History`): a snapshot's block
        self.requested = 0
        self.frames: list[dict[str, Any]] = []
        #: where the program freed it (its history's ``free_completed`` has the frames of its ``free_requested``)
        self.freed_at: list[dict[str, Any]] = []

    @property
    def segment(self) -> Segment:
        seg = self._segment()
        assert seg is not None, "a block outlived its segment"
        return seg

    def __repr__(self) -> str:
        return f"block {self.segment.label}+{self.offset}"


def _order_after(block: Block, clock: VectorClock) -> None:
    """Whoever takes the free ``block`` next is ordered after ``clock`` too."""
    block.after = sync.also_after(block.after, clock)


class Segment:
    """One underlying allocation: its CPU bytes, its blocks, its stream, and its memory-saver state."""

    def __init__(
        self, sid: int, pool: PoolTag, nbytes: int, small: bool, stream: SimStream | None = None, lazy: bool = False,
        backup: bool = False,
    ) -> None:
        self.id, self.pool, self.nbytes, self.small = sid, pool, nbytes, small
        self.stream = stream
        #: made in a region that backs its contents up (``enable_cpu_backup``): the memory saver keeps the setting
        #: per allocation, and torch_memory_saver gives each (tag, backup) its own pool, so that a region of one
        #: setting never takes a cached block of the other
        self.backup = backup
        self.label = f"seg#{sid}"
        #: ``lazy`` (a race-only run, whose operations move no bytes): address space only, no page until one is
        #: written, whatever the size (``MAP_NORESERVE``: not counted against this machine's memory either)
        self.data = _lazy_bytes(nbytes) if lazy else _kept_bytes(nbytes)
        self._array: Any = None
        #: where its bytes start (CPU address)
        self.address = int(self.data.data_ptr())
        #: the shadow of these bytes, shared by every allocation made here (history survives reuse)
        self.shadow = Shadow(nbytes)
        self.blocks: list[Block] = [Block(self, 0, nbytes)]
        #: the physical handle mapped at this segment's addresses (None while paused)
        self.handle: int | None = None
        #: the handle the last pause released (what a buggy free would release again)
        self.last_handle: int | None = None
        #: why the segment is unmapped (the pause), or None while mapped
        self.paused: str | None = None
        self.released = False

    def array(self) -> Any:
        """The segment's bytes as a NumPy array (the same memory), made once."""
        if self._array is None:
            self._array = self.data.numpy()
        return self._array

    def all_free(self) -> bool:
        return len(self.blocks) == 1 and self.blocks[0].free


class _FreeBlocks:
    """The free blocks of live segments, by (pool, small or large, stream, backed up), each list in best-fit order
    (size, then segment, then offset): the fitting blocks of a request are the tail from its size on, found by
    bisection, not by a walk over every block of every segment. The allocator tells it each change (a block taken,
    freed, split or merged; a segment made or released), before a free block's size changes."""

    def __init__(self) -> None:
        self._lists: dict[tuple[PoolTag, bool, SimStream | None, bool], list[tuple[int, int, int, Block]]] = {}

    def add(self, block: Block) -> None:
        bisect.insort(self._lists.setdefault(block.key, []), (block.nbytes, block.sid, block.offset, block))

    def remove(self, block: Block) -> None:
        entries = self._lists[block.key]
        i = bisect.bisect_left(entries, (block.nbytes, block.sid, block.offset))
        assert entries[i][3] is block
        del entries[i]

    def take(
        self, pool: PoolTag, small: bool, stream: SimStream | None, size: int, pick: int, backup: bool = False
    ) -> Block | None:
        """``fitting(...)[pick % len(fitting(...))]``, taken off its list; None where no block fits."""
        entries = self._lists.get((pool, small, stream, backup))
        if not entries:
            return None
        i = bisect.bisect_left(entries, (size,))
        n = len(entries) - i
        if n <= 0:
            return None
        return entries.pop(i + pick % n)[3]

    def fitting(
        self, pool: PoolTag, small: bool, stream: SimStream | None, size: int, backup: bool = False
    ) -> list[Block]:
        """The free blocks of at least ``size`` bytes, in best-fit order."""
        entries = self._lists.get((pool, small, stream, backup))
        if not entries:
            return []
        return [e[3] for e in entries[bisect.bisect_left(entries, (size,)):]]


class Allocation:
    """What ``malloc`` hands out: the block (None for a request of no bytes, which takes none), the tensor's bytes
    (they keep the block allocated), how many bytes the tensor's storage has (``need``), and whether the bytes are
    fresh (never handed out before)."""

    __slots__ = ("alias", "block", "data", "fresh", "need")

    def __init__(self, block: Block | None, data: torch.Tensor, need: int, fresh: bool,
                 alias: torch.Tensor | None = None) -> None:
        self.block, self.data, self.need, self.fresh = block, data, need, fresh
        #: the tensor's bytes once more, shaped as it is, keeping nothing allocated (what a queued operation
        #: holds: ``Storage.alias``), where it came at no extra cost; else None
        self.alias = alias


class _Freed:
    """A block whose last tensor died: where the streams recorded with it were then, and (None for a block of no
    stream) its stream's name, its epoch and what the free is ordered after then (``sync.free_point``)."""

    __slots__ = ("block", "clock", "epoch", "host", "source", "stream", "uses")

    def __init__(
        self, block: Block, stream: str | None, epoch: int, clock: VectorClock | None, uses: list[EventRecord],
        source: str, host: VectorClock | None = None,
    ) -> None:
        self.block, self.stream, self.epoch, self.clock, self.uses, self.source = (
            block, stream, epoch, clock, uses, source)
        #: the freeing host's past as it dropped the block (None: no host), which the block's next taker is
        #: ordered after (:attr:`Block.after`)
        self.host = host


#: the dtypes NumPy has too, as NumPy's
_NUMPY_DTYPES = {
    torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16, torch.int64: np.int64,
    torch.int32: np.int32, torch.int16: np.int16, torch.int8: np.int8, torch.uint8: np.uint8, torch.bool: np.bool_,
    torch.complex64: np.complex64, torch.complex128: np.complex128,
}


def _typed(seg: Segment, block: Block, like: torch.Tensor, need: int) -> Any:
    """The block's first ``need`` bytes as a NumPy array of ``like``'s dtype and shape, where ``like`` covers them
    all in order (contiguous, and as many bytes as its storage: so from its start) and NumPy has its dtype; else
    None."""
    np_dtype = _NUMPY_DTYPES.get(like.dtype)
    if np_dtype is None or not need or not like.is_contiguous() or like.numel() * like.element_size() != need:
        return None
    # (one array made over the segment's, at the block's offset: a fraction of slicing, viewing and reshaping)
    return np.ndarray(tuple(like.shape), np_dtype, seg.array(), block.offset)


#: the CPU bytes of segments whose every alias is gone, by size, for later segments of their size (the process's
#: pages already: a new segment's first writes fault none in), at most :data:`KEPT_AT_MOST` bytes of them in all, the
#: size kept last at the end
_KEPT: dict[int, list[torch.Tensor]] = {}
KEPT_AT_MOST = 256 << 20
#: the smallest segment whose bytes are kept: below glibc's least threshold for new pages (128 KiB), malloc serves
#: a segment from memory the process has, and keeping one would cost more than it saves (about 10 us a segment)
KEPT_FROM = 128 << 10


class _Lease:
    """A segment's hold on bytes of :data:`_KEPT`'s: NumPy's array over them has it as its base, and every alias of
    the segment's bytes (its blocks' tensors, their views, the storage records) holds that array, so the bytes go
    back once the last alias is gone (never while a run, or the program after its run, can still reach them)."""

    __slots__ = ("__array_interface__", "_bytes")

    def __init__(self, data: torch.Tensor) -> None:
        self._bytes = data
        self.__array_interface__ = data.numpy().__array_interface__

    def __del__(self) -> None:
        data = self._bytes
        n = data.numel()
        try:
            kept = _KEPT
            if n > KEPT_AT_MOST:
                return
            # (the items listed at once: a lease may end on another thread while a segment of a new size is made)
            held = sum(k * len(v) for k, v in list(kept.items()))
            # where the bound is reached, the sizes kept longest ago give way to this one: the configuration run
            # last is the one likely to run next (a search moves on from one configuration to another)
            for size in list(kept):
                if held + n <= KEPT_AT_MOST:
                    break
                if size != n:
                    held -= size * len(kept.pop(size, ()))
            if held + n <= KEPT_AT_MOST:
                same = kept.pop(n, [])
                same.append(data)
                kept[n] = same  # (the size kept last: the last to give way)
        except (TypeError, AttributeError):  # (the interpreter's exit, the module's globals gone)
            pass


def _kept_bytes(nbytes: int) -> torch.Tensor:
    """``nbytes`` of CPU memory for a segment: bytes an ended segment of that size had, where kept, else new (a
    segment under :data:`KEPT_FROM` always new).

    Device memory is CPU memory here, and a run's segments end with it: allocated anew, each run's first write of
    each page was a page fault (the kernel zeroing it), about a tenth of a run of ``param_readiness`` and, past
    glibc's largest threshold for keeping freed memory (32 MiB), every page of a large configuration's segments in
    every run (docs/benchmarks.md). Nothing a run computes depends on which: a block is poisoned as it is first
    handed out in a run (a value run) whatever its bytes held."""
    if nbytes < KEPT_FROM:
        return torch.empty(nbytes, dtype=torch.uint8, device="cpu")
    free = _KEPT.get(nbytes)
    data = free.pop() if free else torch.empty(nbytes, dtype=torch.uint8, device="cpu")
    return torch.from_numpy(np.asarray(_Lease(data)))


def _lazy_bytes(nbytes: int) -> torch.Tensor:
    """``nbytes`` of address space: an anonymous private mapping, its pages made only when written (reading an
    untouched page reads zeros, and costs no memory either)."""
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0x4000)
    return torch.frombuffer(mmap.mmap(-1, max(nbytes, 1), flags=flags), dtype=torch.uint8)[:nbytes]


#: the allocations whose end is awaited: a weak reference's id -> (the reference, the allocator, the block, its
#: handing-out). A table of the module's, as ``weakref.finalize`` keeps one (no cycle holds an allocator), at a
#: fraction of finalize's cost, paid for every allocation.
_WATCHED: dict[int, tuple[Any, CachingAllocator, Block, int]] = {}


def _watch(anchor: object, allocator: CachingAllocator, block: Block, gen: int) -> None:
    """``allocator.dropped(block, gen)`` once ``anchor`` dies (the allocation's last tensor went)."""
    ref = weakref.ref(anchor, _ended)
    _WATCHED[id(ref)] = (ref, allocator, block, gen)


def _ended(ref: Any) -> None:
    entry = _WATCHED.pop(id(ref), None)
    if entry is not None:
        entry[1].dropped(entry[2], entry[3])


def _weak(callback: Callable[[Segment], None] | None) -> Callable[[], Callable[[Segment], None] | None]:
    """A callback held without holding its object: the memory saver holds the allocator and hooks it with its own
    methods, a cycle that would leave a run's whole memory model to the cycle collector."""
    if callback is None:
        return lambda: None
    owner = getattr(callback, "__self__", None)
    if owner is None:
        return lambda: callback
    # as ``weakref.WeakMethod`` (its bound method again, None once its object died), at a tenth of its cost to make:
    # every run makes two
    ref, func = weakref.ref(owner), callback.__func__  # type: ignore[attr-defined]

    def method() -> Callable[[Segment], None] | None:
        obj = ref()
        return None if obj is None else MethodType(func, obj)

    return method


class _Counts:
    """One process's statistics (each process of a GPU has its own allocator, and counts its own): bytes allocated
    and its peak, reserved and its peak, the active peak, retries and out-of-memory errors."""

    __slots__ = ("active_peak", "allocated", "ooms", "peak", "reserved", "reserved_peak", "retries")

    def __init__(self) -> None:
        self.allocated = self.peak = self.reserved = self.reserved_peak = self.active_peak = 0
        self.retries = self.ooms = 0


def _process(stream: SimStream | None) -> str | None:
    """The process (its host actor's name) whose allocation a block of ``stream``'s is."""
    return stream.process if stream is not None else None


def program_frames() -> list[dict[str, Any]]:
    """The Python stack of the call being made, innermost first, as torch's memory history records it
    (``filename``, ``line``, ``name``), without the simulator's own frames."""
    frames = []
    f: Any = sys._getframe(1)
    while f is not None:
        code = f.f_code
        if not own_file(code.co_filename):
            frames.append({"filename": code.co_filename, "line": f.f_lineno, "name": code.co_name})
        f = f.f_back
    return frames


class History:
    """``torch.cuda.memory._record_memory_history`` of one process (each process of a GPU has its own allocator):
    with ``trace`` (``enabled="all"``), each action of the allocator on its blocks and segments, at most
    ``max_entries`` (the oldest overwritten, as torch's ring buffer does); with ``context``, where the program made
    each allocation (``"state"``: the live ones, for a snapshot's blocks; ``"alloc"``: the history's allocations too;
    ``"all"``: its frees too). An entry's ``stream`` is the simulated stream, its ``time_us`` virtual time."""

    __slots__ = ("context", "entries", "max_entries", "next", "now", "skip", "trace")

    def __init__(self, trace: bool, context: str | None, max_entries: int, skip: Iterable[str],
                 now: Callable[[], int]) -> None:
        self.trace, self.context, self.max_entries = trace, context, max(int(max_entries), 0)
        self.skip = frozenset(skip)
        self.now = now
        self.entries: list[dict[str, Any]] = []
        self.next = 0

    def frames_of(self, action: str) -> bool:
        """Whether ``action`` is recorded with the program's stack (a free's completion: its request's)."""
        if action == "alloc":
            return self.context is not None
        return self.context == "all" and action == "free_requested"

    def add(self, action: str, addr: int, size: int, stream: SimStream | None, frames: list[dict[str, Any]],
            **more: Any) -> None:
        if not self.trace or action in self.skip or not self.max_entries:
            return
        entry = {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": self.now() // 1000,
                 "frames": frames if self.context not in (None, "state") else [], **more}
        if "device_free" in more:  # (an OOM's entry has what the device had free in place of an address)
            del entry["addr"]
        if len(self.entries) < self.max_entries:
            self.entries.append(entry)
        else:
            self.entries[self.next] = entry
            self.next = (self.next + 1) % self.max_entries

    def recorded(self) -> list[dict[str, Any]]:
        """The entries, oldest first."""
        return self.entries[self.next:] + self.entries[:self.next]


class CachingAllocator:
    """Pools of stream-ordered segments and blocks; reuse of freed blocks; ``record_stream``; ``empty_cache``."""

    def __init__(
        self,
        memory: Memory,
        pick: int = 0,
        on_segment: Callable[[Segment], None] | None = None,
        on_release: Callable[[Segment], None] | None = None,
        current: Callable[[], HostActor | None] = lambda: None,
        capacity: int | None = None,
        lazy: bool = False,
        block: Callable[[HostActor, str, Callable[[], bool]], None] | None = None,
        real_sizes: bool = False,
    ) -> None:
        self.memory = memory
        #: CUDA's sizes (``SimConfig.real_sizes``), or 1/1024 of them: the segments' sizes are multiplied by this
        self._scale = REAL if real_sizes else 1
        #: what block sizes are multiples of, and the largest request served from a small segment
        self._round = REAL_ROUND if real_sizes else ROUND
        self._small = SMALL_REQUEST * self._scale
        #: blocks a host actor until a condition holds (``Execution.block``): the host waiting for an event
        self._block = block
        #: segments as address space only (a race-only run: no operation writes them)
        self.lazy = lazy
        #: bytes its segments may take together (None: no bound)
        self.capacity = capacity
        #: ``torch.cuda.set_per_process_memory_fraction``, per process (a host actor's name): the fraction it set,
        #: and the bytes its segments may take together under it (none set: no entry)
        self.fractions: dict[str | None, tuple[float, int]] = {}
        self._reserved = 0
        #: the host actor running now (whoever drops a tensor frees it)
        self._current = current
        #: offset into the best-fit order of fitting free blocks (a schedule choice)
        self.pick = pick
        self.pools: dict[PoolTag, list[Segment]] = {}
        self._segments: list[Segment] = []  # every segment ever made: keeps CPU bytes alive for the run
        self._free = _FreeBlocks()  # the free blocks of live segments
        self._pending: list[_Freed] = []  # blocks whose last tensor died, not yet processed
        self._deferred: list[_Freed] = []  # freed, waiting for the streams recorded with record_stream
        self._by_storage: dict[int, Block] = {}  # live allocations: storage id -> block
        #: bytes of the blocks handed out and not freed since (``stats()``'s ``allocated``, kept as it changes), and
        #: the most of it so far (``max_memory_allocated``: from the run's start)
        self._allocated = 0
        self._peak = 0
        #: the most reserved so far (``max_memory_reserved``)
        self._reserved_peak = 0
        #: the most active (allocated, and freed but held for recorded streams) so far
        self._active_peak = 0
        #: ``memory_stats``' counts: allocations that released the cached segments to retry, and that failed then
        self.alloc_retries = 0
        self.ooms = 0
        #: the same, per process (``stats(process)``)
        self._by: dict[str | None, _Counts] = {}
        #: called when a new segment is made (the memory saver maps a handle) and when one is released
        self._on_segment = _weak(on_segment)
        self._on_release = _weak(on_release)
        #: facts for tests: (pool, block, segment) of every allocation served from a paused segment
        self.served_paused: list[tuple[PoolTag, str, str]] = []
        self.allocations = 0
        self.reused = 0
        #: ``torch.cuda.memory._record_memory_history`` per process (none: nothing recorded, the common case)
        self.histories: dict[str | None, History] = {}
        #: the private pools a CUDA graph or a ``MemPool`` holds (by tag: how many holders), whose segments
        #: ``empty_cache`` keeps; the ids torch gives those pools (by tag), which a snapshot names them by
        self.kept_pools: dict[PoolTag, int] = {}
        self.pool_ids: dict[PoolTag, tuple[int, int]] = {}

    # -- allocation -----------------------------------------------------------------
    def malloc(
        self, like: torch.Tensor, pool: PoolTag, stream: SimStream | None = None, actor: HostActor | None = None,
        pick: int | None = None, backup: bool = False,
    ) -> Allocation:
        """Bytes for a new device tensor shaped like ``like`` from ``pool``, for ``stream``. ``pick`` offsets the
        best-fit choice among fitting blocks (default: the run's). ``backup``: the region backs its contents up (its
        own segments: the memory saver's pool of that tag and setting). A request of no bytes (``empty(0)``) takes
        no block, as CUDA's allocator hands it a null pointer without a ``malloc``: nothing is counted, and no block
        is split off a freed one that the next allocation would have taken."""
        need = like.untyped_storage().nbytes()
        if not need:
            raw = bytes_at(np.zeros(1, np.uint8), 0, 0)[0]  # (a storage of one byte, seen as none)
            return Allocation(None, raw.view(like.dtype).as_strided(like.shape, like.stride()), 0, True)
        self.collect(actor)
        size = max(self._round, _round_up(need, self._round))
        small = size <= self._small
        block = self._take(pool, size, small, stream, self.pick if pick is None else pick, actor, backup)
        self.allocations += 1
        seg = block.segment
        if seg.paused is not None:
            self.served_paused.append((pool, repr(block), seg.label))
        typed = _typed(seg, block, like, need)
        alias = None
        if typed is not None:  # one tensor made for each, not three (a view by dtype, then by shape)
            anchor: object = typed
            data = torch.from_numpy(typed)
            alias = torch.from_numpy(typed.view())  # (a NumPy view's base is the segment's array, not ``typed``)
        else:
            raw, anchor = bytes_at(seg.array(), block.offset, need)
            data = raw.view(like.dtype).as_strided(like.shape, like.stride(), like.storage_offset())
        # torch.from_numpy keeps its array alive as long as the storage made from it (shared by every view)
        # lives: the array's death is the moment the program dropped the allocation
        block.gen += 1
        _watch(anchor, self, block, block.gen)
        fresh, block.fresh = block.fresh, False
        block.requested = need
        if self.histories:
            self._traced(stream, "alloc", block, need)
        self._allocated += block.nbytes
        self._peak = max(self._peak, self._allocated)
        # active: allocated, and the freed blocks held for the streams recorded with them
        active = self._allocated + sum(f.block.nbytes for f in self._deferred) if self._deferred else self._allocated
        self._active_peak = max(self._active_peak, active)
        mine = self._counts(stream)
        mine.allocated += block.nbytes
        mine.peak = max(mine.peak, mine.allocated)
        held = sum(f.block.nbytes for f in self._deferred if _process(f.block.key[2]) == _process(stream)) if (
            self._deferred) else 0
        mine.active_peak = max(mine.active_peak, mine.allocated + held)
        return Allocation(block, data, need, fresh, alias)

    def _counts(self, stream: SimStream | None) -> _Counts:
        """The statistics of the process ``stream`` is of."""
        return self._counts_of(_process(stream))

    def _counts_of(self, process: str | None) -> _Counts:
        counts = self._by.get(process)
        if counts is None:
            counts = self._by[process] = _Counts()
        return counts

    def dropped(self, block: Block, gen: int) -> None:
        """The program dropped the block's last tensor (a finalizer: record where the streams are, nothing more)."""
        if block.gen != gen or block.free:
            return  # released before (untyped_storage().resize_(0)), perhaps handed out again since
        block.gen += 1
        stream = block.key[2]
        if self.histories:
            self._traced(stream, "free_requested", block, block.nbytes)
        uses = [sync.record(u) for u in block.uses] + block.held
        if stream is None:
            self._pending.append(_Freed(block, None, 0, None, uses, user_source()))
            return
        name = stream.name
        epoch = stream.clock.get(name)
        by = self._current()
        clock = sync.free_point(stream, uses, by)
        # (a process of one host thread takes its blocks on that thread, ordered after its own past already)
        host = by.clock.copy() if by is not None and by.threaded else None
        self._pending.append(_Freed(block, name, epoch, clock, uses, user_source(), host))

    @property
    def has_pending(self) -> bool:
        """Whether tensors died whose frees are not processed yet."""
        return bool(self._pending)

    def release(self, st: Storage) -> None:
        """Free ``st``'s block now, though its tensors live on (``untyped_storage().resize_(0)``)."""
        block = self._by_storage.get(st.id)
        if block is not None:
            self.dropped(block, block.gen)

    def bind(self, block: Block, st: Storage) -> None:
        """The allocation made in ``block`` is ``st``."""
        block.storage = st
        self._by_storage[st.id] = block

    def record_stream(self, st: Storage, stream: SimStream) -> None:
        """``t.record_stream(stream)``: the block is not reused before ``stream`` reaches the point of its free."""
        block = self._by_storage.get(st.id)
        if block is not None and stream is not block.segment.stream and stream not in block.uses:
            block.uses.append(stream)

    def segment_of(self, st: Storage) -> Segment | None:
        """The segment of ``st``'s block (the memory one ``cudaMalloc`` made, which one CUDA IPC handle names), while
        ``st`` holds its block."""
        block = self._by_storage.get(st.id)
        return block.segment if block is not None and block.storage is st else None

    def allocated_on(self, st: Storage) -> SimStream | None:
        """The stream ``st``'s block was allocated for (whose pool it is of), while it is a live allocation here."""
        block = self._by_storage.get(st.id)
        return block.key[2] if block is not None else None

    def released_by(self, st: Storage, rec: EventRecord) -> None:
        """A process that received ``st`` over CUDA IPC let go of its last tensor of it: torch's deleter of the
        received storage synchronizes that process's current stream before it counts the reference down
        (``THPStorage_newSharedCuda``), and the sender's block is not reused before (``CudaIPCSentDataLimbo``).
        So its free waits for ``rec``, the receiver's stream then, as for a stream recorded with ``record_stream``."""
        block = self._by_storage.get(st.id)
        if block is not None and block.storage is st:
            block.held.append(rec)

    def fitting(
        self, pool: PoolTag, small: bool, stream: SimStream | None, size: int, backup: bool = False
    ) -> list[Block]:
        """The free blocks a request of ``size`` bytes (small or large) on ``stream`` from ``pool`` may take, in
        best-fit order (size, segment, offset): the blocks of its pool's live segments of its kind made for its
        stream (and of its backup setting)."""
        return self._free.fitting(pool, small, stream, size, backup)

    def _take(self, pool: PoolTag, size: int, small: bool, stream: SimStream | None, pick: int,
              actor: HostActor | None = None, backup: bool = False) -> Block:
        taken = self._free.take(pool, small, stream, size, pick, backup)
        if taken is not None:
            block = taken
            self.reused += 1
        else:
            nbytes = segment_size(size, self._scale)
            self._reserve(nbytes, actor, stream)
            seg = Segment(len(self._segments) + 1, pool, nbytes, small, stream, self.lazy, backup)
            self._segments.append(seg)
            self.pools.setdefault(pool, []).append(seg)
            if self.histories:
                self._traced(stream, "segment_alloc", seg.blocks[0], nbytes)
            on_segment = self._on_segment()
            if on_segment is not None:
                on_segment(seg)
            block = seg.blocks[0]  # (never on the free list)
        # (CUDA's should_split: a large block only where more than a small request's worth would be left)
        tail = self._split(block, size, self._round if small or self._scale == 1 else self._small + 1)
        if tail is not None:
            self._free.add(tail)
        block.free = False
        if block.after is not None:
            if actor is not None:
                sync.handed_on(actor, block.after)
            block.after = None
        return block

    def _reserve(self, nbytes: int, actor: HostActor | None = None, stream: SimStream | None = None) -> None:
        """Room for a new segment of ``nbytes``: past the capacity, the cached segments are released first (as
        CUDA's allocator does before it gives up: ``actor``, the host allocating, waits for the streams recorded with
        freed blocks), then torch.OutOfMemoryError. The bounds: the fraction the program set
        (``set_per_process_memory_fraction``: the allocating process's own segments under the fraction it set),
        then the device's capacity (every process's segments that hold memory: a paused one's was given back)."""
        mine = self._counts(stream)
        fraction = self.fractions.get(_process(stream))

        def used(own: bool) -> int:
            return mine.reserved if own else self.held()

        bounds = [(True, fraction[1])] if fraction is not None else []
        if self.capacity is not None:
            bounds.append((False, self.capacity))
        for own, bound in bounds:
            # (the device's reserved bytes bound what it holds: past those alone is :meth:`held`'s walk of every
            # segment asked for)
            if (mine.reserved if own else self._reserved) + nbytes > bound and used(own) + nbytes > bound:
                self.empty_cache(actor)
                self.alloc_retries += 1
                mine.retries += 1
                if used(own) + nbytes > bound:
                    self.ooms += 1
                    mine.ooms += 1
                    history = self.histories.get(_process(stream))
                    if history is not None:
                        history.add("oom", 0, nbytes, stream, [], device_free=max(bound - used(own), 0))
                    raise torch.OutOfMemoryError(
                        f"simulated device out of memory: tried to allocate {_size(nbytes)}; {_size(used(own))} "
                        f"reserved of {self._bound_text(bound, fraction if own else None)}")
        self._reserved += nbytes
        self._reserved_peak = max(self._reserved_peak, self._reserved)
        mine.reserved += nbytes
        mine.reserved_peak = max(mine.reserved_peak, mine.reserved)

    def held(self) -> int:
        """The device memory the segments hold: every process's reserved bytes but those of paused segments, whose
        physical memory the memory saver released (their addresses stay reserved, and the caching allocator, which
        knows nothing of the pause, still counts them as reserved)."""
        return self._reserved - sum(s.nbytes for s in self._segments if s.paused is not None and not s.released)

    @staticmethod
    def _fraction_text(bound: int, fraction: tuple[float, int]) -> str:
        return f"the {_size(bound)} the process may take (set_per_process_memory_fraction({fraction[0]}))"

    def _bound_text(self, bound: int, fraction: tuple[float, int] | None = None) -> str:
        """The bound an allocation ran past, in an out-of-memory error's words (``fraction``: the process's own)."""
        if fraction is not None:
            return self._fraction_text(bound, fraction)
        return (f"{_size(bound)} (raise it: SimConfig(device_memory=N), or --device-memory on the command line"
                + ("" if self.lazy else "; with --no-values, a race-only run, its bytes cost this machine no memory")
                + ")")

    @staticmethod
    def _split(block: Block, size: int, least: int = ROUND) -> Block | None:
        """Cut ``block`` to ``size``; the free rest, if any (of ``least`` bytes at least)."""
        rest = block.nbytes - size
        if rest >= least:
            seg = block.segment
            tail = Block(seg, block.offset + size, rest, block.fresh)
            if block.after is not None:
                tail.after = block.after.copy()
            seg.blocks.insert(seg.blocks.index(block) + 1, tail)
            block.nbytes = size
            return tail
        return None

    # -- freeing ----------------------------------------------------------------------
    def collect(self, actor: HostActor | None = None) -> None:
        """Process the blocks whose tensors died (:meth:`collect_frees`); then give back the deferred ones whose
        recorded streams are past their free, as the allocation ``actor`` is making sees them: its own process's
        alone (and those of no stream), as another rank's or process's blocks are its own allocator's on a GPU, which
        that process's next allocation queries (given back here, the block went to its process with no edge from the
        recorded stream to the host that saw it done: a race no GPU has)."""
        self.collect_frees()
        if actor is None or not self._deferred:
            return
        owners = (None, actor.process)
        for freed in [f for f in self._deferred
                      if _process(f.block.key[2]) in owners and all(r.done() for r in f.uses)]:
            self._deferred.remove(freed)
            for r in freed.uses:
                sync.host_observes(actor, r)  # the allocator queried the event: the host saw it done
                if actor.threaded:  # (and so does whichever thread of the process takes the block next)
                    _order_after(freed.block, r.clock)
            self._release(freed.block)

    def collect_frees(self) -> None:
        """Each free is an access of its block's stream, checked against the other streams' pending use; then
        the block goes back on its free list (merging free neighbours), or, with streams recorded, waits."""
        while self._pending:
            freed = self._pending.pop(0)
            block = freed.block
            st = block.storage
            if st is not None and freed.clock is not None:
                assert freed.stream is not None
                who = Accessor(freed.stream, freed.epoch, freed.clock, "free", -1, freed.source)
                self.memory.issue_free(who, st)
            if st is not None:
                self._by_storage.pop(st.id, None)
            block.storage = None
            block.uses = []
            block.held = []
            block.after = freed.host  # (a copy of its own)
            self._allocated -= block.nbytes  # (held back for recorded streams or not: no longer allocated)
            self._counts(block.key[2]).allocated -= block.nbytes
            if freed.uses:
                self._deferred.append(freed)
            else:
                self._release(block)

    def _release(self, block: Block) -> None:
        if self.histories:
            self._traced(block.key[2], "free_completed", block, block.nbytes)
        block.free = True
        block.frames = []
        seg = block.segment
        live = not seg.released
        i = seg.blocks.index(block)
        if i + 1 < len(seg.blocks) and seg.blocks[i + 1].free:
            nxt = seg.blocks.pop(i + 1)
            if live:
                self._free.remove(nxt)
            block.nbytes += nxt.nbytes
            block.fresh = block.fresh and nxt.fresh
            if nxt.after is not None:
                _order_after(block, nxt.after)
        if i > 0 and seg.blocks[i - 1].free:
            prev = seg.blocks[i - 1]
            if live:
                self._free.remove(prev)
            prev.nbytes += block.nbytes
            prev.fresh = prev.fresh and block.fresh
            if block.after is not None:
                _order_after(prev, block.after)
            seg.blocks.pop(i)
            block = prev
        if live:
            self._free.add(block)

    def empty_cache(self, actor: HostActor | None = None) -> list[Segment]:
        """Release every entirely free segment (``torch.cuda.empty_cache``) but those of a pool a CUDA graph holds
        (:attr:`kept_pools`); returns them. First, as CUDA's
        allocator does (``synchronize_and_free_events``), the host ``actor`` waits for every stream recorded with a
        freed block to get past the block's free, and gives the block back. With an ``actor``, its own process's
        segments only (and those of no stream): another rank's or process's are its own allocator's on a GPU."""
        self.collect(actor)
        if actor is not None and self._deferred:
            self._synchronize_events(actor)
        owners = (None, actor.process) if actor is not None else None
        released = []
        for pool, segs in self.pools.items():
            if pool in self.kept_pools:
                continue
            for seg in [s for s in segs if s.all_free() and (owners is None or _process(s.stream) in owners)]:
                segs.remove(seg)
                self._free.remove(seg.blocks[0])
                seg.released = True
                if self.histories:
                    self._traced(seg.stream, "segment_free", seg.blocks[0], seg.nbytes)
                self._reserved -= seg.nbytes
                self._counts(seg.stream).reserved -= seg.nbytes
                released.append(seg)
                on_release = self._on_release()
                if on_release is not None:
                    on_release(seg)
            self.pools[pool] = segs
        return released

    def _synchronize_events(self, actor: HostActor) -> None:
        """The host waits for the events of every block of its process held back for its recorded streams
        (``cudaEventSynchronize`` of each), then those blocks are free. (Another rank's or process's blocks are its
        own allocator's on a GPU: neither waited for nor given back.)"""
        held = [f for f in self._deferred if f.block.key[2] is not None and f.block.key[2].process == actor.process]
        records = [r for freed in held for r in freed.uses]
        if self._block is not None:
            self._block(actor, "the streams recorded with freed blocks (empty_cache)",
                        lambda: all(r.done() for r in records))
        elif not all(r.done() for r in records):
            return
        for r in records:
            sync.host_observes(actor, r)
        for freed in held:
            if freed in self._deferred:  # (not given back meanwhile by another actor's allocation)
                self._deferred.remove(freed)
                self._release(freed.block)

    def _traced(self, stream: SimStream | None, action: str, block: Block, size: int) -> None:
        """``action`` on ``block`` (its segment's, for a segment's action) in the memory history of the process of
        ``stream``, if it records one."""
        history = self.histories.get(_process(stream))
        if history is None:
            return
        if action == "free_completed":
            frames, block.freed_at = block.freed_at, []
        else:
            frames = program_frames() if history.frames_of(action) else []
        if action == "alloc" and history.context is not None:
            block.frames = frames
        elif action == "free_requested":
            block.freed_at = frames
        addr = block.segment.address + (0 if action.startswith("segment") else block.offset)
        history.add(action, addr, size, stream, frames)

    def record_history(self, process: str | None, enabled: str | None, context: str | None, max_entries: int,
                       clear: bool, skip: Iterable[str], now: Callable[[], int]) -> None:
        """``torch.cuda.memory._record_memory_history`` of ``process``: start recording (``enabled`` ``"state"``
        or ``"all"``; the entries so far kept unless ``clear``), or stop (None: what was recorded is dropped, as
        torch's allocator drops it)."""
        self.collect_frees()  # (the frees made before, under the setting they were made in)
        old = self.histories.pop(process, None)
        if enabled is None:
            return
        history = History(enabled == "all", context, max_entries, skip, now)
        if old is not None and not clear:
            history.entries = old.recorded()[-history.max_entries:] if history.max_entries else []
        self.histories[process] = history

    def snapshot(self, process: str | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """``torch.cuda.memory._snapshot()`` of ``process``: its live segments, each with its blocks in address
        order (``active_allocated``, ``active_pending_free`` where held back for a recorded stream, ``inactive``), in
        torch's form, and the entries its memory history recorded. A segment's and an entry's ``stream`` is the
        simulated stream (the caller gives its handle); a ``MemPool``'s and a CUDA graph's pool is named by its id, any
        other by its order (``(0, 0)`` the default pool)."""
        self.collect_frees()
        held = {id(f.block) for f in self._deferred}
        pools: dict[PoolTag, tuple[int, int]] = {None: (0, 0)}
        segments = []
        for seg in self._segments:
            if seg.released or _process(seg.stream) != process:
                continue
            pool_id = pools.setdefault(seg.pool, self.pool_ids.get(seg.pool) or (1, len(pools)))
            blocks = []
            for b in seg.blocks:
                state = "inactive" if b.free else "active_pending_free" if id(b) in held else "active_allocated"
                blocks.append({"address": seg.address + b.offset, "size": b.nbytes,
                               "requested_size": 0 if b.free else b.requested, "state": state,
                               "frames": [] if b.free else list(b.frames)})
            allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
            segments.append({
                "device": 0, "address": seg.address, "total_size": seg.nbytes, "stream": seg.stream,
                "segment_type": "small" if seg.small else "large", "segment_pool_id": pool_id,
                "allocated_size": allocated, "active_size": sum(b["size"] for b in blocks if b["state"] != "inactive"),
                "requested_size": sum(b["requested_size"] for b in blocks if b["state"] == "active_allocated"),
                "is_expandable": False, "frames": [], "blocks": blocks})
        history = self.histories.get(process)
        return segments, (history.recorded() if history is not None else [])

    def segments(self, pool: PoolTag) -> list[Segment]:
        return list(self.pools.get(pool, []))

    def live_blocks(self, seg: Segment) -> list[Block]:
        self.collect()
        return [b for b in seg.blocks if not b.free]

    def deferred(self) -> int:
        """Blocks freed but held back for the streams recorded with them."""
        return len(self._deferred)

    def stats(self, process: str | None = None) -> dict[str, int]:
        """Simulated bytes: ``allocated`` (blocks handed out and not freed since: a freed block held back for the
        streams recorded with it is not, as torch counts it), ``peak`` of it since the run began, ``reserved``
        (segments). ``process``: that process's own (its host actor's name; each process of a GPU has its own
        allocator), else every process's together."""
        if process is not None:
            return self._stats_of(process)
        allocated = sum(b.nbytes for seg in self._segments if not seg.released for b in seg.blocks if not b.free)
        held = sum(f.block.nbytes for f in self._deferred)
        allocated -= held
        # the count kept as blocks are handed out and freed (which the peak follows) is the count of the blocks
        if allocated != self._allocated:
            raise AssertionError(f"allocator: {self._allocated} bytes counted allocated, {allocated} in its blocks")
        live = [seg for seg in self._segments if not seg.released]
        reserved = sum(seg.nbytes for seg in live)
        return {"allocated": allocated, "peak": self._peak, "reserved": reserved,
                "reserved_peak": self._reserved_peak, "segments": len(live),
                "blocks": sum(1 for seg in live for b in seg.blocks if not b.free) - len(self._deferred),
                "alloc_retries": self.alloc_retries, "ooms": self.ooms, "active": allocated + held,
                "active_peak": max(self._active_peak, allocated + held)}

    def _stats_of(self, process: str) -> dict[str, int]:
        """:meth:`stats` of one process: its segments (those made for its streams) and its blocks."""
        mine = self._by.get(process) or _Counts()
        live = [seg for seg in self._segments if not seg.released and _process(seg.stream) == process]
        deferred = [f for f in self._deferred if _process(f.block.key[2]) == process]
        held = sum(f.block.nbytes for f in deferred)
        allocated = sum(b.nbytes for seg in live for b in seg.blocks if not b.free) - held
        if allocated != mine.allocated:
            raise AssertionError(f"allocator: {mine.allocated} bytes counted allocated by {process}, {allocated} in "
                                 "its blocks")
        return {"allocated": allocated, "peak": mine.peak, "reserved": sum(seg.nbytes for seg in live),
                "reserved_peak": mine.reserved_peak, "segments": len(live),
                "blocks": sum(1 for seg in live for b in seg.blocks if not b.free) - len(deferred),
                "alloc_retries": mine.retries, "ooms": mine.ooms, "active": allocated + held,
                "active_peak": max(mine.active_peak, allocated + held)}

    def reset_peaks(self, process: str | None = None) -> None:
        """``torch.cuda.reset_peak_memory_stats``: the peaks start again from what is allocated and reserved now
        (``process``'s own, where given)."""
        self.collect_frees()
        if process is not None:
            mine = self._counts_of(process)
            mine.peak, mine.reserved_peak = mine.allocated, mine.reserved
            mine.active_peak = mine.allocated + sum(
                f.block.nbytes for f in self._deferred if _process(f.block.key[2]) == process)
            return
        self._peak, self._reserved_peak = self._allocated, self._reserved
        self._active_peak = self._allocated + sum(f.block.nbytes for f in self._deferred)
