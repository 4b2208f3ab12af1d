"""Zero-cost checkpoint (ZCC): a worker process snapshots the trainer's fused buffers while training goes on.

The trainer keeps its parameters and optimizer moments in one fused device
buffer. At the end of a save step the checkpoint manager hands the snapshot
to an idle worker process. The worker maps the buffer over CUDA IPC (shared
storage in the simulator), copies it device-to-host on its own stream into a
pinned mirror, in ``offload_chunks`` chunks (the first sent at the end of the
step, the others one per micro-step hook of the next step), publishes
``status = DUMPING`` and the ``global_step`` echo through shared values, then
dumps the mirror (to a file here; the test reads it back). The worker's
stream and the trainer's stream belong to different processes: nothing orders
them but the echo handshake, which the trainer polls in
``sync_offload_status`` before it writes the buffers again.

Invariant: once a worker has echoed step N, its snapshot equals the fused
buffers as of the end of step N, element for element; the trainer writes
nothing to them (``on_step_begin`` callbacks included) before that echo.

Known bugs (variants; the names are the fix flags of :class:`Fixes`):

- ``zcc-frozen-step`` (``Fixes.refresh_step``): the manager's step is set only
  when the worker's buffer mapping is refreshed, at the first save. 1. Save at
  step 1: the worker echoes 1. 2. Save at step 2: the manager still expects 1,
  the reused worker still shows 1, so the barrier passes on the first poll.
  3. Step 3 writes the buffers before the worker's D2H of step 2 ran: the
  checkpoint of step 2 holds step-3 values, silently.
- ``zcc-late-barrier`` (``Fixes.step_begin_sync``): the barrier sits only at
  ``on_optimizer_begin``. 1. Save at step 1, the worker's D2H is slow. 2. The
  ``on_step_begin`` callback of step 2 (an FP8 rescale) writes the buffers.
  3. The D2H copies the rescaled values.
- ``zcc-no-step-begin-guard`` (``Fixes.step_begin_guard``): the step-begin
  barrier also waits when chunks are still to be dispatched. 1. Save at step 1
  with 2 chunks: only chunk 1 is sent. 2. Step 2 begins by waiting for the
  echo, which needs chunk 2, which only step 2's micro-step hook sends: a
  deadlock (reported by the simulator, never a hang).

The fix refreshes ``manager.global_step`` on every ``on_step_end`` (both the
save and the EMA-only branch) and adds ``maybe_sync_offload_status`` before
``on_step_begin``, guarded so it never waits for a chunk not yet sent; the
``on_optimizer_begin`` barrier stays as a backstop.

Remaining gaps of the fixed protocol, shown by tests marked as expected
failures: with several chunks (or the EMA-only branch, which sends every
chunk from the next step's hooks) the guard declines to wait, so a step-begin
mutation still tears the snapshot; and the worker's D2H is ordered after the
trainer's host, not after the trainer's own kernels: the fixed protocol relies
on a host synchronization at the end of the step (the loss logged with
``.item()`` here, ``Plan.log``). The re-allocation of cleared parameter
storage behind the worker's IPC handle is not modelled.

The configuration, expected states and oracle are the harness,
``simdevice/programs/zcc.py``. Checked by
``tests/property/mechanisms/test_zcc.py`` (simulator) and
``tests/gpu/test_zcc_gpu.py`` (CUDA, spawned workers, CUDA IPC).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from typing import Any

import attrs
import torch

from reference.contract import Device, Process, SharedQueue, SharedValue

#: worker status values, published through a shared value
IDLE, OFFLOADING, DUMPING, ERROR = 0, 1, 2, 3
#: worker tasks
PREPARE, OFFLOAD, EXIT = "prepare", "offload", "exit"
#: how long the trainer sleeps between two polls of a shared value, in units (1 unit = 1 ms)
POLL_UNITS = 1
#: a real run must not hang a test: give up after this many polls (the simulator reports a deadlock long before)
MAX_POLLS = 60_000
#: how long the trainer waits for a worker's dump at the end of training (seconds; the simulator never waits)
DUMP_TIMEOUT_S = 120.0


@attrs.frozen
class Fixes:
    """The upstream fix, flag by flag; each flag sits at the line the fix changed."""

    #: ``on_step_end`` (save and EMA-only branch): ``manager.global_step = state.global_step``
    refresh_step: bool = True
    #: the training loop calls ``maybe_sync_offload_status()`` just before ``on_step_begin``
    step_begin_sync: bool = True
    #: ``maybe_sync_offload_status`` returns while chunks remain to be dispatched in this step
    step_begin_guard: bool = True


FIXED = Fixes()
FROZEN_STEP = Fixes(refresh_step=False)
LATE_BARRIER = Fixes(step_begin_sync=False)
NO_STEP_BEGIN_GUARD = Fixes(step_begin_guard=False)
#: the code before the fix: both the frozen step and the late barrier
PRE_FIX = Fixes(refresh_step=False, step_begin_sync=False)

VARIANTS: dict[str, Fixes] = {
    "FIXED": FIXED,
    "zcc-frozen-step": FROZEN_STEP,
    "zcc-late-barrier": LATE_BARRIER,
    "zcc-no-step-begin-guard": NO_STEP_BEGIN_GUARD,
}




@attrs.frozen
class Plan:
    """What the training loop does: how many steps, when it saves, what each step does."""

    steps: int
    #: save a checkpoint every ``save`` steps
    save: int
    #: EMA-only snapshot every ``ema`` steps that are not save steps (0: never)
    ema: int
    workers: int
    #: ``offload_chunks`` = ``pipeline_hooks_steps`` = gradient-accumulation micro-steps
    chunks: int
    #: an ``on_step_begin`` callback rescales the parameters in place (FP8 quantization)
    mutate: bool
    #: the trainer logs the loss with ``.item()`` before ``on_step_end`` (a host sync the fix relies on)
    log: bool
    #: how long writing a dump to disk takes, in units (the simulator knows no file system)
    dump: int
    #: parameters in the fused buffer (it holds twice that: parameters and moments)
    numel: int

    def is_save_step(self, step: int) -> bool:
        return step % self.save == 0

    def is_ema_step(self, step: int) -> bool:
        return self.ema > 0 and step % self.ema == 0 and not self.is_save_step(step)


# ---------------------------------------------------------------------------
# The trainer's arithmetic: the same functions run on the device and, in the oracle, on the CPU.
# Every operation is exact or correctly rounded, so a CPU replay matches a GPU run bit for bit.


def initial_storage(n: int) -> torch.Tensor:
    """The fused buffer at step 0 on the host: ``n`` parameters, then ``n`` moments."""
    params = 1 + (torch.arange(n, dtype=torch.float32) % 251) / 8
    return torch.cat([params, torch.zeros(n, dtype=torch.float32)])


def quantize_fp8_scale(params: torch.Tensor) -> None:
    """The ``on_step_begin`` callback: rescale the weights in place before casting them to FP8."""
    params.mul_(0.5)


def forward_backward(params: torch.Tensor, grads: torch.Tensor) -> None:
    grads.add_(params)


def optimizer_update(params: torch.Tensor, moments: torch.Tensor, grads: torch.Tensor) -> None:
    """The optimizer step: parameters and moments change in place."""
    moments.mul_(0.5)
    moments.add_(grads)
    params.sub_(moments, alpha=0.0625)
    grads.zero_()


def chunk_bounds(numel: int, chunks: int) -> list[tuple[int, int]]:
    step = -(-numel // chunks)
    return [(lo, min(lo + step, numel)) for lo in range(0, numel, step)]


# ---------------------------------------------------------------------------
# The worker process.


def zcc_worker(
    dev: Device,
    index: int,
    storage: torch.Tensor,
    tasks: SharedQueue,
    status: SharedValue,
    global_step: SharedValue,
    results: SharedQueue,
    dump_dir: str,
    chunks: int,
    dump_units: int,
) -> None:
    """Serve PREPARE / OFFLOAD tasks: copy the mapped buffer chunk by chunk, echo the step, dump."""
    d2h = dev.Stream(name="d2h")
    mirror = torch.empty(storage.numel(), dtype=storage.dtype, pin_memory=True)
    bounds = chunk_bounds(storage.numel(), chunks)
    save_step, kind, next_chunk = 0, "", 0
    while True:
        # wait: a task carries the trainer's progress; the D2H it asks for must not start before the step ended
        task = tasks.get()
        if task[0] == EXIT:
            return
        if task[0] == PREPARE:
            _, save_step, kind = task
            next_chunk = 0
            status.value = OFFLOADING
            continue
        _, echo = task
        lo, hi = bounds[next_chunk]
        with dev.stream(d2h):
            mirror[lo:hi].copy_(storage[lo:hi], non_blocking=True)
        next_chunk += 1
        if next_chunk < len(bounds):
            continue
        # wait: every chunk's D2H must have landed before the echo lets the trainer write the buffers again
        d2h.synchronize()
        status.value = DUMPING
        global_step.value = echo
        snapshot = mirror.clone()
        path = os.path.join(dump_dir, f"{kind}-{save_step}-worker{index}.pt")
        torch.save(snapshot, path)
        dev.sleep(dump_units)  # the disk write's duration, which the simulator cannot know
        results.put((save_step, kind, index, path))
        status.value = IDLE


@attrs.define
class ZccWorker:
    """The trainer's handle on one worker process and its shared values."""

    index: int
    process: Process
    tasks: SharedQueue
    status: SharedValue
    global_step: SharedValue


# ---------------------------------------------------------------------------
# The manager and the callback.


class ZeroCostCheckpointManager:
    def __init__(self, dev: Device, fixes: Fixes, storage: torch.Tensor, cfg: Plan) -> None:
        self.dev = dev
        self.fixes = fixes
        self.offload_chunks = cfg.chunks
        self.pipeline_hooks_steps = cfg.chunks
        self.current_pipeline_hook_step = 0
        self.current_worker: ZccWorker | None = None
        #: the step the barrier waits for the current worker to echo (set 'on-step-end')
        self.global_step = 0
        #: the fused-buffer version the workers' IPC mapping was made for
        self.cache_version = -1
        #: (step of the snapshot in flight, worker, echo that released the barrier), for the checker
        self.releases: list[tuple[int, int, int]] = []
        self.requests: list[tuple[int, str, int]] = []
        self._save_step = 0
        self.dump_dir = ""
        self.workers = []
        try:  # the folder made inside it: a stop (Ctrl-C, SIGTERM) landing right after it leaves nothing behind
            # named before it is made (mkdtemp returns its name only after making it: a stop landing in between
            # left a folder that close() did not know of)
            self.dump_dir = os.path.join(tempfile.gettempdir(), f"zcc-{uuid.uuid4().hex}")
            os.mkdir(self.dump_dir, 0o700)
            self.results = dev.Queue()
            for i in range(cfg.workers):
                tasks, status, echo = dev.Queue(), dev.Value("i", IDLE), dev.Value("i", 0)
                # The fused buffer travels to the worker by CUDA IPC: both processes address the same memory.
                args = (i, storage, tasks, status, echo, self.results, self.dump_dir, cfg.chunks, cfg.dump)
                p = dev.Process(target=zcc_worker, args=args, name=f"worker{i}")
                p.start()
                self.workers.append(ZccWorker(i, p, tasks, status, echo))
        except BaseException:  # stopped while the workers start (no manager for the caller to close): no folder left
            self.close()
            raise

    def update_zcc_workers(self, fused_buffer_version: int, global_step: int) -> None:
        """Refresh the workers' buffer mapping (the buffer never moves here) and, upstream, the step."""
        self.cache_version = fused_buffer_version
        self.global_step = global_step

    def get_idle_worker_for_saving(self) -> ZccWorker:
        assert self.global_step != 0, "a snapshot is never requested for step 0"
        polls = 0
        # wait: a worker still copying or dumping must not take a new snapshot into the mirror it reads from
        while True:
            for w in self.workers:
                if w.status.value == IDLE:
                    return w
            self._poll(polls, "an idle ZCC worker")
            polls += 1

    def request_snapshot(self, step: int, kind: str) -> None:
        w = self.get_idle_worker_for_saving()
        self.current_worker = w
        self.current_pipeline_hook_step = 0
        self._save_step = step
        self.requests.append((step, kind, w.index))
        w.tasks.put((PREPARE, step, kind))

    def zcc_pipeline_hook(self) -> None:
        """Dispatch the next chunk of the snapshot in flight, if any is left."""
        if self.current_worker is None or self.current_pipeline_hook_step == self.pipeline_hooks_steps:
            return
        self.current_worker.tasks.put((OFFLOAD, self.global_step))
        self.current_pipeline_hook_step += 1

    def sync_offload_status(self) -> None:
        """The barrier: wait until the current worker echoes the step of the snapshot in flight."""
        w = self.current_worker
        if w is None:
            return
        polls = 0
        # wait: the worker's D2H of the snapshot must finish before the trainer writes the fused buffers
        while (echo := w.global_step.value) != self.global_step:
            self._poll(polls, f"worker{w.index} to echo step {self.global_step}")
            polls += 1
        self.releases.append((self._save_step, w.index, echo))
        self.current_worker = None
        self.current_pipeline_hook_step = 0

    def maybe_sync_offload_status(self) -> None:
        """The step-begin barrier: run it unless chunks are still to be dispatched during this step."""
        if self.current_worker is None:
            return
        if self.fixes.step_begin_guard and self.current_pipeline_hook_step != self.pipeline_hooks_steps:
            # The remaining chunks are sent by this step's hooks: waiting for them here would deadlock.
            return
        self.sync_offload_status()

    def finish(self) -> list[tuple[int, str, int, torch.Tensor]]:
        """End of training: send what is left, wait for it, collect the dumps, stop the workers."""
        while self.current_worker is not None and self.current_pipeline_hook_step < self.pipeline_hooks_steps:
            self.zcc_pipeline_hook()
        self.sync_offload_status()
        # wait: the dumps are read back only once their files are written
        dumped = [self.results.get(timeout=DUMP_TIMEOUT_S) for _ in self.requests]
        for w in self.workers:
            w.tasks.put((EXIT,))
        for w in self.workers:
            w.process.join()
        snapshots = [(step, kind, i, torch.load(path)) for step, kind, i, path in dumped]
        return sorted(snapshots, key=lambda s: (s[0], s[2]))

    def close(self) -> None:
        if not self.dump_dir:
            return
        try:
            shutil.rmtree(self.dump_dir, ignore_errors=True)
        except BaseException:  # a stop landing mid-removal: finish it, then let the stop go on
            shutil.rmtree(self.dump_dir, ignore_errors=True)
            raise

    def _poll(self, polls: int, what: str) -> None:
        dead = [w.index for w in self.workers if not w.process.is_alive()]
        if dead:
            raise RuntimeError(f"waiting for {what}, but worker{dead[0]} has exited")
        if polls >= MAX_POLLS:
            raise TimeoutError(f"gave up waiting for {what} after {polls} polls")
        self.dev.sleep(POLL_UNITS)


@attrs.define
class TrainerState:
    global_step: int = 0
    loss: float = 0.0


class ZeroCostCheckpointCallback:
    #: the fused buffer is allocated once; upstream bumps this when it re-allocates
    fused_buffer_version = 1

    def __init__(self, manager: ZeroCostCheckpointManager, fixes: Fixes, cfg: Plan) -> None:
        self.manager, self.fixes, self.cfg = manager, fixes, cfg

    def maybe_update_zcc_worker(self, state: TrainerState) -> None:
        if self.fused_buffer_version == self.manager.cache_version:
            return
        self.manager.update_zcc_workers(self.fused_buffer_version, state.global_step)

    def on_substep_end(self) -> None:
        self.manager.zcc_pipeline_hook()

    def on_optimizer_begin(self) -> None:
        # wait: the optimizer step writes the buffers the snapshot in flight may still be copying (backstop)
        self.manager.sync_offload_status()

    def on_step_end(self, state: TrainerState) -> None:
        if self.cfg.is_save_step(state.global_step):
            self.maybe_update_zcc_worker(state)
            if self.fixes.refresh_step:
                self.manager.global_step = state.global_step
            self.manager.request_snapshot(state.global_step, "checkpoint")
            self.manager.zcc_pipeline_hook()
        elif self.cfg.is_ema_step(state.global_step):
            self.maybe_update_zcc_worker(state)
            if self.fixes.refresh_step:
                self.manager.global_step = state.global_step
            # No hook here: every chunk of an EMA-only snapshot is sent by the next step's micro-step hooks.
            self.manager.request_snapshot(state.global_step, "ema")


# ---------------------------------------------------------------------------
# The training loop.


def train(dev: Device, fixes: Fixes, cfg: Plan) -> dict[str, Any]:
    """Train ``cfg.steps`` steps with ZCC snapshots; return the snapshots and what the barrier saw."""
    n = cfg.numel
    storage = torch.empty(2 * n, dtype=torch.float32, device=dev.device)
    storage.copy_(initial_storage(n))
    params, moments = storage[:n], storage[n:]
    grads = torch.zeros(n, dtype=torch.float32, device=dev.device)
    # wait: the workers map the buffer as soon as they start; its initial values must be there first
    dev.current_stream().synchronize()
    manager = ZeroCostCheckpointManager(dev, fixes, storage, cfg)
    try:
        callback = ZeroCostCheckpointCallback(manager, fixes, cfg)
        state = TrainerState()
        for _ in range(cfg.steps):
            if fixes.step_begin_sync:
                # wait: on_step_begin may write the buffers the previous step's snapshot is still copying
                manager.maybe_sync_offload_status()
            if cfg.mutate:
                quantize_fp8_scale(params)
            loss = None
            for _ in range(cfg.chunks):
                forward_backward(params, grads)
                loss = grads.sum()
                callback.on_substep_end()
            callback.on_optimizer_begin()
            optimizer_update(params, moments, grads)
            if cfg.log:
                assert loss is not None
                # wait: the host sees this step's kernels done, so a worker handed the buffer next copies them
                state.loss = loss.item()
            state.global_step += 1
            callback.on_step_end(state)
        snapshots = manager.finish()
        final = storage.cpu()
    finally:
        manager.close()
    return {"snapshots": snapshots, "releases": manager.releases, "requests": manager.requests, "final": final}
