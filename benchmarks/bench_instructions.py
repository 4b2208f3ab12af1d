"""Instructions per simulated operation and per run, counted by callgrind: a figure that does not depend on the
machine's load, for two revisions side by side.

    PYTHONPATH=. python benchmarks/bench_instructions.py BEFORE AFTER [--runs 5] [--search N] [--floor]

BEFORE and AFTER are git revisions of this repository (or paths to checkouts), each checked out into a temporary
worktree (as ``bench_check.py`` does). Each figure is one process under ``valgrind --tool=callgrind
--instr-atstart=no`` (valgrind must be installed): the imports and warm-up runs go uncounted, then the process
turns counting on (``callgrind_control -i on``) around the measured part alone:

- the marginal program of ``bench_ops.py`` (``x.mul_(0.5)`` on a 16 KiB device tensor) and its out-of-place twin
  (``y = x * 0.5``): 300 operations less 100, over 200, in instructions per operation;
- each mechanism's FIXED variant at its defaults (and ``offload_reload/correct``): ``--runs`` runs as ``exhaust``
  makes them (a device made and the program run), in instructions per run.

With ``--search N``, also a derandomized Hypothesis search of N schedules of ``offload_reload/correct`` over its
configuration space, as ``bench_paired.py --what hypothesis`` makes it (nothing fails, so every schedule is generated
and run; Hypothesis's own work counted with the simulator's), in instructions per schedule: the load-free figure
for schedules per second with Hypothesis.

With ``--floor``, the same in-place op's count without the simulator is printed too: on a plain CPU tensor, and
under a ``TorchDispatchMode`` that only calls the op (the floor of a design that sees every aten call in Python).

Counts repeat within about 1% from one process to the next (the kernel's and other processes' work is not
counted). User-space instructions only: a page fault's time in the kernel is not in them. Figures, not
assertions.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_check import checkout, remove_checkouts  # this folder is the script's: on sys.path
from bench_paired import SEARCH as PAIRED_SEARCH

ROOT = Path(__file__).resolve().parents[1]

_COUNTED = r"""
import gc, os, subprocess, sys

def counted(body):
    pid = str(os.getpid())
    subprocess.run(["callgrind_control", "-i", "on", pid], check=True, capture_output=True)
    body()
    subprocess.run(["callgrind_control", "-i", "off", pid], check=True, capture_output=True)
"""

OPS = _COUNTED + r"""
import torch
from simdevice import SimDevice

def inplace(dev, k):
    x = torch.ones(4096, device=dev.device)
    for _ in range(k):
        x.mul_(0.5)
    dev.synchronize()

def outplace(dev, k):
    x = torch.ones(4096, device=dev.device)
    for _ in range(k):
        y = x * 0.5
    dev.synchronize()

f, k = globals()[sys.argv[1]], int(sys.argv[2])
for _ in range(3):
    SimDevice().run(lambda dev: f(dev, 50))
gc.collect()
gc.freeze()
d = SimDevice()
counted(lambda: d.run(lambda dev: f(dev, k)))
"""

RUNS = _COUNTED + r"""
from reference.schedule import Schedule
from simdevice.programs import resolve
from simdevice.search.execute import device_for

s = Schedule.parse(sys.argv[1])
program, _ = resolve(s)

def go(n):
    for _ in range(n):
        dev, config = device_for(s)
        dev.run(program.body, s.variant, config)

go(3)
gc.collect()
gc.freeze()
counted(lambda: go(int(sys.argv[2])))
"""

SEARCH = _COUNTED + r"""
import torch
from reference.schedule import Schedule

torch.set_num_threads(1)
schedule = Schedule.parse(sys.argv[1])
""" + PAIRED_SEARCH + r"""
hypothesis(20)  # (long enough for Hypothesis's one look at the process's modules for constants to come in it)
gc.collect()
gc.freeze()
counted(lambda: hypothesis(int(sys.argv[2])))
"""

FLOOR = _COUNTED + r"""
import torch
from torch.utils._python_dispatch import TorchDispatchMode

class Passing(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))

# as SimMode: the plain method, not torch's wrapper that imports dynamo at its first call
Passing.__torch_dispatch__ = getattr(Passing.__torch_dispatch__, "__wrapped__", Passing.__torch_dispatch__)

x = torch.ones(4096)

def plain(k):
    for _ in range(k):
        x.mul_(0.5)

def passing(k):
    with Passing():
        for _ in range(k):
            x.mul_(0.5)

f, k = globals()[sys.argv[1]], int(sys.argv[2])
f(50)
gc.collect()
gc.freeze()
counted(lambda: f(k))
"""

PROGRAMS = ("offload_reload/correct", "activation_offload/FIXED", "param_readiness/FIXED", "zcc/FIXED",
            "memsaver_guard/FIXED")


def instructions(tree: Path, code: str, *args: str) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        p = subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no",
                            f"--callgrind-out-file={tmp}/out", sys.executable, "-c", code, *args],
                           cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True,
                           check=True)
    m = re.search(r"Collected : (\d+)", p.stderr)
    if m is None:
        raise SystemExit(f"no count from callgrind in {tree}: {p.stderr.strip().splitlines()[-1:]}")
    return int(m.group(1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--runs", type=int, default=5, help="runs of each program counted (their mean is printed)")
    p.add_argument("--search", type=int, default=0, metavar="N",
                   help="also count a Hypothesis search of N schedules (per schedule; 0: none)")
    p.add_argument("--floor", action="store_true",
                   help="also count the in-place op on a plain tensor and under a mode that only calls it")
    args = p.parse_args()
    if args.floor:
        for what, label in (("plain", "on a plain CPU tensor"), ("passing", "under a mode that only calls it")):
            n = (instructions(ROOT, FLOOR, what, "1200") - instructions(ROOT, FLOOR, what, "200")) / 1000
            print(f"instructions per in-place op {label}: {n:,.0f}")
    with tempfile.TemporaryDirectory() as tmp:
        trees = [checkout(args.before, Path(tmp) / "before"), checkout(args.after, Path(tmp) / "after")]
        try:
            rows = []
            for what, label in (("inplace", "in-place"), ("outplace", "out-of-place")):
                per = [(instructions(t, OPS, what, "300") - instructions(t, OPS, what, "100")) / 200 for t in trees]
                rows.append((f"instructions per {label} op", per))
            for name in PROGRAMS:
                per = [instructions(t, RUNS, name, str(args.runs)) / args.runs for t in trees]
                rows.append((f"instructions per run, {name}", per))
            if args.search:
                per = [instructions(t, SEARCH, "offload_reload/correct", str(args.search)) / args.search
                       for t in trees]
                rows.append(("instructions per schedule of a Hypothesis search, offload_reload/correct", per))
        finally:
            remove_checkouts(trees, tmp)
    for label, (b, a) in rows:
        print(f"{label}: before {b:,.0f}, after {a:,.0f}, after/before {a / b:.3f}")


if __name__ == "__main__":
    main()
