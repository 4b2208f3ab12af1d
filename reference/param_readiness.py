"""Parameter readiness for prefetching consumers (Megatron-LM DDP with overlapped parameter all-gather, and GTP).

What it does. A data-parallel wrapper keeps the parameters of several layers in
flat *bucket* buffers; each parameter's ``data`` is a view into its bucket.
With a distributed optimizer each rank steps only its shard of a bucket, and
an all-gather of the shards refreshes the whole bucket before the layers read
it. With the gather overlapped, a *bucket group* (the buckets gathered
together) is in one of three states: UNDISPATCHED (no gather yet this
iteration), IN_FLIGHT (gather issued, handle held), PUBLISHED (gathered, the
handle waited). A forward pre-hook per layer finishes its group's gather (the
current stream waits the handle) and starts the next group's (the chain).
The end-of-backward reset makes every group UNDISPATCHED again.

A *prefetching consumer* (GTP's one-block-ahead weight gather) copies the next
layer's weight on its own stream before that layer's pre-hook has run. The
wrapper therefore stamps a readiness callback (one per bucket group, under
``PARAM_READY_ATTR``) on every parameter it publishes asynchronously, and the
consumer calls :func:`ensure_params_ready` before it reads: each distinct
callback runs once; PUBLISHED returns at once (the hot path); IN_FLIGHT
finishes the gather (chaining to the next group only while the wrapper's hooks
own the schedule); UNDISPATCHED starts and finishes it, only while the hooks
are installed; a dead weak reference or a graph capture makes it a no-op.
Disabling the hooks drains an in-flight gather; re-wrapping removes the
callbacks of parameters the new wrapper no longer publishes.

Invariant: every forward read of a parameter is stream-ordered after the
all-gather that published it in this iteration, so it sees this iteration's
weights.

Known bugs (named variants; the fixes are the ``Fixes`` flags below):

- ``param-prefetch-no-ready`` (upstream, before the fix): (1) layer l's
  pre-hook finishes its group and starts the next group's gather on the NCCL
  stream; (2) the consumer copies layer l+1's weight on its prefetch stream
  with no edge to that gather; (3) the copy reads the bucket before the gather
  lands: last iteration's weights, silently.
- ``param-ready-skips-undispatched`` (a callback that only finishes gathers
  in flight): (1) the optimizer step leaves every group UNDISPATCHED (the
  first gather is lazy); (2) the consumer primes layer 0 ahead of its pre-hook
  and the callback returns without starting the gather; (3) the prefetch reads
  the stale bucket.
- ``param-no-drain-on-disable`` (upstream's earlier fix): (1) after the
  optimizer step the first group's gather is in flight; (2) an evaluation
  disables the hooks, which returns without waiting it, and the forced sync
  skips the group because it is dispatched; (3) the evaluation forward reads
  the bucket while the gather is still writing it.

Not modelled: backward and activation recompute (upstream calls the callback
on forward gathers only, and its recompute exclusion covers only the FP8
path), FP8 parameter gathers that reuse the gradient buffer, and real CUDA
graph capture (``graph_capture`` sets the flag the guard reads).

The small model that drives it (weights, training loop, oracle) is the
harness, ``simdevice/programs/param_readiness.py``. Checked by
``tests/property/mechanisms/test_param_readiness.py`` (simulator) and
``tests/gpu/test_param_readiness_gpu.py`` (CUDA, NCCL).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

import attrs
import torch

from reference.contract import Device, Work

#: the attribute a backend sets on each parameter it publishes asynchronously (the contract with consumers)
PARAM_READY_ATTR = "param_ready_callback"

#: what one (stand-in) optimizer step adds to every weight: stale and fresh weights differ by a multiple of it
STEP = 2048.0

UNDISPATCHED, IN_FLIGHT, PUBLISHED = "undispatched", "in flight", "published"


@attrs.frozen
class Fixes:
    #: the consumer calls ensure_params_ready before it reads param.data (the upstream fix)
    consumer_ensures_ready: bool = True
    #: the callback starts a gather nobody dispatched yet (not only finishes one in flight)
    ready_starts_undispatched: bool = True
    #: disabling the pre-hooks waits for a gather in flight
    drain_on_disable: bool = True


FIXED = Fixes()
PARAM_PREFETCH_NO_READY = Fixes(consumer_ensures_ready=False)
PARAM_READY_SKIPS_UNDISPATCHED = Fixes(ready_starts_undispatched=False)
PARAM_NO_DRAIN_ON_DISABLE = Fixes(drain_on_disable=False)

VARIANTS = {
    "FIXED": FIXED,
    "param-prefetch-no-ready": PARAM_PREFETCH_NO_READY,
    "param-ready-skips-undispatched": PARAM_READY_SKIPS_UNDISPATCHED,
    "param-no-drain-on-disable": PARAM_NO_DRAIN_ON_DISABLE,
}


class Param:
    """A model parameter; once wrapped, ``data`` is a view into its bucket's buffer."""

    # the last slot is PARAM_READY_ATTR: a slot, so an unpublished parameter has no callback at all
    __slots__ = ("__weakref__", "data", "name", "numel", "param_ready_callback")

    def __init__(self, name: str, numel: int) -> None:
        self.name, self.numel = name, numel
        self.data: Any = None


# ---------------------------------------------------------------------------
# The data-parallel wrapper's side: buckets, bucket groups, hooks.


class Bucket:
    """A flat buffer holding several parameters; this rank owns one shard of it."""

    def __init__(self, dev: Device, params: list[Param], start: int, rank: int, world: int) -> None:
        self.params = params
        numel = sum(p.numel for p in params)
        self.shard_numel = -(-numel // world)
        self.numel = self.shard_numel * world
        #: where the bucket sits in the flat order of all buckets (names the weight values)
        self.start = start
        self.rank = rank
        self.buffer = torch.empty(self.numel, dtype=torch.float32, device=dev.device)
        #: the distributed optimizer's copy of this rank's shard: the all-gather's input
        self.main_shard = torch.empty(self.shard_numel, dtype=torch.float32, device=dev.device)
        offset = 0
        for p in params:
            p.data = self.buffer[offset : offset + p.numel]
            offset += p.numel


class BucketGroup:
    """Buckets whose parameters are gathered together; three states, a chain to the next group."""

    def __init__(self, ddp: DistributedDataParallel, buckets: list[Bucket], index: int) -> None:
        self.ddp = ddp
        self.buckets = buckets
        self.index = index
        self.params = [p for b in buckets for p in b.params]
        self.param_gather_dispatched = False
        self.param_gather_handle: list[Work] | None = None
        #: dispatched and no handle: the hot path reads only this
        self.published = False
        self.next_param_gather_bucket_group: BucketGroup | None = None

    @property
    def state(self) -> str:
        if not self.param_gather_dispatched:
            return UNDISPATCHED
        return IN_FLIGHT if self.param_gather_handle is not None else PUBLISHED

    def start_param_sync(self, force_sync: bool = False) -> None:
        if self.param_gather_dispatched:
            raise AssertionError(f"bucket group {self.index}: a second all-gather into one buffer in one iteration")
        ddp = self.ddp
        async_op = ddp.overlap and not force_sync
        if async_op:
            self.param_gather_handle = [ddp.dev.all_gather_into_tensor(b.buffer, b.main_shard) for b in self.buckets]
        else:
            for b in self.buckets:
                # wait (inside the call): nothing may read the bucket before the gather wrote it
                ddp.dev.all_gather_into_tensor(b.buffer, b.main_shard, async_op=False)
            self.param_gather_handle = None
        self.param_gather_dispatched = True
        self.published = not async_op

    def finish_param_sync(self, skip_next: bool = False) -> None:
        if not self.param_gather_dispatched:
            self.start_param_sync()
        if self.param_gather_handle is None:
            return
        for h in self.param_gather_handle:
            # wait: the current stream must not read the bucket before the all-gather wrote it
            h.wait()
        self.param_gather_handle = None
        self.published = True
        nxt = self.next_param_gather_bucket_group
        if nxt is not None and not skip_next and not nxt.param_gather_dispatched:
            nxt.start_param_sync()

    def reset(self) -> None:
        if self.param_gather_handle is not None:
            raise AssertionError(f"bucket group {self.index}: not dispatched but has a handle")
        self.param_gather_dispatched = False
        self.published = False


class BucketParamReady:
    """The readiness callback of one bucket group; weak references, so a dropped wrapper is a no-op."""

    __slots__ = ("_ddp", "_group")

    def __init__(self, group: BucketGroup, ddp: DistributedDataParallel) -> None:
        self._group = weakref.ref(group)
        self._ddp = weakref.ref(ddp)

    def __call__(self) -> None:
        group = self._group()
        if group is None or group.published:
            return  # the hot path: nothing to do once this iteration's gather is waited
        ddp = self._ddp()
        if ddp is None or ddp.capturing:
            return  # a graph capture must not record a collective or a wait on it
        if group.param_gather_handle is not None:
            # in flight: finish it; chain only while the hooks own the gather order
            group.finish_param_sync(skip_next=not ddp.owns_schedule)
        elif ddp.hooks_installed and ddp.fixes.ready_starts_undispatched:
            group.finish_param_sync(skip_next=not ddp.owns_schedule)


def ensure_params_ready(params: Iterable[Param]) -> None:
    """Run each distinct readiness callback of ``params`` once, in order (consumers call it before reading)."""
    first = None
    seen: set[int] | None = None
    for p in params:
        cb = getattr(p, PARAM_READY_ATTR, None)
        if cb is None or cb is first:
            continue
        if first is None:
            first = cb
        else:
            if seen is None:
                seen = {id(first)}
            if id(cb) in seen:
                continue
            seen.add(id(cb))
        cb()


class DistributedDataParallel:
    """Buckets ``bucket_layers`` consecutive layers; one bucket per group, chained in forward order."""

    def __init__(
        self,
        dev: Device,
        layers: list[Param],
        bucket_layers: int,
        overlap: bool,
        fixes: Fixes,
        rank: int = 0,
        world: int = 1,
    ) -> None:
        self.dev, self.overlap, self.fixes = dev, overlap, fixes
        self.buckets: list[Bucket] = []
        start = 0
        for i in range(0, len(layers), bucket_layers):
            b = Bucket(dev, layers[i : i + bucket_layers], start, rank, world)
            self.buckets.append(b)
            start += b.numel
        self.groups = [BucketGroup(self, [b], i) for i, b in enumerate(self.buckets)]
        for g, nxt in zip(self.groups, self.groups[1:], strict=False):
            g.next_param_gather_bucket_group = nxt
        self.group_of = {id(p): g for g in self.groups for p in g.params}
        self.hooks_installed = overlap
        self.capturing = False
        published: set[int] = set()
        if overlap:
            for g in self.groups:
                cb = BucketParamReady(g, self)
                for p in g.params:
                    setattr(p, PARAM_READY_ATTR, cb)
                    published.add(id(p))
        for p in layers:
            if id(p) not in published and hasattr(p, PARAM_READY_ATTR):
                # a previous wrapper's callback would act on its bucket group, not the buffer p now lives in
                delattr(p, PARAM_READY_ATTR)

    @property
    def owns_schedule(self) -> bool:
        return self.overlap and self.hooks_installed

    def forward_pre_hook(self, layer: Param) -> None:
        if self.hooks_installed:
            self.group_of[id(layer)].finish_param_sync()

    def disable_forward_pre_hook(self, param_sync: bool = True) -> None:
        self.hooks_installed = False
        if self.fixes.drain_on_disable:
            for g in self.groups:
                if g.param_gather_handle is not None:
                    # nobody else would wait it now; skip_next: without hooks nobody finishes a chained gather
                    g.finish_param_sync(skip_next=True)
        if param_sync:
            self.start_param_sync(force_sync=True)

    def enable_forward_pre_hook(self) -> None:
        self.hooks_installed = self.overlap

    def start_param_sync(self, force_sync: bool = False) -> None:
        """After the optimizer step: overlapped, start the first group; else gather every group now."""
        if self.overlap and not force_sync:
            if not self.groups[0].param_gather_dispatched:
                self.groups[0].start_param_sync()
            return
        for g in self.groups:
            if not g.param_gather_dispatched:
                g.start_param_sync(force_sync=True)

    def finish_grad_sync(self) -> None:
        """End of backward: this iteration's gathers are spent; the next step makes the buckets stale."""
        for g in self.groups:
            g.reset()

    def optimizer_step(self) -> None:
        for b in self.buckets:
            b.main_shard.add_(STEP)

    @contextlib.contextmanager
    def graph_capture(self) -> Iterator[None]:
        """While a CUDA graph is captured the callbacks must not launch or wait collectives."""
        self.capturing = True
        try:
            yield
        finally:
            self.capturing = False


# ---------------------------------------------------------------------------
# The consumer's side.


class PrefetchingConsumer:
    """Copies a layer's weight on its own stream ahead of the layer's pre-hook (GTP's prefetch)."""

    def __init__(self, dev: Device, layers: list[Param], fixes: Fixes) -> None:
        self.dev, self.layers, self.fixes = dev, layers, fixes
        self.stream = dev.Stream(name="prefetch")
        self.buffers = [torch.empty(p.numel, dtype=torch.float32, device=dev.device) for p in layers]
        self.ready = [dev.Event() for _ in layers]

    def prefetch(self, i: int) -> None:
        w = self.layers[i]
        if self.fixes.consumer_ensures_ready:
            # the callback's waits land on the current (compute) stream, which the prefetch then waits
            ensure_params_ready([w])
        # wait: the copy must not overwrite the buffer compute still reads, nor read before compute's waits
        self.stream.wait_stream(self.dev.current_stream())
        with self.dev.stream(self.stream):
            self.buffers[i].copy_(w.data)
            self.ready[i].record()

    def consume(self, i: int) -> torch.Tensor:
        # wait: compute must not read the prefetched weight before the prefetch copy landed
        self.dev.current_stream().wait_event(self.ready[i])
        return self.buffers[i]
