"""A run with values against the same run race-only (``SimConfig(values=False)``, ``--no-values``), side by side:
wall time, peak resident memory, simulated device memory reserved and the reports, each run in a fresh process;
medians over ``--runs``.

Run: ``PYTHONPATH=. python benchmarks/bench_race_only.py [SCHEDULE] [--runs 3] [--race-only-too LARGE_SCHEDULE]``
(default ``offload_reload/racy:kib=262144,scratch=16:d2h#0+1``, 5 GiB of segments; ``--race-only-too`` runs a
schedule too large for values race-only alone, e.g. ``...:kib=1048576,scratch=64:...``, 68 GiB).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, resource, sys, time
from reference.schedule import Schedule
from simdevice import SimDevice
from simdevice.programs import resolve
from simdevice.runtime.config import SimConfig
s = Schedule.parse(sys.argv[1])
program, config = resolve(s)
dev = SimDevice(s, SimConfig(values=sys.argv[2] == "values", device_memory=1 << 40), program.options(s.variant, config))
t = time.perf_counter()
run = dev.run(program.body, s.variant, config)
kinds = {}
for r in run.reports:
    kinds[r.kind] = kinds.get(r.kind, 0) + 1
print(json.dumps({"seconds": time.perf_counter() - t, "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                  "reserved": dev.runtime.memsaver.allocator.stats()["reserved"] / 2**30, "reports": kinds}))
"""


def measure(schedule: str, mode: str, runs: int) -> str:
    docs = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", CHILD, schedule, mode], capture_output=True, text=True,
                             check=True, cwd=ROOT)
        docs.append(json.loads(out.stdout.splitlines()[-1]))
    secs = [d["seconds"] for d in docs]
    rss = [d["rss"] for d in docs]
    return (f"{mode:>9}: {statistics.median(secs):6.2f} s ({', '.join(f'{x:.2f}' for x in secs)}), peak RSS "
            f"{statistics.median(rss):.2f} GiB, reserved {docs[0]['reserved']:.1f} GiB, reports {docs[0]['reports']}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("schedule", nargs="?", default="offload_reload/racy:kib=262144,scratch=16:d2h#0+1")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--race-only-too", default=None, metavar="SCHEDULE")
    args = p.parse_args()
    print(args.schedule)
    for mode in ("values", "race-only"):
        print(measure(args.schedule, mode, args.runs), flush=True)
    if args.race_only_too:
        print(args.race_only_too)
        print(measure(args.race_only_too, "race-only", args.runs))


if __name__ == "__main__":
    main()
