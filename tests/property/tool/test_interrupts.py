"""Ctrl-C and SIGTERM at different moments of ``check``, ``replay`` and ``exhaust``: the command exits 130 (143 for
SIGTERM) with one line saying so, no traceback, and what was done kept (the variants checked so far in the table
or the JSON, the schedules run so far); SIGTERM leaves no temporary folders behind.

Each test starts the real command (signals reach a process, not a function) and sends the signal at a moment it
recognises on stderr: during the imports, after the first variant is done, while schedules run.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _importing_torch(pid: int) -> bool:
    """Whether process ``pid`` has mapped torch's library: its interpreter is up (a Ctrl-C before its ``site`` ran
    is the interpreter's to report, whatever the command does) and the command is importing torch."""
    try:
        return "libtorch_cpu" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def _stop(args: list[str], after: str | None, wait_s: float, sig: int = signal.SIGINT,
          env: dict[str, str] | None = None, group: bool = False) -> tuple[int, str, str]:
    """Run ``simdevice ARGS``; once a stderr line contains ``after`` (None: once the command imports torch), wait
    ``wait_s`` and send ``sig`` (with ``group``: to the command's process group, as a terminal sends Ctrl-C, and the
    command in a session of its own, which :func:`_left_in_session` then reads); return the exit code, stdout and
    stderr."""
    # a crash (once, under load: SIGSEGV with check's zcc/FIXED stopped early) leaves every thread's Python stack
    env = {**(os.environ if env is None else env), "PYTHONFAULTHANDLER": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "simdevice", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=group)
    _SESSION[:] = [proc.pid]
    assert proc.stderr is not None
    seen = []
    if after is not None:
        for line in proc.stderr:
            seen.append(line)
            if after in line:
                break
        else:
            raise AssertionError(f"never saw {after!r} on stderr:\n{''.join(seen)}")
    else:  # (a fixed delay from the start fell in the interpreter's own start under load)
        deadline = time.monotonic() + 60
        while not _importing_torch(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
    time.sleep(wait_s)
    if group:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:  # the test fails; what it started does not run on
        if group:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.kill()
        proc.communicate()
        raise
    return proc.returncode, out, "".join(seen) + err


#: the last command's process id (with ``group``: its session's)
_SESSION: list[int] = []


def _left_in_session() -> list[str]:
    """The processes of the last command's session still alive (zombies aside), as ``pid state cmdline``."""
    left = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile
            continue
        if int(fields[3]) == _SESSION[0] and fields[0] != "Z":  # its session, not a zombie
            left.append(f"{entry.name} {fields[0]} {cmdline[:160]}")
    return left


def _no_traceback(err: str) -> None:
    assert "Traceback" not in err, err
    assert "terminate called" not in err, err


def test_ctrl_c_during_the_imports_is_one_line_and_130() -> None:
    code, out, err = _stop(["check", "--program", "offload_reload", "--json"], None, 0.05)
    assert code == 130, err
    assert err.strip().splitlines()[-1] == "simdevice: interrupted"
    _no_traceback(err)
    if out.strip():  # the JSON document, whether the imports or the first variant were running
        assert json.loads(out)["interrupted"] is True


def test_ctrl_c_in_check_keeps_the_variants_done() -> None:
    code, out, err = _stop(["check", "--program", "offload_reload", "--program", "zcc", "--jobs", "1"], "  ok:", 0.3)
    assert code == 130, err
    _no_traceback(err)
    assert err.strip().splitlines()[-1] == "simdevice: interrupted"
    assert "offload_reload/correct" in out  # the first variant's row
    last = out.strip().splitlines()[-1]
    assert last.startswith("interrupted: "), out
    assert "of 6 variants checked" in last, out


def test_ctrl_c_in_check_json_is_a_valid_document_with_the_variants_done() -> None:
    code, out, err = _stop(["check", "--program", "offload_reload", "--program", "zcc", "--json", "--jobs", "1"],
                           "  ok:", 0.3)
    assert code == 130, err
    _no_traceback(err)
    doc = json.loads(out)
    assert doc["interrupted"] is True
    assert doc["ok"] is False
    assert doc["results"]
    assert doc["results"][0]["variant"] == "correct"


#: the table of ``check --program offload_reload --program zcc``
TABLE = ["offload_reload/correct", "offload_reload/racy", "zcc/FIXED", "zcc/zcc-frozen-step", "zcc/zcc-late-barrier",
         "zcc/zcc-no-step-begin-guard"]


def test_ctrl_c_from_a_terminal_stops_a_parallel_check_and_its_workers() -> None:
    """Ctrl-C on a terminal reaches every process of the group, the workers too: the command stops them, prints the
    variants done in table order and exits 130, with no traceback from any worker and no process of its session
    left alive.

    Mutations caught: the workers not stopped on a stop (the command waited at its exit for workers that never
    end, past the test's two minutes); a worker that lets the stop out of its loop (multiprocessing printed its
    traceback on the command's stderr)."""
    args = ["check", "--program", "offload_reload", "--program", "zcc", "--jobs", "2", "--examples", "40"]
    code, out, err = _stop(args, "  ok:", 0.3, group=True)
    assert code == 130, err
    _no_traceback(err)
    assert err.strip().splitlines()[-1] == "simdevice: interrupted"
    rows = [line.split()[0] for line in out.splitlines() if line.startswith(("offload_reload/", "zcc/"))]
    assert rows, out
    assert rows == sorted(rows, key=TABLE.index)
    assert out.strip().splitlines()[-1].startswith(f"interrupted: {len(rows)} of 6 variants checked"), out
    for _ in range(50):  # the fork server and multiprocessing's resource tracker end once the command has gone
        if not _left_in_session():
            break
        time.sleep(0.1)
    assert _left_in_session() == []


_RACY = """\
import torch


def reload(n: int = 256) -> None:
    act = torch.arange(n, dtype=torch.float32, device="cuda")
    pinned = torch.empty(n, pin_memory=True)
    d2h = torch.cuda.Stream()
    d2h.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(d2h):
        pinned.copy_(act, non_blocking=True)
    back = torch.empty_like(act).copy_(pinned, non_blocking=True)
    assert torch.equal(back.cpu(), torch.arange(n, dtype=torch.float32))
"""


@pytest.mark.parametrize("as_json", [False, True])
def test_ctrl_c_while_check_shrinks_keeps_the_failure_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            run_cli: Any, as_json: bool) -> None:
    """A stop that comes after a failing schedule was found, while Hypothesis shrinks it: check printed "none
    failed so far" (``"found": false``) and the failure was lost. It prints the smallest failing schedule so far,
    and its replay line, and still exits 130."""
    from simdevice.search.targets import FunctionTarget

    (tmp_path / "racy.py").write_text(_RACY)
    real = FunctionTarget.run
    found: list[str] = []

    def run(self: FunctionTarget, schedule: Any, backend: str = "sim") -> Any:
        if found:  # the run after the first failure: Ctrl-C, as the shrinking goes on
            raise KeyboardInterrupt
        out = real(self, schedule, backend)
        if self.failed(out):
            found.append(str(schedule))
        return out

    monkeypatch.setattr(FunctionTarget, "run", run)
    p = run_cli(["check", "racy.py::reload", "-q", *(["--json"] if as_json else [])], tmp_path)
    assert p.returncode == 130, (p.stdout, p.stderr)
    assert found
    if as_json:
        doc = json.loads(p.stdout)
        assert (doc["found"], doc["interrupted"], doc["shrunk"]) == (True, True, False)
        assert doc["schedule"].startswith("racy.py::reload")
        assert doc["replay"] == f'simdevice replay "{doc["schedule"]}"'
    else:
        assert "none failed" not in p.stdout
        assert "interrupted while shrinking" in p.stdout
        assert 'replay: simdevice replay "racy.py::reload' in p.stdout


def test_ctrl_c_in_replay_trials_keeps_the_trials_run() -> None:
    # replay says nothing on stderr before its end: the signal comes 4 s after the start, while the trials run (5,000
    # of them take about 30 s here; 400, as this test had, ended in 3.6 s once the simulator got faster, and the
    # signal came after the command was done)
    code, out, err = _stop(["replay", "offload_reload/racy::d2h#0+1", "--trials", "5000", "--json"], None, 4.0)
    assert code == 130, err
    _no_traceback(err)
    doc = json.loads(out)
    assert doc["interrupted"] is True
    if "trials" in doc:
        assert doc["trials"] < 5000
        assert len(doc.get("verdicts", [])) == doc["trials"]


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_ctrl_c_in_exhaust_says_how_far_it_got(jobs: str) -> None:
    """In this process or in workers (the default on a machine of two CPUs or more), the same line: how many
    schedules had finished, all clean, and exit 130."""
    # 1082 schedules: seconds of work, so the signal comes while they run
    code, out, err = _stop(["exhaust", "offload_reload/correct:", "--delays", "2", "--units", "1", "--jobs", jobs],
                           "running ", 0.5)
    assert code == 130, err
    _no_traceback(err)
    assert ("worker processes" in err) is (jobs != "1"), err
    m = re.fullmatch(r"offload_reload/correct: interrupted after (\d+) of 1082 schedules, all clean so far\n", out)
    assert m is not None, out
    assert int(m.group(1)) < 1082


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_sigterm_unwinds_the_run_and_leaves_no_temporary_folder(tmp_path: Path, jobs: str) -> None:
    """In parallel, the command passes SIGTERM on to the workers, whose runs unwind as the command's own does.

    Mutations caught (``--jobs 2``): the workers killed at once (SIGKILL), their temporary folders left behind; a
    worker that lets the stop out of its loop (a traceback on stderr)."""
    env = dict(os.environ, TMPDIR=str(tmp_path))  # zcc keeps its workers' checkpoints in a temporary folder
    code, out, err = _stop(["check", "--program", "zcc", "--jobs", jobs], "checking zcc/", 1.0, signal.SIGTERM, env)
    assert code == 143, err
    _no_traceback(err)
    assert err.strip().splitlines()[-1] == "simdevice: terminated"
    assert out.strip().splitlines()[-1].startswith("interrupted: ")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("wait_s", [0.0, 0.5, 1.5, 3.0, 6.0])
def test_ctrl_c_at_five_moments_of_check(wait_s: float) -> None:
    code, out, err = _stop(["check", "--program", "activation_offload", "--program", "zcc"], "checking ", wait_s)
    assert code == 130, err
    _no_traceback(err)
    assert out.strip().splitlines()[-1].startswith("interrupted: ")


def test_a_ctrl_c_swallowed_in_a_callback_stops_the_next_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ctrl-C that lands while a ``__del__`` or a weakref callback runs is "unraisable": Python printed "Exception
    ignored in ..." and went on, and a ``replay --trials 400`` ran all its trials. Kept by the command's hook, the
    next simulated run raises it."""
    import gc
    import signal as signal_module

    from simdevice import SimDevice, signals

    class Dropped:
        def __del__(self) -> None:
            raise KeyboardInterrupt  # where a signal can land: Python cannot raise it here

    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
    monkeypatch.setattr(signals, "_PENDING", [])
    old = {s: signal_module.getsignal(s) for s in (signal_module.SIGINT, signal_module.SIGTERM)}
    try:
        signals.install()
        Dropped()
        gc.collect()
        with pytest.raises(KeyboardInterrupt):
            SimDevice().run(lambda dev: None)
        SimDevice().run(lambda dev: None)  # raised once: the next run goes on
    finally:
        for s, h in old.items():
            signal_module.signal(s, h)


def test_without_the_hook_the_swallowed_ctrl_c_is_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant: no hook installed, the same ``__del__`` stops nothing (what the test above would miss)."""
    from simdevice import SimDevice, signals

    class Dropped:
        def __del__(self) -> None:
            raise KeyboardInterrupt

    monkeypatch.setattr(signals, "_PENDING", [])
    seen: list[object] = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    Dropped()
    SimDevice().run(lambda dev: None)
    assert seen  # Python reported it as unraisable, and the run went on


def test_a_ctrl_c_that_code_swallows_stops_the_next_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ctrl-C can be lost on its way with no callback in sight: C code that clears the error (an extension
    module's import, which Hypothesis starts between two runs, did in CI), or a program's own ``except
    BaseException``. The command's handler keeps what it raised until the command answers it."""
    import signal as signal_module

    from simdevice import SimDevice, signals

    monkeypatch.setattr(signals, "_PENDING", [])
    with contextlib.suppress(KeyboardInterrupt):  # raised, and swallowed where it landed
        signals.on_sigint(signal_module.SIGINT, None)
    with pytest.raises(KeyboardInterrupt):
        SimDevice().run(lambda dev: None)
    SimDevice().run(lambda dev: None)  # raised once: the next run goes on


def test_a_ctrl_c_lost_inside_a_run_ends_it_unreported(monkeypatch: pytest.MonkeyPatch) -> None:
    """Swallowed while the program runs (where a cut-short callback can leave it showing what it never did): the
    run raises the stop at its end rather than return its outcome."""
    import signal as signal_module

    from simdevice import SimDevice, signals

    monkeypatch.setattr(signals, "_PENDING", [])

    def program(dev: object) -> int:
        with contextlib.suppress(KeyboardInterrupt):
            signals.on_sigint(signal_module.SIGINT, None)
        return 1

    with pytest.raises(KeyboardInterrupt):
        SimDevice().run(program)


def test_a_ctrl_c_raised_out_of_a_run_is_not_raised_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stop that left its run as raised reached the run's caller (a test's ``pytest.raises``, a library's own
    handler): the next run starts as usual, not with that stop again."""
    import signal as signal_module

    from simdevice import SimDevice, signals

    monkeypatch.setattr(signals, "_PENDING", [])

    def program(dev: object) -> None:
        signals.on_sigint(signal_module.SIGINT, None)

    with pytest.raises(KeyboardInterrupt):
        SimDevice().run(program)
    try:
        again = SimDevice().run(lambda dev: 7)
    except KeyboardInterrupt:
        pytest.fail("the next run raised the stop again")
    assert again.result == 7


def test_python_s_own_handler_loses_the_swallowed_ctrl_c(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant: Python's handler in place of the command's, the same swallow stops nothing."""
    import signal as signal_module

    from simdevice import SimDevice, signals

    monkeypatch.setattr(signals, "_PENDING", [])
    with contextlib.suppress(KeyboardInterrupt):
        signal_module.default_int_handler(signal_module.SIGINT, None)
    SimDevice().run(lambda dev: None)


def test_a_ctrl_c_lost_after_the_last_run_still_exits_130(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    import signal as signal_module

    import simdevice.cli
    from simdevice import command, signals

    def main(argv: list[str] | None = None, imported: Any = None) -> int:
        with contextlib.suppress(KeyboardInterrupt):
            signals.on_sigint(signal_module.SIGINT, None)
        return 0

    monkeypatch.setattr(signals, "_PENDING", [])
    monkeypatch.setattr(simdevice.cli, "main", main)
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)

    def leave(code: int) -> None:  # the command's own ends the process (os._exit): here, the test's would end
        raise SystemExit(code)

    monkeypatch.setattr(command, "leave", leave)
    handlers = {s: signal_module.getsignal(s) for s in (signal_module.SIGINT, signal_module.SIGTERM)}
    try:
        with pytest.raises(SystemExit) as stop:
            command.entry()
    finally:
        for s, h in handlers.items():
            signal_module.signal(s, h)
        gc.enable()  # entry() turns the collector off until torch's import, which this main does not report
    assert stop.value.code == 130
    assert capsys.readouterr().err == "simdevice: interrupted\n"


def test_a_reader_that_goes_away_ends_the_command_quietly() -> None:
    """``simdevice replay ... --trace | head -1``: the pipe closes under the command; it ends with 141 (128 +
    SIGPIPE) and no traceback. The trace is about 150 KB, more than a pipe holds (64 KiB), so the command is still
    writing when the reader goes."""
    p = subprocess.Popen([sys.executable, "-m", "simdevice", "replay", "activation_offload/FIXED:layers=4,mb=4,iters=6",
                          "--trace", "--no-fix"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert p.stdout is not None
    assert p.stderr is not None
    p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 141, err
    assert "Traceback" not in err


def test_unbuffered_output_that_a_pipe_takes_in_part_is_an_error_not_a_silent_loss(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ``PYTHONUNBUFFERED`` (``python -u``) the text layer writes straight to the file, and a write the pipe
    takes in part (its reader gone mid-write) used to return as if all was written: the command ended 0 with most of
    its output lost. ``command.whole_writes`` puts a buffered layer between: the rest is written or the write
    raises. Deterministic: the reader takes 100 bytes of a 200 kB write, then closes, while the writer is blocked on a
    full pipe (64 KiB), so the write is always partial."""
    from simdevice import command

    r, w = os.pipe()
    unbuffered = io.TextIOWrapper(io.FileIO(w, "w"), write_through=True)  # what -u makes of stdout
    monkeypatch.setattr(sys, "stdout", unbuffered)
    monkeypatch.setattr(sys, "stderr", sys.stderr)  # whole_writes may wrap the test's own: put it back after
    command.whole_writes()
    out = sys.stdout

    def reader() -> None:
        os.read(r, 100)
        os.close(r)

    t = threading.Thread(target=reader)
    t.start()
    try:
        with pytest.raises(BrokenPipeError):
            sys.stdout.write("x" * 200_000)  # one write, as the trace is printed
    finally:
        t.join()
        with contextlib.suppress(BrokenPipeError):
            out.close()
        with contextlib.suppress(OSError, ValueError):
            unbuffered.close()


def test_zccs_folder_is_removed_wherever_a_stop_lands_in_its_making_or_removal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stop (Ctrl-C, SIGTERM: a ``KeyboardInterrupt`` at any line) right after the manager made its folder, or in
    the middle of removing it, leaves no folder behind. (A clean-clone CI run found one left: the stop had landed
    between the folder's making and the ``try`` that removes it.)"""
    import shutil
    import tempfile

    from reference import zcc

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    class Stopped:  # the first thing the manager asks of the device after its folder: where the stop lands
        def Queue(self) -> Any:  # the contract's name
            raise KeyboardInterrupt

    plan = zcc.Plan(steps=2, save=1, ema=0, workers=1, chunks=1, mutate=False, log=True, dump=1, numel=8)
    with pytest.raises(KeyboardInterrupt):
        zcc.ZeroCostCheckpointManager(Stopped(), zcc.FIXED, None, plan)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []

    folder = tmp_path / "zcc-made"
    (folder / "inner").mkdir(parents=True)
    (folder / "inner" / "dump.pt").write_bytes(b"x")
    manager = zcc.ZeroCostCheckpointManager.__new__(zcc.ZeroCostCheckpointManager)
    manager.dump_dir = str(folder)
    real = shutil.rmtree
    calls: list[str] = []

    def stopped_midway(path: str, ignore_errors: bool = False) -> None:
        calls.append(path)
        if len(calls) == 1:
            os.remove(folder / "inner" / "dump.pt")  # a part removed, then the stop
            raise KeyboardInterrupt
        real(path, ignore_errors=ignore_errors)

    monkeypatch.setattr(shutil, "rmtree", stopped_midway)
    with pytest.raises(KeyboardInterrupt):
        manager.close()
    assert list(tmp_path.iterdir()) == []


def test_a_stop_never_cuts_a_move_of_torch_s_state_between_actors(monkeypatch: pytest.MonkeyPatch) -> None:
    """Greenlet actors move torch's per-thread state (dispatch modes, key sets) off the thread and back at each
    switch. A Ctrl-C that lands halfway is held, and raised where the actor's state is whole again: the run still
    stops, and leaves no mode behind. (A stop raised halfway crashed the command in torch's C++ once under load.)"""
    import signal as signal_module

    import torch

    from simdevice import SimDevice, signals
    from simdevice.runtime import tls

    monkeypatch.setattr(signals, "_PENDING", [])
    real = tls.release
    landed: list[str] = []

    def release(held: object) -> None:  # the last step of tls.take: the actor's modes are off the stack by now
        if not landed and sys._getframe(2).f_code.co_name == "_switch":
            landed.append("in a move")
            try:
                signals.on_sigint(signal_module.SIGINT, None)  # as Python runs the handler between two bytecodes
            except KeyboardInterrupt:
                landed.append("raised there")
                raise
        real(held)

    monkeypatch.setattr(tls, "release", release)

    def ranks(dev: Any) -> None:
        def rank(d: Any) -> None:
            x = torch.ones(4, device=d.device)
            for _ in range(3):
                x.add_(1)
            d.synchronize()

        dev.spawn_ranks(rank, 2)

    with pytest.raises(KeyboardInterrupt):
        SimDevice().run(ranks)
    assert landed == ["in a move"]
    assert torch._C._len_torch_dispatch_stack() == 0
    monkeypatch.setattr(tls, "release", real)
    assert SimDevice().run(lambda dev: torch.ones(2, device=dev.device).sum().item()).result == 2.0


def test_a_keyboard_interrupt_the_program_raises_is_its_own_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the command's handlers are installed, a ``KeyboardInterrupt`` no signal raised is the program's (a
    host error of the run, as any exception); one the handler raised still stops the run."""
    import signal as signal_module

    from simdevice import SimDevice, signals

    monkeypatch.setattr(signals, "_PENDING", [])
    old = signal_module.signal(signal_module.SIGTERM, signals.on_sigterm)
    try:
        def own(dev: object) -> None:
            raise KeyboardInterrupt("the program's own")

        r = SimDevice().run(own)
        assert [x.kind for x in r.reports] == ["host-error"]
        assert "KeyboardInterrupt" in str(r.reports[0])

        def stopped(dev: object) -> None:
            signals.on_sigint(signal_module.SIGINT, None)

        with pytest.raises(KeyboardInterrupt):
            SimDevice().run(stopped)
    finally:
        signal_module.signal(signal_module.SIGTERM, old)


def test_check_of_a_program_that_raises_keyboard_interrupt_reports_it(tmp_path: Path) -> None:
    prog = tmp_path / "prog.py"
    prog.write_text("import torch\n\ndef f():\n    torch.ones(4, device='cuda')\n    raise KeyboardInterrupt\n")
    p = subprocess.run([sys.executable, "-m", "simdevice", "check", f"{prog}::f"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert "host error: host raised KeyboardInterrupt" in p.stdout
    assert "interrupted" not in p.stderr
