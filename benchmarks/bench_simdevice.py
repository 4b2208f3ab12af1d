"""Simulator throughput and time-to-find for the demonstration program.

Run: ``PYTHONPATH=. python benchmarks/bench_simdevice.py [--seeds 20] [--runs 200]``. Prints medians;
nothing here is asserted anywhere. Figures measured on the project's 2-core CPU machine go in notes.
"""

from __future__ import annotations

import argparse
import statistics
import time

from hypothesis import HealthCheck, given, settings

from reference.schedule import Schedule
from simdevice import SimDevice
from simdevice.programs import Program, resolve
from simdevice.search import execute, search
from simdevice.search.strategies import schedules


def _offload_reload() -> Program:
    """The demonstration program (its module imported alone, as a replay imports it; each function here can run
    first)."""
    return resolve(Schedule.parse("offload_reload/correct"))[0]


def median_run(text: str, runs: int) -> tuple[float, int]:
    """Median seconds of one simulated run of a schedule, and its operations (host steps + stream operations)."""
    s = Schedule.parse(text)
    prog, cfg = resolve(s)
    times, ops = [], 0
    for _ in range(runs):
        dev = SimDevice(s)
        t0 = time.perf_counter()
        r = dev.run(prog.body, s.variant, cfg)
        times.append(time.perf_counter() - t0)
        ops = sum(r.op_counts.values())
    return statistics.median(times), ops


def per_operation(runs: int) -> tuple[float, float, float]:
    """Median µs per simulated operation, runs/s and operations per run."""
    med, ops = median_run("offload_reload/correct", runs)
    return med / ops * 1e6, 1 / med, ops


def runs_per_second_searched(runs: int) -> float:
    """Runs per second of ``offload_reload/correct`` the way a search and ``simdevice exhaust`` make them
    (``execute``: the run, its oracle and its outcome), without Hypothesis."""
    s = Schedule.parse("offload_reload/correct")
    for _ in range(10):
        execute(s)
    t0 = time.perf_counter()
    for _ in range(runs):
        execute(s)
    return runs / (time.perf_counter() - t0)


def marginal_per_operation(runs: int) -> float:
    """µs per extra operation: iters=16 against iters=2 (thread start and set-up cancel out)."""
    t2, o2 = median_run("offload_reload/correct:iters=2", runs)
    t16, o16 = median_run("offload_reload/correct:iters=16", runs)
    return (t16 - t2) / (o16 - o2) * 1e6


def schedules_per_second_with_hypothesis(n: int, run: bool = True) -> float:
    """Schedules per second of a search of ``offload_reload/correct``; ``run=False``: the same search with no run,
    Hypothesis and the strategy alone (the strategy's probe still runs once: its configuration is the default's)."""
    count = [0]

    @settings(max_examples=n, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(schedules(_offload_reload(), "correct"))
    def prop(s: Schedule) -> None:
        count[0] += 1
        if run:
            assert execute(s).clean

    t0 = time.perf_counter()
    prop()
    return count[0] / (time.perf_counter() - t0)


def time_to_find(seeds: int) -> tuple[float, float, set[str]]:
    times, examples, found = [], [], set()
    for seed in range(seeds):
        result = search(_offload_reload(), "racy", max_examples=1000, seed=seed)
        times.append(result.seconds)
        examples.append(result.examples)
        found.add(str(result.schedule))
    return statistics.median(times), statistics.median(examples), found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--runs", type=int, default=200)
    args = ap.parse_args()
    us, rps, ops = per_operation(args.runs)
    print(f"offload_reload/correct: {ops} operations per run; median {us:.1f} us per operation, {rps:.1f} runs/s")
    print(f"the same as a search runs it (execute): {runs_per_second_searched(args.runs):.1f} runs/s")
    print(f"marginal cost: {marginal_per_operation(max(20, args.runs // 4)):.1f} us per operation (iters=16 vs 2)")
    with_runs = schedules_per_second_with_hypothesis(args.runs)
    alone = schedules_per_second_with_hypothesis(args.runs, run=False)
    print(f"with Hypothesis generating: {with_runs:.1f} schedules/s; Hypothesis alone (no run): {alone:.1f} "
          f"schedules/s, so a run costs {(1 / with_runs - 1 / alone) * 1e3:.2f} ms of a schedule's "
          f"{1e3 / with_runs:.2f} ms (400 schedules/s leaves a run {(1 / 400 - 1 / alone) * 1e3:.2f} ms)")
    t, ex, found = time_to_find(args.seeds)
    print(f"find+shrink offload_reload/racy: median {t:.2f} s, median {ex:.0f} schedules over {args.seeds} seeds; "
          f"shrunk to {sorted(found)}")


if __name__ == "__main__":
    main()
