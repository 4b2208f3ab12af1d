"""Storages and byte-range shadow memory.

Every device allocation and every pinned host buffer is a :class:`Storage`:
real CPU tensor data (so a stale read returns stale values) plus a shadow
that keeps, for each byte range, two layers:

- the happens-before layer, updated when an access is *issued* (enqueued on
  a stream, or done by a host step): the last write and the reads since, each
  an :class:`~simdevice.report.Access` with its actor's epoch. A new access
  that conflicts with one its clock has not seen is a :class:`Race`.
- the version layer: every write gets a write id when issued; a range's
  ``issued`` id is the last write the program issued to it, its ``done`` id
  the last write whose data actually landed. A read remembers the ids issued
  before it and compares them with the landed ones when it *executes*; a
  difference is a :class:`StaleRead`.

Views alias: a tensor's byte range is computed from its offset, sizes and
strides within its storage. A strided view with gaps between its bytes (a
column of a matrix, every other element) is checked at its own bytes only, its
pieces (:func:`pieces`); reports name its extent.

Every access goes through one function, :meth:`Memory.issue`, whoever makes
it (a stream operation, a host step touching pinned memory, a collective);
:meth:`Memory.start` checks what an issued access finds when it runs and
:meth:`Memory.finish` lands its writes.
"""

from __future__ import annotations

import bisect
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from simdevice.runtime.clock import VectorClock
from simdevice.runtime.reports import (
    Access,
    AccessKind,
    IllegalAccess,
    Race,
    ReportSink,
    StaleRead,
    UnorderedFree,
)

#: (lo, hi, write id) pieces of a read's expectation
Expectation = list[tuple[int, int, int]]


class _Cell:
    __slots__ = ("done", "issued", "last_write", "reads")

    def __init__(self) -> None:
        self.last_write: Access | None = None
        self.reads: list[Access] = []
        self.issued = 0
        self.done = 0

    def split_copy(self) -> _Cell:
        c = _Cell()
        c.last_write, c.reads, c.issued, c.done = self.last_write, list(self.reads), self.issued, self.done
        return c


class Shadow:
    """The shadow of one piece of memory: a device segment (shared by every allocation made in it, so history
    survives a block's reuse) or a pinned buffer. Cells cover byte ranges; writes are numbered per shadow."""

    def __init__(self, nbytes: int) -> None:
        self._bounds = [0, nbytes]
        self._cells = [_Cell()]
        #: (lo, hi, the write) by write id, in shadow coordinates (id 1 is writes[0])
        self.writes: list[tuple[int, int, Access]] = []
        #: what :meth:`cells` answered, by its arguments, until the next split: a program touches the same ranges
        #: over and over (every access of an operation asks four times), and a split is rare once they are cut
        self._answers: dict[tuple[int, int, int], list[tuple[int, int, _Cell]]] = {}
        #: splits so far: a list of cells :meth:`cells` answered is still the cells over its range while this is
        #: what it was then (an access issued keeps its cells for its execution, :class:`Issued`)
        self.splits = 0

    def _boundary(self, x: int) -> int:
        i = bisect.bisect_left(self._bounds, x)
        if i < len(self._bounds) and self._bounds[i] == x:
            return i
        # x falls inside cell i-1: split it
        self._bounds.insert(i, x)
        self._cells.insert(i, self._cells[i - 1].split_copy())
        self._answers.clear()
        self.splits += 1
        return i

    def cells(self, lo: int, hi: int, off: int = 0) -> list[tuple[int, int, _Cell]]:
        """The cells over ``[lo, hi)`` (shadow coordinates), each with its bounds less ``off`` (a list the caller
        must not change: it is kept for the next call with the same arguments)."""
        key = (lo, hi, off)
        got = self._answers.get(key)
        if got is not None:
            return got
        if hi <= lo:
            return []
        i, j = self._boundary(lo), self._boundary(hi)
        bounds, cells = self._bounds, self._cells
        got = self._answers[key] = [(bounds[k] - off, bounds[k + 1] - off, cells[k]) for k in range(i, j)]
        return got


def bytes_at(array: Any, offset: int, n: int) -> tuple[torch.Tensor, Any]:
    """``n`` bytes from ``offset`` in ``array`` (a segment's bytes, as NumPy's uint8 array), as a tensor with a
    storage of its own, and the object whose death is that storage's (a NumPy view of the array: it lives exactly as
    long as the storage made from it, shared by every view of the tensor)."""
    if n:
        piece = array[offset:offset + n]
        return torch.from_numpy(piece), piece
    piece = array[offset:offset + 1]  # a storage of one byte, seen as none
    return torch.from_numpy(piece)[:0], piece


#: the contiguous byte ranges a strided view covers, in order, where it has gaps between them (None: no gaps)
Pieces = tuple[tuple[int, int], ...] | None

#: the most pieces a view is checked at; past it, its whole extent (conservative: a race on bytes between its
#: pieces may be reported, none is missed)
MAX_PIECES = 4096


def pieces(shape: Any, stride: Any, esize: int, lo: int) -> Pieces:
    """The contiguous byte ranges of a strided view whose first byte is ``lo``, merged and in order, where there is a
    gap between them; None where its bytes are one range (a transpose of a whole tensor) or it has more than
    :data:`MAX_PIECES` of them. The dimensions by stride: those that continue the innermost run make it longer,
    the others place copies of it."""
    dims = sorted((st, sz) for sz, st in zip(shape, stride, strict=True) if sz > 1 and st > 0)
    run, i = esize, 0
    while i < len(dims) and dims[i][0] * esize == run:
        run *= dims[i][1]
        i += 1
    outer = dims[i:]
    if not outer:
        return None
    count = 1
    for _, sz in outer:
        count *= sz
    if count > MAX_PIECES:
        return None
    starts = [lo]
    for st, sz in outer:
        step = st * esize
        starts = [s + k * step for s in starts for k in range(sz)]
    starts.sort()
    merged = [[starts[0], starts[0] + run]]
    for s in starts[1:]:
        if s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], s + run)
        else:
            merged.append([s, s + run])
    return tuple((a, b) for a, b in merged) if len(merged) > 1 else None


def footprint(st: Storage, data: torch.Tensor, mask: torch.Tensor) -> tuple[int, int, Pieces] | None:
    """The bytes of ``st`` that the elements of ``data`` (a view of it) where ``mask`` is True cover: from the
    first to the last, and the contiguous pieces between where there are gaps (as :meth:`Storage.byte_pieces`
    gives a view's); None past :data:`MAX_PIECES` pieces."""
    esize = data.element_size()
    lo = st._start(data)
    coords = mask.nonzero()
    if coords.numel() == 0:
        return lo, lo, None
    offsets = torch.unique((coords * torch.tensor(data.stride(), dtype=torch.int64, device="cpu")).sum(1))
    # runs of consecutive elements: where the next offset is not one more, a run ends
    ends = (offsets[1:] != offsets[:-1] + 1).nonzero().flatten()
    if ends.numel() + 1 > MAX_PIECES:
        return None
    firsts = [int(offsets[0])] + (offsets[ends + 1].tolist() if ends.numel() else [])
    lasts = (offsets[ends].tolist() if ends.numel() else []) + [int(offsets[-1])]
    parts = tuple((lo + a * esize, lo + (b + 1) * esize) for a, b in zip(firsts, lasts, strict=True))
    return parts[0][0], parts[-1][1], (parts if len(parts) > 1 else None)


#: every pinned buffer a run made in this process, by address: its storage (weakly), the registered tensor's dtype,
#: shape, strides and offset, and the process that made it
#: (:meth:`Memory.lookup` makes one a later run still uses pinned memory of that run)
_PINNED_BEFORE: dict[int, tuple[Any, torch.dtype, torch.Size, tuple[int, ...], int, str]] = {}


class Storage:
    """One allocation: device memory, or pinned host memory registered with the simulator."""

    def __init__(
        self, sid: int, kind: str, process: str, data: torch.Tensor | None, shadow: Shadow | None = None,
        offset: int = 0, within: Any = None, size: int = 0, base: int = 0,
    ) -> None:
        self.id = sid
        self.kind = kind
        self.process = process
        self.label = f"{kind}#{sid}"
        self._data = data
        if data is not None:
            storage = data.untyped_storage()
            self.base: int = storage.data_ptr()
            self.nbytes = storage.nbytes()
            self.size = data.nbytes
        else:  # device memory: ``size`` bytes at ``offset`` in ``within`` (its segment's array, at address ``base``
            # here), made into a tensor when first asked for; the array, not the segment, so that no cycle holds it
            assert within is not None
            self.base = base
            self.nbytes = max(size, 1)  # (an empty allocation's tensor has a storage of one byte)
            self.size = size
        self._within = within
        self.shadow = shadow if shadow is not None else Shadow(self.nbytes)
        #: where this storage's bytes start in its shadow
        self.offset = offset
        #: why the storage is not mapped, or None while it is (checked when an operation runs)
        self.unmapped: str | None = None
        #: why the storage has no memory any more (``resize_(0)``), or None: checked when an operation is issued,
        #: since one issued before the release still reads the block it had
        self.released: str | None = None
        #: pinned memory the host gave values as it made it (``zeros``, ``.pin_memory()``): what its bytes held
        #: before any write is no uninitialized memory
        self.made = False

    @property
    def data(self) -> torch.Tensor:
        """The CPU bytes (for device memory, an alias of its block that does not keep the block allocated; made
        when first asked for: most allocations never are)."""
        data = self._data
        if data is None:
            assert self._within is not None
            data = self._data = bytes_at(self._within, self.offset, self.size)[0]
        return data

    def byte_range(self, t: torch.Tensor) -> tuple[int, int]:
        """The bytes of this storage that tensor ``t`` (a view of it) spans: from its first byte to its last."""
        return self.byte_pieces(t)[:2]  # type: ignore[return-value]

    def byte_pieces(self, t: torch.Tensor) -> tuple[int, int, Pieces]:
        """The bytes tensor ``t`` (a view of this storage) spans, ``lo, hi``, and where it has gaps between them (a
        strided view: a column, every other element) the contiguous pieces it covers (:func:`pieces`), else None."""
        n = t.nbytes  # numel() * element_size()
        if n == 0:
            lo = self._start(t)
            return lo, lo, None
        lo = t.data_ptr() - self.base
        if t.is_contiguous():
            return lo, lo + n, None
        esize = t.element_size()
        shape, stride = t.shape, t.stride()
        extent = 1 + sum((s - 1) * st for s, st in zip(shape, stride, strict=True) if s > 0)
        return lo, lo + extent * esize, pieces(shape, stride, esize, lo)

    def alias(self, t: torch.Tensor) -> torch.Tensor:
        """A view of the same bytes as ``t`` (a view of this storage) that does not keep its block allocated:
        what a queued stream operation holds, so that the program's ``del`` frees the block as on a GPU."""
        dtype_view = self.data.view(t.dtype)
        al = dtype_view.as_strided(t.shape, t.stride(), self._start(t) // t.element_size())
        if t.is_conj():  # (a lazily conjugated or negated view: its values are the bytes' conjugate, negation)
            torch._C._set_conj(al, True)
        if t.is_neg():
            torch._C._set_neg(al, True)
        return al

    def _start(self, t: torch.Tensor) -> int:
        """Where ``t``'s first element lies in this storage, in bytes. (An empty tensor's ``data_ptr()`` is 0, not
        its place: from its storage and offset then.)"""
        if t.numel():
            return int(t.data_ptr()) - self.base
        return int(t.untyped_storage().data_ptr()) - self.base + int(t.storage_offset()) * int(t.element_size())

    def cells(self, lo: int, hi: int) -> list[tuple[int, int, _Cell]]:
        """The shadow cells over this storage's bytes ``lo:hi`` (storage coordinates in, storage coordinates out)."""
        off = self.offset
        shadow = self.shadow
        # (the shadow's kept answer asked here first: four of these come with every operation)
        got = shadow._answers.get((off + lo, off + hi, off))
        return got if got is not None else shadow.cells(off + lo, off + hi, off)


#: what an access touches: a storage and the CPU view of its bytes that the access covers
Ref = tuple["Storage", torch.Tensor]


def nbytes(refs: list[Ref] | tuple[Ref, ...]) -> int:
    """The bytes the tensors of ``refs`` span."""
    n = 0
    for _, d in refs:
        n += d.numel() * d.element_size()
    return n


class Accessor(NamedTuple):
    """Who makes an access, and where: the facts every access of one operation or host step shares (a named
    tuple: made for every operation, it costs a third of a frozen attrs class)."""

    actor: str
    #: ``actor``'s own vector-clock component at the access
    epoch: int
    #: ``actor``'s clock at the access: what happened before it
    clock: VectorClock
    op: str
    #: the operation's index on its actor, as schedules count them (-1 for uncounted); it hides the tuple's index()
    index: int  # type: ignore[assignment]
    source: str
    #: "stream" for a stream operation, "host" for a host step ("thread": one of a thread the program started)
    on: str = "stream"


class Issued:
    """The accesses of one operation, issued: reads with the versions they expect, writes with their ids; for a
    sweeping copy, the landing copies it follows (their ``Issued``, found at its start: :meth:`Memory.start`).

    A landing copy that can land part of its bytes before it completes (``early``: NCCL's one-rank copy, whose
    bytes are known when it starts) lets a copy that trails it over a part and completes first read that part:
    the reader's ``pending`` parts land at its completion (:meth:`Memory.finish`), and the writer's completion
    leaves what it ``landed_early`` as it is then."""

    __slots__ = ("early", "follows", "landed_early", "pending", "reads", "writes")

    def __init__(self) -> None:
        #: each read with the write ids it expects, each write with its id; each with the shadow cells it was issued
        #: on and the shadow's ``splits`` then: where no split came since, its execution finds the same cells there
        self.reads: list[tuple[Storage, Access, Expectation, list[tuple[int, int, _Cell]], int]] = []
        self.writes: list[tuple[Storage, Access, int, list[tuple[int, int, _Cell]], int]] = []
        # (these three are tuples, grown only where a copy trails another: most operations never touch them)
        self.follows: tuple[Issued, ...] = ()
        #: a writer's: land its bytes ``[lo, hi)`` of a storage now (storage coordinates), data only
        self.early: Callable[[Storage, int, int], None] | None = None
        #: a reader's: parts of writers it trails that land at its completion (writer, storage, lo, hi, write id)
        self.pending: tuple[tuple[Issued, Storage, int, int, int], ...] = ()
        #: a writer's: the parts it landed before its completion (storage, lo, hi)
        self.landed_early: tuple[tuple[Storage, int, int], ...] = ()


#: a copy landing: the shadow's id and the write's id -> (its Issued, start, end, first byte, end byte in the
#: shadow's coordinates)
_Landing = tuple[Issued, int, int, int, int]


def trails(writer: tuple[int, int, int, int], reader: tuple[int, int, int, int], lo: int, hi: int) -> bool:
    """Whether a copy ``reader`` (start, end, first byte, end byte) reaches every byte of ``[lo, hi)`` no earlier
    than a copy ``writer`` writes it, each moving its bytes in order at a constant rate: the byte at ``b`` is
    reached at ``start + (b - first) * (end - start) / (last - first)``. Both are linear in ``b``, so the two
    ends of the range decide (exact, in integers)."""
    ws, we, wlo, whi = writer
    rs, re_, rlo, rhi = reader
    wl, rl = max(whi - wlo, 1), max(rhi - rlo, 1)
    return all((ws * wl + (b - wlo) * (we - ws)) * rl <= (rs * rl + (b - rlo) * (re_ - rs)) * wl for b in (lo, hi))


def ranges_without(lo: int, hi: int, cut: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``[lo, hi)`` less the ranges ``cut``, as ranges in order."""
    out = [(lo, hi)]
    for a, b in cut:
        out = [piece for x, y in out for piece in ((x, min(y, a)), (max(x, b), y)) if piece[0] < piece[1]]
    return out


def span(t: torch.Tensor) -> tuple[int, int]:
    """The bytes of ``t``'s storage (a view's is its base's: conservative)."""
    st = t.untyped_storage()
    lo = int(st.data_ptr())
    return lo, lo + int(st.nbytes())


def overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Whether two byte spans (lo, hi) share a byte."""
    return a[0] < b[1] and b[0] < a[1]


class Reading:
    """The inputs of one operation in flight that reads them when it completes (see :class:`InFlight`)."""

    __slots__ = ("_spans", "follows", "inputs", "snaps")

    def __init__(self, inputs: list[torch.Tensor]) -> None:
        self.inputs = inputs
        self._spans: list[tuple[int, int]] | None = None
        #: the landing copies this one trails (their ``Issued``): their writes are what it reads
        self.follows: tuple[Issued, ...] = ()
        #: id of an input -> its bytes as they were when the operation started (taken before they changed)
        self.snaps: dict[int, torch.Tensor] = {}

    @property
    def spans(self) -> list[tuple[int, int]]:
        """The inputs' byte spans (:func:`span`), found when a write first lands while it is in flight."""
        if self._spans is None:
            self._spans = [span(x) for x in self.inputs]
        return self._spans


class InFlight:
    """Operations in flight that read their inputs when they complete, not when they start.

    A stream operation reads its inputs at its start and lands its writes at its completion. Computing it at the
    start needs its result held until the completion: a copy of the whole destination for an in-place operation
    (a 1 GiB ``mul_`` cost 1 GiB more). Computed at the completion instead, it finds the inputs it would have
    read at the start unless some write landed on their bytes in between, which only a racing program does; so
    every write that lands (an operation's completion, a host step on pinned memory, a collective's receive, a
    pause's poison) first calls :meth:`before_write`, which copies the inputs it is about to change for the
    operations in flight that read them. The values every read sees are those of the start-time rule, race or
    not; the copy is paid where two accesses race, not for every in-place operation.
    """

    def __init__(self) -> None:
        self._reading: list[Reading] = []
        #: the operation whose writes are landing now (set by :meth:`Memory.finish`, cleared after its effects):
        #: a reader that follows it (a copy trailing a copy) keeps no older copy of what it writes
        self.landing: Issued | None = None
        #: what the operation starting now follows (set by :meth:`Memory.start`'s caller, taken by :meth:`open`)
        self.starting: Issued | None = None
        #: False in a race-only run (``SimConfig.values``): no bytes move, so nothing is kept for a reader
        self.values = True

    def open(self, inputs: list[torch.Tensor]) -> Reading:
        r = Reading(inputs)
        if self.starting is not None:
            r.follows = self.starting.follows
        self._reading.append(r)
        return r

    def close(self, r: Reading) -> None:
        self._reading.remove(r)

    def before_write(self, tensors: list[torch.Tensor]) -> None:
        """Bytes of ``tensors`` are about to be written: keep, for each operation in flight reading them, what
        they hold now."""
        if not self._reading or not tensors or not self.values:
            return
        spans = [span(t) for t in tensors]
        landing = self.landing
        for r in self._reading:
            if landing is not None and landing in r.follows:
                continue  # it trails this copy: it reads what lands now
            for x, sp in zip(r.inputs, r.spans, strict=True):
                if id(x) not in r.snaps and any(overlap(sp, w) for w in spans):
                    r.snaps[id(x)] = x.clone()


#: what :meth:`Memory.issue_free` keeps of a free's access: (actor, epoch, op, index, source, on, storage, lo, hi, seq)
_FreeFacts = tuple[str, int, str, int, str, str, str, int, int, int]


def _free_access(facts: _FreeFacts) -> Access:
    """A free's :class:`Access` (kind ``free``) from what :meth:`Memory.issue_free` kept of it."""
    actor, epoch, op, index, source, on, storage, lo, hi, seq = facts
    return Access(actor, epoch, op, index, "free", storage, lo, hi, source, 0, on, seq)


def _cells_for(st: Storage, access: Access) -> list[tuple[int, int, _Cell]]:
    """The shadow cells an access of ``st`` covers (storage coordinates): over its range, or its pieces' (a shadow's
    kept answer asked first, as :meth:`Storage.cells` does: two of these come with every in-place operation)."""
    if access.pieces is None:
        off = st.offset
        return st.shadow._answers.get((off + access.lo, off + access.hi, off)) or st.cells(access.lo, access.hi)
    return _cells_of(st, access.pieces)


def _cells_of(st: Storage, parts: tuple[tuple[int, int], ...]) -> list[tuple[int, int, _Cell]]:
    """The shadow cells over the pieces of a strided view (storage coordinates), in order."""
    out: list[tuple[int, int, _Cell]] = []
    for lo, hi in parts:
        out += st.cells(lo, hi)
    return out


class Memory:
    """All storages of one simulation, and the checks run against their shadows."""

    def __init__(self, reports: ReportSink) -> None:
        self.storages: dict[int, Storage] = {}
        #: pageable host memory shared between processes (``share_memory_``) by address, which the simulator tracks
        #: as it tracks pinned memory (:meth:`lookup_host`): two processes' hosts reach it with no device between
        self.shared: dict[int, Storage] = {}
        self._next_id = 0
        self.reports = reports
        self._seen_races: set[tuple[str, int, str, int, str]] = set()
        #: allocation label -> the free that handed its block on, as the facts of its access (:meth:`_free_access`
        #: makes it where a report names it: most frees are never named)
        self._frees: dict[str, _FreeFacts] = {}
        #: frees with another stream's access not ordered before them (see :class:`UnorderedFree`)
        self.unordered_frees: list[UnorderedFree] = []
        self._seen_frees: set[tuple[str, str, str]] = set()
        #: actor (a stream, or a host on pinned memory) -> the storages it accessed
        self.touched: dict[str, set[int]] = {}
        #: operations and host steps issued so far (each access carries its operation's count: issue order)
        self.issues = 0
        #: whether any storage was released with ``resize_(0)`` (:meth:`release`): only then is an access checked
        #: for one
        self.released = False
        #: operations in flight that read their inputs at completion (every write that lands tells it first)
        self.in_flight = InFlight()
        #: copies in flight, by the writes they are landing (see :meth:`start`)
        self._landing: dict[tuple[int, int], _Landing] = {}
        #: the bytes the next issue's accesses of a tensor cover where they are fewer than its view's (an indexed
        #: write's destination: ``index_copy_`` writes the rows its index names), by the id of its CPU view
        self.narrowed: dict[int, tuple[int, int, Pieces]] = {}

    # -- allocation ------------------------------------------------------------
    def register(
        self, data: torch.Tensor | None, kind: str, process: str, shadow: Shadow | None = None, offset: int = 0,
        within: Any = None, size: int = 0, base: int = 0,
    ) -> Storage:
        """A new storage over ``data``: device memory lives in its segment's shadow at ``offset`` (where ``data`` is
        None, its bytes are the ``size`` at ``offset`` in ``within``, the segment's array at address ``base``);
        pinned memory gets a shadow of its own and is found again by address (:meth:`lookup`)."""
        self._next_id += 1
        st = Storage(self._next_id, kind, process, data, shadow, offset, within, size, base)
        if kind == "pinned":
            self.storages[st.base] = st
            assert data is not None
            # (the storage's Python object lives while any tensor of it does; the registered tensor may not)
            _PINNED_BEFORE[st.base] = (
                weakref.ref(data.untyped_storage(), lambda _, at=st.base: _PINNED_BEFORE.pop(at, None)),
                data.dtype, data.shape, data.stride(), data.storage_offset(), process)
        return st

    def release(self, st: Storage, why: str) -> None:
        """``st`` has no memory any more (``resize_(0)``): an access issued from now is an illegal access, ``why``."""
        st.released = why
        self.released = True

    def lookup(self, t: torch.Tensor) -> Storage | None:
        """The pinned storage of a plain CPU tensor, if the simulator owns it. Pinned memory an earlier run made (a
        pool the program keeps across runs) is pinned memory of this run too, from its first use here, as it still
        is on a GPU: its values are what the earlier run left."""
        if not _PINNED_BEFORE or not t.is_cpu:  # (no run made pinned memory in this process yet)
            return None
        # A registered storage keeps its bytes alive, so its address cannot be reused meanwhile.
        try:
            ptr = t.untyped_storage().data_ptr()
        except NotImplementedError:  # a tensor without a storage of its own (sparse): never pinned memory here
            return None
        st = self.storages.get(ptr)
        if st is not None:
            if st.kind != "pinned":
                return None
            if st.data.untyped_storage().data_ptr() != ptr:
                # moved since: ``share_memory_`` (also as torch sends a host tensor to another process) copies the
                # bytes into shared memory, pageable, and frees the pinned block, whose address may be another
                # buffer's now
                del self.storages[ptr]
                return None
            return st
        before = _PINNED_BEFORE.get(ptr)
        if before is None:
            return None
        storage, dtype, shape, stride, offset, process = before
        kept = storage()
        if kept is None or kept.data_ptr() != ptr:  # freed since (the address may be another buffer's now)
            del _PINNED_BEFORE[ptr]
            return None
        with torch._C._DisableTorchDispatch():  # (made here, not an operation of the program's)
            data = torch.empty(0, dtype=dtype, device="cpu").set_(kept, offset, shape, stride)
        st = self.register(data, "pinned", process)
        st.made = True
        return st

    def unregister_pinned(self, ptr: int) -> bool:
        """The pinned storage at address ``ptr`` is pageable memory from now on (``cudaHostUnregister``); whether
        there was one."""
        st = self.storages.get(ptr)
        if st is None or st.kind != "pinned":
            return False
        del self.storages[ptr]
        _PINNED_BEFORE.pop(ptr, None)
        return True

    def register_shared(self, data: torch.Tensor, process: str) -> Storage:
        """Pageable host memory shared between processes (``data`` over all of its storage's bytes), tracked from now
        on: what it holds is the values it was made with."""
        st = self.register(data, "shared", process)
        st.made = True
        self.shared[st.base] = st
        return st

    def lookup_host(self, t: torch.Tensor) -> Storage | None:
        """The storage of a plain CPU tensor the simulator tracks: pinned memory (:meth:`lookup`), or pageable memory
        shared between processes (:meth:`register_shared`)."""
        if self.shared and t.is_cpu:
            try:
                ptr = t.untyped_storage().data_ptr()
            except NotImplementedError:  # (a tensor without a storage of its own: sparse)
                return None
            st = self.shared.get(ptr)
            if st is not None:
                return st
        return self.lookup(t)

    @staticmethod
    def landed(st: Storage, data: torch.Tensor) -> bool:
        """Whether every write issued to the bytes of ``data`` (a view of ``st``) has landed: its CPU bytes are
        what an operation issued now reads, unless a write issued later races with it."""
        lo, hi = st.byte_range(data)
        return all(cell.done == cell.issued for _, _, cell in st.cells(lo, hi))

    # -- the one way an access is made ---------------------------------------------
    def issue(self, who: Accessor, reads: list[Ref], writes: list[Ref]) -> Issued:
        """Record the reads and writes of one operation or host step in the happens-before layer."""
        self.issues += 1
        issued = Issued()
        if self.released:
            for st, _ in (*reads, *writes):
                if st.released is not None:  # an access to a storage released with resize_(0): reported, not made
                    reads = self._allocated(who, "read", reads)
                    writes = self._allocated(who, "write", writes)
                    break
        actor, epoch, clock, op, index, source, on = who
        seen = self.touched.get(actor)
        if seen is None:
            seen = self.touched[actor] = set()
        seq = self.issues
        # (as _access, inline: two or more of these come with every operation)
        last: torch.Tensor | None = None
        last_range: tuple[int, int, Pieces] = (0, 0, None)
        narrowed = self.narrowed
        for st, data in reads:
            seen.add(st.id)
            lo, hi, parts = last_range = narrowed[id(data)] if narrowed and id(data) in narrowed else (
                st.byte_pieces(data))
            last = data
            acc = Access(actor, epoch, op, index, "read", st.label, lo, hi, source, 0, on, seq, parts)
            issued.reads.append(self.issue_read(st, acc, clock))
        for st, data in writes:
            seen.add(st.id)
            # an in-place op's destination is its last read too: its range is known (that read's, not the range of
            # the write before: a list op's destinations are each their own)
            lo, hi, parts = last_range if data is last else (
                narrowed[id(data)] if narrowed and id(data) in narrowed else st.byte_pieces(data))
            acc = Access(actor, epoch, op, index, "write", st.label, lo, hi, source, 0, on, seq, parts)
            issued.writes.append(self.issue_write(st, acc, clock))
        return issued

    def _allocated(self, who: Accessor, kind: AccessKind, refs: list[Ref]) -> list[Ref]:
        """The refs whose storage still has memory; an access to a released one is an illegal access, unless it
        touches no byte (a tensor of no elements: a GPU's kernel reads nothing of it, or none is launched)."""
        kept = []
        for st, data in refs:
            if st.released is None:
                kept.append((st, data))
            elif data.nbytes:
                access = self._access(who, kind, st, data)
                self.reports.add(IllegalAccess(access=access, allocation=st.label, reason=st.released))
        return kept

    def _access(self, who: Accessor, kind: AccessKind, st: Storage, data: torch.Tensor) -> Access:
        lo, hi = st.byte_range(data)
        actor, epoch, _, op, index, source, on = who  # (unpacked once: a named tuple's fields are properties)
        return Access(actor, epoch, op, index, kind, st.label, lo, hi, source, 0, on, self.issues)

    def start(self, issued: Issued, now: int, until: int | None = None, sweeps: bool = False) -> None:
        """The operation runs (until ``until``): its reads see what has landed by now; unmapped memory is an illegal
        access. ``sweeps``: it is a copy that reads its source at its completion.

        A copy moves its bytes in order at a constant rate, so a copy that starts while another copy is still
        writing its source sees that copy's bytes where it never overtakes it: it reaches each byte no earlier
        than the writer wrote it (:func:`trails`) and completes after the writer landed. Such a read is not
        stale, and since a sweeping copy reads its source at its completion (after the writer landed), it gets
        the writer's data: ``follows`` names the writer, so that :class:`InFlight` keeps no older copy for it. A
        copy the reader would overtake, a kernel on either side, or a writer that has not started yet: the
        reader sees what had landed when it started, as before."""
        end = now if until is None else until
        for st, access, expected, cells, splits in issued.reads:
            if st.unmapped is None or self.check_mapped(st, access):
                if splits == st.shadow.splits and len(cells) == len(expected):
                    # the cells it was issued on, each its own piece of the expectation (in order)
                    for (lo, hi, wid), (_, _, cell) in zip(expected, cells, strict=True):
                        if cell.done != wid and not (sweeps and self._trails(st, access, wid, lo, hi, issued, now,
                                                                             end)):
                            self.reports.add(self._stale(st, access, wid, cell.done, now, lo, hi))
                            break
                else:
                    self.execute_read(st, access, expected, now, issued if sweeps else None, end)
        for st, access, wid, _, _ in issued.writes:
            if st.unmapped is not None:
                self.check_mapped(st, access)
            if sweeps and until is not None:
                base = st.offset
                self._landing[(id(st.shadow), wid)] = (issued, now, until, base + access.lo, base + access.hi)

    def finish(self, issued: Issued) -> None:
        """The operation completed: the parts of copies it trails that it needs land first (see :class:`Issued`),
        then its writes land (but for what landed early: the bytes there are those written since)."""
        if issued.pending:
            for writer, st, lo, hi, wid in issued.pending:
                if (id(st.shadow), wid) in self._landing and writer.early is not None:
                    self.in_flight.landing = writer  # what follows it reads what lands; the others keep theirs
                    writer.early(st, lo, hi)
                    self.execute_write(st, lo, hi, wid)
                    writer.landed_early += ((st, lo, hi),)
            issued.pending = ()
        early = issued.landed_early
        for st, access, wid, cells, splits in issued.writes:
            if not early and access.pieces is None:
                if splits == st.shadow.splits:  # the cells it was issued on are its bytes' cells still
                    for _, _, cell in cells:
                        cell.done = wid
                else:
                    self.execute_write(st, access.lo, access.hi, wid)
            else:
                cut = [(a, b) for s, a, b in early if s is st]
                for plo, phi in access.pieces or ((access.lo, access.hi),):
                    for lo, hi in ranges_without(plo, phi, cut):
                        self.execute_write(st, lo, hi, wid)
            if self._landing:
                self._landing.pop((id(st.shadow), wid), None)
        self.in_flight.landing = issued

    # -- the happens-before layer (at issue) -------------------------------------
    def _race(self, cur: Access, prev: Access) -> None:
        key = (prev.actor, prev.index, cur.actor, cur.index, cur.storage)
        if key in self._seen_races:
            return
        self._seen_races.add(key)
        # (a pause unmaps a whole segment: another storage's bytes, but no free handed them on)
        free = self._frees.get(prev.storage) if prev.storage != cur.storage and "unmap" not in (
            cur.kind, prev.kind) else None
        freed = _free_access(free) if free is not None else None
        self.reports.add(Race(current=cur, previous=prev, freed=freed))

    def issue_read(
        self, st: Storage, access: Access, clock: VectorClock
    ) -> tuple[Storage, Access, Expectation, list[tuple[int, int, _Cell]], int]:
        """A read issued: checked against the writes it is not ordered after; with what it expects (the write ids
        over its bytes), the cells it was issued on and the shadow's splits then (an :class:`Issued` read)."""
        expected: Expectation = []
        actor = access.actor
        cells = _cells_for(st, access)
        for lo, hi, cell in cells:
            lw = cell.last_write
            if lw is not None and lw.actor != actor and not clock.happens_before(lw.actor, lw.epoch):
                self._race(access, lw)
            # A later read by the same actor subsumes its earlier ones (program order), so keep one per actor.
            reads = cell.reads
            if reads:
                cell.reads = reads = [r for r in reads if r.actor != actor]
                reads.append(access)
            else:
                cell.reads = [access]
            if expected and expected[-1][2] == cell.issued and expected[-1][1] == lo:
                expected[-1] = (expected[-1][0], hi, cell.issued)
            else:
                expected.append((lo, hi, cell.issued))
        return st, access, expected, cells, st.shadow.splits

    def issue_write(
        self, st: Storage, access: Access, clock: VectorClock
    ) -> tuple[Storage, Access, int, list[tuple[int, int, _Cell]], int]:
        """A write issued: checked against the accesses it is not ordered after; with its write id, the cells it was
        issued on and the shadow's splits then (an :class:`Issued` write)."""
        shadow, off, actor = st.shadow, st.offset, access.actor
        shadow.writes.append((off + access.lo, off + access.hi, access))
        wid = len(shadow.writes)
        cells = _cells_for(st, access)
        for _, _, cell in cells:
            lw = cell.last_write
            if lw is not None and lw.actor != actor and not clock.happens_before(lw.actor, lw.epoch):
                self._race(access, lw)
            for r in cell.reads:
                if r.actor != actor and not clock.happens_before(r.actor, r.epoch):
                    self._race(access, r)
            cell.last_write = access
            cell.reads = []
            cell.issued = wid
        return st, access, wid, cells, shadow.splits

    # -- the version layer (at execution) -----------------------------------------
    def check_mapped(self, st: Storage, access: Access) -> bool:
        """Whether the access touches mapped memory (or no byte at all); else an illegal access, reported."""
        if st.unmapped is None or access.lo == access.hi:
            return True
        self.reports.add(IllegalAccess(access=access, allocation=st.label, reason=st.unmapped))
        return False

    def execute_read(self, st: Storage, access: Access, expected: Expectation, now: int,
                     sweeping: Issued | None = None, end: int = 0) -> None:
        for elo, ehi, wid in expected:
            for lo, hi, cell in st.cells(elo, ehi):
                if cell.done != wid and not (sweeping is not None and self._trails(st, access, wid, lo, hi,
                                                                                   sweeping, now, end)):
                    self.reports.add(self._stale(st, access, wid, cell.done, now, lo, hi))
                    return

    def _trails(self, st: Storage, access: Access, wid: int, lo: int, hi: int, reader: Issued, now: int,
                end: int) -> bool:
        """Whether the sweeping ``reader`` follows the copy landing write ``wid`` over ``[lo, hi)`` and completes
        after it lands (strictly); if so it is noted in ``reader.follows``."""
        landing = self._landing.get((id(st.shadow), wid))
        if landing is None:
            return False
        writer, ws, we, wlo, whi = landing
        base = st.offset
        if not trails((ws, we, wlo, whi), (now, end, base + access.lo, base + access.hi), base + lo, base + hi):
            return False
        # it completes after the writer lands, or (a writer that can) the part it read lands at its completion: at
        # the same moment the event order could put the reader first, and it would read the old bytes
        if we >= end:
            if writer.early is None:
                return False
            reader.pending += ((writer, st, lo, hi, wid),)
        if writer not in reader.follows:
            reader.follows += (writer,)
        return True

    def _stale(self, st: Storage, access: Access, expected: int, seen: int, now: int, lo: int, hi: int) -> StaleRead:
        """The stale read of ``access`` over bytes ``lo:hi`` (storage coordinates), where it saw write ``seen`` and
        the program had issued ``expected``: how many writes it is stale by is counted over those bytes (another part
        of the read may have seen what it expected)."""
        writes = st.shadow.writes
        lo, hi = st.offset + lo, st.offset + hi
        if seen < expected:
            stale_by = sum(1 for wlo, whi, _ in writes[seen:expected] if wlo < hi and lo < whi)
        else:
            stale_by = -sum(1 for wlo, whi, _ in writes[expected:seen] if wlo < hi and lo < whi)
        return StaleRead(
            read=access,
            expected=writes[expected - 1][2] if expected else None,
            seen=writes[seen - 1][2] if seen else None,
            stale_by=stale_by,
            time_ns=now,
            before="the values the host made it with" if st.made else "uninitialized memory",
        )

    def issue_unmap(self, who: Accessor, segments: list[tuple[str, Shadow, int]]) -> None:
        """A memory-saver pause unmaps each of ``segments`` (its label, its shadow, its size): checked in the
        happens-before layer as a write of all its bytes (kind ``unmap``), so that an access a stream issued before
        it and the host did not wait for (one that may still be in flight), of a live allocation or of a freed
        block alike, is a :class:`Race` naming the pause. Nothing is recorded: the bytes keep their history and
        versions (what the pause does to the contents is the memory saver's, at the device's side)."""
        self.issues += 1
        actor, epoch, clock, op, index, source, on = who
        for label, shadow, size in segments:
            acc = Access(actor, epoch, op, index, "unmap", label, 0, size, source, 0, on, self.issues)
            for _, _, cell in shadow.cells(0, size):
                lw = cell.last_write
                if lw is not None and lw.actor != actor and not clock.happens_before(lw.actor, lw.epoch):
                    self._race(acc, lw)
                for r in cell.reads:
                    if r.actor != actor and not clock.happens_before(r.actor, r.epoch):
                        self._race(acc, r)

    def issue_free(self, who: Accessor, st: Storage) -> None:
        """The program dropped allocation ``st``: from here its block may be handed on. Not an access: the bytes
        keep their history, so a new owner's access that another stream's pending one is not ordered with is the
        race (naming this free). An access of another stream that the free is not ordered after is kept as an
        :class:`UnorderedFree` (the run's notes name those no reuse turned into a race)."""
        lo, hi = 0, st.size  # (st.byte_range(st.data): all of its bytes)
        actor, epoch, clock, op, index, source, on = who
        free = self._frees[st.label] = (actor, epoch, op, index, source, on, st.label, lo, hi, self.issues)
        for _, _, cell in st.cells(lo, hi):
            pending = [r for r in cell.reads if r.actor != actor]
            lw = cell.last_write
            if lw is not None and lw.actor != actor and lw.storage == st.label:
                pending.append(lw)
            for other in pending:
                if other.storage != st.label or clock.happens_before(other.actor, other.epoch):
                    continue
                key = (source, other.actor, other.source)
                if key not in self._seen_frees:
                    self._seen_frees.add(key)
                    self.unordered_frees.append(UnorderedFree(_free_access(free), other))

    def execute_write(self, st: Storage, lo: int, hi: int, wid: int) -> None:
        for _, _, cell in st.cells(lo, hi):
            cell.done = wid
