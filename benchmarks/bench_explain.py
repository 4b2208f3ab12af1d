"""What a suggested fix costs: seconds to suggest and check it (the re-runs and the 200-schedule search with the
edges inserted) for each built-in bug variant's shrunk schedule, median over ``--runs``.

Run: ``PYTHONPATH=. python benchmarks/bench_explain.py [--runs 3] [--schedules 200]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

from simdevice.explain import suggest
from simdevice.programs import REGISTRY, load_all
from simdevice.search import search
from simdevice.search.targets import ProgramTarget


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--schedules", type=int, default=200)
    args = p.parse_args()
    load_all()
    for prog in REGISTRY.values():
        for variant in prog.buggy:
            found = search(prog, variant, max_examples=200)
            if found.failure is None:
                continue
            secs, fix = [], None
            for _ in range(args.runs):
                target = ProgramTarget(prog, variant)  # a fresh one: no cached runs
                start = time.perf_counter()
                fix = suggest(target, found.failure, schedules=args.schedules)
                secs.append(time.perf_counter() - start)
            assert fix is not None
            verdict = "none" if fix.why_none else ("checked" if fix.checked else "not enough")
            name = f"{prog.name}/{variant}"
            print(f"{name:48} {verdict:10} {len(fix.edges)} edge(s), {fix.schedules:4} schedules; "
                  f"median {statistics.median(secs):.2f} s ({', '.join(f'{s:.2f}' for s in secs)})", flush=True)


if __name__ == "__main__":
    main()
