"""Benchmark of the memory-saver guard: CPU time-to-find per variant, GPU pause/resume figures.

CPU (always): for each bug variant of ``memsaver_guard``, over several seeds,
how many schedules Hypothesis runs before the first failing one, and the
seconds to find it (no shrinking). Also schedules per second on FIXED.

GPU (when CUDA and ``torch_memory_saver`` are present): pause and resume time
and the device memory released for a 1-8 GiB region, in the hook mode given
by ``--hook-mode`` (``preload`` re-executes this script with ``LD_PRELOAD``
set to the package's preload library).

Run: ``PYTHONPATH=. python benchmarks/bench_memsaver.py [--seeds 5] [--gpu-only] [--hook-mode preload]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from reference.schedule import Schedule
from simdevice.search import execute, programs, search


def cpu(seeds: int) -> None:
    (program,) = programs(["memsaver_guard"])
    for variant in program.buggy:
        counts, secs = [], []
        for seed in range(seeds):
            found = search(program, variant, shrink=False, seed=seed)
            counts.append(found.examples if found.schedule is not None else -1)
            secs.append(found.seconds)
        print(
            f"CPU {variant}: schedules to first failure {counts} (median {statistics.median(counts)}), "
            f"seconds median {statistics.median(secs):.3f}"
        )
    s = Schedule.parse("memsaver_guard/FIXED:cycles=3")
    start, runs = time.perf_counter(), 0
    while time.perf_counter() - start < 2:
        execute(s)
        runs += 1
    print(f"CPU FIXED cycles=3: {runs / (time.perf_counter() - start):.1f} schedules/s")


def gpu(hook_mode: str, reps: int = 5) -> None:
    import torch

    if not torch.cuda.is_available():
        print("GPU: no CUDA device, skipped")
        return
    try:
        import torch_memory_saver
    except ImportError:
        print("GPU: torch_memory_saver not installed (pip extra 'gpu'), skipped")
        return
    from torch_memory_saver.utils import get_binary_path_from_package

    if hook_mode == "preload" and "torch_memory_saver" not in os.environ.get("LD_PRELOAD", ""):
        lib = str(get_binary_path_from_package("torch_memory_saver_hook_mode_preload"))
        site = Path(torch.__file__).resolve().parents[1]
        # the preloaded library needs the CUDA runtime that torch's wheels carry
        libs = sorted({str(p.parent) for p in site.glob("nvidia/**/libcudart.so*")} | {str(site / "torch" / "lib")})
        paths = os.pathsep.join([*libs, os.environ.get("LD_LIBRARY_PATH", "")])
        env = dict(os.environ, LD_PRELOAD=lib, LD_LIBRARY_PATH=paths)
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    saver = torch_memory_saver.torch_memory_saver
    saver.hook_mode = hook_mode
    for gib, backup in ((1, False), (2, False), (4, False), (8, False), (1, True), (8, True)):
        tag = f"bench{gib}{'b' if backup else ''}"
        with saver.region(tag=tag, enable_cpu_backup=backup):
            x = torch.ones(gib << 30, dtype=torch.uint8, device="cuda")
        pauses, resumes, released = [], [], []
        for _ in range(reps):
            torch.cuda.synchronize()
            free0, _ = torch.cuda.mem_get_info()
            t0 = time.perf_counter()
            saver.pause(tag)
            t1 = time.perf_counter()
            free1, _ = torch.cuda.mem_get_info()
            saver.resume(tag)
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            pauses.append(t1 - t0)
            resumes.append(t2 - t1)
            released.append((free1 - free0) / (1 << 30))
        intact = bool((x == 1).all())  # without a backup the contents after resume are not promised
        print(
            f"GPU {hook_mode} {gib} GiB{', CPU backup' if backup else ''}: "
            f"pause median {1e3 * statistics.median(pauses):.1f} ms, resume median "
            f"{1e3 * statistics.median(resumes):.1f} ms (of {reps}), released {statistics.median(released):.2f} GiB"
            f" (contents after resume {'kept' if intact else 'not kept'})",
            flush=True,
        )
        del x


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--gpu-only", action="store_true")
    ap.add_argument("--hook-mode", default="preload", choices=("preload", "torch"))
    a = ap.parse_args()
    if not a.gpu_only:
        cpu(a.seeds)
    gpu(a.hook_mode)


if __name__ == "__main__":
    main()
