"""Host actors as greenlets against threads, side by side in one process (``SimConfig.actors``).

    PYTHONPATH=. python benchmarks/bench_actors.py [--runs 15] [--load 0] [SCHEDULE ...]
    PYTHONPATH=. python benchmarks/bench_actors.py --random 20 [--seed 11]

Each schedule runs ``--runs`` times with each kind of actor, the kinds alternating, after one warm-up run of each;
the per-run medians are printed with their ratio, and whether both kinds gave the same run (outcome, operation
counts, trace). ``--load N`` keeps N busy processes running meanwhile (a loaded machine, as under ``pytest -n 2``,
where a thread's wake-up waits for a core). ``--random N``: instead, N random schedules of every variant (a
configuration of its space, 0-3 delays of 1, 5 or 20 units at operations a probe saw), each run once each way;
the schedules that differ are printed, then each program's medians. Figures, not assertions.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time

DEFAULT = ("zcc/FIXED", "zcc/zcc-late-barrier:steps=4:worker0#5+5", "param_readiness/FIXED:ranks=2",
           "param_readiness/param-prefetch-no-ready:ranks=2", "activation_offload/FIXED",
           "offload_reload/racy::d2h#0+1", "memsaver_guard/FIXED")


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("schedules", nargs="*", default=list(DEFAULT))
    p.add_argument("--runs", type=int, default=15)
    p.add_argument("--load", type=int, default=0, metavar="N", help="busy processes meanwhile")
    p.add_argument("--random", type=int, default=0, metavar="N", help="N random schedules per variant instead")
    p.add_argument("--seed", type=int, default=11)
    args = p.parse_args()
    if args.random:
        return random_schedules(args.random, args.seed)

    from reference.schedule import Schedule
    from simdevice.programs import REGISTRY, load_all
    from simdevice.runtime.config import overridden
    from simdevice.search.targets import ProgramTarget

    load_all()
    hogs = [multiprocessing.Process(target=_spin, args=(3600,), daemon=True) for _ in range(args.load)]
    for h in hogs:
        h.start()
    try:
        print(f"runs {args.runs}, load {args.load}; median ms per run")
        print(f"{'schedule':60} {'threads':>9} {'greenlets':>9} {'ratio':>6}  same run")
        for text in args.schedules:
            s = Schedule.parse(text)
            target = ProgramTarget(REGISTRY[s.program], s.variant)
            times: dict[str, list[float]] = {"thread": [], "greenlet": []}
            keys = {}
            for k in range(args.runs + 1):
                for mode in ("thread", "greenlet"):
                    with overridden(actors=mode):
                        t0 = time.perf_counter()
                        out = target.run(s)
                        took = time.perf_counter() - t0
                    if k:
                        times[mode].append(took)
                    r = out.run
                    keys[mode] = (out.verdict(), tuple(map(repr, r.reports)), tuple(sorted(r.op_counts.items())),
                                  r.trace)
            a, b = (statistics.median(times[m]) * 1e3 for m in ("thread", "greenlet"))
            print(f"{text:60} {a:9.2f} {b:9.2f} {b / a:6.2f}  {keys['thread'] == keys['greenlet']}", flush=True)
    finally:
        for h in hogs:
            h.terminate()
    return 0


def _key(out: object) -> tuple[object, ...]:
    r = out.run  # type: ignore[attr-defined]
    return (out.verdict(), tuple(map(repr, r.reports)), tuple(sorted(r.op_counts.items())), r.trace,  # type: ignore[attr-defined]
            r.unfired)


def random_schedules(per_variant: int, seed: int) -> int:
    import random

    from reference.schedule import Delay
    from simdevice.programs import REGISTRY, load_all
    from simdevice.runtime.config import overridden
    from simdevice.search.targets import ProgramTarget

    load_all()
    rng = random.Random(seed)
    times: dict[str, dict[str, list[float]]] = {}
    total = differ = 0
    for program in REGISTRY.values():
        per = times.setdefault(program.name, {"thread": [], "greenlet": []})
        for variant in program.variants:
            target = ProgramTarget(program, variant)
            configs = target.configs()
            for _ in range(per_variant):
                config = rng.choice(configs)
                counts = target.probe(config)
                actors = sorted(a for a, n in counts.items() if n > 0)
                delays: list[Delay] = []
                for _ in range(rng.randint(0, 3)):
                    a = rng.choice(actors)
                    k = rng.randrange(counts[a])
                    if all((d.actor, d.index) != (a, k) for d in delays):
                        delays.append(Delay(a, k, rng.choice((1, 5, 20))))
                schedule = target.canonical(target.schedule(config, delays))
                keys = {}
                for mode in ("thread", "greenlet"):
                    with overridden(actors=mode):
                        t0 = time.perf_counter()
                        out = target.run(schedule)
                        per[mode].append(time.perf_counter() - t0)
                    keys[mode] = _key(out)
                total += 1
                if keys["thread"] != keys["greenlet"]:
                    differ += 1
                    print(f"differs: {schedule}", flush=True)
    for name, per in times.items():
        a, b = (statistics.median(per[m]) * 1e3 for m in ("thread", "greenlet"))
        print(f"{name}: threads {a:.1f} ms, greenlets {b:.1f} ms, ratio {b / a:.2f}")
    print(f"{total} schedules, {differ} differ")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
