"""The memory-saver guard around weight sync (miles ``update_weights`` over ``torch_memory_saver``).

A trainer keeps its model, optimizer state and gradient buffer in a pausable
memory-saver region. Between training steps it *sleeps*: it copies its
weights to pinned host memory, then pauses the region, which unmaps the
region's device memory (addresses kept, contents backed up to host). While it
sleeps, ``update_weights`` sends the weights to the rollout engine: if the
engines changed it first reconnects (the connection handshake is an object
all-gather whose tensors live on the device), records the new connection and
passes a barrier (under NCCL the barrier allocates too: it all-reduces a
one-element device tensor); then it sends the host copy of the weights in
buckets. The trainer then *wakes* (resume) and trains on.

The caching allocator does not know about the pause: free blocks of the
region's segments stay on its free list. So every device allocation made
while the trainer sleeps must be routed to ordinary memory with
``memory_saver.disable()``. When offloading is off nothing is paused and the
guard is not used (``nullcontext``).

Invariant: while the trainer sleeps, every device allocation of the weight
sync, the barrier's included, is made inside ``disable()`` (none comes from the
paused pool: neither a cached block of a paused segment nor a fresh segment of
the paused region), and each physical handle of the region is released exactly
once.

Known bugs, each a named variant:

- ``memsaver-connect-unguarded`` (miles, fixed by guarding the connection):
  1. a training step frees its activations; their block stays cached in a
  region segment; the trainer sleeps and the pause unmaps that segment;
  2. ``update_weights`` reconnects outside ``disable()`` (only the transfer
  was guarded): the handshake's device tensor is served from the cached,
  unmapped block;
  3. the copy into it is an illegal memory access.
- ``memsaver-free-while-paused-twice`` (``torch_memory_saver``; miles picked
  up the fixed version): 1. the pause releases the physical handle of each
  region segment; 2. asleep, the trainer drops its gradient buffer and empties
  the cache, so the allocator frees a paused segment; 3. the library releases
  that segment's handle a second time: the driver refuses and the process
  aborts. The fix is in the library, not in this protocol: the variant runs
  FIXED on a simulated library with the bug
  (``simdevice.runtime.memsaver.LibraryFixes``); a GPU run gets whatever
  ``torch_memory_saver`` is installed.

The configuration, expected weights and oracle are the harness,
``simdevice/programs/memsaver_guard.py``. Checked by
``tests/property/mechanisms/test_memsaver_guard.py`` (simulator) and
``tests/gpu/test_memsaver_guard_gpu.py`` (H200, real ``torch_memory_saver``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import attrs
import torch

from reference.contract import Device

#: the memory-saver region tag of the trainer's memory
TAG = "train"


@attrs.frozen
class Fixes:
    #: connection setup, reconnect bookkeeping and barrier run inside disable() too, not only the transfer
    guard_connection: bool = True


FIXED = Fixes()
CONNECT_UNGUARDED = Fixes(guard_connection=False)
#: the protocol's variants; ``memsaver-free-while-paused-twice`` is FIXED on a buggy library (see above)
VARIANTS = {"FIXED": FIXED, "memsaver-connect-unguarded": CONNECT_UNGUARDED}




@attrs.frozen
class Plan:
    """Sizes (in float32 elements) and what each cycle does."""

    #: the model's weights (and one optimizer state of the same size)
    n: int
    #: the gradient buffer and each step's activations (at least ``n``)
    act_n: int
    #: the connection handshake's device tensor
    conn_n: int
    #: one transfer bucket
    bucket_n: int
    #: trainer offloading: sleep (pause) before each weight sync, wake (resume) after it
    offload: bool
    #: the engines change every cycle, so each sync reconnects (asleep); else one connection, made awake
    reconnect: bool
    #: the first reconnection inside update_weights raises
    fail: bool
    #: train / sleep / sync / wake cycles
    cycles: int
    #: asleep, the trainer drops its gradient buffer and empties the allocator's cache
    drop: bool


def initial_weights(n: int) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32) / 8


@attrs.define
class SyncRecord:
    """What the weight sync did, for the value oracle."""

    guard_entries: int = 0
    guard_exits: int = 0
    connects: int = 0
    failed_connects: int = 0
    transfers: int = 0
    #: per cycle: whether that cycle's update_weights completed
    updated: list[bool] = attrs.field(factory=list)
    #: per cycle: the engine's weights after the sync (host copies)
    received: list[torch.Tensor] = attrs.field(factory=list)
    #: per connection: whether the handshake all-gather returned what was sent
    handshakes: list[bool] = attrs.field(factory=list)


class ConnectionStatus:
    """The reconnect bookkeeping: which engine generation the trainer is connected to."""

    def __init__(self) -> None:
        self.generation = -1

    def needs_reconnect(self, generation: int) -> bool:
        return generation != self.generation

    def mark_reconnected(self, generation: int) -> None:
        self.generation = generation


class RolloutEngine:
    """The inference engine's copy of the weights, outside the trainer's region.

    The engine is another process; its copy stands here in pinned host memory, which no pause of the
    trainer touches on either backend (on CUDA the whole trainer process may be the region, see
    ``reference.device.CudaDevice.memory_saver``).
    """

    def __init__(self, dev: Device, n: int) -> None:
        self.weights = torch.zeros(n, dtype=torch.float32, pin_memory=True)


class Trainer:
    """Model, optimizer state and gradients, all allocated in the pausable region (build it inside it)."""

    def __init__(self, dev: Device, cfg: Plan) -> None:
        self.dev, self.cfg = dev, cfg
        self.n, self.act_n = cfg.n, cfg.act_n
        self.weights = torch.empty(self.n, dtype=torch.float32, device=dev.device)
        self.weights.copy_(initial_weights(self.n))
        self.exp_avg = torch.zeros(self.n, dtype=torch.float32, device=dev.device)
        self.grad: torch.Tensor | None = torch.zeros(self.act_n, dtype=torch.float32, device=dev.device)
        self.host_weights = torch.empty(self.n, dtype=torch.float32, pin_memory=True)
        self.steps = 0
        self.asleep = False

    def train_step(self) -> None:
        assert self.grad is not None
        self.steps += 1
        # the activations die at the end of the step; their block stays cached in the region's pool
        activations = torch.full((self.act_n,), float(self.steps), dtype=torch.float32, device=self.dev.device)
        self.grad.copy_(activations)
        self.exp_avg.mul_(0.5).add_(self.grad[: self.n])
        self.weights.sub_(self.exp_avg * 0.25)

    def sleep(self) -> None:
        # the sync sends these while the device copy is unmapped
        self.host_weights.copy_(self.weights, non_blocking=True)
        # wait: the D2H and every kernel on region memory must finish before pause unmaps it
        self.dev.synchronize()
        self.dev.memory_saver.pause(TAG)
        self.asleep = True
        if self.cfg.drop:
            self.grad = None
            # gives the entirely free segments back: frees paused memory
            self.dev.empty_cache()

    def wake(self) -> None:
        self.dev.memory_saver.resume(TAG)
        self.asleep = False
        if self.grad is None:
            self.grad = torch.zeros(self.act_n, dtype=torch.float32, device=self.dev.device)


class WeightUpdater:
    """``update_weights``: reconnect to the rollout engines when they changed, then send the weights."""

    def __init__(self, dev: Device, fixes: Fixes, cfg: Plan, trainer: Trainer, record: SyncRecord) -> None:
        self.dev, self.fixes, self.cfg, self.trainer, self.record = dev, fixes, cfg, trainer, record
        self.conn_status = ConnectionStatus()
        self.attempts = 0

    @contextlib.contextmanager
    def _safe_allocations(self) -> Iterator[None]:
        """``disable()`` when offloading (route allocations to ordinary memory), else a no-op."""
        if not self.cfg.offload:
            yield
            return
        self.record.guard_entries += 1
        try:
            with self.dev.memory_saver.disable():
                yield
        finally:
            self.record.guard_exits += 1

    def connect_rollout_engines(self, fail: bool) -> None:
        """The connection handshake: an object all-gather, whose tensors are allocated on the device."""
        self.attempts += 1
        self.record.handshakes.append(self._handshake(float(1000 * self.attempts)))
        # the handshake's tensors died with _handshake, inside the guard (an exception's traceback would
        # otherwise keep them alive past disable(), which deletes its temporary pool on exit)
        if fail:
            self.record.failed_connects += 1
            raise ConnectionError("a rollout engine refused the connection")
        self.record.connects += 1

    def _handshake(self, token: float) -> bool:
        n = self.cfg.conn_n
        mine = torch.full((n,), token, dtype=torch.float32, device=self.dev.device)
        gathered = torch.empty(n, dtype=torch.float32, device=self.dev.device)
        work = self.dev.all_gather_into_tensor(gathered, mine, async_op=True)
        # wait: the gathered handshake must land before the host reads it
        work.wait()
        return bool(torch.equal(gathered.cpu(), torch.full((n,), token)))

    def _barrier(self) -> None:
        # NCCL's barrier allocates: dist.barrier() all-reduces a one-element tensor it makes on the current
        # device (at::empty({1}) in ProcessGroupNCCL::barrier), from the caller's pool like any other allocation,
        # so asleep it too must run inside disable(); here the allocation, and a write standing for the all-reduce
        flag = torch.zeros(1, dtype=torch.float32, device=self.dev.device)
        # wait: barrier: no rank sends weights before every rank's connection is up (world size 1: drain)
        self.dev.synchronize()
        # the flag dies inside the guard, whose temporary pool disable() deletes on exit
        del flag

    def update_weights(self, engine: RolloutEngine, generation: int) -> None:
        if self.conn_status.needs_reconnect(generation):
            fail = self.cfg.fail and self.attempts == 0
            # fix: the connection's collectives allocate too: guard them, the bookkeeping and the barrier
            with self._safe_allocations() if self.fixes.guard_connection else contextlib.nullcontext():
                self.connect_rollout_engines(fail)
                self.conn_status.mark_reconnected(generation)
                self._barrier()
        with self._safe_allocations():
            self._transfer(engine)

    def _transfer(self, engine: RolloutEngine) -> None:
        # asleep, the device weights are unmapped: send the host copy made before the pause
        src = self.trainer.host_weights if self.trainer.asleep else self.trainer.weights
        nb = self.cfg.bucket_n
        for lo in range(0, src.numel(), nb):
            hi = min(src.numel(), lo + nb)
            bucket = torch.empty(hi - lo, dtype=torch.float32, device=self.dev.device)
            bucket.copy_(src[lo:hi], non_blocking=True)
            # the broadcast to the engine (a copy out, ordered after the bucket's H2D; it returns once done)
            engine.weights[lo:hi].copy_(bucket)
            # the bucket dies inside the guard, whose temporary pool disable() deletes on exit
            del bucket
        self.record.transfers += 1


def run_lifecycle(dev: Device, fixes: Fixes, cfg: Plan) -> SyncRecord:
    """Train, sleep, sync, wake, ``cfg.cycles`` times; return what the syncs did."""
    record = SyncRecord()
    engine = RolloutEngine(dev, cfg.n)
    with dev.memory_saver.region(TAG, enable_cpu_backup=True):
        trainer = Trainer(dev, cfg)
        updater = WeightUpdater(dev, fixes, cfg, trainer, record)
        if not cfg.reconnect:
            updater.connect_rollout_engines(fail=False)  # awake: nothing is paused yet
            updater.conn_status.mark_reconnected(0)
        for cycle in range(cfg.cycles):
            trainer.train_step()
            if cfg.offload:
                trainer.sleep()
            try:
                updater.update_weights(engine, cycle + 1 if cfg.reconnect else 0)
                record.updated.append(True)
            except ConnectionError:
                record.updated.append(False)
            record.received.append(engine.weights.clone())
            if cfg.offload:
                trainer.wake()
    return record
