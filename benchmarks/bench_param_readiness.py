"""Benchmarks of parameter readiness: the hot path, time-to-find on CPU, GPU rates where CUDA is present.

    PYTHONPATH=. python benchmarks/bench_param_readiness.py [--seeds 5] [--gpu-trials 10]

1. The hot path: ``ensure_params_ready([p])`` when ``p``'s bucket group is
   already published (what a consumer pays per layer per microbatch once the
   gather is done), in ns per call, plain Python objects on the CPU; and the
   bare callback call. Upstream measured about 190 ns for the former.
2. Time-to-find each bug variant on the simulator: examples and seconds until
   Hypothesis first draws a corrupting schedule, over several seeds (generate
   phase only: no shrinking), and the derandomized ``check_variant`` figure.
3. With CUDA: each pinned GPU schedule's corruption rate and seconds per run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import timeit
from typing import Any

import torch

import reference.param_readiness as pr
from simdevice.programs import load_all
from simdevice.programs.param_readiness import load
from simdevice.search import check_variant, execute, search


class _Work:
    def __init__(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        self.out, self.inp = out, inp

    def wait(self) -> None:
        self.out.copy_(self.inp)


class _HostDev:
    """Plain CPU tensors, a gather lands when waited: enough to publish a group."""

    device = torch.device("cpu")

    def all_gather_into_tensor(self, out: torch.Tensor, inp: torch.Tensor, async_op: bool = True) -> Any:
        work = _Work(out, inp)
        if not async_op:
            work.wait()
            return None
        return work


def hot_path_ns(number: int = 200_000, repeat: int = 7) -> dict[str, float]:
    params = [pr.Param(f"layer{i}.weight", 16) for i in range(4)]
    ddp = pr.DistributedDataParallel(_HostDev(), params, 1, True, pr.FIXED)
    for b in ddp.buckets:
        load(b, 0)
    pr.ensure_params_ready(params)
    assert all(g.state == pr.PUBLISHED for g in ddp.groups)
    one = [params[1]]
    cb = getattr(params[1], pr.PARAM_READY_ATTR)
    ensure = pr.ensure_params_ready
    out = {}
    for name, stmt in [
        ("ensure_params_ready([p])", lambda: ensure(one)),
        ("callback()", cb),
        ("ensure_params_ready(4 params, 4 groups)", lambda: ensure(params)),
    ]:
        best = min(timeit.repeat(stmt, number=number, repeat=repeat))
        empty = min(timeit.repeat(lambda: None, number=number, repeat=repeat))
        out[name] = (best - empty) / number * 1e9
    return out


def time_to_find(variant: str, seeds: int) -> list[tuple[int, float]]:
    load_all()
    from simdevice.programs.param_readiness import PROGRAM

    runs = []
    for seed in range(seeds):
        found = search(PROGRAM, variant, shrink=False, seed=seed)
        runs.append((found.examples if found.schedule is not None else -1, found.seconds))
    return runs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--gpu-trials", type=int, default=10)
    args = ap.parse_args(argv)

    print("hot path (published group), ns per call:")
    for name, ns in hot_path_ns().items():
        print(f"  {name:42s} {ns:7.1f} ns")

    load_all()
    from simdevice.programs.param_readiness import PROGRAM

    print(f"\ntime-to-find on CPU (generate only, {args.seeds} seeds; examples, seconds):")
    for variant in PROGRAM.buggy:
        runs = time_to_find(variant, args.seeds)
        ex = [n for n, _ in runs]
        secs = [s for _, s in runs]
        print(
            f"  {variant:32s} examples {ex} median {statistics.median(ex)}; "
            f"seconds median {statistics.median(secs):.2f} max {max(secs):.2f}"
        )
    print("\nderandomized check_variant (150 examples, with shrinking):")
    for variant in PROGRAM.variants:
        f = check_variant(PROGRAM, variant, max_examples=150)
        print(f"  {variant:32s} found={f.found} examples={f.examples} {f.seconds:.2f}s {f.schedule or ''}")

    if torch.cuda.is_available():
        sys.path.insert(0, "tests/gpu")
        from test_param_readiness_gpu import BUGGY, CLEAN  # type: ignore[import-not-found]

        from reference.schedule import Schedule

        print(f"\nGPU ({torch.cuda.get_device_name()}), {args.gpu_trials} trials each:")
        for text in BUGGY + CLEAN:
            s = Schedule.parse(text)
            start = time.perf_counter()
            bad = sum(execute(s, backend="cuda").corrupted for _ in range(args.gpu_trials))
            per = (time.perf_counter() - start) / args.gpu_trials
            print(f"  RATE {s.variant} {text} corrupted {bad}/{args.gpu_trials} ({per:.2f} s per run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
