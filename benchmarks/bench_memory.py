"""Peak resident memory of one simulated run: a device tensor of ``--gib`` GiB, filled, then one in-place op on it
(``mul_``), each run in a fresh process; median over ``--runs``. The resident size before the tensor (Python,
torch, the simulator) is printed beside it, so the run's own cost is the difference.

Run: ``PYTHONPATH=. python benchmarks/bench_memory.py [--gib 1] [--runs 3]``. Run it on two checkouts side by side
(``git worktree``) to compare a change.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CHILD = r"""
import json, resource, sys, torch
from simdevice import SimDevice
n = int(float(sys.argv[1]) * (1 << 30)) // 4
start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

def prog(dev):
    x = torch.empty(n, device=dev.device)
    x.fill_(1.0)
    x.mul_(0.5)
    dev.synchronize()

run = SimDevice().run(prog)
assert run.reports == (), run.reports
print(json.dumps({"before": start / 2**20, "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}))
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    peaks, befores = [], []
    for _ in range(args.runs):
        out = subprocess.run([sys.executable, "-c", CHILD, str(args.gib)], capture_output=True, text=True, check=True)
        doc = json.loads(out.stdout)
        peaks.append(doc["peak"])
        befores.append(doc["before"])
    print(f"{args.gib:g} GiB device tensor, fill_ + mul_: peak RSS median {statistics.median(peaks):.2f} GiB "
          f"({', '.join(f'{x:.2f}' for x in peaks)}); before the run {statistics.median(befores):.2f} GiB")


if __name__ == "__main__":
    main()
