"""A pausable memory pool on the simulated device (``torch_memory_saver``).

The semantics of ``torch_memory_saver`` over the caching allocator of
:mod:`simdevice.runtime.allocator`:

- ``region(tag, enable_cpu_backup=False)``: allocations of the current actor
  come from the pool of ``tag`` and that backup setting (the library keeps the
  setting per allocation, and gives each tag and setting a ``MemPool`` of its
  own); every new segment of it gets a physical handle mapped at its
  addresses.
- ``disable()``: allocations inside it come from the ordinary pool (plain
  device memory), even inside a region.
- Both are the calling thread's (a host actor's): the library's region
  configuration is ``thread_local`` and torch's ``use_mem_pool`` routes only
  the current thread's allocations, so another thread of the process
  allocates from whatever pool its own contexts name (outside any: ordinary
  memory), even while this one is inside a region. A backward pass's
  operations run on autograd's device thread (one per process), so what they
  allocate is outside the region its caller is in, unless a hook of the
  backward enters one itself (:meth:`SimMemorySaver.backward`).
- ``pause(tag)``: for every segment of the tag, unmap and release its handle;
  the addresses stay reserved, the contents are lost (poisoned with 0xFF
  bytes, which read as NaN in floats) unless the region that made the segment
  backs them up to host.
  Every live storage of the segment is then unmapped: any access is an
  :class:`~simdevice.report.IllegalAccess` naming the allocation, the pause and
  the access.
- The caching allocator does not know about pausing: the free blocks of a
  paused segment stay on its free list. An allocation in the region while it
  is paused can be served from one, and is unmapped from birth. (A request
  that no cached block fits gets a fresh, mapped segment, as on a GPU.)
- ``resume(tag)``: a fresh handle mapped at the same addresses; contents back
  only with a backup.
- Each process (host actor: the trainer, a rank, a spawned process) has a
  memory saver of its own, as each has its own library and allocations:
  ``pause`` and ``resume`` act on the calling process's segments only.
- The library pauses only active allocations and resumes only paused ones
  (``torch_memory_saver``'s ``pause`` and ``resume`` exit the process on any
  other allocation of the tag): pausing a paused region, resuming one that is
  not paused, and resuming a region that got a fresh segment while paused
  (an allocation outside ``disable()`` that no cached block fitted: active,
  not paused) each end the process, reported as a host error.
- Free while paused: when the allocator releases a segment
  (``empty_cache``), the memory saver releases its handle and its addresses.
  A paused segment's handle was already released by the pause: releasing it
  again fails in the driver and the process aborts (a shipped bug, kept as
  ``LibraryFixes.release_paused_once``, chosen when the simulated device is
  made); here that raises, which the run reports as a host error.

Invariant: each physical handle is released exactly once, and no access
touches a segment while its handle is released.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import attrs
import torch

from simdevice.runtime.allocator import Block, CachingAllocator, PoolTag, Segment
from simdevice.runtime.execution import Execution, HostActor
from simdevice.runtime.memory import Memory, Storage
from simdevice.runtime.reports import user_source


@attrs.frozen
class LibraryFixes:
    """Fixes inside the memory-saver library itself (the real one is whatever version is installed)."""

    #: free of a paused allocation releases only its addresses: the pause already released its handle
    release_paused_once: bool = True


class SimMemorySaver:
    """The memory saver's state over the caching allocator: which pool each actor allocates from, what is paused."""

    def __init__(
        self, execution: Execution, memory: Memory, fixes: LibraryFixes, pick: int = 0,
        unmap: Callable[[HostActor, str, list[Segment], str], None] | None = None,
    ) -> None:
        self._exec = execution
        self._memory = memory
        #: the runtime's host access of a pause's unmap (the segments, ordered against the streams' accesses); let go
        #: when the run ends (the runtime holds this model: a run dies by reference counting once dropped)
        self.unmap = unmap
        # the library hooks the allocator's segments, as torch_memory_saver hooks cudaMalloc
        self.allocator = CachingAllocator(
            memory, pick, on_segment=self._on_segment, on_release=self._on_release, current=execution.current_or_none,
            capacity=execution.config.device_memory, lazy=not execution.config.values, block=execution.block,
            real_sizes=execution.config.real_sizes,
        )
        self.fixes = fixes
        #: per host actor (a thread: the library's configuration and torch's ``use_mem_pool`` are thread-local):
        #: stack of active pools (a tag inside region(), None inside disable())
        self._tags: dict[str, list[PoolTag]] = {}
        #: per actor, beside it: whether each backs its allocations up (``enable_cpu_backup``)
        self._backups: dict[str, list[bool]] = {}
        #: (process, tag) of each region paused and not resumed since
        self._paused: set[tuple[str, str]] = set()
        #: the pools that are not the library's (a CUDA graph's or a ``MemPool``'s, by tag): a pause of every region
        #: leaves them, and their segments get no handle of the library's (the runtime shares its set here)
        self.foreign: set[PoolTag] = set()
        self._saved: dict[int, torch.Tensor] = {}
        self._handles = 0
        #: handle -> what released it (each handle is released once)
        self.released: dict[int, str] = {}
        self.disable_entries = 0
        #: per host actor: how many backward passes it is inside (autograd's device thread allocates for them)
        self._backward: dict[str, int] = {}
        #: a note for each pause that discarded what a live tensor held (a segment with no backup): the run's notes
        #: carry them, and a program whose own check then fails is told why no wait helps
        self.discarded: list[str] = []

    # -- the current pool ----------------------------------------------------------------
    def thread_of(self, actor: HostActor) -> str:
        """The thread whose region contexts route ``actor``'s allocations now: its own, or during a backward pass it
        called, its process's autograd device thread (CUDA's engine runs a device's nodes there, with their hooks)."""
        return f"{actor.process} (autograd)" if self._backward.get(actor.name) else actor.name

    @contextlib.contextmanager
    def backward(self, actor: HostActor) -> Iterator[None]:
        """``actor`` runs a backward pass (``torch.autograd``'s call into the engine) until the context ends."""
        self._backward[actor.name] = self._backward.get(actor.name, 0) + 1
        try:
            yield
        finally:
            self._backward[actor.name] -= 1

    def _stack(self) -> list[PoolTag]:
        return self._tags.setdefault(self.thread_of(self._exec.current()), [])

    def pool_of(self, actor: str | None) -> PoolTag:
        """The pool an allocation by ``actor`` (the thread allocating: :meth:`thread_of` a host actor) comes from
        (None: ordinary memory)."""
        stack = self._tags.get(actor, []) if actor else []
        return stack[-1] if stack else None

    def backup_of(self, actor: str | None) -> bool:
        """Whether an allocation by ``actor`` is backed up at a pause (made in a region with ``enable_cpu_backup``;
        never in ordinary memory)."""
        stack = self._backups.get(actor, []) if actor else []
        return bool(stack) and stack[-1]

    def open_contexts(self) -> int:
        """How many region() and disable() contexts are entered and not yet left, over all actors."""
        return sum(len(stack) for stack in self._tags.values())

    def allocated(self, block: Block, st: Storage) -> None:
        """A device allocation was served from ``block``: a block of a paused segment is unmapped from birth."""
        self.allocator.bind(block, st)
        seg = block.segment
        if seg.paused is not None:
            st.unmapped = (
                f"which {seg.paused} unmapped ({block}, handed out again from the caching allocator's free list "
                f"while paused)"
            )

    # -- handles -----------------------------------------------------------------------
    def _on_segment(self, seg: Segment) -> None:
        if seg.pool is not None and seg.pool not in self.foreign:
            self._handles += 1
            seg.handle = self._handles

    def _release_handle(self, seg: Segment, handle: int, why: str) -> None:
        first = self.released.get(handle)
        if first is not None:
            raise RuntimeError(
                f"memory saver released handle h{handle} of {seg.label} twice ({first}, then {why}): "
                "the driver refuses the second release and the process aborts"
            )
        self.released[handle] = why

    def _on_release(self, seg: Segment) -> None:
        if seg.pool is None or seg.pool in self.foreign:
            return
        why = f"free of {seg.label} while {'paused' if seg.paused else 'mapped'}"
        handle = seg.handle if seg.handle is not None else seg.last_handle
        # fix: a paused segment's handle went with the pause; its free releases only the addresses
        if handle is not None and (seg.handle is not None or not self.fixes.release_paused_once):
            self._release_handle(seg, handle, why)
        seg.handle = None

    # -- the contract ------------------------------------------------------------------------
    @contextlib.contextmanager
    def region(
        self, tag: str = "default", enable_cpu_backup: bool = False, enable_disk_backup: bool = False,
        cpu_backup_backend: str | None = None,
    ) -> Iterator[None]:
        # the library's own checks; a backup to host memory (pinned or mmap) or to disk keeps the contents alike
        if cpu_backup_backend is not None and not enable_cpu_backup:
            raise ValueError("cpu_backup_backend requires enable_cpu_backup=True")
        if enable_cpu_backup and enable_disk_backup:  # (the library's assert: the program's error, as there)
            raise AssertionError("enable_cpu_backup and enable_disk_backup are mutually exclusive")
        with self.routed(tag, bool(enable_cpu_backup or enable_disk_backup)):
            yield

    @contextlib.contextmanager
    def routed(self, tag: PoolTag, backup: bool = False) -> Iterator[None]:
        """The current thread's allocations from the pool ``tag`` (None: ordinary memory) for the block, backed up at
        a pause or not: a region's, ``disable()``'s, and ``torch.cuda.use_mem_pool``'s."""
        backups = self._backups.setdefault(self.thread_of(self._exec.current()), [])
        self._stack().append(tag)
        backups.append(backup)
        try:
            yield
        finally:
            self._stack().pop()
            backups.pop()

    @contextlib.contextmanager
    def disable(self) -> Iterator[None]:
        self.disable_entries += 1
        with self.routed(None):
            yield

    def _tags_of(self, tag: str | None) -> list[str]:
        return [tag] if tag else [t for t in self.allocator.pools if t is not None and t not in self.foreign]

    def _segments(self, tag: str, process: str) -> list[Segment]:
        """The segments of ``tag``'s pool that ``process``'s library holds (each process pauses its own memory)."""
        return [s for s in self.allocator.segments(tag) if s.stream is None or s.stream.process == process]

    def pause(self, tag: str | None = None) -> None:
        ex = self._exec
        a = ex.host_step(f"memory_saver.pause({tag})")
        self.allocator.collect()
        me = a.process
        self._refuse(tag, "pause", me)
        unmap = self.unmap
        if unmap is not None:
            # the unmap is the host's: a stream's access of the segments must be ordered before it (the library
            # does not synchronize: with no backup to copy, nothing waits for the streams)
            segments = [seg for t in self._tags_of(tag) for seg in self._segments(t, me) if seg.handle is not None]
            if segments:
                unmap(a, f"memory_saver.pause({tag!r})", segments, user_source())
        # the library's own work on segment bytes (unmap, back up) is no access by the program
        with ex.device_side():
            self._pause(tag, me)
        ex.progress()

    def _refuse(self, tag: str | None, what: str, process: str) -> None:
        """The library pauses only active allocations and resumes only paused ones: any other allocation of the
        tag (every tag for None) makes it print why and exit the process (``exit(1)``), raised here as a host
        error. An allocation made while its region is paused, outside ``disable()``, is active: still cached or
        alive at the resume, it ends the process there."""
        for t in self._tags_of(tag):
            for seg in self._segments(t, process):
                if what == "pause" and seg.paused is not None:
                    why = f"already paused ({seg.paused})"
                elif what == "resume" and seg.paused is None:
                    why = (
                        f"not paused: made while the region was paused, outside disable(), and still "
                        f"{'alive' if self.allocator.live_blocks(seg) else 'cached'}"
                        if (process, t) in self._paused
                        else "not paused (the region is not paused)"
                    )
                else:
                    continue
                raise RuntimeError(
                    f"memory_saver.{what}({tag!r}) meets {seg.label} of region {t!r}, {why}: the memory saver "
                    f"refuses to {what} it and exits the process"
                )
        capacity = self.allocator.capacity
        if what == "resume" and capacity is not None:
            # the pause gave the memory back: the resume maps fresh memory, and exits the process where none is left
            held = self.allocator.held()
            for t in self._tags_of(tag):
                for seg in self._segments(t, process):
                    if seg.paused is None:
                        continue
                    if held + seg.nbytes > capacity:
                        raise RuntimeError(
                            f"memory_saver.resume({tag!r}) cannot map {seg.label} of region {t!r} again "
                            f"({seg.nbytes} bytes): the device holds {held} of its {capacity} bytes (cuMemCreate: "
                            "out of memory), and the memory saver exits the process"
                        )
                    held += seg.nbytes

    def _pause(self, tag: str | None, process: str) -> None:
        for t in self._tags_of(tag):
            self._paused.add((process, t))
            why = f"memory_saver.pause({t!r}) at t={self._exec.now / 1e6:.3f}"
            for seg in self._segments(t, process):
                if seg.handle is None:
                    continue
                if self._exec.config.values:  # race-only: the contents are not kept, so nothing to lose
                    if seg.backup:
                        self._saved[seg.id] = seg.data.clone()
                    self._memory.in_flight.before_write([seg.data])
                    seg.data.fill_(0xFF)
                seg.last_handle = seg.handle
                self._release_handle(seg, seg.handle, f"pause of {seg.label}")
                seg.handle = None
                seg.paused = why
                live = False
                for b in self.allocator.live_blocks(seg):
                    if b.storage is not None:
                        b.storage.unmapped = f"which {why} unmapped ({b})"
                        live = True
                if live and not seg.backup:
                    self.discarded.append(
                        f"{why} discarded what the live tensors of {seg.label} held (region {t!r} has no CPU "
                        "backup): read after the resume before they are written again, they hold garbage "
                        "(enable_cpu_backup=True keeps their values)")

    def resume(self, tag: str | None = None) -> None:
        ex = self._exec
        ex.host_step(f"memory_saver.resume({tag})")
        self.allocator.collect()
        me = ex.current().process
        self._refuse(tag, "resume", me)
        with ex.device_side():
            self._resume(tag, me)
        ex.progress()

    def _resume(self, tag: str | None, process: str) -> None:
        for t in self._tags_of(tag):
            self._paused.discard((process, t))
            for seg in self._segments(t, process):
                if seg.paused is None:
                    continue
                self._handles += 1
                seg.handle = self._handles
                seg.paused = None
                saved = self._saved.pop(seg.id, None)
                if saved is not None:
                    self._memory.in_flight.before_write([seg.data])
                    seg.data.copy_(saved)
                for b in self.allocator.live_blocks(seg):
                    if b.storage is not None:
                        b.storage.unmapped = None

    def empty_cache(self, actor: HostActor | None = None) -> bool:
        """Release the allocator's entirely free segments (``torch.cuda.empty_cache``; ``actor``, the host that
        calls it, waits for the streams recorded with freed blocks first); whether any was released."""
        return bool(self.allocator.empty_cache(actor))

    def is_paused(self, tag: str, process: str = "host") -> bool:
        return (process, tag) in self._paused
