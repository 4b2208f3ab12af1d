"""Wall time of ``simdevice exhaust`` in its own process and in worker processes, side by side: the same tree, the
same machine, runs alternating.

    PYTHONPATH=. python benchmarks/bench_exhaust.py [--runs 3] [--jobs 2] [TARGET AND OPTIONS ...]

The words after the options are ``exhaust``'s (default: ``offload_reload/correct: --delays 2 --units 1,5``, 4,233
schedules of one configuration). Each run is ``python -m simdevice exhaust WORDS --quiet --jobs 1`` or ``--jobs N``;
the medians are printed with their ratio and the schedules per second of each, and both must print the same
answer. Figures, not assertions.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one_run(words: list[str], jobs: int) -> tuple[float, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "simdevice", "exhaust", *words, "--quiet", "--jobs", str(jobs)],
                       cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if p.returncode not in (0, 1):
        raise SystemExit(f"exhaust --jobs {jobs} exited {p.returncode}: {p.stderr.strip().splitlines()[-1:]}")
    return seconds, p.stdout


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="runs each way (default 3)")
    ap.add_argument("--jobs", type=int, default=2, help="workers of the parallel runs (default 2)")
    ap.add_argument("words", nargs=argparse.REMAINDER, help="exhaust's target and options")
    args = ap.parse_args(argv)
    words = args.words or ["offload_reload/correct:", "--delays", "2", "--units", "1,5"]
    times: dict[int, list[float]] = {1: [], args.jobs: []}
    answers: dict[int, set[str]] = {1: set(), args.jobs: set()}
    for _ in range(args.runs):
        for jobs in (1, args.jobs):
            seconds, out = one_run(words, jobs)
            times[jobs].append(seconds)
            answers[jobs].add(out)
    answer = next(iter(answers[1]))
    print(answer.splitlines()[0] if answer else "(no answer)")
    m = re.search(r"(?:over all|fails at schedule) (\d+)", answer)
    n = int(m.group(1)) if m else 0  # the schedules run: all of them, or up to the first that failed
    one, par = statistics.median(times[1]), statistics.median(times[args.jobs])
    for jobs, t in ((1, one), (args.jobs, par)):
        runs = ", ".join(f"{x:.2f}" for x in times[jobs])
        print(f"--jobs {jobs}: median {t:.2f} s ({runs}); {n / t:.0f} schedules run per second of the command's "
              "wall time")
    print(f"ratio --jobs {args.jobs} / --jobs 1: {par / one:.2f}; same answer: {answers[1] == answers[args.jobs]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
