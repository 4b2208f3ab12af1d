"""The ``simdevice`` command line: ``check``, ``replay``, ``list``.

Exit codes: 0 as expected (check: every clean variant clean and every known
bug found; replay: the run is clean), 1 otherwise (check: a surprise;
replay: the run shows a failure), 2 for bad input (a one-line message).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

from reference.schedule import MAX_UNITS, Schedule, ScheduleError, is_function_target

# imported whether or not the table runs in workers: Hypothesis draws from the loaded modules' constants, so the
# command's process loads the same modules either way (simdevice.jobs says more)
from simdevice.jobs import PARALLEL_FROM, Setup, check_in_workers, default_jobs, loaded_modules


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"simdevice: error: {message} (see simdevice --help)\n")


#: where ``--json``'s document goes: the command's own stdout (the program's prints go to stderr meanwhile)
_JSON_OUT: list[Any] = [None]


def _print_json(text: str) -> None:
    print(text, file=_JSON_OUT[0] or sys.stdout)


def _count(n: int, noun: str) -> str:
    """``n`` and ``noun``, in the plural but for one."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _unquoted(line: str) -> str:
    """A schedule line pasted with the quotes ``check`` prints around it (``replay '"f.py::fn::d#0+1"'``): without
    them (a schedule line never starts or ends with a quote)."""
    if len(line) >= 2 and line[0] == line[-1] and line[0] in "'\"":
        return line[1:-1]
    return line


def _fail(message: str) -> int:
    print(f"simdevice: error: {message}", file=_stderr())
    return 2


def _bad_target(text: str, error: ScheduleError) -> str:
    """A TARGET's one-line error: where the text is no schedule's target at all but names a folder, or a file that
    is not a FILE.py, on disk (a path the user meant), that; else the error's own."""
    text = text.strip()
    if not text or "::" in text:
        return str(error)
    try:
        Schedule.parse(text)
    except ScheduleError:
        from simdevice.search.targets import path_problem

        return path_problem(text) or str(error)
    return str(error)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("simdevice")
    except PackageNotFoundError:
        return "(not installed)"


class _Version(argparse.Action):
    """``--version``: the installed version, looked up only when asked (importlib.metadata and the lookup were
    about a quarter of ``simdevice --help``'s time)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(f"simdevice {_version()}")
        parser.exit()


_MAX_STEPS = ("host steps one simulated run may make before it is stopped with a step-limit report (default "
              "200000)")
_DEVICE_MEMORY = ("bytes the simulated device may hold (its bytes are this machine's memory): 512M, 8G, 1.5GiB or a "
                  "number of bytes; past it an allocation raises torch's OutOfMemoryError (default: half of this "
                  "machine's memory)")
_NO_VALUES = ("race-only: compute no value, so memory does not grow with the device's bytes (a configuration of "
              "64 GiB runs in a few hundred MiB): races and stale reads are found as with values; the program's value "
              "checks are skipped and a host read of device memory gets a placeholder (True, or 0); the output says so")
_PROFILE = ("the simulator's costs: default (a fast host, 5 us per host step: the narrowest windows, for finding "
            "bugs), a profile measured on a GPU by scripts/calibrate (shipped: simdevice/profiles/NAME.json), or the "
            "path of a profile's .json; the output names the profile that judged it")
_WORLD_SIZE = ("a function target's ranks (1..32): run it once per rank as rank0..rankN-1 (torch.distributed's default "
               "group is theirs), as simdevice.explore(fn, world_size=N) does; a replay line printed for such a run "
               "says it")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def _bytes(text: str) -> int | None:
    """``8G``, ``512MiB``, ``1.5g`` or ``1073741824`` as bytes; None if it is none of these."""
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?)(?:i?b)?", text.strip().lower(), flags=re.ASCII)
    if m is None:
        return None
    return int(float(m.group(1)) * _UNITS[m.group(2)])


_SHOW_OUTPUT = ("let what the program prints through, once per run (default: held back while the schedules run, "
                "and counted: simdevice replay shows one run's)")


class _Lines:
    """Where the program's ``print`` goes while a search runs its schedules: counted, not kept."""

    def __init__(self) -> None:
        self.lines = 0

    def write(self, text: str) -> int:
        self.lines += text.count("\n")
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


#: lines the program printed in the searches of this command (held back: :func:`_held_output`)
_HELD: list[int] = [0]
#: the command's own stderr while :func:`_held_output` holds the program's back (None: ``sys.stderr``)
_OWN_ERR: list[Any] = [None]


def _stderr() -> Any:
    """Where the command's own lines for stderr go (progress, "checking a fix ..."): its stderr, also while the
    program's is held back."""
    return _OWN_ERR[0] or sys.stderr


@contextlib.contextmanager
def _held_output(args: argparse.Namespace) -> Iterator[None]:
    """While the block runs the program's schedules, what it prints (to stdout or stderr: its warnings and log
    lines too) is held back and counted (a search runs it hundreds of times), unless ``--show-output``."""
    if getattr(args, "show_output", False):
        yield
        return
    lines = _Lines()
    own = _OWN_ERR[0]
    _OWN_ERR[0] = _stderr()
    try:
        with contextlib.redirect_stdout(lines), contextlib.redirect_stderr(lines):  # type: ignore[type-var]
            yield
    finally:
        _OWN_ERR[0] = own
        _HELD[0] += lines.lines


def _say_held(args: argparse.Namespace, schedule: str) -> None:
    """Say, on stderr, that the program's output was held back, and how to see it."""
    if _HELD[0] and not args.quiet:
        print(f"(the program printed {_count(_HELD[0], 'line')} over its runs, held back: simdevice replay "
              f"\"{schedule}\" shows one run's, --show-output all of them)", file=_stderr())


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="simdevice",
        description="Find, shrink and replay data races in GPU offload protocols on a simulated device.",
    )
    p.add_argument("--version", action=_Version, help="show program's version number and exit")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    c = sub.add_parser(
        "check",
        help="fuzz a function of yours (FILE.py::FN, MODULE::FN), each of a file's (FILE.py), or every known "
        "program",
        description="With a TARGET (FILE.py::FUNCTION or MODULE::FUNCTION: plain torch.cuda code taking no "
        "argument without a default, or contract code FUNCTION(dev); or a known PROGRAM/VARIANT), search its "
        "schedules for a failure, shrink it and print the line that replays it: exit 0 clean, 1 found; "
        "':KEY=VALUE,...' after it holds its parameters fixed. FILE.py::__main__: the file's `if __name__ == "
        "\"__main__\":` block, run as 'python FILE.py' runs it. FILE.py alone: each function of the file that "
        "'simdevice list FILE.py' names, in turn (exit 1 if one failed). Without a TARGET, fuzz every known "
        "program variant: "
        "exit 0 when every clean variant is clean and every known bug is found. Bad input: exit 2. Nothing is "
        "written to disk unless --db is given.",
    )
    c.add_argument("target", nargs="?", metavar="TARGET",
                   help="FILE.py::FUNCTION[:KEY=VALUE,...], MODULE::FUNCTION[:...], FILE.py::__main__ (the "
                        "script's main block), FILE.py (each of its functions) or PROGRAM/VARIANT[:...] (default: "
                        "every known program)")
    c.add_argument("--db", metavar="DIR", default=None,
                   help="keep Hypothesis's example database in DIR: failures found are replayed first next time "
                        "(default: no database)")
    c.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    c.add_argument("--examples", type=int, default=150, metavar="N", help="schedules per variant (default 150)")
    c.add_argument(
        "--budget", type=float, default=None, metavar="SECONDS", help="stop searching a variant after this long"
    )
    c.add_argument("--program", action="append", metavar="NAME", help="check only this program (repeatable)")
    c.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="check the table's variants in N worker processes at once, with the same results (default: "
                        "one per CPU this process may use, at most one per variant; 1: one after another in this "
                        "process); a TARGET is one search and ignores it")
    c.add_argument("--fix", action=argparse.BooleanOptionalAction, default=None,
                   help="suggest the missing synchronization for a failure and check it by re-running with it "
                        "inserted (default: on for a TARGET, off for the table of every program)")
    c.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    c.add_argument("--show-output", action="store_true", help=_SHOW_OUTPUT)
    c.add_argument("--max-steps", type=int, default=None, metavar="N", help=_MAX_STEPS)
    c.add_argument("--device-memory", default=None, metavar="SIZE", help=_DEVICE_MEMORY)
    c.add_argument("--no-values", action="store_true", help=_NO_VALUES)
    c.add_argument("--profile", default=None, metavar="NAME", help=_PROFILE)
    c.add_argument("--world-size", type=int, default=None, metavar="N", help=_WORLD_SIZE)

    r = sub.add_parser(
        "replay",
        help="run one schedule and explain what happened",
        description='Run one schedule, e.g. simdevice replay "offload_reload/racy::d2h#0+1". '
        "Exit 0 when the run is clean, 1 when it shows a failure; exit 2 for bad input (one line) and for a run that "
        "gives no verdict (stopped at its step bound with nothing found, or at what the simulator does not run).",
    )
    r.add_argument("schedule", help="a schedule line as printed by check or a failing test "
                   "(PROGRAM/VARIANT:CONFIG:DELAYS or FILE.py::FUNCTION:CONFIG:DELAYS)")
    r.add_argument("--gpu", action="store_true",
                   help="run it on the CUDA GPU instead of the simulator (after one warm-up run, not counted: a "
                        "cold caching allocator's cudaMalloc or cudaHostAlloc synchronizes the device and can hide "
                        "a race; each run starts with gc.collect(), so what the last one left is back in the "
                        "caches); with --profile NAME each trial's host steps are timed and the trial is judged "
                        "again on the simulator with them and the profile's device")
    r.add_argument("--trials", type=int, default=1, metavar="N", help="repeat N times and report the rate")
    r.add_argument("--json", action="store_true", help="print the outcome as JSON")
    r.add_argument("--trace", action="store_true",
                   help="print every host step and stream operation (with --gpu: the GPU's, timed by CUDA events "
                        "around each operation, in the same form)")
    r.add_argument("--edge", action="append", default=[], metavar="A@FILE:LINE->B@FILE:LINE",
                   help="insert this synchronization (repeatable): every operation of actor B issued at that line "
                        "waits for the latest of actor A's at its line, as a fix would; a forward edge "
                        "A@FILE:LINE[+D]=>B@FILE:LINE: the k-th operation of B at its line waits for the (k+D)-th "
                        "of A at its line, issued later (simulator; the 'replay with it' line of a suggested fix)")
    r.add_argument("--max-steps", type=int, default=None, metavar="N", help=_MAX_STEPS)
    r.add_argument("--device-memory", default=None, metavar="SIZE", help=_DEVICE_MEMORY)
    r.add_argument("--no-values", action="store_true", help=_NO_VALUES)
    r.add_argument("--profile", default=None, metavar="NAME", help=_PROFILE)
    r.add_argument("--world-size", type=int, default=None, metavar="N", help=_WORLD_SIZE)
    r.add_argument("--perfetto", metavar="FILE.json", default=None,
                   help="write the run's timeline as a Perfetto / Chrome trace (open in ui.perfetto.dev)")
    r.add_argument("--png", metavar="FILE.png", default=None,
                   help="draw the run's timeline (matplotlib): lanes per actor, the race in red, the fix dashed")
    r.add_argument("--fix", action=argparse.BooleanOptionalAction, default=True,
                   help="for a failing run with races, suggest the missing synchronization and check it (default: "
                        "on; simulator)")

    e = sub.add_parser(
        "exhaust",
        help="run every schedule of at most K delays (bounded exhaustive mode)",
        description="Run every schedule of one target with at most K delays at operations that exist, each stall "
        "one of --units, in the configuration given (PROGRAM/VARIANT:KEY=V,...; PROGRAM/VARIANT: for the "
        "defaults) or, without one, over the program's whole configuration space (a function: its defaults). "
        "A known variant: exit 0 when none fails (a clean variant) or one fails (a bug variant), 1 otherwise. "
        "A function of yours: exit 0 when none fails, 1 when one does. Exit 2 for bad input (one line) and for a "
        "run that gives no verdict.",
    )
    e.add_argument("target", help="PROGRAM/VARIANT[:CONFIG] (e.g. offload_reload/correct, zcc/FIXED:workers=2) "
                   "or FILE.py::FUNCTION[:CONFIG] (its defaults, or the configuration given)")
    e.add_argument("--delays", type=int, default=1, metavar="K",
                   help="at most K delays per schedule, 0 to 4 (default 1)")
    e.add_argument("--units", default="1,5,20", metavar="U,U,..", help="stall sizes in units (default 1,5,20)")
    e.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    e.add_argument("--show-output", action="store_true", help=_SHOW_OUTPUT)
    e.add_argument("--json", action="store_true", help="print the answer as JSON")
    e.add_argument("--max-steps", type=int, default=None, metavar="N", help=_MAX_STEPS)
    e.add_argument("--device-memory", default=None, metavar="SIZE", help=_DEVICE_MEMORY)
    e.add_argument("--no-values", action="store_true", help=_NO_VALUES)
    e.add_argument("--profile", default=None, metavar="NAME", help=_PROFILE)
    e.add_argument("--world-size", type=int, default=None, metavar="N", help=_WORLD_SIZE)
    e.add_argument("--max-schedules", type=int, default=100_000, metavar="N",
                   help="refuse to start when there are more schedules than this (default 100000)")
    e.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="run the schedules in N worker processes (default: one per CPU; 1: in this process); the "
                   f"answer is the same. Fewer than {PARALLEL_FROM} schedules run in this process")

    ls = sub.add_parser(
        "list",
        help="list the known programs (or the functions of a file of yours, with their actors)",
        description="Without a PATH: the known programs, their variants and actors. With one (FILE.py or a "
        "module, or FILE.py::FUNCTION for that function alone): its public functions a schedule can target, each "
        "probed once on the simulator: its style (plain torch.cuda or contract), parameters, and the operations "
        "each actor makes.",
    )
    ls.add_argument("path", nargs="?", metavar="PATH",
                    help="FILE.py or MODULE, or one function of it, FILE.py::FUNCTION[:KEY=VALUE,...] (default: the "
                    "known programs)")
    ls.add_argument("--world-size", type=int, default=None, metavar="N",
                    help="probe each function on N ranks, as check --world-size N runs it (its actors: rank0, "
                    "rank0.default, ...)")
    return p


def _progress(quiet: bool) -> Any:
    def show(label: str, n: int) -> None:
        if not quiet and _stderr().isatty():
            print(f"\r  {label}: {n} schedules", end="", file=_stderr(), flush=True)

    return show


def cmd_check(args: argparse.Namespace) -> int:
    from simdevice.programs import REGISTRY, programs
    from simdevice.search.engine import database

    if args.examples < 1:
        return _fail(f"--examples must be >= 1, got {args.examples}")
    if args.budget is not None and not 0 < args.budget < float("inf"):  # NaN and inf too
        return _fail(f"--budget must be > 0 seconds, got {args.budget}")
    if args.target is not None and not args.target.strip():
        return _fail("empty TARGET: name FILE.py::FUNCTION, MODULE::FUNCTION or PROGRAM/VARIANT, or give none for "
                     "every known program")
    if args.db is not None and not args.db.strip():
        return _fail("--db: an empty path (name a directory for Hypothesis's example database)")
    if args.db is not None and os.path.exists(args.db) and not os.path.isdir(args.db):
        return _fail(f"--db {args.db!r} is a file, not a directory")
    if args.jobs is not None and args.jobs < 1:
        return _fail(f"--jobs must be >= 1, got {args.jobs}")
    if args.target and args.program:
        return _fail("--program picks the built-in programs of check's table; with a TARGET, drop it")
    if not args.target and args.world_size is not None:
        return _fail("--world-size is for a function target (check FILE.py::FUNCTION --world-size N)")
    if args.db is not None:
        # made now, as the user asked: Hypothesis makes it at its first save and says nothing when it cannot (a
        # path under a file, or in /proc, saved nothing)
        if not os.path.isdir(os.path.dirname(os.path.abspath(args.db))):
            return _fail(f"--db {args.db!r}: its folder does not exist")
        try:
            if not os.path.isdir(args.db):
                os.mkdir(args.db)
        except OSError as e:
            return _fail(f"--db {args.db!r}: cannot make the directory ({e.strerror or e})")
        if not os.access(args.db, os.W_OK | os.X_OK):
            return _fail(f"--db {args.db!r}: the directory cannot be written")
    db = database(args.db)
    if args.target and "::" not in args.target and args.target.strip().endswith(".py"):
        return _check_file(args, db)
    if args.target:
        return _check_target(args, db)
    progs = programs(None)
    if args.program:
        unknown = [n for n in args.program if n not in REGISTRY]
        if unknown:
            return _fail(f"unknown program {unknown[0]!r}; known: {', '.join(sorted(REGISTRY))}")
        progs = programs(list(dict.fromkeys(args.program)))  # (one given twice is checked once)
    findings: list[Any] = []
    errors: list[tuple[str, str, str]] = []
    started = time.monotonic()
    bars = not (args.quiet or args.json) and _stderr().isatty()
    interrupted = False
    try:
        _check_all(args, progs, db, bars, findings, errors)
    except KeyboardInterrupt:  # what was done is kept: the variants checked so far are printed as usual
        interrupted = True
    fixes = _fixes(findings, args.quiet or args.json) if args.fix and not interrupted else {}
    ok = all(f.ok for f in findings) and not errors and not interrupted
    if args.json:
        results = [dict(f.as_dict(), **({"fix": _fix_json(fixes[i], str(f.schedule))} if i in fixes else {}))
                   for i, f in enumerate(findings)]
        _print_json(json.dumps({"ok": ok, "seconds": round(time.monotonic() - started, 2), "profile": _profile(),
                          "values": _values(), "results": results,
                          **({"errors": [{"program": p, "variant": v, "error": why} for p, v, why in errors]}
                             if errors else {}),
                          **({"interrupted": True} if interrupted else {})}, indent=2))
    else:
        if _profile() != "default":
            print(f"cost profile: {_profile()}")
        if sys.stdout.isatty():
            _rich_table(findings)
        else:
            _table(findings)
        for program, variant, why in errors:
            print(f"{program}/{variant}: no verdict: {why}")
        for i, fix in fixes.items():
            print(f"\n{findings[i].program}/{findings[i].variant}: {findings[i].schedule}")
            _print_fix(fix, str(findings[i].schedule))
        total = sum(len(prog.variants) for prog in progs)
        failed = f" ({len(errors)} with no verdict)" if errors else ""
        if interrupted:
            print(f"\ninterrupted: {len(findings)} of {total} variants checked, "
                  f"{sum(f.ok for f in findings)} as expected{failed}, {time.monotonic() - started:.1f}s")
        else:
            print(f"\n{'all as expected' if ok else 'NOT as expected'}: "
                  f"{sum(f.ok for f in findings)}/{len(findings) + len(errors)} variants{failed}, "
                  f"{time.monotonic() - started:.1f}s")
    if interrupted:
        return _interrupted()
    return 0 if ok else 1


def _profile() -> str:
    """The cost profile runs made now are judged with (``--profile``)."""
    from simdevice.runtime.config import active_profile

    return active_profile()


def _values() -> bool:
    """Whether runs made now compute values (``--no-values``: a race-only run)."""
    from simdevice.runtime.config import active_values

    return active_values()


def _say_judged() -> None:
    """Under a measured cost profile, say which judged what was just printed."""
    if _profile() != "default":
        print(f"  (judged with the cost profile {_profile()})")


def _interrupted() -> int:
    """Say how the command was stopped early (Ctrl-C, SIGTERM) and return its exit code."""
    from simdevice.signals import stopped

    return stopped()


def _check_all(args: argparse.Namespace, progs: list[Any], db: Any, bars: bool, findings: list[Any],
               errors: list[tuple[str, str, str]]) -> None:
    """Check every variant of ``progs``, one after another in this process or in ``--jobs`` workers
    (:mod:`simdevice.jobs`), and put each finding in ``findings`` in table order (program, then variant), whatever
    order they were made in; a variant left with no verdict (its worker died) goes in ``errors``. On a stop, what
    was done is there."""
    variants = _variants(progs)
    tasks = [(prog.name, variant) for prog, variant in variants]
    jobs = min(args.jobs or default_jobs(), len(tasks))
    with _Bars(bars) as progress:
        shown = _Shown(tasks, args, bars, progress, named=jobs > 1)
        try:
            if jobs > 1:
                db_path = os.path.abspath(args.db) if args.db is not None else None
                setup = Setup(args.examples, args.budget, db_path, _overrides(), loaded_modules())
                # clean variants first: they run every schedule, where a bug is usually found in a few, so the
                # longest searches start early and the last to end is a short one
                clean = [i for i, (prog, variant) in enumerate(variants) if variant in prog.clean]
                check_in_workers(tasks, jobs, setup, shown, clean + [i for i in range(len(tasks)) if i not in clean])
                return
            from simdevice.search import check_variant

            for i, (prog, variant) in enumerate(variants):
                shown.started(i)
                shown.finished(i, check_variant(prog, variant, args.examples, args.budget,
                                                lambda n, i=i: shown.stepped(i, n), db))
        finally:
            findings.extend(shown.findings[i] for i in sorted(shown.findings))
            errors.extend((*tasks[i], shown.errors[i]) for i in sorted(shown.errors))


def _first_sentence(text: str) -> str:
    """An error's first sentence, where its message runs on (torch's about a missing CUDA library is a paragraph)."""
    head, dot, _ = text.partition(". ")
    return head if dot and len(text) > 200 else text


def _variants(progs: list[Any]) -> list[tuple[Any, str]]:
    """Each variant of ``progs`` with its program, in table order."""
    return [(prog, variant) for prog in progs for variant in prog.variants]


def _overrides() -> tuple[tuple[str, Any], ...]:
    """The SimConfig fields runs made now get (``--profile``, ``--max-steps``, ...: what ``main`` set)."""
    from simdevice.runtime.config import active_overrides

    return active_overrides()


class _Shown:
    """``check``'s progress per variant, told by index in the table (a :class:`simdevice.jobs.Listener`): bars on a
    terminal, plain lines for scripts otherwise (none with ``--quiet`` or ``--json``); with ``named`` (variants
    checked at once, whose lines interleave) a variant's last line names it. Keeps the findings and the variants
    left with no verdict."""

    def __init__(self, tasks: list[tuple[str, str]], args: argparse.Namespace, bars: bool, progress: _Bars,
                 named: bool) -> None:
        self.labels = [f"{program}/{variant}" for program, variant in tasks]
        self.plain = not (args.quiet or bars)
        self.examples = args.examples
        self.progress = progress
        self.named = named
        self.tasks: dict[int, Any] = {}
        self.findings: dict[int, Any] = {}
        self.errors: dict[int, str] = {}

    def started(self, index: int) -> None:
        if self.plain:
            print(f"checking {self.labels[index]} ...", file=_stderr(), flush=True)
        self.tasks[index] = self.progress.start(self.labels[index], self.examples)

    def stepped(self, index: int, n: int) -> None:
        self.progress.step(self.tasks[index], n)

    def finished(self, index: int, f: Any) -> None:
        verdict = "ok" if f.ok else "UNEXPECTED"
        line = f"{verdict}: {'found' if f.found else 'clean'} after {f.examples} schedules, {f.seconds}s"
        self.progress.finish(self.tasks[index], f"{self.labels[index]}: {line}", f.ok)
        if self.plain:
            print(f"  {line}" + (f" ({self.labels[index]})" if self.named else ""), file=_stderr(), flush=True)
        self.findings[index] = f

    def failed(self, index: int, why: str, detail: str) -> None:
        if index in self.tasks:
            self.progress.finish(self.tasks[index], f"{self.labels[index]}: no verdict: {why}", False)
        print(f"simdevice: error: {self.labels[index]}: {why}", file=_stderr(), flush=True)
        if detail:
            print(detail, end="", file=_stderr(), flush=True)
        self.errors[index] = why


def _fixes(findings: list[Any], quiet: bool) -> dict[int, Any]:
    """A checked fix for each variant found failing (``check --fix``)."""
    from simdevice.programs import REGISTRY
    from simdevice.search.targets import ProgramTarget

    fixes = {}
    for i, f in enumerate(findings):
        if not f.found or f.schedule is None:
            continue
        target = ProgramTarget(REGISTRY[f.program], f.variant)
        out = target.run(Schedule.parse(f.schedule))
        if not quiet:
            print(f"fix for {f.program}/{f.variant} ...", file=_stderr(), flush=True)
        fixes[i] = _suggest(target, out, True)
    return fixes


def _world_size(args: argparse.Namespace) -> int | None:
    """``--world-size``, checked (ScheduleError: the caller's one-line error)."""
    from simdevice.runtime.config import MAX_WORLD_SIZE

    n = args.world_size
    if n is not None and not 1 <= n <= MAX_WORLD_SIZE:
        raise ScheduleError(f"--world-size must be in 1..{MAX_WORLD_SIZE}, got {n}")
    return n  # type: ignore[no-any-return]


def _target_and_config(text: str, what: str, world_size: int | None = None) -> tuple[Any, dict[str, Any]]:
    """The target a command's TARGET names (a function on ``world_size`` ranks, where given), and the configuration
    it holds fixed; ScheduleError if bad."""
    from simdevice.search.targets import FunctionTarget, ProgramTarget, target_of

    given = Schedule.parse(text)
    if given.delays or given.choices:
        raise ScheduleError(f"{what} draws the delays itself; drop them from {text[:200]!r}")
    target = target_of(given.program if is_function_target(given.program) else given.target, world_size)
    if isinstance(target, FunctionTarget):
        return target, target.config(given.config_dict())
    assert isinstance(target, ProgramTarget)
    target.program.parse_config(given.config_dict())  # one-line errors for bad keys and values
    return target, given.config_dict()


def _named(target: Any, text: str) -> str:
    """The target's name as the command's lines say it: with the configuration TARGET fixes, where it fixes one
    (``FILE.py::fn:n=1024``), so that a clean line says which configuration was clean."""
    config = Schedule.parse(text).config_dict()
    return str(target.name) + (":" + ",".join(f"{k}={v}" for k, v in config.items()) if config else "")


def _check_target(args: argparse.Namespace, db: Any) -> int:
    from hypothesis import strategies as st

    from simdevice.search.execute import SHOWN_OF_A_KIND, replay_command
    from simdevice.search.explore import explore
    from simdevice.search.strategies import configs
    from simdevice.search.targets import ProgramTarget, TargetError

    try:
        target, fixed = _target_and_config(args.target, "check", _world_size(args))
    except ScheduleError as e:
        return _fail(_bad_target(args.target, e))
    config = st.just(fixed) if fixed else None
    if config is None and isinstance(target, ProgramTarget):
        config = configs(target.program)
    show = _progress(args.quiet or args.json)
    name = _named(target, args.target)
    if not args.quiet:
        print(f"checking {name} ...", file=_stderr(), flush=True)
    ran = [0]

    def step(n: int) -> None:
        ran[0] = n
        show(target.name, n)

    try:
        with _held_output(args):
            result = explore(target, max_examples=args.examples, budget_s=args.budget, config=config, progress=step,
                             db=db, default_config=fixed or None)
    except TargetError as e:
        return _fail(str(e))
    except KeyboardInterrupt as stop:  # a failure found so far comes with it, its shrinking cut short
        so_far = getattr(stop, "found", None)
        if so_far is None:
            if args.json:
                _print_json(json.dumps({"target": target.name, "found": False, "examples": ran[0],
                                        "interrupted": True}, indent=2))
            else:
                print(f"{name}: interrupted after {ran[0]} schedules, none failed so far")
        elif args.json:
            _print_json(json.dumps({
                "target": target.name, "found": True, "examples": so_far.examples, "interrupted": True,
                "shrunk": False, "schedule": str(so_far.schedule), "summary": so_far.failure.verdict(),
                "reports": [str(r) for r in so_far.failure.run.reports], "world_size": args.world_size or 1,
                "replay": replay_command(so_far.schedule, so_far.failure.replay_options()),
            }, indent=2))
        else:
            print(f"{name}: found, interrupted while shrinking it after {ran[0]} schedules; the smallest "
                  "failing schedule so far:")
            print(so_far.failure.text(SHOWN_OF_A_KIND))
        return _interrupted()
    if not args.quiet and _stderr().isatty():
        print("\r\x1b[K", end="", file=_stderr())  # clear the progress line
    out = result.failure
    no_verdict = _no_verdict(target.name, out) if out is not None else None
    if no_verdict is not None:
        key, why = no_verdict
        if args.json:
            _print_json(json.dumps({"target": target.name, "found": False, "examples": result.examples,
                                    "schedule": result.schedule, key: why}, indent=2))
        return _fail(why)
    with _held_output(args):
        fix = _suggest(target, out, args.quiet or args.json) if out is not None and args.fix is not False else None
    if args.json:
        _print_json(json.dumps({
            "target": target.name, "found": out is not None, "examples": result.examples, "profile": _profile(),
            "values": _values(),
            "seconds": result.seconds, "schedule": result.schedule,
            "summary": out.verdict() if out is not None else "clean",
            "reports": [str(r) for r in out.run.reports] if out is not None else [],
            "fix": _fix_json(fix, str(out.schedule), out.replay_options()) if fix is not None and out is not None
            else None, "notes": list(result.notes),
            "world_size": args.world_size or 1, "replay": result.replay,
        }, indent=2))
    elif out is None:
        print(f"{name}: clean over {_count(result.examples, 'schedule')} ({result.seconds}s)")
        for n in result.notes:
            print(f"  note: {n}")
    else:
        print(f"{name}: found after {_count(result.examples, 'schedule')} ({result.seconds}s)")
        print(out.text(SHOWN_OF_A_KIND))
        _say_judged()
        if fix is not None:
            _print_fix(fix, str(out.schedule), out.replay_options())
    _say_held(args, str(out.schedule) if out is not None else name)
    return 1 if out is not None else 0


def _check_file(args: argparse.Namespace, db: Any) -> int:
    """``check FILE.py``: each function of the file that ``list FILE.py`` names, checked in turn as
    ``check FILE.py::FUNCTION`` checks it; exit 1 if one failed, else 2 if one got no verdict, else 0."""
    from simdevice.search.targets import TargetError, functions_in, main_block_hint

    path = args.target.strip()
    try:
        with contextlib.redirect_stdout(sys.stderr):  # (what the file prints as it is imported)
            found = functions_in(path, _world_size(args))
    except (ScheduleError, TargetError) as e:
        return _fail(str(e))
    if not found:
        return _fail(f"{path}: no function a schedule can target (public, defined there, every parameter but dev "
                     f"with a default); name one as FILE.py::FUNCTION{main_block_hint(path)}")
    codes: dict[str, int] = {}
    documents: list[Any] = []
    for target in found:
        one = argparse.Namespace(**{**vars(args), "target": target.name})
        if args.json:
            held, _JSON_OUT[0] = _JSON_OUT[0], io.StringIO()
            try:
                code = _check_target(one, db)
                text = _JSON_OUT[0].getvalue()
            finally:
                _JSON_OUT[0] = held
            if text.strip():
                documents.append(json.loads(text))
        else:
            if codes:
                print()
            code = _check_target(one, db)
        codes[target.name] = code
        if code not in (0, 1, 2):  # stopped (Ctrl-C, SIGTERM): what was checked so far is printed
            break
    failed = [name for name, code in codes.items() if code == 1]
    unjudged = [name for name, code in codes.items() if code == 2]
    stopped = next((code for code in codes.values() if code not in (0, 1, 2)), None)
    if args.json:
        _print_json(json.dumps({"file": path, "ok": not failed and not unjudged and stopped is None,
                                "results": documents, **({"interrupted": True} if stopped is not None else {})},
                               indent=2))
    else:
        tail = f", {len(unjudged)} with no verdict" if unjudged else ""
        print(f"{path}: {len(codes)} of {len(found)} functions checked: {len(failed)} failed, "
              f"{len(codes) - len(failed) - len(unjudged)} clean{tail}")
    if stopped is not None:
        return stopped
    return 1 if failed else 2 if unjudged else 0


def _suggest(target: Any, out: Any, quiet: bool) -> Any:
    """The suggested fix for a failing outcome, checked (progress on stderr)."""
    from simdevice.explain import suggest

    show = _progress(quiet)
    if not quiet and out.races:
        print("checking a fix ...", file=_stderr(), flush=True)
    fix = suggest(target, out, progress=lambda n: show("fix", n))
    if not quiet and _stderr().isatty():
        print("\r\x1b[K", end="", file=_stderr())  # clear the progress line
    return fix


def _print_fix(fix: Any, schedule: str, options: str = "") -> None:
    """The fix's lines, and the replay line with its edges (``options``: what the failing run's own replay line
    carries, so that the fix is replayed on the same run)."""
    for line in fix.lines():
        print(f"  {line}")
    if fix.edges:
        print(f"  replay with {'it' if len(fix.edges) == 1 else 'them'}: {_replay_with(schedule, fix.edges, options)}")


def _fix_json(fix: Any, schedule: str, options: str = "") -> dict[str, Any]:
    """The fix as ``--json`` gives it: its fields, and where it has edges the command that replays the failing
    schedule with them (the text's 'replay with it' line)."""
    return dict(fix.as_dict(), **({"replay": _replay_with(schedule, fix.edges, options)} if fix.edges else {}))


def _replay_with(schedule: Any, edges: Any, options: str) -> str:
    """The command that replays ``schedule`` with ``edges`` inserted."""
    inserted = " ".join(f'--edge "{e}"' for e in edges)
    return f'simdevice replay "{schedule}" {inserted}{options}'


class _Bars:
    """``check``'s progress on a terminal: a rich progress bar per variant (schedules run out of ``--examples``),
    each left as a one-line verdict when done. Off the terminal (or ``--quiet``, ``--json``): nothing; the caller
    prints its plain lines, unchanged for scripts."""

    def __init__(self, on: bool) -> None:
        self.on = on
        self._progress: Any = None

    def __enter__(self) -> _Bars:
        if self.on:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                      TimeElapsedColumn(), console=Console(stderr=True), transient=False)
            self._progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)

    def start(self, label: str, total: int) -> Any:
        return self._progress.add_task(label, total=total) if self._progress is not None else None

    def step(self, task: Any, n: int) -> None:
        if self._progress is not None:
            self._progress.update(task, completed=n)

    def finish(self, task: Any, text: str, ok: bool) -> None:
        if self._progress is not None:
            self._progress.update(task, description=f"[{'green' if ok else 'red'}]{text}[/]",
                                  total=max(self._progress.tasks[task].completed, 1),
                                  completed=max(self._progress.tasks[task].completed, 1))


def _rich_table(findings: list[Any]) -> None:
    """The table of ``check`` on a terminal (the same columns as :func:`_table`)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    for name in ("program/variant", "expect", "result", "examples", "race@default"):
        table.add_column(name, no_wrap=True)
    table.add_column("shrunk schedule / what it shows", overflow="fold")
    for f in findings:
        what = f"{f.schedule}  ({f.summary})" if f.schedule else "-"
        style = "" if f.ok else "bold red"
        table.add_row(f"{f.program}/{f.variant}", f.expect, "found" if f.found else "clean", str(f.examples),
                      "yes" if f.race_at_default else "no", what, style=style)
    Console().print(table)


def _table(findings: list[Any]) -> None:
    rows = [("program/variant", "expect", "result", "examples", "race@default", "shrunk schedule / what it shows")]
    for f in findings:
        what = f"{f.schedule}  ({f.summary})" if f.schedule else "-"
        rows.append((f"{f.program}/{f.variant}", f.expect, "found" if f.found else "clean", str(f.examples),
                     "yes" if f.race_at_default else "no", what))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r[:5], widths, strict=True)) + "  " + r[5])


def _named_as_reported(edge: Any) -> Any:
    """``edge`` with each site's file named as the run's reports name it (relative to the working directory, or
    its last two components: :func:`reference.naming.short_path`), where it names a file that exists otherwise
    (``/abs/path/my_offload.py:11``, ``./my_offload.py:11``): such an edge matched no operation, and did nothing."""
    import attrs

    from reference.naming import short_path

    def named(site: Any) -> Any:
        file, _, line = site.source.rpartition(":")
        if not os.path.isfile(file):
            return site
        return attrs.evolve(site, source=f"{short_path(os.path.abspath(file))}:{line}")

    return attrs.evolve(edge, after=named(edge.after), before=named(edge.before))


def cmd_replay(args: argparse.Namespace) -> int:
    from simdevice.programs import resolve
    from simdevice.runtime import Edge
    from simdevice.search.targets import FunctionTarget, ProgramTarget, Target, target_of

    if args.trials < 1:
        return _fail(f"--trials must be >= 1, got {args.trials}")
    try:
        edges = [_named_as_reported(Edge.parse(e)) for e in args.edge]
    except ValueError as e:
        return _fail(str(e))
    try:
        schedule = Schedule.parse(_unquoted(args.schedule))
        target: Target
        if is_function_target(schedule.program):
            function = target_of(schedule.program, _world_size(args))
            assert isinstance(function, FunctionTarget)
            function.validate(schedule, edges)
            target = function
        else:
            if args.world_size is not None:
                target_of(schedule.program, args.world_size)  # (its one-line error)
            program, _ = resolve(schedule)
            target = ProgramTarget(program, schedule.variant)
    except ScheduleError as e:
        return _fail(_bad_target(_unquoted(args.schedule), e))
    if edges and args.gpu:
        return _fail("--edge inserts a synchronization on the simulator; apply it to the code to run it on a GPU")
    if (args.perfetto or args.png) and args.gpu:
        return _fail("--perfetto and --png draw the simulator's timeline; drop --gpu")
    for option, path in (("--perfetto", args.perfetto), ("--png", args.png)):
        if path is not None and os.path.isdir(path):
            return _fail(f"{option} {path!r}: a folder; name the file to write in it ({option} "
                         f"{os.path.join(path, 'run.png' if option == '--png' else 'run.json')!r})")
        if path is not None and (not path or not os.path.isdir(os.path.dirname(path) or ".")):
            return _fail(f"{option} {path!r}: not a file in an existing folder")
        why = _cannot_create_in(os.path.dirname(path) or ".") if path else None
        if why is not None:
            return _fail(f"{option} {path!r}: cannot write it ({why})")
    if args.png is not None and not args.png.lower().endswith(".png"):
        return _fail(f"--png {args.png!r}: not a .png file name (the picture is a PNG, written where named)")
    if args.perfetto is not None and args.perfetto.lower().endswith(".png"):
        return _fail(f"--perfetto {args.perfetto!r}: a trace is JSON, not a picture: name a .json file (--png "
                     "FILE.png draws the picture)")
    if args.png:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            return _fail("--png needs matplotlib (pip install matplotlib)")
    backend = "sim"
    if args.gpu:
        import torch

        if not torch.cuda.is_available():
            return _fail("--gpu needs a CUDA GPU, and torch sees none on this machine")
        ranks = args.world_size or 0
        if ranks > torch.cuda.device_count():
            return _fail(f"--gpu --world-size {ranks} needs {ranks} GPUs, a rank each; torch sees "
                         f"{torch.cuda.device_count()} on this machine")
        if ranks and args.trace:
            return _fail("--trace --gpu draws one process's GPU timeline; a run on ranks has one a rank: drop --trace")
        backend = "cuda"
        target.run(schedule, backend)  # warm-up: the trials meet warm caching allocators, as in a steady state
    from simdevice.explain import check_edges

    outcomes: list[Any] = []
    interrupted = False
    timed: Any = contextlib.nullcontext()
    if args.trace and backend == "cuda":
        from reference.cuda import timelines

        timed = timelines()
    # --gpu under a measured profile: each trial's host timed, to judge that trial on the simulator with it
    judge = backend == "cuda" and _profile() != "default"
    hosts: list[tuple[dict[str, tuple[int, ...]], dict[str, int]]] = []
    try:
        with timed:
            for _ in range(args.trials):
                if edges:
                    outcomes.append(check_edges(target, schedule, edges))
                elif judge:
                    outcomes.append(_timed_run(target, schedule, hosts))
                else:
                    outcomes.append(target.run(schedule, backend))
    except KeyboardInterrupt:
        interrupted = True
    judged = _judged(target, schedule, hosts[: len(outcomes)]) if judge and not interrupted else []
    if not outcomes:  # interrupted in the first run: nothing to show
        if args.json:
            _print_json(json.dumps({"schedule": str(schedule), "backend": backend, "trials": 0, "interrupted": True},
                             indent=2))
        return _interrupted()
    bad = sum(not o.clean for o in outcomes)
    first = outcomes[0]
    pace = _pace(args.profile, target, schedule, first) if backend == "sim" and not edges and not interrupted else {}
    fix = None
    if args.fix and backend == "sim" and not edges and not first.clean and not interrupted:
        fix = _suggest(target, first, args.json)
    if args.json:
        _print_json(json.dumps({
            "schedule": str(schedule), "backend": backend, "trials": len(outcomes), "failed": bad,
            **({"profile": _profile(), "values": _values()} if backend == "sim" else {}),
            **({"pace_sensitive": any(o.shows_on_gpu != first.shows_on_gpu for o in pace.values()),
                "pace": {str(f): o.verdict() for f, o in pace.items()}} if pace else {}),
            "edges": [str(e) for e in edges],
            "verdicts": [o.verdict() for o in outcomes],
            **({"judged": [o.verdict() for o in judged], "judged_same": _same(outcomes, judged)} if judged else {}),
            "reports": [str(r) for r in first.run.reports], "problems": list(first.problems),
            "fix": _fix_json(fix, str(schedule), first.replay_options()) if fix is not None else None,
            **({"interrupted": True} if interrupted else {}),
            # (--trace: the first run's trace, each line as the text prints it)
            **({"trace": first.trace_text().splitlines()} if args.trace else {}),
        }, indent=2))
    else:
        print(first.text())
        if backend == "sim":
            _say_judged()
        turned = {f: o for f, o in pace.items() if o.shows_on_gpu != first.shows_on_gpu}
        if turned:
            said = "; ".join(f"with the host's costs x{f}: {o.verdict()}" for f, o in turned.items())
            print(f"  pace-sensitive: {said} (a calibration of the same GPU can find its host that much faster or "
                  "slower: a GPU shows this schedule at a rate, trial by trial; --gpu --trials 10)")
        if edges:
            print(f"  (with {len(edges)} inserted edge{'s' if len(edges) > 1 else ''}: "
                  f"{', '.join(str(e) for e in edges)}; replay with them: "
                  f"{_replay_with(schedule, edges, first.replay_options())})")
        if fix is not None:
            _print_fix(fix, str(schedule), first.replay_options() if backend == "sim" else "")
        if args.trials > 1:
            print(f"{bad}/{len(outcomes)} trials failed" + (f" (interrupted, of {args.trials})" if interrupted else ""))
        if judged:
            print(f"  each trial judged on the simulator with its own host's steps and the device of cost profile "
                  f"{_profile()}: {_same(outcomes, judged)}/{len(judged)} the same")
            for k, (gpu, sim) in enumerate(zip(outcomes, judged, strict=True)):
                print(f"    trial {k + 1}: GPU {gpu.verdict()}, simulator {sim.verdict()}")
        if args.trace:
            if backend == "cuda":
                print("  the GPU's timeline (ms since the run's start; CUDA events around each counted operation, "
                      "a collective from its launch stream's position to its end):")
            print("".join(f"  {line}\n" for line in first.trace_text().splitlines()), end="")
    if args.perfetto or args.png:
        # after the report: a file that cannot be written after all (the folder checked up front) loses no report
        from simdevice.timeline import write_perfetto, write_png

        for option, path, write in (("--perfetto", args.perfetto, write_perfetto), ("--png", args.png, write_png)):
            if path:
                try:
                    write(first, path, fix)
                except OSError as e:
                    return _fail(f"{option} {path!r}: cannot write it ({e.strerror or e})")
    if interrupted:
        return _interrupted()
    if bad and all(o.clean or _no_verdict(target.name, o) is not None for o in outcomes):
        refused = next((v for o in outcomes if o.backend == "cuda" and (v := _no_verdict(target.name, o))), None)
        if refused is not None:  # (the GPU's reason, said as a refusal: its "wrong values" above are no verdict)
            return _fail(refused[1])
        return 2  # no verdict (a step limit, or what the simulator does not run): neither clean nor failing
    return 1 if bad else 0


def _cannot_create_in(folder: str) -> str | None:
    """Why no file can be created in ``folder`` (a file made there and removed at once), or None."""
    import tempfile

    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".simdevice-")
    except OSError as e:
        return e.strerror or str(e)
    os.close(fd)
    os.unlink(probe)
    return None


def _no_verdict(name: str, out: Any) -> tuple[str, str] | None:
    """Where a run says nothing of the program: ``("unsupported", why)`` where it used what the simulator does not
    run; ``("step_limit", why)`` where it stopped at its step bound with nothing found before; else None. ``why``: the
    command's one line."""
    from simdevice.explain import not_run
    from simdevice.runtime.reports import StepLimit

    reports = out.run.reports
    if out.backend == "cuda":
        # a GPU run stopped at what it does not replay (processes or threads the program starts: their steps are
        # not counted there), not at the program's own error
        refused = next((p for p in out.problems if p.startswith("host raised NotImplementedError")), None)
        if refused is not None:
            return ("unsupported", f"{name}: the GPU run does not replay it: {refused[len('host raised '):]}, "
                    f"under schedule \"{out.schedule}\"")
        return None
    stopped, why = not_run(out), "the program uses what the simulator does not run"
    if stopped is not None:
        return ("unsupported", f"{name}: {why}: {_first_sentence(stopped.error)} in {stopped.actor} "
                f"({stopped.source}), under schedule \"{out.schedule}\"; see \"Not intercepted\" in docs/dropin.md")
    if reports and all(isinstance(r, StepLimit) for r in reports):
        return ("step_limit", f"{name}: no verdict under schedule \"{out.schedule}\": {reports[0]}; nothing was "
                "found before it")
    return None


def _timed_run(target: Any, schedule: Any, hosts: list[tuple[dict[str, tuple[int, ...]], dict[str, int]]]) -> Any:
    """One GPU run with its host timed (``reference.cuda.host_traces``): its steps' costs and its processes' starts
    go to ``hosts``, even where the run raises."""
    from reference.cuda import host_traces, measured_hosts

    with host_traces() as devices:
        try:
            return target.run(schedule, "cuda")
        finally:
            hosts.append(measured_hosts(devices))


def _judged(target: Any, schedule: Any, hosts: list[tuple[dict[str, tuple[int, ...]], dict[str, int]]]) -> list[Any]:
    """Each GPU trial judged on the simulator with its own host (``SimConfig.host_trace``, ``host_starts``) and the
    command's profile for the device: whether the simulator, given the host that run had, gives what it gave."""
    from simdevice.runtime.config import overridden

    judged = []
    for costs, starts in hosts:
        with overridden(host_trace={a: c for a, c in costs.items() if c}, host_starts=starts):
            judged.append(target.run(schedule))
    return judged


def _same(outcomes: list[Any], judged: list[Any]) -> int:
    """Trials whose GPU run failed exactly where the simulator, judging it, shows a failure."""
    return sum((not gpu.clean) == sim.shows_on_gpu for gpu, sim in zip(outcomes, judged, strict=True))


def _pace(spec: str | None, target: Any, schedule: Any, first: Any) -> dict[float, Any]:
    """Under a measured profile (``--profile``, not the fast default): the runs with the host's costs scaled by each
    factor of ``PACE_SPREAD``, which say whether the verdict turns on the host's pace."""
    if spec is None or _profile() == "default":
        return {}
    from simdevice.runtime.profiles import load, paced

    return paced(load(spec), lambda: target.run(schedule))


def cmd_exhaust(args: argparse.Namespace) -> int:
    from simdevice.jobs import CHUNK, WorkerError, exhaust_in_workers
    from simdevice.search import count_target_schedules, exhaust_target
    from simdevice.search.execute import SHOWN_OF_A_KIND, replay_command
    from simdevice.search.exhaust import target_schedules
    from simdevice.search.explore import race_at_default
    from simdevice.search.targets import ProgramTarget

    try:
        units = tuple(int(u) for u in args.units.split(","))
    except ValueError:
        return _fail(f"--units must be integers separated by commas, got {args.units!r}")
    if not units or min(units) < 1:
        return _fail(f"--units must be >= 1, got {args.units!r}")
    if max(units) > MAX_UNITS:
        return _fail(f"--units must be in 1..{MAX_UNITS}, got {args.units!r}")
    units = tuple(dict.fromkeys(units))  # (a stall given twice makes each schedule twice)
    if not 0 <= args.delays <= 4:
        return _fail(f"--delays must be in 0..4, got {args.delays}")
    if args.jobs is not None and args.jobs < 1:
        return _fail(f"--jobs must be >= 1, got {args.jobs}")
    if args.max_schedules < 1:
        return _fail(f"--max-schedules must be >= 1, got {args.max_schedules}")
    try:
        target, fixed = _target_and_config(args.target, "exhaust", _world_size(args))
    except ScheduleError as e:
        return _fail(_bad_target(args.target, e))
    builtin = isinstance(target, ProgramTarget)
    # a built-in program: the configuration given (PROGRAM/VARIANT: for the defaults), or its whole space
    config = fixed if (fixed or not builtin or args.target.rstrip().endswith(":")) else None
    with _held_output(args):
        total = count_target_schedules(target, args.delays, units, config, stop_above=args.max_schedules)
    if total > args.max_schedules:
        return _fail(f"too many schedules: at least {total}, more than --max-schedules {args.max_schedules}; fewer "
                     "--delays or --units, a configuration, or a larger --max-schedules")
    jobs = min(args.jobs or default_jobs(), -(-total // CHUNK)) if total >= PARALLEL_FROM else 1
    if not args.quiet:
        print(f"running {_count(total, 'schedule')}" + (f" in {jobs} worker processes" if jobs > 1 else ""),
              file=_stderr(),
              flush=True)
    #: schedules run to their end so far, and whether all were clean
    ran = [0, True]
    began = time.monotonic()

    def step(k: int, clean: bool = True) -> None:
        ran[:] = [k, clean]
        if not args.quiet and _stderr().isatty() and (jobs > 1 or k % 10 == 0 or k == total):
            left = (time.monotonic() - began) / max(k, 1) * (total - k)  # the command's own clock, not the simulator's
            print(f"\r  {args.target}: {k}/{total} schedules, about {left:.0f}s left ", end="", file=_stderr(),
                  flush=True)

    try:
        if jobs > 1:
            setup = Setup(overrides=_overrides(), modules=loaded_modules(), show_output=args.show_output)
            with _held_output(args):
                n, failed = exhaust_in_workers(target, target_schedules(target, args.delays, units, config), jobs,
                                               setup, step)
        else:
            # the schedule running when a stop comes is not counted: step(k) comes before it runs
            with _held_output(args):
                n, failed = exhaust_target(target, args.delays, units, lambda k: step(k - 1), config)
    except WorkerError as e:
        if e.detail:
            print(e.detail, file=_stderr(), end="")
        _fail(f"{target.name}: {e}; the target cannot be called clean")
        return 1
    except KeyboardInterrupt:
        clean = ", all clean so far" if ran[1] else ", one failed (not shown: the schedules before it had not all run)"
        if args.json:
            _print_json(json.dumps({"target": target.name, "ran": ran[0], "total": total, "clean_so_far": ran[1],
                                    "interrupted": True}, indent=2))
        else:
            print(f"{_named(target, args.target)}: interrupted after {ran[0]} of {total} schedules{clean}")
        return _interrupted()
    if not args.quiet and _stderr().isatty():
        print("\r\x1b[K", end="", file=_stderr())  # clear the progress line
    scope = "the configuration given" if fixed or (builtin and config is not None) else (
        "every configuration" if builtin else "its defaults")
    where = f"{_named(target, args.target)} ({scope})"
    whatever = False
    if failed is None and not builtin:
        # as check: a race is there whatever the timing, though no schedule made it show (the default run's: cached)
        with _held_output(args):
            failed = race_at_default(target, config or None)
        whatever = failed is not None
    no_verdict = _no_verdict(target.name, failed) if failed is not None and not builtin else None
    if no_verdict is not None:  # as check says it
        key, why = no_verdict
        if args.json:
            _print_json(json.dumps({"target": target.name, "clean": False, "ran": n, "total": total,
                                    "schedule": str(failed.schedule), key: why}, indent=2))
        return _fail(why)
    code = 1 if failed is not None else 0
    if builtin:
        expect_bug = target.variant not in target.program.clean
        code = 0 if (failed is not None) == expect_bug else 1
    stalls = ",".join(map(str, units))
    if args.json:
        _print_json(json.dumps({
            "target": target.name, "scope": scope, "delays": args.delays, "units": list(units), "total": total,
            "ran": n, "clean": failed is None, "schedule": str(failed.schedule) if failed is not None else None,
            "summary": failed.verdict() if failed is not None else "clean",
            "reports": [str(r) for r in failed.run.reports] if failed is not None else [],
            "profile": _profile(), "values": _values(), "ok": code == 0, "world_size": args.world_size or 1,
            "replay": replay_command(failed.schedule, failed.replay_options()) if failed is not None else None,
        }, indent=2))
    elif failed is None:
        delays = "1 delay" if args.delays == 1 else f"{args.delays} delays"
        of = (f"of at most {delays} of {stalls} unit{'' if stalls == '1' else 's'}" if args.delays
              else "without delays (the default order)")
        print(f"{where}: clean over {'all ' if n > 1 else ''}{_count(n, 'schedule')} {of}")
    elif whatever:
        print(f"{where}: no schedule of the {n} shows wrong values, but the default one races (a race is there "
              "whatever the timing):")
        print(failed.text(SHOWN_OF_A_KIND))
    else:
        print(f"{where}: fails at schedule {n}:")
        print(failed.text(SHOWN_OF_A_KIND))
    if not args.json:
        _say_judged()
    _say_held(args, str(failed.schedule) if failed is not None else _named(target, args.target))
    return code


def cmd_list(args: argparse.Namespace) -> int:
    if args.path is not None and not args.path.strip():
        return _fail("empty PATH: name FILE.py or MODULE, or give none for the known programs")
    if args.path:
        try:
            world = _world_size(args)
        except ScheduleError as e:
            return _fail(str(e))
        return _list_functions(args.path, world)
    if args.world_size is not None:
        return _fail("--world-size is for a file or module of functions (list FILE.py --world-size N)")
    from simdevice.programs import programs

    for p in programs(None):
        print(f"{p.name}: {p.doc}")
        for v in p.clean:
            print(f"  {v} (must be clean)")
        for v, why in p.buggy.items():
            print(f"  {v} (known bug: {why})")
        print(f"  actors: {', '.join(p.actors)}")
    return 0


def _list_functions(path: str, world_size: int | None = None) -> int:
    from simdevice.search.targets import TargetError, functions_in, main_block_hint

    # what the file prints as it is imported and probed goes to stderr: stdout holds the listing alone
    apart = contextlib.redirect_stdout(sys.stderr)
    config: dict[str, Any] = {}
    try:
        with apart:
            if "::" in path:  # one function (FILE.py::FUNCTION[:KEY=VALUE,...]), as check and replay name it
                given = Schedule.parse(path)
                if given.delays or given.choices:
                    raise ScheduleError(f"list probes the default schedule; drop the delays from {path[:200]!r}")
                target, config = _target_and_config(path, "list", world_size)
                found = [target]
            else:
                found = functions_in(path, world_size)
    except ScheduleError as e:
        return _fail(str(e))
    if not found:
        print(f"{path}: no function a schedule can target (public, defined there, every parameter but dev "
              f"with a default){main_block_hint(path)}")
        return 0
    for target in found:
        params = ", ".join(f"{k}={v!r}" for k, v in {**target.params, **config}.items())
        style = "plain torch.cuda" if target.style == "plain" else "contract (dev)"
        try:
            with apart:
                counts = target.probe(config)
        except TargetError as e:
            print(f"{target.name}  [{style}]({params})\n  probe failed: {e}")
            continue
        ops = ", ".join(f"{a} {n}" for a, n in sorted(counts.items()) if n)
        print(f"{target.name}  [{style}]({params})\n  operations: {ops or 'none'}")
        with apart:
            default = target.run(target.schedule(config))  # (the probe's run, kept)
        if any(r.kind in ("host-error", "step-limit", "deadlock") for r in default.run.reports):
            # an error or a limit ended it early: the counts are of what it did until then
            print(f"  its default schedule ends early: {default.verdict()} (simdevice replay "
                  f"\"{_named(target, path) if config else target.name}\"{default.replay_options()})")
    return 0


@contextlib.contextmanager
def _json_apart(args: argparse.Namespace) -> Iterator[None]:
    """With ``--json``, what the program prints goes to stderr, so that stdout holds the document alone."""
    if not getattr(args, "json", False):
        yield
        return
    _JSON_OUT[0] = sys.stdout
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        _JSON_OUT[0] = None


def main(argv: list[str] | None = None, imported: Callable[[], None] | None = None) -> int:
    """The command line: its exit code. ``imported`` is called once torch is imported (the ``simdevice`` command
    then has the garbage collector leave torch's objects alone: :func:`simdevice.command.entry`)."""
    parser = _parser()
    args = parser.parse_args(argv)
    _HELD[0] = 0
    commands = {"check": cmd_check, "replay": cmd_replay, "exhaust": cmd_exhaust, "list": cmd_list}
    try:
        if args.command in commands:
            import torch

            if imported is not None:
                imported()
            # a simulated device's tensors are small and many: one intra-op thread (two spin against each other and
            # the host actors on a loaded machine, 20% slower measured under a load of 2 on 2 cores)
            torch.set_num_threads(1)
            fields: dict[str, Any] = {}
            spec = getattr(args, "profile", None)
            if spec is not None:
                from simdevice.runtime.profiles import ProfileError, load

                try:
                    profile = load(spec)
                except ProfileError as e:
                    return _fail(str(e))
                fields.update(profile.overrides())
            steps = getattr(args, "max_steps", None)
            if steps is not None:
                if steps < 1:
                    return _fail(f"--max-steps must be >= 1, got {steps}")
                fields["max_host_steps"] = steps
            size = getattr(args, "device_memory", None)
            if size is not None:
                nbytes = _bytes(size)
                if nbytes is None or nbytes < 1:
                    return _fail(f"--device-memory must be a size such as 512M, 8G or a number of bytes, got "
                                 f"{size[:40]!r}")
                fields["device_memory"] = nbytes
            if getattr(args, "no_values", False):
                fields["values"] = False
            from simdevice.runtime.config import overridden

            with overridden(**fields), _json_apart(args):
                return commands[args.command](args)
    except KeyboardInterrupt:  # before or after a command's own loop: nothing of its results to keep
        if getattr(args, "json", False):
            _print_json(json.dumps({"interrupted": True}))
        return _interrupted()
    parser.print_help()
    return 2
