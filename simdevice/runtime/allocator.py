"""The caching allocator of the simulated device: pools, segments, blocks, reuse.

It follows PyTorch's CUDA caching allocator closely enough for the memory
saver's hazards to appear as they do on a GPU:

- A *pool* per memory-saver region tag (``"train"``), plus the ordinary pool
  (tag ``None``) used outside any region and inside ``disable()``.
- A *segment* is one underlying device allocation (one ``cudaMalloc``, one
  memory-saver handle). Sizes scale like the real allocator's, in simulated
  bytes (one simulated byte stands for ``SimConfig.byte_scale`` real ones):
  requests up to 1 KiB share 2 KiB "small" segments, requests below 10 KiB get
  a 20 KiB segment, larger ones are rounded up to 2 KiB.
- A *block* is a piece of a segment. A request takes a free block of its pool
  (same small/large kind) that fits, splitting off the rest; a freed block goes
  back to the free list and merges with free neighbours. The choice among the
  fitting blocks is best fit, offset by the schedule's ``pick`` configuration
  value (so reuse choices come from the schedule, not from memory pressure).
- The allocator knows nothing of pausing: free blocks of a paused segment
  stay on the free list and can be handed out. Such a block is unmapped from
  birth (``Storage.unmapped``), so its first use is an illegal access.
- ``empty_cache()`` releases segments that are entirely free (the memory saver
  then frees their handle: see :mod:`simdevice.runtime.memsaver`).

A device tensor's bytes are a CPU alias of its block (``torch.frombuffer`` over
the segment's address), with a storage of its own: when the program drops the
last tensor or view of an allocation, a ``weakref`` finalizer returns the block,
as ``del t`` does with the caching allocator. The storage record kept by
:class:`~simdevice.runtime.memory.Memory` is a second alias, so it does not keep the
block alive. Segments' CPU bytes are never given back during a run, so no alias
ever dangles.
"""

from __future__ import annotations

import ctypes
import weakref
from collections.abc import Callable

import torch

from simdevice.runtime.memory import Memory, Storage

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


def _round_up(n: int, k: int) -> int:
    return (n + k - 1) // k * k


def segment_size(nbytes: int) -> int:
    """The size of the segment the caching allocator makes for a request it cannot serve from cache."""
    if nbytes <= SMALL_REQUEST:
        return SMALL_SEGMENT
    if nbytes < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return _round_up(nbytes, ROUND_LARGE)


class Block:
    __slots__ = ("free", "nbytes", "offset", "segment", "storage")

    def __init__(self, segment: Segment, offset: int, nbytes: int) -> None:
        self.segment, self.offset, self.nbytes = segment, offset, nbytes
        self.free = True
        self.storage: Storage | None = None

    def __repr__(self) -> str:
        return f"block {self.segment.label}+{self.offset}"


class Segment:
    """One underlying allocation: its CPU bytes, its blocks, and its memory-saver state."""

    def __init__(self, sid: int, pool: PoolTag, nbytes: int, small: bool) -> None:
        self.id, self.pool, self.nbytes, self.small = sid, pool, nbytes, small
        self.label = f"seg#{sid}"
        self.data = torch.empty(nbytes, dtype=torch.uint8)
        self.blocks: list[Block] = [Block(self, 0, nbytes)]
        #: the physical handle mapped at this segment's addresses (None while paused)
        self.handle: int | None = None
        #: the handle the last pause released (what a buggy free would release again)
        self.last_handle: int | None = None
        #: why the segment is unmapped (the pause), or None while mapped
        self.paused: str | None = None
        self.released = False

    @property
    def address(self) -> int:
        return int(self.data.data_ptr())

    def all_free(self) -> bool:
        return len(self.blocks) == 1 and self.blocks[0].free


class CachingAllocator:
    """Pools of segments and blocks; reuse of freed blocks; ``empty_cache``."""

    def __init__(
        self,
        memory: Memory,
        pick: int = 0,
        on_segment: Callable[[Segment], None] | None = None,
        on_release: Callable[[Segment], None] | None = None,
    ) -> None:
        self.memory = memory
        #: offset into the best-fit order of fitting free blocks (a schedule choice)
        self.pick = pick
        self.pools: dict[PoolTag, list[Segment]] = {}
        self._segments: list[Segment] = []  # every segment ever made: keeps CPU bytes alive for the run
        self._pending: list[Block] = []  # blocks whose last tensor died, not yet back on the free list
        #: called when a new segment is made (the memory saver maps a handle) and when one is released
        self._on_segment = on_segment
        self._on_release = on_release
        #: facts for tests: (pool, block, segment) of every allocation served from a paused segment
        self.served_paused: list[tuple[PoolTag, str, str]] = []
        self.allocations = 0
        self.reused = 0

    # -- allocation -----------------------------------------------------------------
    def malloc(self, like: torch.Tensor, pool: PoolTag) -> tuple[Block, torch.Tensor, torch.Tensor]:
        """Bytes for a new device tensor shaped like ``like`` from ``pool``: (block, tensor data, storage record)."""
        self.collect()
        need = like.untyped_storage().nbytes()
        size = max(ROUND, _round_up(need, ROUND))
        small = size <= SMALL_REQUEST
        block = self._take(pool, size, small)
        self.allocations += 1
        seg = block.segment
        if seg.paused is not None:
            self.served_paused.append((pool, repr(block), seg.label))
        raw, anchor = self._alias(block, need)
        data = raw.view(like.dtype).as_strided(like.shape, like.stride(), like.storage_offset())
        record, _ = self._alias(block, need)
        # torch.frombuffer keeps its buffer object alive as long as the storage made from it (shared by every
        # view) lives: the buffer's death is the moment the program dropped the allocation
        weakref.finalize(anchor, self._pending.append, block)
        return block, data, record

    def _alias(self, block: Block, need: int) -> tuple[torch.Tensor, object]:
        buf = (ctypes.c_uint8 * max(need, 1)).from_address(block.segment.address + block.offset)
        return torch.frombuffer(buf, dtype=torch.uint8)[:need], buf

    def _take(self, pool: PoolTag, size: int, small: bool) -> Block:
        fits = [
            b
            for seg in self.pools.get(pool, [])
            if seg.small == small and not seg.released
            for b in seg.blocks
            if b.free and b.nbytes >= size
        ]
        if fits:
            fits.sort(key=lambda b: (b.nbytes, b.segment.id, b.offset))
            block = fits[self.pick % len(fits)]
            self.reused += 1
        else:
            seg = Segment(len(self._segments) + 1, pool, segment_size(size), small)
            self._segments.append(seg)
            self.pools.setdefault(pool, []).append(seg)
            if self._on_segment is not None:
                self._on_segment(seg)
            block = seg.blocks[0]
        self._split(block, size)
        block.free = False
        return block

    @staticmethod
    def _split(block: Block, size: int) -> None:
        rest = block.nbytes - size
        if rest >= ROUND:
            seg = block.segment
            tail = Block(seg, block.offset + size, rest)
            seg.blocks.insert(seg.blocks.index(block) + 1, tail)
            block.nbytes = size

    # -- freeing ----------------------------------------------------------------------
    def collect(self) -> None:
        """Put blocks whose tensors died back on their free lists (merging free neighbours)."""
        while self._pending:
            block = self._pending.pop(0)
            block.free = True
            if block.storage is not None:
                self.memory.forget(block.storage)
                block.storage = None
            seg = block.segment
            i = seg.blocks.index(block)
            if i + 1 < len(seg.blocks) and seg.blocks[i + 1].free:
                block.nbytes += seg.blocks.pop(i + 1).nbytes
            if i > 0 and seg.blocks[i - 1].free:
                prev = seg.blocks[i - 1]
                prev.nbytes += block.nbytes
                seg.blocks.pop(i)

    def empty_cache(self) -> list[Segment]:
        """Release every entirely free segment (``torch.cuda.empty_cache``); returns them."""
        self.collect()
        released = []
        for pool, segs in self.pools.items():
            for seg in [s for s in segs if s.all_free()]:
                segs.remove(seg)
                seg.released = True
                released.append(seg)
                if self._on_release is not None:
                    self._on_release(seg)
            self.pools[pool] = segs
        return released

    def segments(self, pool: PoolTag) -> list[Segment]:
        return list(self.pools.get(pool, []))

    def live_blocks(self, seg: Segment) -> list[Block]:
        self.collect()
        return [b for b in seg.blocks if not b.free]
