"""What the torch.cuda drop-in costs over contract code: the same protocols, run side by side on the simulator.

    PYTHONPATH=. python benchmarks/bench_dropin.py [--runs 30] [--n 4096]

``examples/offload_plain.py`` (plain torch.cuda, run through ``simdevice.cuda()``) and
``examples/offload_contract.py`` (the same protocols against ``dev``, on ``SimDevice``) are run in turn, one run
of each protocol and style after the other, under the default schedule; the per-run medians are printed with their
ratio. The probe, the search and shrinking are the same code for both styles, so a run's cost is what differs.
Figures, not assertions.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reference.schedule import Schedule  # noqa: E402
from simdevice.dropin.session import held  # noqa: E402
from simdevice.search.targets import resolve  # noqa: E402

PROTOCOLS = ("reload_racy", "reload_correct", "freed_racy", "freed_correct", "gather_racy", "gather_correct")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--n", type=int, default=4096, help="elements per tensor")
    args = ap.parse_args(argv)
    os.chdir(ROOT)
    targets = {(style, p): resolve(f"examples/offload_{style}.py::{p}") for style in ("plain", "contract")
               for p in PROTOCOLS}
    times: dict[tuple[str, str], list[float]] = {k: [] for k in targets}
    verdicts: dict[tuple[str, str], str] = {}
    for k, t in targets.items():  # warm-up: imports, caches
        verdicts[k] = t.run(Schedule(t.name, "", {"n": args.n})).verdict()
    held_times: dict[str, list[float]] = {p: [] for p in PROTOCOLS}
    for _ in range(args.runs):
        for k, t in targets.items():
            s = Schedule(t.name, "", {"n": args.n})
            start = time.perf_counter()
            t.run(s)
            times[k].append(time.perf_counter() - start)
        with held():  # as a search runs them: torch patched once for all its runs
            for p in PROTOCOLS:
                t = targets["plain", p]
                s = Schedule(t.name, "", {"n": args.n})
                start = time.perf_counter()
                t.run(s)
                held_times[p].append(time.perf_counter() - start)
    print(f"median per run over {args.runs} runs, n={args.n}, default schedule; 'in a search': torch patched once")
    print(f"{'protocol':<16} {'contract':>10} {'plain':>10} {'ratio':>7} {'in a search':>12} {'ratio':>7}  verdicts")
    for p in PROTOCOLS:
        c = statistics.median(times["contract", p])
        d = statistics.median(times["plain", p])
        h = statistics.median(held_times[p])
        same = "same" if verdicts["contract", p] == verdicts["plain", p] else "DIFFER"
        print(f"{p:<16} {c * 1e3:>8.2f}ms {d * 1e3:>8.2f}ms {d / c:>7.3f} {h * 1e3:>10.2f}ms {h / c:>7.3f}  "
              f"{same}: {verdicts['plain', p]}")
    total_c = sum(statistics.median(times["contract", p]) for p in PROTOCOLS)
    total_d = sum(statistics.median(times["plain", p]) for p in PROTOCOLS)
    total_h = sum(statistics.median(held_times[p]) for p in PROTOCOLS)
    print(f"{'all':<16} {total_c * 1e3:>8.2f}ms {total_d * 1e3:>8.2f}ms {total_d / total_c:>7.3f} "
          f"{total_h * 1e3:>10.2f}ms {total_h / total_c:>7.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
