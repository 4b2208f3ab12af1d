"""Zero-cost checkpoint benchmarks: CPU time-to-find per variant; on a GPU, what saving costs a training step.

CPU (always): for each bug variant and several Hypothesis seeds, how many schedules and seconds until
the simulator finds (a) what ``simdevice check`` counts as found (a stale read, a deadlock, wrong values)
and (b) a snapshot torn in values (the kind a GPU shows), with the configuration narrowed to where the
bug lives for (b). Prints one line per variant with the median and the range.

GPU (when CUDA is present): the training loop of ``reference.zcc`` with a matmul standing in for each
micro-step's forward/backward, a 256 MiB fused buffer, three workers and a save every 8 steps, timing each step:

- ``no-save``: steps with no snapshot in flight;
- ``FIXED``: the step after a save, with the step-begin barrier (the D2H cannot overlap that step);
- ``late-barrier``: the same with the barrier only at ``on_optimizer_begin`` (the D2H overlaps the
  forward/backward; unsafe when ``on_step_begin`` writes the buffers, so it runs without mutation);
- the bare D2H of the fused buffer into pinned memory, for reference.

Run: ``PYTHONPATH=. python benchmarks/bench_zcc.py [--seeds 5] [--examples 300] [--gpu-steps 48]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

from simdevice.programs import load_all
from simdevice.search import search


def time_to_find(variant: str, seeds: int, examples: int) -> None:
    import attrs

    from simdevice.programs.zcc import PROGRAM

    narrow = dict(PROGRAM.config_space)
    narrow.update({"mutate": ("1",), "chunks": ("1",), "ema": ("0",)})
    searches = {
        "found": (PROGRAM, lambda out: out.corrupted),
        "torn": (attrs.evolve(PROGRAM, config_space=narrow), lambda out: bool(out.problems)),
    }
    if variant == "zcc-no-step-begin-guard":
        del searches["torn"]  # a liveness bug: nothing is torn, the run deadlocks
    for what, (program, fails) in searches.items():
        counts, secs, shrunk = [], [], []
        for seed in range(seeds):
            found = search(program, variant, fails, examples, shrink=False, seed=seed)
            counts.append(found.examples if found.schedule is not None else -1)
            if found.schedule is not None:
                shrunk.append(str(found.schedule))
            secs.append(found.seconds)
        ok = [c for c in counts if c >= 0]
        med = statistics.median(ok) if ok else float("nan")
        print(
            f"{variant:26} {what:5}: found {len(ok)}/{seeds} seeds; schedules to find: median {med}, "
            f"range {min(ok, default=-1)}..{max(ok, default=-1)}; seconds: median {statistics.median(secs):.2f}"
            f"; e.g. {shrunk[0] if shrunk else '-'}",
            flush=True,
        )


# ---------------------------------------------------------------------------
# GPU


def _timed_loop(dev: Any, fixes: Any, steps: int, save_every: int, kib: int, dim: int) -> dict[str, list[float]]:
    import torch

    from reference.zcc import (
        IDLE,
        Plan,
        TrainerState,
        ZeroCostCheckpointCallback,
        ZeroCostCheckpointManager,
        forward_backward,
        initial_storage,
        optimizer_update,
    )

    cfg = Plan(steps=1, save=1, ema=0, workers=3, chunks=1, mutate=False, log=True, dump=0, numel=kib * 256)
    n = kib * 256
    storage = torch.empty(2 * n, dtype=torch.float32, device=dev.device)
    storage.copy_(initial_storage(n))
    params, moments = storage[:n], storage[n:]
    grads = torch.zeros(n, dtype=torch.float32, device=dev.device)
    a = torch.ones(dim, dim, device=dev.device) / dim
    dev.synchronize()
    manager = ZeroCostCheckpointManager(dev, fixes, storage, cfg)
    callback = ZeroCostCheckpointCallback(manager, fixes, cfg)
    state = TrainerState()
    times: dict[str, list[float]] = {"no-save": [], "after-save": [], "on_step_end": []}
    saved_last = False
    try:
        # Warm up: one snapshot per worker, so that every worker process is up before the timing starts.
        for _ in manager.workers:
            state.global_step += 1
            callback.on_step_end(state)
            manager.sync_offload_status()
        while any(w.status.value != IDLE for w in manager.workers):
            dev.sleep(1)
        for step in range(steps):
            start = time.perf_counter()
            if fixes.step_begin_sync:
                manager.maybe_sync_offload_status()
            for _ in range(cfg.chunks):
                forward_backward(params, grads)
                a = a @ a  # stands in for the forward/backward compute
                callback.on_substep_end()
            callback.on_optimizer_begin()
            optimizer_update(params, moments, grads)
            state.loss = a.sum().item()
            elapsed = time.perf_counter() - start
            times["after-save" if saved_last else "no-save"].append(elapsed)
            state.global_step += 1
            saved_last = step % save_every == save_every - 1
            if saved_last:
                t = time.perf_counter()
                callback.on_step_end(state)
                times["on_step_end"].append(time.perf_counter() - t)
        manager.finish()
    finally:
        manager.close()
    return times


def gpu_figures(steps: int, kib: int, dim: int) -> None:
    import torch

    from reference.cuda import CudaDevice
    from reference.zcc import FIXED, LATE_BARRIER

    n = kib * 256 * 2
    src = torch.ones(n, device="cuda")
    dst = torch.empty(n, pin_memory=True)
    d2h = []
    for _ in range(5):
        torch.cuda.synchronize()
        t = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        d2h.append(time.perf_counter() - t)
    ms = 1e3
    print(f"GPU {torch.cuda.get_device_name()}: fused buffer {n * 4 >> 20} MiB, D2H to pinned "
          f"{statistics.median(d2h) * ms:.2f} ms", flush=True)
    for name, fixes in (("FIXED", FIXED), ("late-barrier", LATE_BARRIER)):
        dev = CudaDevice()
        times = dev.run(_timed_loop, fixes, steps, 8, kib, dim).result
        line = ", ".join(f"{k} {statistics.median(v) * ms:.2f} ms (n={len(v)})" for k, v in times.items() if v)
        print(f"GPU {name:12}: step time {line}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--examples", type=int, default=300)
    p.add_argument("--gpu-steps", type=int, default=48)
    p.add_argument("--kib", type=int, default=128 * 1024, help="GPU parameter size in KiB (fused buffer: twice)")
    p.add_argument("--dim", type=int, default=8192, help="GPU matmul size standing in for compute")
    p.add_argument("--no-cpu", action="store_true")
    args = p.parse_args(argv)
    load_all()
    if not args.no_cpu:
        from simdevice.programs.zcc import PROGRAM

        for variant in PROGRAM.buggy:
            time_to_find(variant, args.seeds, args.examples)
    try:
        import torch

        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    if cuda:
        gpu_figures(args.gpu_steps, args.kib, args.dim)
    else:
        print("no CUDA GPU: GPU figures skipped", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
