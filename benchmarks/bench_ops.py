"""The cost of one simulated operation and of one ``simdevice replay``, for two revisions side by side.

    PYTHONPATH=. python benchmarks/bench_ops.py BEFORE AFTER [--runs 5]

BEFORE and AFTER are git revisions of this repository (or paths to checkouts), each checked out into a temporary
worktree. Measured in turn, alternating between the two, each in a fresh process:

- a simulated in-place op's marginal cost: a program of 2000 ``x.mul_(0.5)`` on a 16 KiB device tensor against
  one of 200 (set-up cancels out), median of five runs each, in microseconds per op;
- the wall time of ``simdevice replay "offload_reload/racy::d2h#0+1" --no-fix`` (start-up, imports and exit
  included);
- runs per second of ``offload_reload/correct`` at its default schedule (a device made and the program run, as
  ``simdevice exhaust`` does for each schedule, no Hypothesis), the mean of 200 runs after one warm-up;
- per mechanism (each FIXED variant at its defaults), microseconds of a run per counted operation (the ops and host
  steps a schedule counts), the mean of 30 runs after one warm-up.

Each measuring process freezes the collector after its imports and warm-up (``gc.freeze()``), as the ``simdevice``
command does once torch is imported: a full collection over torch's objects (about 100 ms, every few hundred runs)
otherwise lands in some means and not in others (figures before 2026-12-03's third sitting were taken without).
Medians over ``--runs`` and their ratio are printed. Figures, not assertions.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_check import checkout, remove_checkouts  # this folder is the script's: on sys.path

ROOT = Path(__file__).resolve().parents[1]

MARGINAL = r"""
import gc, statistics, time, torch
from simdevice import SimDevice

def prog(dev, k):
    x = torch.ones(4096, device=dev.device)
    for _ in range(k):
        x.mul_(0.5)
    dev.synchronize()

def t(k):
    ts = []
    for _ in range(5):
        d = SimDevice()
        t0 = time.perf_counter()
        d.run(lambda dev: prog(dev, k))
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)

t(10)
gc.collect()
gc.freeze()
print((t(2000) - t(200)) / 1800 * 1e6)
"""


MECHANISMS = r"""
import gc, json, time
from reference.schedule import Schedule
from simdevice.programs import resolve
from simdevice.search.execute import device_for

def mean(text, n):
    s = Schedule.parse(text)
    program, _ = resolve(s)
    dev, config = device_for(s)
    run = dev.run(program.body, s.variant, config)
    gc.collect()
    gc.freeze()
    t0 = time.perf_counter()
    for _ in range(n):
        dev, config = device_for(s)
        run = dev.run(program.body, s.variant, config)
    return (time.perf_counter() - t0) / n, sum(run.op_counts.values())

out = {"runs_per_s": 1 / mean("offload_reload/correct", 200)[0]}
for name in ("activation_offload/FIXED", "param_readiness/FIXED", "zcc/FIXED", "memsaver_guard/FIXED"):
    seconds, ops = mean(name, 30)
    out[name] = seconds / ops * 1e6
print(json.dumps(out))
"""


def mechanisms(tree: Path) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", MECHANISMS], cwd=tree, env={"PYTHONPATH": str(tree), "PATH": ""},
                         capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def marginal(tree: Path) -> float:
    out = subprocess.run([sys.executable, "-c", MARGINAL], cwd=tree, env={"PYTHONPATH": str(tree), "PATH": ""},
                         capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def replay(tree: Path) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "simdevice", "replay", "offload_reload/racy::d2h#0+1", "--no-fix"],
                   cwd=tree, env={"PYTHONPATH": str(tree), "PATH": ""}, capture_output=True, check=False)
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trees = [checkout(args.before, Path(tmp) / "before"), checkout(args.after, Path(tmp) / "after")]
        try:
            figures: dict[str, list[list[float]]] = {}
            for _ in range(args.runs):
                for i, tree in enumerate(trees):
                    got = {"op": marginal(tree), "replay": replay(tree)}
                    got.update({k if k == "runs_per_s" else f"us per counted op, {k}": v
                                for k, v in mechanisms(tree).items()})
                    for k, v in got.items():
                        figures.setdefault(k, [[], []])[i].append(v)
            units = {"op": "us per in-place op", "replay": "s per replay",
                     "runs_per_s": "runs/s, offload_reload/correct"}
            for name in figures:
                unit = units.get(name, name)
                b, a = (statistics.median(x) for x in figures[name])
                print(f"{unit}: before {b:.2f} ({', '.join(f'{x:.2f}' for x in figures[name][0])}), "
                      f"after {a:.2f} ({', '.join(f'{x:.2f}' for x in figures[name][1])}), after/before {a / b:.2f}")
        finally:
            remove_checkouts(trees, tmp)


if __name__ == "__main__":
    main()
