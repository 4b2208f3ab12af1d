"""``simdevice exhaust --jobs N``: the schedules run in worker processes give the serial answer, the first schedule
that fails in the serial order (not the first a worker happened to find) or every schedule clean; a worker that
dies or a run that raises leaves the target not called clean (exit 1, one line); bad values are refused in one
line. The split between workers is :data:`simdevice.jobs.CHUNK` schedules at a time; the tests make it small, and
``PARALLEL_FROM`` (below which the command runs the schedules itself) 1, so that a short walk is shared out.

Each mutation named in a test's docstring was applied by hand and made that test fail.
"""

from __future__ import annotations

import os
import re
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import simdevice.cli
from simdevice import jobs

RunCli = Callable[[list[str], Path], Any]

#: a protocol of the user's whose schedules fail only where a stall lands between a synchronize and a write that a
#: side stream reads without waiting (six of its 136 one-delay schedules, from the 32nd, then three at the end)
LATE = textwrap.dedent('''
    import os
    import signal

    import torch


    def late(n: int = 256, ops: int = 8) -> None:
        if os.environ.get("KILL_WORKERS_OF") not in (None, str(os.getpid())):
            os.kill(os.getpid(), signal.SIGKILL)  # a worker of the test's command dies on its first run
        y = torch.zeros(n, device="cuda")
        x = torch.ones(n, device="cuda")
        side = torch.cuda.Stream()
        for _ in range(ops):
            x.mul_(1.0)
        torch.cuda.synchronize()
        y.copy_(x).mul_(2.0)
        for _ in range(ops):
            x.mul_(1.0)
        with torch.cuda.stream(side):  # no side.wait_stream(): the read of y is ordered by time alone
            out = y.sum()
        assert out.item() == 2.0 * n
''')


@pytest.fixture
def shared(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Chunks of 4 schedules, workers from the first schedule; the user's file in ``tmp_path``."""
    monkeypatch.setattr(jobs, "CHUNK", 4)
    monkeypatch.setattr(simdevice.cli, "PARALLEL_FROM", 1)
    (tmp_path / "late.py").write_text(LATE)
    return tmp_path


def test_the_parallel_answer_is_the_serial_first_failure(run_cli: RunCli, shared: Path) -> None:
    """Mutations caught: the failure reported the first to come back from a worker (a later chunk's, found in its
    first schedule, usually came back before the chunk holding the serial first's fourth); the command ending as
    soon as one failure came back."""
    serial = run_cli(["exhaust", "late.py::late", "--jobs", "1"], shared)
    assert serial.returncode == 1, serial.stderr
    assert "late.py::late (its defaults): fails at schedule 32:" in serial.stdout
    for _ in range(3):
        parallel = run_cli(["exhaust", "late.py::late", "--jobs", "2"], shared)
        assert (parallel.returncode, parallel.stdout) == (1, serial.stdout), parallel.stderr
        assert parallel.stderr == "running 136 schedules in 2 worker processes\n"


def test_a_clean_walk_in_workers_counts_every_schedule(run_cli: RunCli, shared: Path) -> None:
    """Mutation caught: the last chunk, shorter than the others, not handed out (the count came out short)."""
    args = ["exhaust", "offload_reload/correct:work=0", "--units", "1"]
    serial = run_cli([*args, "--jobs", "1"], shared)
    parallel = run_cli([*args, "--jobs", "3"], shared)
    assert (serial.returncode, parallel.returncode) == (0, 0), parallel.stderr
    assert re.search(r"clean over all (\d+) schedules", serial.stdout)
    assert parallel.stdout == serial.stdout
    assert parallel.stderr.endswith(" schedules in 3 worker processes\n")


def test_the_command_line_s_settings_reach_the_workers(run_cli: RunCli, shared: Path) -> None:
    """``--max-steps`` (a SimConfig field, as ``--profile``, ``--device-memory`` and ``--no-values`` are) acts in a
    worker as in the command's own process: with 10 host steps every run is cut short, so the clean variant fails.

    Mutation caught: the worker runs without ``config.overridden`` (the walk ended clean)."""
    args = ["exhaust", "offload_reload/correct:work=0", "--units", "1", "--max-steps", "10"]
    serial = run_cli([*args, "--jobs", "1"], shared)
    parallel = run_cli([*args, "--jobs", "2"], shared)
    assert (serial.returncode, parallel.returncode) == (1, 1), parallel.stderr
    assert "fails at schedule 1:" in serial.stdout
    assert parallel.stdout == serial.stdout


def test_the_order_decides_whatever_order_the_chunks_come_back_in(monkeypatch: pytest.MonkeyPatch,
                                                                   shared: Path) -> None:
    """The workers' answers, given back last chunk first (in this process, without workers): still the serial
    first failure.

    Mutation caught: the failure kept the first to come back (or the last), not the one first in order."""
    from simdevice.search.exhaust import exhaust_target, target_schedules
    from simdevice.search.targets import target_of

    def backwards(name: str, work: Any, args: Any, n: int, next_item: Any, handle: Any, died: Any,
                  finished: Any) -> None:
        target = target_of(args[1])
        items = []
        while (item := next_item()) is not None:
            items.append(item)
        for start, chunk in reversed(items):
            handle("done", start, list(jobs.run_chunk(target, chunk)))

    monkeypatch.setattr(jobs, "_serve", backwards)
    monkeypatch.chdir(shared)
    target = target_of("late.py::late")
    n, out = jobs.exhaust_in_workers(target, target_schedules(target), 2, jobs.Setup())
    serial_n, serial_out = exhaust_target(target)
    assert (n, out.schedule) == (serial_n, serial_out.schedule) == (32, serial_out.schedule)
    assert out.text() == serial_out.text()


def test_plain_code_stays_patched_across_a_walk_s_runs(monkeypatch: pytest.MonkeyPatch, shared: Path) -> None:
    """A walk of plain torch.cuda code patches torch once, not once per run (12% of a run's instructions,
    docs/benchmarks.md), in the command's process as in a worker's chunk, and restores it after.

    Mutation caught: ``kept_patched`` left out of ``exhaust_target`` or of ``run_chunk`` (one install per run)."""
    import torch

    from simdevice.dropin import facade
    from simdevice.search.exhaust import exhaust_target, target_schedules
    from simdevice.search.targets import target_of

    installs = []
    install = facade.install
    monkeypatch.setattr(facade, "install", lambda p: (installs.append(p), install(p))[1])
    monkeypatch.chdir(shared)
    stream = torch.cuda.Stream
    target = target_of("late.py::late")
    assert exhaust_target(target, units=(1,))[0] == 12  # its first failure with stalls of 1 unit
    assert len(installs) == 1
    installs.clear()
    assert jobs.run_chunk(target, list(target_schedules(target, units=(1,)))[:8]) == (8, None)
    assert len(installs) == 1
    assert torch.cuda.Stream is stream


def test_a_worker_that_dies_leaves_the_target_not_clean(run_cli: RunCli, shared: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every worker kills itself at its first run: the command says which schedules have no answer, in one line,
    and exits 1 (not 0: those schedules were never judged).

    Mutation caught: a dead worker's chunk forgotten (each worker in its place died the same way, and the walk
    ended with nothing failed, exit 0)."""
    monkeypatch.setenv("KILL_WORKERS_OF", str(os.getpid()))
    p = run_cli(["exhaust", "late.py::late", "--jobs", "2"], shared)
    assert p.returncode == 1
    assert p.stdout == ""
    assert re.fullmatch(r"running 136 schedules in 2 worker processes\n"
                        r"simdevice: error: late\.py::late: schedules \d+-\d+: their worker process died \(killed by "
                        r"SIGKILL\); the target cannot be called clean\n", p.stderr), p.stderr


def test_a_run_that_raises_in_a_worker_is_shown_with_its_traceback(run_cli: RunCli, shared: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug of the simulator's (an exception out of a run, which the command's own process would show as a
    traceback): the worker's traceback, then one line naming the schedules, exit 1.

    Mutation caught: the worker's error dropped (its chunk counted as run, the walk ended clean)."""
    monkeypatch.setattr(jobs, "_exhaust_work", _raising_work)
    p = run_cli(["exhaust", "offload_reload/correct:work=0", "--units", "1", "--jobs", "2"], shared)
    assert p.returncode == 1
    assert "Traceback (most recent call last)" in p.stderr
    assert "RuntimeError: a simulator bug" in p.stderr
    # (the chunk of whichever worker answered first: 1-4 or 5-8)
    assert re.search(r"simdevice: error: offload_reload/correct: schedules \d+-\d+: a run raised RuntimeError: a "
                     r"simulator bug; the target cannot be called clean\n$", p.stderr), p.stderr


def _raising_work(conn: Any, setup: Any, name: str, world_size: int | None = None) -> None:
    """A worker whose every run raises (module level: a worker process imports it by name)."""
    import traceback

    while (item := conn.recv()) is not None:
        try:
            raise RuntimeError("a simulator bug")
        except RuntimeError as e:
            conn.send(("error", item[0], f"a run raised {type(e).__name__}: {e}", traceback.format_exc()))


@pytest.mark.parametrize(("value", "message"), [
    ("0", "simdevice: error: --jobs must be >= 1, got 0\n"),
    ("-1", "simdevice: error: --jobs must be >= 1, got -1\n"),
    ("many", "simdevice: error: argument --jobs: invalid int value: 'many' (see simdevice --help)\n"),
])
def test_a_bad_jobs_is_one_line_and_exit_2(run_cli: RunCli, tmp_path: Path, value: str, message: str) -> None:
    """Mutation caught: no check of the value (0 then meant the default, -1 the command's own process)."""
    p = run_cli(["exhaust", "offload_reload/correct:work=0", "--units", "1", "--jobs", value], tmp_path)
    assert (p.returncode, p.stdout, p.stderr) == (2, "", message)
