"""``simdevice check --jobs N``: the table's variants searched in worker processes give the serial table, row for
row (verdicts, examples, shrunk schedules, in program order whatever order the workers finish in), with the
command line's settings reaching the workers; bad values are refused in one line; a worker that dies leaves its
variant without a verdict and the command goes on to its end. The stops (Ctrl-C, SIGTERM) of a parallel check
are in test_interrupts.py.

Each mutation named in a test's docstring was applied by hand and made that test fail.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
#: a table of five variants, two clean (searched first, the longest) and three bugs (found in a few schedules): the
#: workers finish them in another order than the table's
SMALL = ["check", "--program", "offload_reload", "--program", "memsaver_guard", "--examples", "20"]

RunCli = Callable[[list[str], Path], subprocess.CompletedProcess[str]]


def _without_seconds(text: str) -> str:
    return re.sub(r"[0-9.]+s$", "<s>", text, flags=re.MULTILINE)


@contextlib.contextmanager
def _within(seconds: float) -> Iterator[None]:
    """Fail the test, rather than hang it, if the block runs longer than ``seconds``."""

    def late(signum: int, frame: Any) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, late)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_the_parallel_table_is_the_serial_table(run_cli: RunCli, tmp_path: Path) -> None:
    """Mutation caught: the findings put in the table in the order the workers finished them."""
    serial = run_cli([*SMALL, "--jobs", "1"], tmp_path)
    parallel = run_cli([*SMALL, "--jobs", "2"], tmp_path)
    assert (serial.returncode, parallel.returncode) == (0, 0), serial.stderr + parallel.stderr
    assert _without_seconds(parallel.stdout) == _without_seconds(serial.stdout)
    assert "all as expected: 5/5 variants" in parallel.stdout
    # the lines on stderr: each variant started and finished, the finishing line naming it (lines interleave)
    for label in ("offload_reload/correct", "offload_reload/racy", "memsaver_guard/FIXED"):
        assert f"checking {label} ...\n" in parallel.stderr
        assert re.search(rf"^  ok: (clean|found) after [0-9]+ schedules, [0-9.]+s \({label}\)$", parallel.stderr,
                         flags=re.MULTILINE), parallel.stderr


def test_the_parallel_json_is_the_serial_json(run_cli: RunCli, tmp_path: Path) -> None:
    """Mutation caught: the results in the order the workers finished them."""
    serial = json.loads(run_cli([*SMALL, "--json", "--jobs", "1"], tmp_path).stdout)
    parallel = json.loads(run_cli([*SMALL, "--json", "--jobs", "2"], tmp_path).stdout)
    for doc in (serial, parallel):
        del doc["seconds"]
        for r in doc["results"]:
            del r["seconds"]
    assert parallel == serial
    assert [(r["program"], r["variant"]) for r in parallel["results"]] == [
        ("offload_reload", "correct"), ("offload_reload", "racy"), ("memsaver_guard", "FIXED"),
        ("memsaver_guard", "memsaver-connect-unguarded"), ("memsaver_guard", "memsaver-free-while-paused-twice")]


def test_each_schedule_a_worker_runs_reaches_the_command_s_progress(run_cli: RunCli, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The workers' progress messages drive the command's bars (``_Bars.step``, through ``_Shown.stepped``): every
    schedule of every variant, in order.

    Mutation caught: the worker searching with no progress callback (the bars stood still until each variant's
    end)."""
    import simdevice.cli

    steps: dict[int, list[int]] = {}
    stepped = simdevice.cli._Shown.stepped

    def record(self: Any, index: int, n: int) -> None:
        steps.setdefault(index, []).append(n)
        stepped(self, index, n)

    monkeypatch.setattr(simdevice.cli._Shown, "stepped", record)
    p = run_cli(["check", "--program", "offload_reload", "--examples", "20", "--jobs", "2", "-q"], tmp_path)
    assert p.returncode == 0, p.stderr
    assert steps[0] == list(range(1, 21))  # offload_reload/correct: clean after 20 schedules
    assert steps[1] == list(range(1, len(steps[1]) + 1))
    assert steps[1]


def test_the_command_line_s_settings_reach_the_workers(run_cli: RunCli, tmp_path: Path) -> None:
    """``--max-steps`` (a SimConfig field, as ``--profile``, ``--device-memory`` and ``--no-values`` are) and
    ``--db`` (relative to the command's folder) act in a worker as in the command's own process: with 10 host steps
    every run is cut short, so the clean variant is found failing, and the failure is saved.

    Mutations caught: the worker runs without ``config.overridden`` (its clean variant stays clean); the worker
    opens no database."""
    args = ["check", "--program", "offload_reload", "--examples", "5", "--max-steps", "10", "--json"]
    serial = json.loads(run_cli([*args, "--jobs", "1", "--db", "db1"], tmp_path).stdout)
    parallel = json.loads(run_cli([*args, "--jobs", "2", "--db", "db2"], tmp_path).stdout)
    assert [r["summary"] for r in parallel["results"]] == ["1 step-limit", "1 step-limit"]
    assert [r["schedule"] for r in parallel["results"]] == [r["schedule"] for r in serial["results"]]
    saved = sorted(p.relative_to(tmp_path / "db2") for p in (tmp_path / "db2").rglob("*") if p.is_file())
    assert saved
    assert saved == sorted(p.relative_to(tmp_path / "db1") for p in (tmp_path / "db1").rglob("*") if p.is_file())


@pytest.mark.parametrize(("value", "message"), [
    ("0", "simdevice: error: --jobs must be >= 1, got 0\n"),
    ("-3", "simdevice: error: --jobs must be >= 1, got -3\n"),
    ("two", "simdevice: error: argument --jobs: invalid int value: 'two' (see simdevice --help)\n"),
])
def test_a_bad_jobs_is_one_line_and_exit_2(run_cli: RunCli, tmp_path: Path, value: str, message: str) -> None:
    """Mutation caught: no check of the value (0 then meant the default, -3 one after another: both ran the table
    and exited 0)."""
    p = run_cli(["check", "--program", "offload_reload", "--examples", "1", "--jobs", value], tmp_path)
    assert (p.returncode, p.stdout, p.stderr) == (2, "", message)


def test_a_worker_that_dies_leaves_its_variant_without_a_verdict(run_cli: RunCli, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Both workers are killed as the first variant starts: the two variants they hold (the clean ones, handed out
    first) are reported with no verdict, new workers check the other three, and the command exits 1.

    Mutations caught: a dead worker not noticed (the command went on reading its closed pipe); its variant not
    reported (three rows, no line for the two, exit 0); no worker started in its place (the other three variants
    never checked). The timer fails the test rather than hang it if the command waits for a dead worker."""
    import multiprocessing

    import simdevice.cli

    started = simdevice.cli._Shown.started
    killed: list[int] = []

    def start_and_kill(self: Any, index: int) -> None:
        started(self, index)
        if not killed:
            for child in multiprocessing.active_children():
                if child.name == "simdevice-check-worker" and child.pid is not None:
                    os.kill(child.pid, signal.SIGKILL)
                    killed.append(child.pid)

    monkeypatch.setattr(simdevice.cli._Shown, "started", start_and_kill)
    with _within(90):
        p = run_cli([*SMALL, "--jobs", "2"], tmp_path)
    assert len(killed) == 2
    assert p.returncode == 1, p.stderr
    died = "no verdict: its worker process died (killed by SIGKILL)"
    assert f"offload_reload/correct: {died}" in p.stdout
    assert f"memsaver_guard/FIXED: {died}" in p.stdout
    rows = [line.split()[0] for line in p.stdout.splitlines()[1:] if line.startswith(("offload", "memsaver"))
            and "no verdict" not in line]
    assert rows == ["offload_reload/racy", "memsaver_guard/memsaver-connect-unguarded",
                    "memsaver_guard/memsaver-free-while-paused-twice"]
    assert "NOT as expected: 3/5 variants (2 with no verdict)" in p.stdout
    assert "simdevice: error: offload_reload/correct: its worker process died (killed by SIGKILL)\n" in p.stderr
    assert "Traceback" not in p.stderr


def test_a_worker_draws_from_the_command_s_hypothesis_constants(tmp_path: Path) -> None:
    """Hypothesis draws some values from the constants of the local modules loaded in its process: a worker
    prepared by ``simdevice.jobs.prepare`` has the same as a ``check`` that searched in its own process. Run in a
    fresh process, as the command is (this one has loaded other modules).

    Mutations caught: the worker not importing the command's modules (it lacks ``simdevice.cli``'s and
    ``simdevice.command``'s constants); ``simdevice.cli`` importing ``simdevice.jobs`` only for a parallel table
    (the serial table's process lacks what it brings); the fork server importing a module the command does not
    (``simdevice.explain`` imported by ``simdevice.preloaded``)."""
    script = """
import json, sys
import simdevice.command
from simdevice.cli import main
assert main(["check", "--program", "offload_reload", "--examples", "1", "--jobs", "1", "-q", "--json"]) == 0
PROVIDERS = "__import__('hypothesis.internal.conjecture.providers', fromlist=['_'])"
POOL = f"sorted(map(repr, {PROVIDERS}._get_local_constants()))"
mine = eval(POOL)
from simdevice.jobs import Setup, context, loaded_modules, prepare
with context().Pool(1, initializer=prepare, initargs=(Setup(1, None, None, (), loaded_modules()),)) as pool:
    theirs = pool.apply(eval, (POOL,))
print(json.dumps({"mine": mine, "theirs": theirs}))
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120, check=False)
    assert p.returncode == 0, p.stderr
    pools = json.loads(p.stdout.splitlines()[-1])
    assert len(pools["mine"]) > 100
    assert pools["theirs"] == pools["mine"]


def test_a_worker_starts_with_the_fork_server_s_imports_done_and_frozen(tmp_path: Path) -> None:
    """A worker has Hypothesis from the fork server (:mod:`simdevice.preloaded`) before it imports anything itself,
    and the garbage collector on, leaving the server's objects alone.

    Mutations caught: the search left out of the server's imports (each worker imported it, and Hypothesis with it,
    after its fork: 0.4 s of its start); no ``gc.freeze`` there; the collector left off after the imports."""
    script = """
import json
from simdevice.jobs import context
SEEN = ("{'hypothesis': 'hypothesis' in __import__('sys').modules, 'frozen': __import__('gc').get_freeze_count(), "
        "'collecting': __import__('gc').isenabled()}")
with context().Pool(1) as pool:
    print(json.dumps(pool.apply(eval, (SEEN,))))
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120, check=False)
    assert p.returncode == 0, p.stderr
    seen = json.loads(p.stdout.splitlines()[-1])
    assert seen == {"hypothesis": True, "frozen": seen["frozen"], "collecting": True}
    assert seen["frozen"] > 100_000


def test_the_early_start_reads_check_s_options_as_the_parser_does() -> None:
    """``simdevice.jobs.VALUED`` (what :func:`~simdevice.jobs.wants_workers` skips as an option's value) is the set
    of ``check``'s options that take one.

    Mutation caught: an option added to the parser and not to ``VALUED`` (``--jobs`` left out)."""
    from simdevice.cli import _parser
    from simdevice.jobs import VALUED

    check = next(a for a in _parser()._subparsers._group_actions[0].choices.items() if a[0] == "check")[1]
    valued = {s for a in check._actions for s in a.option_strings if s.startswith("--") and a.nargs != 0}
    assert valued == set(VALUED)


@pytest.mark.parametrize(("argv", "cpus", "want"), [
    (["check"], 2, True),
    (["check"], 1, False),
    (["check", "--jobs", "2"], 1, True),
    (["check", "--jobs", "1"], 2, False),
    (["check", "--jobs=1"], 2, False),
    (["check", "--program", "zcc", "--db", "d", "--examples", "5", "-q"], 2, True),
    (["check", "--program=zcc", "--json"], 2, True),
    (["check", "examples/offload_plain.py::reload_racy"], 2, False),
    (["check", "--examples", "5", "offload_reload/racy"], 2, False),
    (["replay", "offload_reload/racy::d2h#0+1"], 2, False),
    (["exhaust", "offload_reload/correct"], 2, True),
    (["exhaust", "offload_reload/correct", "--units", "1"], 1, False),
    (["exhaust", "offload_reload/correct", "--jobs", "1"], 2, False),
    (["exhaust", "--delays", "2", "offload_reload/correct", "--jobs=3"], 1, True),
])
def test_the_fork_server_starts_early_for_work_in_workers_only(argv: list[str], cpus: int, want: bool,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutations caught: an option's value read as a TARGET (``--program`` left out of ``VALUED``); ``exhaust``
    left out (its workers waited for the server's imports after the command's own)."""
    from simdevice import jobs

    monkeypatch.setattr(jobs, "default_jobs", lambda: cpus)
    assert jobs.wants_workers(argv) is want
