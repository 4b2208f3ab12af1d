"""Fine-grained activation offload: reload ordering and the chunk cursor (Megatron-LM).

What it does. Each layer's saved activations form an ``OffloadTensorGroup``.
In forward, ``torch.autograd.graph.saved_tensors_hooks`` hands every saved
tensor to ``tensor_push``; at the group's commit the whole group is copied to
pinned host buffers on ``d2h_stream`` (bulk offload) and ``_offload_event`` is
recorded. In backward, the end of one group's backward prefetches the next
group to reload (a LIFO per microbatch) on ``h2d_stream`` and records
``_reload_event``; the start of a group's backward makes the compute stream
wait for that event. A tensor that nobody prefetched is reloaded inline by
``tensor_pop``, on the compute stream. One ``ChunkOffloadHandler`` per
microbatch holds the groups; the manager walks them with a forward cursor,
and backward takes them in the same order, whether every forward runs first
or a pipeline's 1F1B order runs later forwards between earlier backwards.
The first pass (warmup) offloads every group, later passes the first
``activation_offload_fraction`` of them; the rest stay resident.

Invariant: every tensor popped in backward equals the tensor pushed in forward,
because D2H(g) completes before any H2D(g) starts and H2D(g) before compute
reads g, and backward consumes the chunk handler that forward filled. And the
pinned pool hands a buffer to the next D2H only once the H2D that read it is
ordered before that D2H: a prefetched group's buffers go back to the pool with
its ``_reload_event``, which the taker's stream waits for (the event is reused
every pass; a later record only makes the taker wait longer). The other
buffers go back at ``reset()`` with no event: their last reader, if any, is an
inline H2D on the compute stream, which every D2H waits for.

Known bugs (``Fixes`` flags below sit where the upstream fixes changed the code):

- ``offload-inline-no-wait``: (1) the last group's D2H is enqueued on
  ``d2h_stream`` at commit; (2) backward starts at once, nothing prefetched
  that group, so ``tensor_pop`` enqueues its H2D on the compute stream with no
  edge on ``_offload_event``; (3) the H2D reads the pinned buffer while the D2H
  is still filling it: stale activations, wrong gradients, nothing raised.
  The inline pop also left the group on the LIFO, so every later prefetch
  re-targeted a drained group and every reload went inline, unordered.
- ``offload-queue-empty-cursor``: (1) with fraction 0 nothing is queued, so
  after the first group of a microbatch both queues are empty; (2) the next
  ``group_start`` takes "queues empty" for "this chunk's forward is finished"
  and moves the cursor to the next microbatch's handler; (3) backward meets a
  group of the wrong handler: ``Chunk mismatch``.

Fix: a ``reload_pending`` latch per group, set when its D2H is enqueued and
cleared by whichever reload consumes it (inline: after the compute stream
waited ``_offload_event``; prefetch: its H2D already waited). The latch, not
an unconditional wait, because the event is reused every pass: a group not
offloaded this pass must not wait on a stale edge, so ``reset()`` clears
latches of groups never reloaded. A chunk's forward is finished when no group
of that name remains after its cursor.

Not upstream, a mutation the pool-reuse property must catch:

- ``pool-reuse-on-enqueue``: (1) under 1F1B the end of microbatch 0's backward
  primes microbatch 1's last group: its H2D is enqueued on ``h2d_stream`` and
  its buffers go back to the pool at once; (2) microbatch 2's forward takes
  them for its D2H, ordered after the compute stream only, which has not waited
  for that H2D yet; (3) the D2H overwrites a buffer the H2D may still be
  reading. With every forward before any backward no D2H comes between a
  prefetch and the compute stream's wait for it, so it hides there.

The simulated device runs this module's autograd route as is: its tensors
are wrapper subclasses, ``saved_tensors_hooks`` receive them and backward runs
on the calling host actor. Groups keep their sources until ``reset()`` (see
``_sources``), where the compute stream first waits for the D2H of a group
nobody reloaded (as after a forward-only evaluation pass): "a source
activation freed before its D2H read it" cannot happen.

The small model that drives it (the harness: configuration, training loop,
expected weights) is ``simdevice/programs/activation_offload.py``. Checked by
``tests/property/mechanisms/test_activation_offload.py`` (simulator) and
``tests/gpu/test_activation_offload_gpu.py`` (CUDA).
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from reference.contract import Device, Event

# ---------------------------------------------------------------------------
# Fixes and variants


@attrs.frozen
class Fixes:
    #: inline reload waits ``_offload_event`` when the latch is set, and drops the group from the LIFO
    inline_reload_waits: bool = True
    #: the inline wait is keyed on the latch (False: wait on every pop, stale edges included)
    latch_keys_wait: bool = True
    #: a prefetch clears the latch, so popping a prefetched group does not wait on the D2H again
    prefetch_clears_latch: bool = True
    #: ``reset()`` clears latches of groups offloaded but never reloaded
    reset_clears_latch: bool = True
    #: a chunk's forward is finished when no group of that name remains after the cursor
    cursor_by_remaining_groups: bool = True
    #: a prefetched group's buffers go back to the pool with its ``_reload_event`` (False: as soon as the H2D is
    #: enqueued, with nothing the next taker waits for)
    pool_waits_reload: bool = True


FIXED = Fixes()
OFFLOAD_INLINE_NO_WAIT = Fixes(inline_reload_waits=False)
OFFLOAD_QUEUE_EMPTY_CURSOR = Fixes(cursor_by_remaining_groups=False)
# Correct but slower arms: each breaks one of the wait-count properties (and serves the benchmark).
UNCONDITIONAL_WAIT = Fixes(latch_keys_wait=False)
PREFETCH_KEEPS_LATCH = Fixes(prefetch_clears_latch=False)
RESET_KEEPS_LATCH = Fixes(reset_clears_latch=False)
# Not upstream: a mutation of the pool's reuse rule, which only a pipeline (1F1B) microbatch order shows.
POOL_REUSE_ON_ENQUEUE = Fixes(pool_waits_reload=False)

BUGS = {"offload-inline-no-wait": OFFLOAD_INLINE_NO_WAIT, "offload-queue-empty-cursor": OFFLOAD_QUEUE_EMPTY_CURSOR}
SLOW_ARMS = {
    "unconditional-wait": UNCONDITIONAL_WAIT,
    "prefetch-keeps-latch": PREFETCH_KEEPS_LATCH,
    "reset-keeps-latch": RESET_KEEPS_LATCH,
}
MUTANTS = {"pool-reuse-on-enqueue": POOL_REUSE_ON_ENQUEUE}
VARIANTS: dict[str, Fixes] = {"FIXED": FIXED, **BUGS, **SLOW_ARMS, **MUTANTS}


# ---------------------------------------------------------------------------
# Bookkeeping the properties count (no effect on the protocol)


@attrs.frozen
class WaitRecord:
    """One stream wait on a group's event, as the wait-count properties see it."""

    stream: str  # "compute" or "h2d"
    event: str  # "offload" or "reload"
    chunk: int
    group: str
    pass_index: int
    #: whether the group was offloaded in this pass (else the event is a stale one)
    offloaded: bool
    #: whether a prefetch had already scheduled this group's reload in this pass
    prefetched: bool
    path: str  # "inline", "prefetch", "commit" or "reset"


@attrs.frozen
class ReloadRecord:
    chunk: int
    group: str
    pass_index: int
    path: str  # "inline" or "prefetch"
    tensors: int


@attrs.define
class OnHost:
    """A saved tensor whose bytes live in a pinned buffer until it is reloaded."""

    buf: torch.Tensor


@attrs.define(eq=False)
class TensorTag:
    """What the pack hook stores in the autograd graph instead of an offloadable tensor."""

    group: OffloadTensorGroup
    index: int


# ---------------------------------------------------------------------------
# Groups and chunk handlers


@attrs.define(eq=False)
class OffloadTensorGroup:
    """The saved tensors of one layer. The events live as long as the group: they are reused every pass."""

    name: str
    index: int
    handler: ChunkOffloadHandler
    _offload_event: Event
    _reload_event: Event
    offload: bool = False
    reload_pending: bool = False
    _tensors: list[torch.Tensor | OnHost] = attrs.Factory(list)
    _sources: list[torch.Tensor] = attrs.Factory(list)
    _buffers: list[torch.Tensor] = attrs.Factory(list)
    _reload_scheduled: bool = False


class ChunkOffloadHandler:
    """The groups of one microbatch (chunk), its forward cursor and its reload LIFO."""

    def __init__(self, manager: ActivationOffloadManager, chunk: int) -> None:
        self.manager = manager
        self.chunk = chunk
        dev = manager.dev
        self.offload_groups = [
            OffloadTensorGroup(name, i, self, dev.Event(), dev.Event()) for i, name in enumerate(manager.group_names)
        ]
        self._offloaded_group_index = 0
        self._groups_to_offload: list[OffloadTensorGroup] = []
        self._groups_to_reload: list[OffloadTensorGroup] = []
        self._started: list[OffloadTensorGroup] = []
        self._backward_done = 0
        self._primed = False

    def should_bulk_offload(self, group: OffloadTensorGroup) -> bool:
        m = self.manager
        if m.is_warmup:
            return True
        return group.index < int(m.activation_offload_fraction * len(self.offload_groups))

    def finish_all_groups(self, name: str) -> bool:
        """Whether this chunk's forward is over, judged when a group named ``name`` starts."""
        queues_empty = not self._groups_to_offload and not self._groups_to_reload
        if not self.manager.fixes.cursor_by_remaining_groups and self._offloaded_group_index > 0 and queues_empty:
            return True  # bug: with fraction 0 the queues are always empty, so every chunk "ends" after one group
        return not any(g.name == name for g in self.offload_groups[self._offloaded_group_index :])

    def group_start(self, name: str) -> OffloadTensorGroup:
        for i in range(self._offloaded_group_index, len(self.offload_groups)):
            group = self.offload_groups[i]
            if group.name == name:
                self._offloaded_group_index = i + 1
                group.offload = self.should_bulk_offload(group)
                if group.offload:
                    self._groups_to_offload.append(group)
                self._started.append(group)
                return group
        raise AssertionError(f"Chunk mismatch: no group {name} left in chunk {self.chunk}")

    def backward_finished(self) -> bool:
        return self._backward_done == len(self._started)

    def reset(self, pool: PinnedPool, clear_latches: bool) -> None:
        for group in self.offload_groups:
            for buf in group._buffers:
                pool.give_back(buf)
            group._tensors, group._sources, group._buffers = [], [], []
            group._reload_scheduled = group.offload = False
            if clear_latches:
                group.reload_pending = False  # offloaded, never reloaded: its event is stale from now on
        self._offloaded_group_index = 0
        self._groups_to_offload, self._groups_to_reload, self._started = [], [], []
        self._backward_done = 0
        self._primed = False


class PinnedPool:
    """Pinned host staging buffers, reused across passes (and within one, under 1F1B) by shape and dtype.

    A buffer comes back with the event recorded after the last copy that reads it, or with none when its
    readers are already ordered before every later D2H; the stream that takes it next waits for that event."""

    def __init__(self, dev: Device) -> None:
        self.dev = dev
        self._free: dict[tuple[tuple[int, ...], torch.dtype], list[tuple[torch.Tensor, Event | None]]] = {}
        self.allocated = 0
        #: buffers handed out again behind a wait (bookkeeping the properties count)
        self.waited = 0

    def take(self, like: torch.Tensor) -> torch.Tensor:
        free = self._free.get((tuple(like.shape), like.dtype))
        if free:
            buf, after = free.pop()
            if after is not None:
                # wait: the H2D that read this buffer last may still be reading it
                self.dev.current_stream().wait_event(after)
                self.waited += 1
            return buf
        self.allocated += 1
        return torch.empty(like.shape, dtype=like.dtype, pin_memory=True)

    def reserve(self, shape: tuple[int, ...], dtype: torch.dtype, count: int) -> None:
        """Allocate ``count`` buffers now. Allocating page-locked memory (``cudaHostAlloc``) synchronizes the
        whole device, so a pool that grows between a D2H and the work after it would serialize them."""
        for _ in range(count):
            self.allocated += 1
            self.give_back(torch.empty(shape, dtype=dtype, pin_memory=True))

    def give_back(self, buf: torch.Tensor, after: Event | None = None) -> None:
        self._free.setdefault((tuple(buf.shape), buf.dtype), []).append((buf, after))


# ---------------------------------------------------------------------------
# The manager


class ActivationOffloadManager:
    """Streams, the pinned pool, the warmup flag and the chunk handlers in forward order."""

    def __init__(
        self, dev: Device, fixes: Fixes, group_names: list[str], fraction: float, warmup: bool = True
    ) -> None:
        self.dev = dev
        self.fixes = fixes
        self.group_names = group_names
        self.activation_offload_fraction = fraction
        self.is_warmup = warmup
        self.compute_stream = dev.current_stream()
        self.d2h_stream = dev.Stream(name="d2h")
        self.h2d_stream = dev.Stream(name="h2d")
        self.pool = PinnedPool(dev)
        self.handlers: list[ChunkOffloadHandler] = []
        self._cur_forward = -1
        self._cur_backward = 0
        self._cur_group: OffloadTensorGroup | None = None
        self.pass_index = 0
        self.waits: list[WaitRecord] = []
        self.reloads: list[ReloadRecord] = []

    # -- forward ---------------------------------------------------------------
    def group_start(self, name: str) -> OffloadTensorGroup:
        """Start a group in the current forward chunk, advancing to the next chunk when this one is finished."""
        if self._cur_forward < 0 or self.handlers[self._cur_forward].finish_all_groups(name):
            self._cur_forward += 1
            if self._cur_forward == len(self.handlers):
                self.handlers.append(ChunkOffloadHandler(self, self._cur_forward))
        group = self.handlers[self._cur_forward].group_start(name)
        self._cur_group = group
        return group

    def tensor_push(self, t: torch.Tensor) -> Any:
        """Pack hook: parameters and tensors saved outside a group stay as they are."""
        group = self._cur_group
        if group is None or (t.is_leaf and t.requires_grad):
            return t
        group._tensors.append(t)
        return TensorTag(group, len(group._tensors) - 1)

    def group_commit(self, group: OffloadTensorGroup) -> None:
        """Bulk offload at commit: every tensor of the group to pinned memory, on ``d2h_stream``."""
        self._cur_group = None
        handler = group.handler
        if not group.offload:
            return
        handler._groups_to_offload.remove(group)
        # wait: the D2H must not read an activation before compute has produced it
        self.d2h_stream.wait_stream(self.compute_stream)
        with self.dev.stream(self.d2h_stream):
            for i, t in enumerate(group._tensors):
                if not isinstance(t, torch.Tensor):
                    continue
                buf = self.pool.take(t)
                with torch.no_grad():  # a copy of a saved tensor, not part of the graph (the buffer outlives it)
                    buf.copy_(t, non_blocking=True)
                group._buffers.append(buf)
                # keep: the source's memory must not go back to compute while the D2H still reads it
                group._sources.append(t)
                group._tensors[i] = OnHost(buf)
            group._offload_event.record()
        group.reload_pending = True
        handler._groups_to_reload.append(group)

    # -- backward ----------------------------------------------------------------
    def cur_backward_chunk(self) -> ChunkOffloadHandler:
        return self.handlers[self._cur_backward]

    def on_group_commit_backward(self, group: OffloadTensorGroup) -> None:
        """Start of a group's backward: the right chunk, and its prefetch must have landed."""
        cur = self.cur_backward_chunk()
        if group.handler is not cur:
            raise AssertionError(
                f"Chunk mismatch: backward reached group {group.name} of chunk {group.handler.chunk} "
                f"while chunk {cur.chunk} is current"
            )
        if group._reload_scheduled:
            self._log(group, "compute", "reload", "commit")
            # wait: compute must not read the group's tensors before their H2D landed
            self.compute_stream.wait_event(group._reload_event)

    def tensor_pop(self, tag: Any) -> torch.Tensor:
        """Unpack hook: the saved tensor, reloaded inline on the compute stream if nobody prefetched it."""
        if not isinstance(tag, TensorTag):
            return tag  # type: ignore[no-any-return]
        group = tag.group
        latched = group.reload_pending if self.fixes.latch_keys_wait else True
        if self.fixes.inline_reload_waits and latched:
            self._log(group, "compute", "offload", "inline")
            # wait: the D2H filling this pinned buffer may still be in flight
            self.compute_stream.wait_event(group._offload_event)
            if group in group.handler._groups_to_reload:
                group.handler._groups_to_reload.remove(group)  # so the next prefetch advances
            group.reload_pending = False
        t = group._tensors[tag.index]
        if isinstance(t, OnHost):
            dst = torch.empty(t.buf.shape, dtype=t.buf.dtype, device=self.dev.device)
            dst.copy_(t.buf, non_blocking=True)  # on the current (compute) stream
            group._tensors[tag.index] = dst
            self.reloads.append(ReloadRecord(group.handler.chunk, group.name, self.pass_index, "inline", 1))
            return dst
        return t

    def on_group_start_backward(self, group: OffloadTensorGroup) -> None:
        """End of a group's backward: prefetch the next group of this chunk, or prime the next chunk."""
        handler = group.handler
        handler._backward_done += 1
        if handler._groups_to_reload:
            self.bulk_reload_group(handler._groups_to_reload.pop())
        else:
            self.pre_reload_last_layer()
        if handler.backward_finished():
            self._cur_backward += 1

    def pre_reload_last_layer(self) -> None:
        """Prime the next chunk: its last offloaded group, so its backward does not start inline."""
        nxt = self._cur_backward + 1
        if nxt >= len(self.handlers):
            return
        handler = self.handlers[nxt]
        if handler._primed or not handler._groups_to_reload:
            return
        handler._primed = True
        self.bulk_reload_group(handler._groups_to_reload.pop())

    def bulk_reload_group(self, group: OffloadTensorGroup) -> None:
        """Prefetch: reload every tensor of the group still on the host, on ``h2d_stream``."""
        on_host = [(i, t) for i, t in enumerate(group._tensors) if isinstance(t, OnHost)]
        # Destinations come from the compute stream's pool, so compute frees them in its own order.
        dsts = [torch.empty(t.buf.shape, dtype=t.buf.dtype, device=self.dev.device) for _, t in on_host]
        # wait: the destinations' previous users on the compute stream must be done before H2D writes them
        self.h2d_stream.wait_stream(self.compute_stream)
        with self.dev.stream(self.h2d_stream):
            self._log(group, "h2d", "offload", "prefetch")
            # wait: H2D(g) must not read the pinned buffer before D2H(g) filled it
            self.h2d_stream.wait_event(group._offload_event)
            for (i, t), dst in zip(on_host, dsts, strict=True):
                dst.copy_(t.buf, non_blocking=True)
                group._tensors[i] = dst
            group._reload_event.record()
        if on_host:
            # The H2D is the buffers' last reader: they go back to the pool now, for a later forward's D2H (under
            # 1F1B, before the compute stream waited for this reload), with the event that says the H2D is done.
            after = group._reload_event if self.fixes.pool_waits_reload else None  # mutant: back once enqueued
            for _, t in on_host:
                self.pool.give_back(t.buf, after)
            back = {id(t.buf) for _, t in on_host}
            group._buffers = [b for b in group._buffers if id(b) not in back]
        group._reload_scheduled = True
        if self.fixes.prefetch_clears_latch:
            group.reload_pending = False
        self.reloads.append(ReloadRecord(group.handler.chunk, group.name, self.pass_index, "prefetch", len(dsts)))

    # -- between passes --------------------------------------------------------------
    def reset(self) -> None:
        """End of a pass (training iteration or forward-only evaluation): rewind cursors, end warmup."""
        for handler in self.handlers:
            for group in handler.offload_groups:
                if group.reload_pending and group._sources:
                    self._log(group, "compute", "offload", "reset")
                    # wait: dropped sources go back to compute's pool, and a D2H nobody reloaded may still read them
                    self.compute_stream.wait_event(group._offload_event)
            handler.reset(self.pool, self.fixes.reset_clears_latch)
        self._cur_forward, self._cur_backward, self._cur_group = -1, 0, None
        self.is_warmup = False
        self.pass_index += 1

    def _log(self, group: OffloadTensorGroup, stream: str, event: str, path: str) -> None:
        self.waits.append(
            WaitRecord(stream, event, group.handler.chunk, group.name, self.pass_index, group.offload,
                       group._reload_scheduled, path)
        )


class GroupStart(torch.autograd.Function):
    """Identity marker before a layer; its backward runs at the end of that layer's backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, manager: ActivationOffloadManager, group: OffloadTensorGroup) -> Any:
        ctx.manager, ctx.group = manager, group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        ctx.manager.on_group_start_backward(ctx.group)
        return grad, None, None


class GroupCommit(torch.autograd.Function):
    """Identity marker after a layer; its backward runs at the start of that layer's backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, manager: ActivationOffloadManager, group: OffloadTensorGroup) -> Any:
        ctx.manager, ctx.group = manager, group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        ctx.manager.on_group_commit_backward(ctx.group)
        return grad, None, None
