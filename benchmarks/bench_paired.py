"""Runs per second and schedules per second for two revisions, measured in pairs: on a machine whose speed drifts
(a shared VM), the ratio of two batches run back to back holds where medians taken minutes apart do not.

    PYTHONPATH=. python benchmarks/bench_paired.py BEFORE AFTER [--what runs|hypothesis] [--schedule S]
                                                   [--rounds 15] [--batch N]

BEFORE and AFTER are git revisions of this repository (or paths to checkouts), each checked out into a temporary
worktree (as ``bench_check.py`` does). One process per tree imports everything, warms up and freezes the collector
(as the ``simdevice`` command does), then waits; each round asks both for one batch, the two in turn (which goes
first alternates), and each answers with the batch's seconds. Measured:

- ``runs``: ``--batch`` runs of ``--schedule`` (default ``offload_reload/correct``) as ``simdevice exhaust`` makes
  them (``execute``: the run, its oracle, its outcome), no Hypothesis; in runs per second, and the microseconds per
  counted operation (a schedule's host steps and stream operations) of each tree's fastest batch;
- ``hypothesis``: a derandomized search of ``--batch`` schedules of the schedule's variant over its configuration
  space, as ``simdevice check`` makes it (nothing fails, so every schedule is generated and run); in schedules per
  second, Hypothesis's own time included.

Printed: each tree's median rate, and the median over the rounds of the after/before ratio of the round's two
batches (above 1: AFTER is faster). Figures, not assertions.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_check import checkout, remove_checkouts  # this folder is the script's: on sys.path

ROOT = Path(__file__).resolve().parents[1]

#: ``hypothesis(n)``: a derandomized Hypothesis search of ``n`` schedules of ``schedule``'s variant over its
#: configuration space, as ``simdevice check`` makes it (nothing fails, so every schedule is generated and run);
#: code for a process where ``schedule`` is defined (``bench_instructions.py --search`` counts the same search)
SEARCH = r"""
def hypothesis(n):
    from hypothesis.errors import NoSuchExample
    from hypothesis import find
    from simdevice.programs import resolve
    from simdevice.search import engine
    from simdevice.search.strategies import configs, schedules_of
    from simdevice.search.targets import ProgramTarget
    program, _ = resolve(schedule)
    target = ProgramTarget(program, schedule.variant)
    with engine.storage():
        try:
            find(schedules_of(target, configs(program)), lambda s: target.failed(target.run(s)),
                 settings=engine.search_settings(n, True, True, None))
        except NoSuchExample:
            pass
"""

WORKER = r"""
import gc, sys, time
import torch
torch.set_num_threads(1)
from reference.schedule import Schedule
from simdevice.search.execute import execute

what, text = sys.argv[1], sys.argv[2]
schedule = Schedule.parse(text)

def runs(n):
    for _ in range(n):
        execute(schedule)
""" + SEARCH + r"""
body = {"runs": runs, "hypothesis": hypothesis}[what]
body(5)
gc.collect()
gc.freeze()
print("ready", sum(execute(schedule).run.op_counts.values()), flush=True)
for line in sys.stdin:
    n = int(line)
    t0 = time.perf_counter()
    body(n)
    print(time.perf_counter() - t0, flush=True)
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--what", choices=("runs", "hypothesis"), default="runs")
    p.add_argument("--schedule", default="offload_reload/correct")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--batch", type=int, default=0, help="runs or schedules a batch (default: 200 runs, 150 schedules)")
    args = p.parse_args()
    batch = args.batch or (200 if args.what == "runs" else 150)
    with tempfile.TemporaryDirectory() as tmp:
        trees = [checkout(args.before, Path(tmp) / "before"), checkout(args.after, Path(tmp) / "after")]
        procs = [subprocess.Popen([sys.executable, "-c", WORKER, args.what, args.schedule], cwd=tree,
                                  env={"PYTHONPATH": str(tree), "PATH": ""}, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True) for tree in trees]
        try:
            ops = []
            for tree, proc in zip(trees, procs, strict=True):
                assert proc.stdout is not None
                words = proc.stdout.readline().split()
                if words[:1] != ["ready"]:
                    raise SystemExit(f"the worker in {tree} did not start (its error is above)")
                ops.append(int(words[1]))
            rates: list[list[float]] = [[], []]
            ratios = []
            for r in range(args.rounds):
                got = [0.0, 0.0]
                for i in ((0, 1) if r % 2 == 0 else (1, 0)):
                    proc = procs[i]
                    assert proc.stdin is not None
                    assert proc.stdout is not None
                    proc.stdin.write(f"{batch}\n")
                    proc.stdin.flush()
                    got[i] = batch / float(proc.stdout.readline())
                    rates[i].append(got[i])
                ratios.append(got[1] / got[0])
            unit = "runs/s" if args.what == "runs" else "schedules/s with Hypothesis"
            b, a = (statistics.median(x) for x in rates)
            print(f"{unit}, {args.schedule}: before {b:.1f} ({min(rates[0]):.1f}-{max(rates[0]):.1f}), "
                  f"after {a:.1f} ({min(rates[1]):.1f}-{max(rates[1]):.1f}); after/before, median of "
                  f"{args.rounds} paired rounds: {statistics.median(ratios):.3f} "
                  f"({min(ratios):.3f}-{max(ratios):.3f})")
            if args.what == "runs":  # the fastest batch: the figure of a quiet moment
                print("us per counted operation (host steps and stream operations) in the fastest batch: "
                      + ", ".join(f"{name} {1e6 / (max(r) * n):.1f} ({n} a run)"
                                  for name, r, n in zip(("before", "after"), rates, ops, strict=True)))
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()
            remove_checkouts(trees, tmp)


if __name__ == "__main__":
    main()
