"""Page faults and time per run, for two revisions side by side: what new pages cost a run.

    PYTHONPATH=. python benchmarks/bench_pages.py BEFORE AFTER [--rounds 3] [--runs 20] [SCHEDULE ...]

BEFORE and AFTER are git revisions of this repository (or paths to checkouts), each checked out into a temporary
worktree. For each schedule (default: ``offload_reload/correct`` at its default 16 KiB and at 4 MiB, whose scratch
buffer is a 64 MiB segment; ``param_readiness/FIXED``; ``activation_offload/FIXED``), in a fresh process per tree
and round, the trees alternating: one warm-up run, the collector frozen, then ``--runs`` runs as ``simdevice
exhaust`` makes them (a device made, the program run): the median milliseconds a run and the minor page faults a run
(``getrusage``'s ``ru_minflt``: each a page the process had to be given, its first write zeroed by the kernel).
Medians over the rounds are printed with their ratio. Figures, not assertions.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_check import checkout, remove_checkouts  # this folder is the script's: on sys.path

SCHEDULES = ("offload_reload/correct", "offload_reload/correct:kib=4096", "param_readiness/FIXED",
             "activation_offload/FIXED")

CHILD = r"""
import gc, json, resource, statistics, sys, time
from reference.schedule import Schedule
from simdevice.programs import resolve
from simdevice.search.execute import device_for

s = Schedule.parse(sys.argv[1])
program, _ = resolve(s)
n = int(sys.argv[2])

def run():
    dev, config = device_for(s)
    dev.run(program.body, s.variant, config)

run()
gc.collect()
gc.freeze()
times = []
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(n):
    t0 = time.perf_counter()
    run()
    times.append(time.perf_counter() - t0)
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / n
print(json.dumps({"ms": statistics.median(times) * 1e3, "faults": faults}))
"""


def measure(tree: Path, schedule: str, runs: int) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", CHILD, schedule, str(runs)], cwd=tree,
                         env={"PYTHONPATH": str(tree), "PATH": ""}, capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("schedules", nargs="*", default=list(SCHEDULES))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--runs", type=int, default=20)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trees = [checkout(args.before, Path(tmp) / "before"), checkout(args.after, Path(tmp) / "after")]
        try:
            for schedule in args.schedules:
                got: dict[str, list[list[float]]] = {"ms": [[], []], "faults": [[], []]}
                for _ in range(args.rounds):
                    for i, tree in enumerate(trees):
                        for k, v in measure(tree, schedule, args.runs).items():
                            got[k][i].append(v)
                for k, unit in (("ms", "ms a run"), ("faults", "page faults a run")):
                    b, a = (statistics.median(x) for x in got[k])
                    print(f"{schedule}, {unit}: before {b:.2f} ({', '.join(f'{x:.2f}' for x in got[k][0])}), "
                          f"after {a:.2f} ({', '.join(f'{x:.2f}' for x in got[k][1])}), "
                          f"after/before {a / b if b else float('nan'):.3f}", flush=True)
        finally:
            remove_checkouts(trees, tmp)


if __name__ == "__main__":
    main()
