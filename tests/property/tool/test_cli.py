"""The command line as a user meets it: exit codes, one-line errors, JSON, replay."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from simdevice.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_replay_of_a_failing_schedule_explains_it_and_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "offload_reload/racy::d2h#0+1", "--no-fix"]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0] == (
        'schedule "offload_reload/racy::d2h#0+1" on sim: wrong values; 3 race, 1 stale-read'
    )
    assert "stale by 1 write" in out
    assert out.splitlines()[-1] == '  replay: simdevice replay "offload_reload/racy::d2h#0+1" [--gpu]'


def test_replay_of_a_clean_schedule_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "offload_reload/correct::d2h#0+1", "--trials", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith('schedule "offload_reload/correct::d2h#0+1" on sim: clean')
    assert "0/2 trials failed" in out


def test_replay_json_and_trace(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "offload_reload/racy::d2h#0+1", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["failed"] == 1
    assert doc["verdicts"] == ["wrong values; 3 race, 1 stale-read"]
    assert main(["replay", "offload_reload/correct", "--trace"]) == 0
    assert "start copy_ (D2H) #0" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown where there is no GPU")
def test_gpu_replay_without_a_gpu_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "offload_reload/racy", "--gpu"]) == 2
    assert capsys.readouterr().err == "simdevice: error: --gpu needs a CUDA GPU, and torch sees none on this machine\n"


@pytest.mark.parametrize(("extra", "said"), [
    ([], "--gpu --world-size 2 needs 2 GPUs, a rank each; torch sees 1 on this machine"),
    (["--world-size", "1", "--trace"], "--trace --gpu draws one process's GPU timeline; a run on ranks has one a rank"),
])
def test_gpu_replay_on_more_ranks_than_gpus_or_traced_on_ranks_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], extra: list[str], said: str
) -> None:
    # (a machine with one GPU, as torch would see it; refused before anything runs)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    args = ["replay", "examples/pipeline_plain.py::handoff_racy::rank0.p2p1-nccl#0+20", "--gpu"]
    assert main([*args, *(extra or ["--world-size", "2"])]) == 2
    assert capsys.readouterr().err.startswith(f"simdevice: error: {said}")


def test_check_json_reports_every_variant(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--json", "--examples", "30", "--program", "offload_reload"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is True
    by_variant = {r["variant"]: r for r in doc["results"]}
    assert by_variant["correct"]["found"] is False
    assert by_variant["correct"]["examples"] == 30
    assert by_variant["racy"]["found"] is True
    assert by_variant["racy"]["schedule"] == "offload_reload/racy::d2h#0+1"
    assert set(by_variant["racy"]) >= {"program", "variant", "expect", "found", "examples", "schedule", "summary"}


def test_list_names_programs_variants_and_actors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "offload_reload: " in out
    assert "  racy (known bug: the reload does not wait for the event recorded after the D2H)" in out
    assert "  actors: host, default, d2h" in out


def test_the_installed_command_prints_no_traceback() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "simdevice", "replay", "a/b:c:d:e"], capture_output=True, text=True,
                       env=env, cwd=ROOT, check=False)
    assert p.returncode == 2
    assert p.stderr == "simdevice: error: bad schedule 'a/b:c:d:e': more than three ':'-separated fields\n"
    p = subprocess.run([sys.executable, "-m", "simdevice", "frobnicate"], capture_output=True, text=True, env=env,
                       cwd=ROOT, check=False)
    assert p.returncode == 2
    assert "Traceback" not in p.stderr


def test_the_command_runs_programs_with_string_hashes_fixed(tmp_path: Path) -> None:
    """A program that iterates a set of names took another order in each process (Python seeds its string hashes per
    process): a replay, a new process, could take another path than the search that printed its line. The command
    runs with ``PYTHONHASHSEED=0`` unless the environment fixed one (``command.fixed_string_hashes``)."""
    (tmp_path / "hashes.py").write_text(textwrap.dedent("""\
        import os
        import sys


        def seed_fixed(want="0"):
            assert os.environ.get("PYTHONHASHSEED") == want, os.environ.get("PYTHONHASHSEED")
            assert sys.flags.hash_randomization == (want != "0")
    """))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    env["PYTHONPATH"] = str(ROOT)
    for seed, line in ((None, "hashes.py::seed_fixed"), ("random", "hashes.py::seed_fixed"),
                       ("5", "hashes.py::seed_fixed:want=5")):
        p = subprocess.run([sys.executable, "-m", "simdevice", "replay", line, "--no-fix"], capture_output=True,
                           text=True, env=env if seed is None else {**env, "PYTHONHASHSEED": seed}, cwd=tmp_path,
                           check=False)
        assert p.returncode == 0, (seed, p.stdout, p.stderr)
        assert p.stdout.startswith(f'schedule "{line}" on sim: clean'), p.stdout


def test_exhaust_reports_clean_and_found(capsys: pytest.CaptureFixture[str]) -> None:
    # a delay at each operation the probe saw (host 27, default 17, d2h 2; with work=0, host 19 and default 9)
    # plus the empty schedule
    assert main(["exhaust", "offload_reload/correct", "--units", "1", "-q"]) == 0
    assert capsys.readouterr().out == (
        "offload_reload/correct (every configuration): clean over all 47 schedules of at most 1 delay of 1 unit\n"
    )
    assert main(["exhaust", "offload_reload/correct:work=0", "--units", "1"]) == 0
    captured = capsys.readouterr()
    assert captured.err.startswith("running 31 schedules\n")
    assert captured.out.startswith(
        "offload_reload/correct:work=0 (the configuration given): clean over all 31 schedules")
    assert main(["exhaust", "offload_reload/correct", "--delays", "0", "-q"]) == 0
    assert capsys.readouterr().out == (  # (not "of at most 0 delays of 1,5,20 units")
        "offload_reload/correct (every configuration): clean over 1 schedule without delays (the default order)\n")
    assert main(["exhaust", "offload_reload/correct::d2h#0+1"]) == 2
    assert "exhaust draws the delays itself" in capsys.readouterr().err
    assert main(["exhaust", "offload_reload/racy", "--units", "1", "-q"]) == 0
    assert 'schedule "offload_reload/racy::d2h#0+1" on sim' in capsys.readouterr().out
    assert main(["exhaust", "offload_reload/racy", "--delays", "9"]) == 2
    assert capsys.readouterr().err == "simdevice: error: --delays must be in 0..4, got 9\n"


def _on_a_terminal(args: list[str]) -> str:
    """What ``simdevice ARGS`` writes to a pseudo-terminal (stdout and stderr both on it)."""
    import os
    import pty
    import subprocess
    import sys

    master, slave = pty.openpty()
    env = dict(os.environ, COLUMNS="160", LINES="50", TERM="xterm")
    proc = subprocess.Popen([sys.executable, "-m", "simdevice", *args], stdin=slave, stdout=slave, stderr=slave,
                            env=env, close_fds=True)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=300)
    os.close(master)
    return b"".join(chunks).decode(errors="replace")


def test_check_on_a_terminal_shows_progress_bars_and_a_table() -> None:
    shown = _on_a_terminal(["check", "--program", "offload_reload", "--examples", "20"])
    assert "━" in shown  # rich's bar
    assert "offload_reload/racy: ok: found after" in shown
    assert "all as expected: 2/2 variants" in shown
    assert "checking offload_reload/racy ..." not in shown  # the plain progress lines are for scripts


def test_exhaust_on_a_terminal_shows_its_progress_with_the_time_left() -> None:
    shown = _on_a_terminal(["exhaust", "offload_reload/correct:", "--units", "1"])
    assert "offload_reload/correct:: 10/47 schedules, about " in shown
    assert "\x1b[K" in shown  # the progress line is cleared before the result
    assert "clean over all 47 schedules" in shown


def test_check_off_a_terminal_prints_plain_lines_for_scripts(capsys: pytest.CaptureFixture[str]) -> None:
    # one after another: each variant's two lines together (test_jobs.py has the lines of a parallel check)
    assert main(["check", "--program", "offload_reload", "--examples", "20", "--jobs", "1"]) == 0
    captured = capsys.readouterr()
    assert "━" not in captured.err + captured.out
    assert "checking offload_reload/racy ...\n  ok: found after" in captured.err
    header = captured.out.splitlines()[0]
    assert header.split() == ["program/variant", "expect", "result", "examples", "race@default", "shrunk",
                              "schedule", "/", "what", "it", "shows"]


def test_a_step_bound_is_reported_as_such_and_can_be_raised(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "offload_reload/correct", "--max-steps", "10", "--no-fix"]) == 2  # no verdict
    out = capsys.readouterr().out
    assert "on sim: 1 step-limit" in out
    assert "the run made 10 host steps without ending (raise it:" in out
    assert main(["replay", "offload_reload/correct", "--max-steps", "100000"]) == 0


def test_a_stall_past_the_stall_horizon_is_no_deadlock(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "offload_reload/correct::host#0+1001"]) == 0
    assert main(["exhaust", "offload_reload/correct", "--units", "2000", "-q"]) == 0
    assert "clean over all" in capsys.readouterr().out


EDGE = "activation_offload/offload-inline-no-wait::host#29+5"


def test_a_gpu_replay_under_a_profile_judges_each_trial_with_its_own_host(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """``replay --gpu --profile NAME``: each trial's host is timed and the trial judged on the simulator with it.
    A fake GPU here: its runs are the simulator's with a fast host (trial 1: the reload reads the buffer the D2H is
    still writing) and a slow one (trial 2: clean), and they hand those hosts to the timing as CUDA's counter
    would. Judged with each trial's own host the simulator says what each trial gave; with the profile's one host
    step it would call both clean."""
    import types

    import attrs

    import reference.cuda
    from simdevice import Race, StaleRead
    from simdevice.runtime.config import overridden
    from simdevice.search.targets import ProgramTarget

    hosts = iter([[60_000] * 33, [200_000] * 33])
    sim_run = ProgramTarget.run

    def run(self: ProgramTarget, schedule: Any, backend: str = "sim") -> Any:
        if backend == "sim":
            return sim_run(self, schedule)
        costs = {"host": (200_000,) * 33}  # the warm-up's host: not timed
        if reference.cuda._TRACED:  # a trial: timed
            costs = {"host": tuple(next(hosts))}
            counter = types.SimpleNamespace(host_costs=lambda: costs, starts={})
            reference.cuda._TRACED[-1].append(types.SimpleNamespace(counter=counter))
        with overridden(host_trace=costs):
            out = sim_run(self, schedule)
        # what a GPU run shows: the values, no race report
        shown = tuple(r for r in out.run.reports if not isinstance(r, (Race, StaleRead)))
        return attrs.evolve(out, run=attrs.evolve(out.run, reports=shown), backend="cuda")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(ProgramTarget, "run", run)
    assert main(["replay", EDGE, "--gpu", "--trials", "2", "--profile", "h200-torch2.11", "--json"]) == 1
    got = json.loads(capsys.readouterr().out)
    assert got["failed"] == 1
    assert [v.startswith("wrong values") for v in got["judged"]] == [True, False]
    assert got["judged_same"] == 2
    hosts = iter([[60_000] * 33, [200_000] * 33])
    assert main(["replay", EDGE, "--gpu", "--trials", "2", "--profile", "h200-torch2.11"]) == 1
    out = capsys.readouterr().out
    assert ("each trial judged on the simulator with its own host's steps and the device of cost profile "
            "h200-torch2.11: 2/2 the same") in out
    assert "    trial 2: GPU " in out
    # without a profile: no judgement (the fast default host is no GPU's)
    hosts = iter([[60_000] * 33])
    main(["replay", EDGE, "--gpu", "--json"])
    assert "judged" not in json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("command", ["check", "replay", "exhaust"])
def test_each_command_s_help_says_its_exit_code_for_bad_input(command: str, run_cli: Any, tmp_path: Path) -> None:
    """The README gives ``replay`` and ``exhaust`` exit 2 for bad input and for a run with no verdict; their help
    said only 0 and 1."""
    p = run_cli([command, "--help"], tmp_path)
    assert p.returncode == 0
    assert "exit 2" in " ".join(p.stdout.split()).lower(), p.stdout


def test_a_gpu_run_stopped_at_what_it_does_not_replay_gives_no_verdict() -> None:
    """``replay --gpu`` of a program that starts threads or processes: the GPU run stops at the refusal
    (``reference.cuda_plain``), which said "wrong values" and exit 1, as if the program had failed; it is no
    verdict (exit 2, one line naming it), where the program's own error on a GPU stays one."""
    from reference.contract import Run
    from reference.schedule import Schedule
    from simdevice.cli import _no_verdict
    from simdevice.search.execute import Outcome

    s = Schedule.parse("t.py::fn")
    refused = Outcome(s, Run(result=None, op_counts={}), (
        "host raised NotImplementedError: threads a program starts are not replayed on a GPU yet: their steps are "
        "not counted there (the simulator runs them) (reference/cuda_plain.py:426)",), "cuda")
    key, why = _no_verdict("t.py::fn", refused)
    assert key == "unsupported"
    assert why.startswith("t.py::fn: the GPU run does not replay it: NotImplementedError: threads a program starts")
    own = Outcome(s, Run(result=None, op_counts={}), ("host raised AssertionError: wrong (t.py:3)",), "cuda")
    assert _no_verdict("t.py::fn", own) is None


def test_check_shows_a_few_reports_of_each_kind_and_replay_all(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A read repeated over a buffer's elements makes a report each: ``check`` and ``exhaust`` show the first eight
    of a kind and count the rest, naming the replay, which shows every one (a mutant that shows all, or drops the
    count, fails here)."""
    (tmp_path / "reads.py").write_text(textwrap.dedent("""\
        import torch

        def elementwise_reads():
            x = torch.arange(20, dtype=torch.float32, device="cuda")
            p = torch.empty(20, pin_memory=True)
            p.copy_(x, non_blocking=True)
            return [p[i].item() for i in range(20)]
        """))
    target = f"{tmp_path / 'reads.py'}::elementwise_reads"
    for command in (["check", target, "--no-fix"], ["exhaust", target]):
        assert main(command) == 1
        out = capsys.readouterr().out
        assert out.count("\n  stale read: ") == 8, out
        assert "\n  ... and 12 more stale-read reports (simdevice replay shows them all)\n" in out
        assert out.count("\n  race: ") == 1  # (one race: the first read; the others are stale reads alone)
    line = out.split('schedule "', 1)[1].split('"', 1)[0]
    assert main(["replay", line, "--no-fix"]) == 1
    out = capsys.readouterr().out
    assert out.count("\n  stale read: ") == 20
    assert "more stale-read" not in out
