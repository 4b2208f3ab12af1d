"""A safety net for performance work: the same random schedules run on two trees must give the same runs.

    PYTHONPATH=. python benchmarks/golden.py record OUT.json [--schedules 256] [--seed 18]
    PYTHONPATH=. python benchmarks/golden.py BEFORE AFTER [--schedules 256] [--seed 18]

``record`` runs a fixed, seeded set of random schedules with the tree on ``PYTHONPATH`` and writes one JSON file:
per schedule its text, verdict, report text (``Outcome.text()``), the value oracle's problems, per-actor operation
counts, unfired delays, notes, sites, the result's ``repr`` and the whole trace. The schedules are drawn as
``bench_actors.py --random`` and ``tests/property/model/test_actors.py`` draw them: every registered program's every
variant in turn (``--schedules`` spread evenly), a configuration of the variant's space, then 0-3 delays of 1, 5 or
20 units at operations the configuration's probe counted. Nothing reads the wall clock or the global random state
(one ``random.Random(seed)``), so a tree records the same file every time.

The compare mode takes two git revisions of this repository, paths to checkouts, or files ``record`` wrote: each
revision is checked out into a temporary worktree (as ``bench_check.py`` does) and recorded in a fresh process. It
prints how many schedules differ and the first difference, and exits 1 if any do.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench_check import checkout, remove_checkouts  # this folder is the script's: on sys.path

HERE = Path(__file__).resolve()


def draw(per_variant: int, seed: int) -> list[dict[str, Any]]:
    """Run ``per_variant`` random schedules of every variant; one record each, in drawing order."""
    import random

    from reference.schedule import Delay
    from simdevice.programs import REGISTRY, load_all
    from simdevice.search.targets import ProgramTarget

    load_all()
    rng = random.Random(seed)
    records = []
    for name in sorted(REGISTRY):
        program = REGISTRY[name]
        for variant in program.variants:
            target = ProgramTarget(program, variant)
            configs = target.configs()
            for _ in range(per_variant):
                config = configs[rng.randrange(len(configs))]
                counts = target.probe(config)
                slots = sorted((a, k) for a, n in counts.items() for k in range(n))
                delays: list[Delay] = []
                for _ in range(rng.randint(0, 3) if slots else 0):
                    a, k = slots[rng.randrange(len(slots))]
                    if all((d.actor, d.index) != (a, k) for d in delays):
                        delays.append(Delay(a, k, (1, 5, 20)[rng.randrange(3)]))
                schedule = target.canonical(target.schedule(config, delays))
                records.append(one(target, schedule))
    return records


def one(target: Any, schedule: Any) -> dict[str, Any]:
    try:
        out = target.run(schedule)
    except Exception as e:  # a run that raises is recorded as such: the other tree must raise the same
        return {"schedule": str(schedule), "raised": f"{type(e).__name__}: {e}"}
    r = out.run
    return {"schedule": str(schedule), "verdict": out.verdict(), "text": out.text(), "problems": list(out.problems),
            "op_counts": dict(sorted(r.op_counts.items())), "unfired": list(r.unfired), "notes": list(r.notes),
            "sites": {k: list(v) for k, v in sorted(r.sites.items())}, "result": repr(r.result),
            "trace": [list(step) for step in r.trace]}


def record(path: Path, schedules: int, seed: int) -> None:
    from simdevice.programs import REGISTRY, load_all

    load_all()
    variants = sum(len(p.variants) for p in REGISTRY.values())
    doc = {"seed": seed, "schedules": draw(max(1, schedules // variants), seed)}
    path.write_text(json.dumps(doc, indent=0, sort_keys=True))
    print(f"{len(doc['schedules'])} schedules recorded in {path}")


def recorded(rev: str, into: Path, schedules: int, seed: int) -> list[dict[str, Any]]:
    if Path(rev).is_file():
        return list(json.loads(Path(rev).read_text())["schedules"])
    into.mkdir(parents=True)
    tree = checkout(rev, into / "tree")
    out = into / "golden.json"
    try:
        subprocess.run([sys.executable, str(HERE), "record", str(out), "--schedules", str(schedules),
                        "--seed", str(seed)], cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, check=True,
                       stdout=subprocess.DEVNULL)
    finally:
        remove_checkouts([tree], into)
    return list(json.loads(out.read_text())["schedules"])


def first_difference(b: dict[str, Any], a: dict[str, Any]) -> str:
    for key in sorted(set(b) | set(a)):
        if b.get(key) != a.get(key):
            if isinstance(b.get(key), list) and isinstance(a.get(key), list):
                for i, (x, y) in enumerate(zip(b[key], a[key], strict=False)):
                    if x != y:
                        return f"{key}[{i}]: {x!r} -> {y!r}"
                return f"{key}: {len(b[key])} items -> {len(a[key])}"
            return f"{key}: {b.get(key)!r} -> {a.get(key)!r}"
    return "none"


def compare(before: str, after: str, schedules: int, seed: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        runs = [recorded(rev, Path(tmp) / side, schedules, seed)
                for rev, side in ((before, "before"), (after, "after"))]
    b, a = runs
    differ = [(x, y) for x, y in zip(b, a, strict=False) if x != y]
    if len(b) != len(a):
        print(f"{len(b)} schedules before, {len(a)} after")
    print(f"{len(differ)} of {min(len(b), len(a))} schedules differ")
    if differ:
        x, y = differ[0]
        print(f"first: {x['schedule']}\n  {first_difference(x, y)}")
    return 1 if differ or len(b) != len(a) else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", help="'record', a git revision, a checkout or a recorded file")
    ap.add_argument("after", help="the file to record into, or a git revision, a checkout or a recorded file")
    ap.add_argument("--schedules", type=int, default=256, help="spread evenly over the variants")
    ap.add_argument("--seed", type=int, default=18)
    args = ap.parse_args(argv)
    if args.before == "record":
        record(Path(args.after), args.schedules, args.seed)
        return 0
    return compare(args.before, args.after, args.schedules, args.seed)


if __name__ == "__main__":
    raise SystemExit(main())
