"""Activation offload benchmark: time to find each bug on CPU; fix overhead and copy bandwidth on a GPU.

    PYTHONPATH=. python benchmarks/bench_activation_offload.py [--seeds 20] [--gpu-only | --cpu-only]

CPU: for each bug variant, Hypothesis searches ``activation_offload`` schedules from 20 different random
seeds (no shrinking); prints the median seconds and examples to the first failing schedule.

GPU (when CUDA is present): wall time per training iteration of the small model (4 layers, 2 microbatches,
64 MiB activations, two per layer) with offload FIXED, without offload, and with the correct-but-slower arms
(an unconditional wait in place of the latch; a prefetch that leaves the latch set); and the bandwidth a
group's bulk D2H and prefetch H2D achieve against a plain pinned copy of the same size. Figures, not
assertions: nothing here is a test.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from typing import Any

import torch

from reference import activation_offload as ao
from simdevice.programs import REGISTRY, load_all
from simdevice.programs import activation_offload as harness
from simdevice.search import search


def time_to_find(variant: str, seeds: int) -> None:
    load_all()
    program = REGISTRY["activation_offload"]
    secs, examples = [], []
    for seed in range(seeds):
        found = search(program, variant, shrink=False, seed=seed)
        secs.append(found.seconds)
        examples.append(found.examples if found.schedule is not None else -1)
    missed = sum(1 for e in examples if e < 0)
    print(f"CPU {variant}: median {statistics.median(secs):.2f}s, median {statistics.median(examples)} examples "
          f"to the first failing schedule over {seeds} seeds (max {max(secs):.2f}s; not found: {missed})")


def _gpu_iteration_times(iters: int = 6, runs: int = 5, dim: int = 4096) -> None:
    """Per-iteration wall time of each arm, the arms interleaved run by run (side by side), the first
    iteration of each run (warm-up pass, no offload) left out. Each layer's forward also multiplies two
    ``dim`` x ``dim`` matrices on the compute stream, compute that the copies can overlap."""
    from reference.cuda import CudaDevice

    base = harness.TrainConfig(layers=4, mb=2, iters=iters, frac=100, warmup=1, kib=64 * 1024, check=0)
    arms: list[tuple[str, ao.Fixes, harness.TrainConfig]] = [
        ("no offload", ao.FIXED, harness.TrainConfig(**{**_fields(base), "offload": 0})),
        ("FIXED (latch)", ao.FIXED, base),
        ("unconditional wait", ao.UNCONDITIONAL_WAIT, base),
        ("prefetch keeps latch", ao.PREFETCH_KEEPS_LATCH, base),
        ("FIXED, fraction 0.5", ao.FIXED, harness.TrainConfig(**{**_fields(base), "frac": 50})),
    ]
    a = torch.randn(dim, dim, device="cuda")
    plain_layer = harness.layer_forward

    def layer_with_compute(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        torch.mm(a, a)  # stands in for the layer's matmuls: stream time the copies can overlap
        return plain_layer(x, w)

    harness.layer_forward = layer_with_compute  # type: ignore[assignment]
    try:
        times: dict[str, list[float]] = {name: [] for name, _, _ in arms}
        cycles = None
        for r in range(runs + 1):  # run 0 warms up every arm
            for name, fixes, cfg in arms:
                dev = CudaDevice(None, cycles_per_ms=cycles)
                cycles = dev.cycles_per_ms
                stamps: list[float] = []

                def stamp(it: int, stamps: list[float] = stamps) -> None:
                    torch.cuda.synchronize()
                    stamps.append(time.perf_counter())

                dev.run(harness.train, fixes, cfg, stamp)
                if r:
                    times[name] += [t1 - t0 for t0, t1 in itertools.pairwise(stamps)]
    finally:
        harness.layer_forward = plain_layer  # type: ignore[assignment]
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(8 * 10):
        torch.mm(a, a)
    torch.cuda.synchronize()
    mm = (time.perf_counter() - start) / 10
    print(f"GPU compute alone: {1e3 * mm:.1f} ms per iteration (8 layer forwards' matmuls, {dim}x{dim})")
    for name, ts in times.items():
        print(f"GPU iteration, {name}: median {1e3 * statistics.median(ts):.1f} ms over {len(ts)} iterations "
              f"(min {1e3 * min(ts):.1f}, max {1e3 * max(ts):.1f}; {runs} runs x {iters - 1}, arms interleaved)")


def _fields(cfg: harness.TrainConfig) -> dict[str, Any]:
    import attrs

    return attrs.asdict(cfg)


def _gpu_bandwidth(mib: int = 64, reps: int = 5) -> None:
    from reference.cuda import CudaDevice

    n = mib * (1 << 20) // 4
    nbytes = 2 * n * 4

    def timed(stream: torch.cuda.Stream, fn: Any) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record(stream)
        fn()
        end.record(stream)
        end.synchronize()
        return float(start.elapsed_time(end)) / 1e3

    src = [torch.randn(n, device="cuda") for _ in range(2)]
    pinned = [torch.empty(n, pin_memory=True) for _ in range(2)]
    side = torch.cuda.Stream()

    def plain_d2h() -> None:
        with torch.cuda.stream(side):
            for p, s in zip(pinned, src, strict=True):
                p.copy_(s, non_blocking=True)

    def plain_h2d() -> None:
        with torch.cuda.stream(side):
            for p, s in zip(pinned, src, strict=True):
                s.copy_(p, non_blocking=True)

    d2h = statistics.median(timed(side, plain_d2h) for _ in range(reps))
    h2d = statistics.median(timed(side, plain_h2d) for _ in range(reps))
    print(f"GPU plain pinned copy, 2 x {mib} MiB: D2H {nbytes / d2h / 1e9:.1f} GB/s, H2D {nbytes / h2d / 1e9:.1f} GB/s")

    def program(dev: Any) -> None:
        offload, reload = [], []
        for _ in range(reps):
            m = ao.ActivationOffloadManager(dev, ao.FIXED, ["g"], 1.0)
            m.pool.reserve((n,), torch.float32, 2)  # outside the timed copy: cudaHostAlloc synchronizes
            group = m.group_start("g")
            for s in src:
                m.tensor_push(s.clone())
            torch.cuda.synchronize()
            offload.append(timed(m.d2h_stream.raw, lambda m=m, group=group: m.group_commit(group)))
            reload.append(timed(m.h2d_stream.raw, lambda m=m, group=group: m.bulk_reload_group(group)))
        print(f"GPU manager bulk offload {nbytes / statistics.median(offload) / 1e9:.1f} GB/s, "
              f"prefetch reload {nbytes / statistics.median(reload) / 1e9:.1f} GB/s (same sizes)")

    CudaDevice(None).run(program)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--gpu-only", action="store_true")
    ap.add_argument("--cpu-only", action="store_true")
    args = ap.parse_args()
    if not args.gpu_only:
        for variant in ("offload-inline-no-wait", "offload-queue-empty-cursor"):
            time_to_find(variant, args.seeds)
    if not args.cpu_only:
        if not torch.cuda.is_available():
            print("GPU: no CUDA device here; skipped")
            return
        _gpu_bandwidth()
        _gpu_iteration_times()


if __name__ == "__main__":
    main()
