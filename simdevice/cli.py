"""The ``simdevice`` command line: ``check``, ``replay``, ``list``.

Exit codes: 0 as expected (check: every clean variant clean and every known
bug found; replay: the run is clean), 1 otherwise (check: a surprise;
replay: the run shows a failure), 2 for bad input (a one-line message).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, NoReturn

from reference.schedule import Schedule, ScheduleError, is_function_target


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"simdevice: error: {message} (see simdevice --help)\n")


def _fail(message: str) -> int:
    print(f"simdevice: error: {message}", file=sys.stderr)
    return 2


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("simdevice")
    except PackageNotFoundError:
        return "(not installed)"


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="simdevice",
        description="Find, shrink and replay data races in GPU offload protocols on a simulated device.",
    )
    p.add_argument("--version", action="version", version=f"simdevice {_version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    c = sub.add_parser(
        "check",
        help="fuzz a function of yours (FILE.py::FN, MODULE::FN), or every known program",
        description="With a TARGET (FILE.py::FUNCTION or MODULE::FUNCTION: plain torch.cuda code taking no "
        "argument without a default, or contract code FUNCTION(dev)), search its schedules for a failure, "
        "shrink it and print the line that replays it: exit 0 clean, 1 found; ':KEY=VALUE,...' after it holds "
        "its parameters fixed. Without one, fuzz every known program variant: exit 0 when every clean variant "
        "is clean and every known bug is found. Bad input: exit 2.",
    )
    c.add_argument("target", nargs="?", metavar="TARGET",
                   help="FILE.py::FUNCTION[:KEY=VALUE,...] or MODULE::FUNCTION[:...] (default: the known programs)")
    c.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    c.add_argument("--examples", type=int, default=150, metavar="N", help="schedules per variant (default 150)")
    c.add_argument(
        "--budget", type=float, default=None, metavar="SECONDS", help="stop searching a variant after this long"
    )
    c.add_argument("--program", action="append", metavar="NAME", help="check only this program (repeatable)")
    c.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")

    r = sub.add_parser(
        "replay",
        help="run one schedule and explain what happened",
        description='Run one schedule, e.g. simdevice replay "offload_reload/racy::d2h#0+1". '
        "Exit 0 when the run is clean, 1 when it shows a failure.",
    )
    r.add_argument("schedule", help="a schedule line as printed by check or a failing test "
                   "(PROGRAM/VARIANT:CONFIG:DELAYS or FILE.py::FUNCTION:CONFIG:DELAYS)")
    r.add_argument("--gpu", action="store_true",
                   help="run it on the CUDA GPU instead of the simulator (after one warm-up run, not counted: a "
                        "cold caching allocator's cudaMalloc synchronizes the device and can hide a race)")
    r.add_argument("--trials", type=int, default=1, metavar="N", help="repeat N times and report the rate")
    r.add_argument("--json", action="store_true", help="print the outcome as JSON")
    r.add_argument("--trace", action="store_true", help="print every host step and stream operation (simulator)")

    e = sub.add_parser(
        "exhaust",
        help="run every schedule of at most K delays (bounded exhaustive mode)",
        description="Run every schedule of one variant with at most K delays, each stall one of --units, "
        "in the configuration given (PROGRAM/VARIANT:KEY=V,...; PROGRAM/VARIANT: for the defaults) or, without "
        "one, over the program's whole configuration space. Exit 0 when none fails (a clean variant) "
        "or one fails (a bug variant): 1 otherwise.",
    )
    e.add_argument("target", help="PROGRAM/VARIANT[:CONFIG], e.g. offload_reload/correct or zcc/FIXED:workers=2")
    e.add_argument("--delays", type=int, default=1, metavar="K", help="at most K delays per schedule (default 1)")
    e.add_argument("--units", default="1,5,20", metavar="U,U,..", help="stall sizes in units (default 1,5,20)")
    e.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")

    sub.add_parser("list", help="list the known programs, their variants and actors")
    return p


def _progress(quiet: bool) -> Any:
    def show(label: str, n: int) -> None:
        if not quiet and sys.stderr.isatty():
            print(f"\r  {label}: {n} schedules", end="", file=sys.stderr, flush=True)

    return show


def cmd_check(args: argparse.Namespace) -> int:
    from simdevice.programs import REGISTRY, programs
    from simdevice.search import check_variant

    if args.examples < 1:
        return _fail(f"--examples must be >= 1, got {args.examples}")
    if args.budget is not None and args.budget <= 0:
        return _fail(f"--budget must be > 0 seconds, got {args.budget}")
    if args.target:
        return _check_function(args)
    progs = programs(None)
    if args.program:
        unknown = [n for n in args.program if n not in REGISTRY]
        if unknown:
            return _fail(f"unknown program {unknown[0]!r}; known: {', '.join(sorted(REGISTRY))}")
        progs = programs(args.program)
    show = _progress(args.quiet or args.json)
    findings = []
    started = time.monotonic()
    for prog in progs:
        for variant in prog.variants:
            label = f"{prog.name}/{variant}"
            if not args.quiet:
                print(f"checking {label} ...", file=sys.stderr, flush=True)
            f = check_variant(prog, variant, args.examples, args.budget, lambda n, lb=label: show(lb, n))
            if not args.quiet and sys.stderr.isatty():
                print("\r", end="", file=sys.stderr)
            if not args.quiet:
                verdict = "ok" if f.ok else "UNEXPECTED"
                print(f"  {verdict}: {'found' if f.found else 'clean'} after {f.examples} schedules, {f.seconds}s",
                      file=sys.stderr, flush=True)
            findings.append(f)
    ok = all(f.ok for f in findings)
    if args.json:
        print(json.dumps({"ok": ok, "seconds": round(time.monotonic() - started, 2),
                          "results": [f.as_dict() for f in findings]}, indent=2))
    else:
        _table(findings)
        print(f"\n{'all as expected' if ok else 'NOT as expected'}: "
              f"{sum(f.ok for f in findings)}/{len(findings)} variants, {time.monotonic() - started:.1f}s")
    return 0 if ok else 1


def _check_function(args: argparse.Namespace) -> int:
    from hypothesis import strategies as st

    from simdevice.search.explore import explore
    from simdevice.search.targets import TargetError, resolve

    try:
        given = Schedule.parse(args.target)
        if not is_function_target(given.program):
            return _fail(f"check takes FILE.py::FUNCTION or MODULE::FUNCTION (and --program for the built-in "
                         f"programs), got {args.target[:200]!r}")
        if given.delays or given.choices:
            return _fail(f"check draws the delays itself; drop them from {args.target[:200]!r}")
        target = resolve(given.program)
        fixed = target.config(given.config_dict())
    except ScheduleError as e:
        return _fail(str(e))
    show = _progress(args.quiet or args.json)
    if not args.quiet:
        print(f"checking {target.name} ...", file=sys.stderr, flush=True)
    try:
        result = explore(target, max_examples=args.examples, budget_s=args.budget,
                         config=st.just(fixed) if fixed else None, progress=lambda n: show(target.name, n))
    except TargetError as e:
        return _fail(str(e))
    if not args.quiet and sys.stderr.isatty():
        print("\r", end="", file=sys.stderr)
    out = result.failure
    if args.json:
        print(json.dumps({
            "target": target.name, "found": out is not None, "examples": result.examples,
            "seconds": result.seconds, "schedule": result.schedule,
            "summary": out.verdict() if out is not None else "clean",
            "reports": [str(r) for r in out.run.reports] if out is not None else [],
        }, indent=2))
    elif out is None:
        print(f"{target.name}: clean over {result.examples} schedules ({result.seconds}s)")
    else:
        print(f"{target.name}: found after {result.examples} schedules ({result.seconds}s)")
        print(out.text())
    return 1 if out is not None else 0


def _table(findings: list[Any]) -> None:
    rows = [("program/variant", "expect", "result", "examples", "race@default", "shrunk schedule / what it shows")]
    for f in findings:
        what = f"{f.schedule}  ({f.summary})" if f.schedule else "-"
        rows.append((f"{f.program}/{f.variant}", f.expect, "found" if f.found else "clean", str(f.examples),
                     "yes" if f.race_at_default else "no", what))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r[:5], widths, strict=True)) + "  " + r[5])


def cmd_replay(args: argparse.Namespace) -> int:
    from simdevice.api import SimDevice
    from simdevice.programs import resolve
    from simdevice.search import device_for, execute

    if args.trials < 1:
        return _fail(f"--trials must be >= 1, got {args.trials}")
    try:
        schedule = Schedule.parse(args.schedule)
        if is_function_target(schedule.program):
            from simdevice.search.targets import resolve as resolve_function

            function = resolve_function(schedule.program)
            function.validate(schedule)
        else:
            function = None
            resolve(schedule)
    except ScheduleError as e:
        return _fail(str(e))
    backend = "sim"
    if args.gpu:
        import torch

        if not torch.cuda.is_available():
            return _fail("--gpu needs a CUDA GPU, and torch sees none on this machine")
        backend = "cuda"
    def once() -> Any:
        return function.run(schedule, backend) if function is not None else execute(schedule, backend)

    if backend == "cuda":
        once()  # warm-up: the trials meet warm caching allocators, as a program in its steady state does
    outcomes = [once() for _ in range(args.trials)]
    bad = sum(not o.clean for o in outcomes)
    if args.json:
        print(json.dumps({
            "schedule": str(schedule), "backend": backend, "trials": args.trials, "failed": bad,
            "verdicts": [o.verdict() for o in outcomes],
            "reports": [str(r) for r in outcomes[0].run.reports], "problems": list(outcomes[0].problems),
        }, indent=2))
    else:
        print(outcomes[0].text())
        if args.trials > 1:
            print(f"{bad}/{args.trials} trials failed")
        if args.trace and backend == "sim" and function is None:
            prog, _ = resolve(schedule)
            dev, config = device_for(schedule)
            assert isinstance(dev, SimDevice)
            dev.run(prog.body, schedule.variant, config)
            for t, actor, what in dev.trace:
                print(f"  {t / 1e6:10.3f}  {actor:<16} {what}")
    return 1 if bad else 0


def cmd_exhaust(args: argparse.Namespace) -> int:
    from simdevice.programs import resolve
    from simdevice.search import count_schedules, exhaust

    try:
        units = tuple(int(u) for u in args.units.split(","))
    except ValueError:
        return _fail(f"--units must be integers separated by commas, got {args.units!r}")
    if not units or min(units) < 1:
        return _fail(f"--units must be >= 1, got {args.units!r}")
    if not 0 <= args.delays <= 4:
        return _fail(f"--delays must be in 0..4, got {args.delays}")
    try:
        target = Schedule.parse(args.target)
        prog, _ = resolve(target)
    except ScheduleError as e:
        return _fail(str(e))
    if target.delays:
        return _fail(f"exhaust draws the delays itself; drop them from {args.target!r}")
    variant = target.variant
    config = target.config_dict() if ":" in args.target else None
    total = count_schedules(prog, args.delays, units, config)
    if not args.quiet:
        print(f"running {total} schedules", file=sys.stderr, flush=True)
    show = _progress(args.quiet)
    n, failed = exhaust(prog, variant, args.delays, units, lambda k: show(args.target, k), config)
    if not args.quiet and sys.stderr.isatty():
        print("\r", end="", file=sys.stderr)
    expect_bug = variant not in prog.clean
    where = f"{target.target} ({'the configuration given' if config is not None else 'every configuration'})"
    if failed is None:
        print(f"{where}: clean over all {n} schedules of at most {args.delays} delays of {args.units} units")
    else:
        print(f"{where}: fails at schedule {n}:")
        print(failed.text())
    return 0 if (failed is not None) == expect_bug else 1


def cmd_list() -> int:
    from simdevice.programs import programs

    for p in programs(None):
        print(f"{p.name}: {p.doc}")
        for v in p.clean:
            print(f"  {v} (must be clean)")
        for v, why in p.buggy.items():
            print(f"  {v} (known bug: {why})")
        print(f"  actors: {', '.join(p.actors)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "check":
            return cmd_check(args)
        if args.command == "replay":
            return cmd_replay(args)
        if args.command == "exhaust":
            return cmd_exhaust(args)
        if args.command == "list":
            return cmd_list()
    except KeyboardInterrupt:
        print("simdevice: interrupted", file=sys.stderr)
        return 130
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
