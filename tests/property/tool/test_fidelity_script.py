"""``scripts/fidelity``: the plan samples deterministic schedules with the simulator's verdicts, the table counts
agreement, and bad input is one line and exit 2 (the GPU step itself runs on a GPU: docs/fidelity.md). A
memsaver_guard trial's process is tested here without a GPU: its command line and environment, and how its exit
and output become a trial (fake children, tiny ``python -c`` scripts)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from script_modules import load_script

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "fidelity"


fid = load_script("fidelity")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)


def test_the_plan_is_deterministic_and_carries_the_simulators_verdicts(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    for out in (a, b):
        p = _run("plan", "--per-variant", "4", "--seed", "3", "--variant", "offload_reload/racy", "-o", str(out))
        assert p.returncode == 0, p.stderr
    assert a.read_text() == b.read_text()
    rows = json.loads(a.read_text())["rows"]
    assert len(rows) == 4
    assert rows[0]["schedule"].startswith("offload_reload/racy")
    assert all(isinstance(r["sim_fails"], bool) for r in rows)
    assert len({r["schedule"] for r in rows}) == 4  # no schedule twice
    assert json.loads(a.read_text())["profile"] == "default"


def test_the_plan_judges_with_the_profile_it_is_given(tmp_path: Path) -> None:
    """The verdicts are the profile's: a host as slow as a GPU machine's closes a window the fast host opens."""
    slow = tmp_path / "slow.json"
    slow.write_text(json.dumps({"name": "slow-host", "fields": {"host_step_ns": 200_000}}))
    verdicts = {}
    for name, extra in (("fast", []), ("slow", ["--profile", str(slow)])):
        out = tmp_path / f"{name}.json"
        p = _run("plan", "--per-variant", "6", "--seed", "4", "--where", "ranks=1", "--variant",
                 "param_readiness/param-prefetch-no-ready", *extra, "-o", str(out))
        assert p.returncode == 0, p.stderr
        doc = json.loads(out.read_text())
        verdicts[name] = {r["schedule"]: r["sim_fails"] for r in doc["rows"]}
        assert doc["profile"] == ("slow-host" if extra else "default")
    assert verdicts["fast"].keys() == verdicts["slow"].keys()  # the same schedules, judged differently
    assert any(verdicts["fast"][s] and not verdicts["slow"][s] for s in verdicts["fast"])


def test_the_table_counts_agreement_and_lists_each_disagreement(tmp_path: Path) -> None:
    rows = [
        {"variant": "x/a", "schedule": "x/a::s#0+1", "sim_fails": True, "gpu_fails": True, "sim_verdict": "wrong",
         "gpu_failed_trials": 3, "trials": 3},
        {"variant": "x/a", "schedule": "x/a::s#0+5", "sim_fails": True, "gpu_fails": False, "sim_verdict": "wrong",
         "gpu_failed_trials": 0, "trials": 3},
        {"variant": "x/b", "schedule": "x/b", "sim_fails": False, "gpu_fails": None, "deadlock": True},
    ]
    doc = {"meta": {"device": "GPU", "torch": "t", "trials": 3, "date": "d", "seed": 0}, "results": rows}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    p = _run("table", str(path))
    assert p.returncode == 0, p.stderr
    assert "overall: 1/2 agree (50.0%); 1 deadlock schedule(s) not replayed" in p.stdout
    assert "disagree: x/a::s#0+5: sim wrong, gpu 0/3" in p.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["plan", "--variant", "nope/x", "-o", "/dev/null"], "unknown variant 'nope/x'"),
    (["plan", "--per-variant", "0", "-o", "/dev/null"], "must be >= 1"),
    (["table", "/no/such/file.json"], "cannot read the results"),
    (["plan", "--profile", "no-such-gpu", "-o", "/dev/null"], "no cost profile 'no-such-gpu'"),
    (["pace", "/no/such/timeline.txt"], "cannot read the timeline"),
    (["plan", "--pace-spread", "fast", "-o", "/dev/null"], "--pace-spread 'fast': want LO,HI"),
    (["plan", "--pace-spread", "1.2,1.5", "-o", "/dev/null"], "want 0 < LO < 1 < HI"),
    (["pace", str(ROOT / "README.md")], "is not a `scripts/gpu-campaign timeline` file"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    p = _run(*args)
    assert p.returncode == 2
    assert message in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


#: a knife edge of seed 11 (GPU 0/2, then 6/10): clean on the simulator with the shipped profile, failing with the
#: host a quarter faster; and a schedule whose stall decides it whatever the host's pace
EDGE = "activation_offload/offload-inline-no-wait::host#29+5"
ROBUST = "offload_reload/racy::d2h#0+5"


def test_rejudge_marks_the_schedules_whose_verdict_turns_within_the_pace_spread(tmp_path: Path) -> None:
    from simdevice.runtime.profiles import PACE_SPREAD

    assert ",".join(str(f) for f in PACE_SPREAD) == fid.SPREAD  # the script's default is replay's spread
    rows = [{"variant": s.split(":")[0], "schedule": s, "sim_fails": False, "sim_verdict": "?", "gpu_fails": True,
             "gpu_failed_trials": 1, "trials": 2} for s in (EDGE, ROBUST)]
    before = tmp_path / "r.json"
    before.write_text(json.dumps({"meta": {"device": "GPU", "torch": "t", "trials": 2, "date": "d",
                                           "profile": "h200-torch2.11"}, "results": rows}))
    after = tmp_path / "again.json"
    p = _run("rejudge", str(before), "-o", str(after))
    assert p.returncode == 0, p.stderr
    got = {r["schedule"]: r for r in json.loads(after.read_text())["results"]}
    assert (got[EDGE]["sim_fails"], got[EDGE]["pace_sensitive"]) == (False, True)
    assert (got[ROBUST]["sim_fails"], got[ROBUST]["pace_sensitive"]) == (True, False)
    table = _run("table", str(after)).stdout
    assert "robust (the verdict holds over the pace spread): 1/1 agree; pace-sensitive: 0/1 agree" in table
    assert f"disagree: {EDGE}: sim 2 race, gpu 1/2 (pace-sensitive)" in table
    # a narrower spread, inside the window: no longer marked; none: not judged at all
    p = _run("rejudge", str(before), "--pace-spread", "0.99,1.01", "-o", str(after))
    assert p.returncode == 0, p.stderr
    assert not any(r["pace_sensitive"] for r in json.loads(after.read_text())["results"])
    p = _run("rejudge", str(before), "--pace-spread", "none", "-o", str(after))
    assert p.returncode == 0, p.stderr
    assert not any("pace_sensitive" in r for r in json.loads(after.read_text())["results"])
    assert "robust" not in _run("table", str(after)).stdout


def _edge_trials(tmp_path: Path, traces: list[dict[str, list[int]]], failed: list[bool]) -> Path:
    row = {"variant": "activation_offload/offload-inline-no-wait", "schedule": EDGE, "sim_fails": False,
           "sim_verdict": "?", "deadlock": False, "gpu_fails": any(failed), "gpu_failed_trials": sum(failed),
           "trials": len(failed), "trials_failed": failed, "host_traces": traces}
    path = tmp_path / "traced.json"
    path.write_text(json.dumps({"meta": {"device": "GPU", "torch": "t", "trials": len(failed), "date": "d",
                                         "profile": "h200-torch2.11"}, "results": [row]}))
    return path


def test_rejudge_judges_each_trial_with_its_own_hosts_measured_steps(tmp_path: Path) -> None:
    """A knife edge the GPU failed once in two: its failing trial's host ran the steps between the forward's copy
    and the backward's reload fast, its clean one slowly. Judged with each trial's own steps the simulator says
    the same of each trial; with the profile alone it has one verdict for both."""
    steps = 33  # the schedule's counted host steps, less the last
    fast, slow = {"host": [60_000] * steps}, {"host": [200_000] * steps}
    before, after = _edge_trials(tmp_path, [fast, slow], [True, False]), tmp_path / "again.json"
    p = _run("rejudge", str(before), "--pace-spread", "none", "-o", str(after))
    assert p.returncode == 0, p.stderr
    assert "1 of them also trial by trial" in p.stderr
    (row,) = json.loads(after.read_text())["results"]
    assert row["sim_fails"] is False  # the profile's host: clean
    assert row["sim_trials"] == [True, False]
    assert "trace_mismatch" not in row
    table = _run("table", str(after)).stdout
    assert "overall: 0/1 agree" in table  # with the profile
    assert re.search(r"^overall +1 +100\.0% +0 +0 +2/2$", table, re.MULTILINE), table  # trial by trial
    # the other way round (a slow host failed, a fast one ran clean): the simulator disagrees on both trials
    p = _run("rejudge", str(_edge_trials(tmp_path, [slow, fast], [True, False])), "--pace-spread", "none",
             "-o", str(after))
    assert p.returncode == 0, p.stderr
    table = _run("table", str(after)).stdout
    assert re.search(r"^overall +1 +100\.0% +0 +0 +0/2$", table, re.MULTILINE), table
    # a trace that does not line up with the simulator's steps is said so, and a trial with none is not judged
    p = _run("rejudge", str(_edge_trials(tmp_path, [{"host": [200_000] * 5}, {}], [False, False])),
             "--pace-spread", "none", "-o", str(after))
    assert p.returncode == 0, p.stderr
    (row,) = json.loads(after.read_text())["results"]
    assert row["sim_trials"] == [False, None]
    assert row["trace_mismatch"] == {"host": [6, steps + 1]}


TIMELINE = """== x/v:k=1 on the GPU
schedule "x/v:k=1" on cuda: wrong values
  the GPU's timeline (ms since the run's start; ...):
       1.000  host             copy_
       1.100  d2h              start copy_ (D2H) #0
       1.150  host             copy_
       1.190  default          start copy_ (H2D) #3
       1.400  host             sum
       2.500  d2h              done copy_ (D2H) #0
== x/v:k=1 on the simulator (h200-torch2.11)
schedule "x/v:k=1" on sim: 1 race
  race: copy_ (H2D) on stream default #3 (a.py:2) reads pinned#1[0:8], which copy_ (D2H) on stream d2h #0 \
(a.py:1) wrote; no happens-before edge orders them
  note: stream h2d got no operation: nothing ran on it to race
       0.000  host             copy_
       0.000  d2h              start copy_ (D2H) #0
       0.200  host             copy_
       0.400  host             sum
       0.400  default          start copy_ (H2D) #3
       0.500  h2d              pass event recorded on stream d2h (item 1)
       1.243  d2h              done copy_ (D2H) #0
"""


def test_pace_sets_a_gpu_timeline_beside_the_simulators(tmp_path: Path) -> None:
    """Each race between two stream operations: who started first, by how much, on each machine; each host actor's
    gaps. A stream that only passes waits is no host actor."""
    path = tmp_path / "timeline_1.txt"
    path.write_text(TIMELINE)
    p = _run("pace", str(path))
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == "x/v:k=1 on the GPU"
    assert lines[1] == "  against the simulator (h200-torch2.11)"
    assert "  default #3 after d2h #0: +0.090 ms, +0.400 ms" in lines
    assert "  host: 200, 150, 250 (3 steps) | 200, 200, 200 (3 steps)" in lines
    assert not any(line.startswith("  h2d:") or line.startswith("  d2h:") for line in lines)


def test_rejudge_keeps_the_gpu_verdicts_and_recomputes_the_simulators(tmp_path: Path) -> None:
    row = {"variant": "offload_reload/racy", "schedule": "offload_reload/racy::d2h#0+1", "sim_fails": False,
           "sim_verdict": "clean", "deadlock": False, "gpu_fails": True, "gpu_failed_trials": 2, "trials": 2}
    doc = {"meta": {"device": "GPU", "torch": "t", "trials": 2, "date": "d", "seed": 0, "profile": "default"},
           "results": [row]}
    before, after = tmp_path / "r.json", tmp_path / "again.json"
    before.write_text(json.dumps(doc))
    p = _run("rejudge", str(before), "-o", str(after))
    assert p.returncode == 0, p.stderr
    assert "1 verdict(s) changed" in p.stderr
    (again,) = json.loads(after.read_text())["results"]
    assert again["sim_fails"] is True  # the D2H a unit late: the reload reads the buffer before it lands
    assert again["gpu_fails"] is True
    assert again["was"] == {"sim_fails": False, "sim_verdict": "clean"}


# -- memsaver_guard: a trial in a process of its own -----------------------------------------------------------

MEMSAVER = "memsaver_guard/memsaver-connect-unguarded:kib=16"


def test_a_memsaver_trial_process_is_started_with_the_preload_hook_and_the_process_wide_saver() -> None:
    base = {"PATH": "/bin", "LD_PRELOAD": "/other.so", "LD_LIBRARY_PATH": "/mine", "PYTHONPATH": "/site",
            "TMS_INIT_ENABLE": "0", "TMS_INIT_ENABLE_CPU_BACKUP": "0", "NCCL_NVLS_ENABLE": "1"}
    env = fid.child_env(base, "/pkg/torch_memory_saver_hook_mode_preload_cu13.abi3.so", ["/cuda/lib", "/torch/lib"])
    # only the hook: torch_memory_saver refuses an LD_PRELOAD naming it twice, and the process is the region
    assert env["LD_PRELOAD"] == "/pkg/torch_memory_saver_hook_mode_preload_cu13.abi3.so"
    assert env["TMS_INIT_ENABLE"] == "1"
    assert env["TMS_INIT_ENABLE_CPU_BACKUP"] == "1"  # the reference's region asks for a backup
    assert env["LD_LIBRARY_PATH"] == os.pathsep.join(["/cuda/lib", "/torch/lib", "/mine"])  # before torch loads
    assert env["PYTHONPATH"] == os.pathsep.join([str(ROOT), "/site"])  # this checkout, then the wheel's site
    assert env["NCCL_NVLS_ENABLE"] == "0"
    assert env["PATH"] == "/bin"
    assert base["TMS_INIT_ENABLE"] == "0"  # the parent's own environment is left alone
    warm = MEMSAVER + ",cycles=3"
    assert fid.child_command(MEMSAVER, warm) == [sys.executable, str(SCRIPT), "_child", MEMSAVER, "--warm-up", warm]
    assert fid.child_command(MEMSAVER, None) == [sys.executable, str(SCRIPT), "_child", MEMSAVER]
    assert fid._own_process(MEMSAVER)
    assert not fid._own_process("offload_reload/racy::d2h#0+1")


def test_the_child_command_is_one_the_child_accepts(missing_saver: dict[str, str]) -> None:
    """The real child, on this machine (no GPU, and no torch_memory_saver as the test makes it): it takes the command
    line and dies in its setup, a failing trial naming why."""
    env = dict(os.environ, **missing_saver)
    trial = fid.run_trial(fid.child_command(MEMSAVER, MEMSAVER), env, 120)
    assert trial["failed"] is True
    assert trial["error"].startswith("the child died (exit 1) in the setup: ImportError: torch_memory_saver is not")


def _fake(code: str) -> list[str]:
    return [sys.executable, "-c", "import os, sys, json, time\n" + code]


def _line(kind: str, value: Any) -> str:
    prefix = fid.PHASE if kind == "phase" else fid.RESULT
    return f"print({(prefix + (value if kind == 'phase' else json.dumps(value)))!r}, flush=True)\n"


CLEAN = {"clean": True, "verdict": "clean", "problems": [], "error": None}
WRONG = {"clean": False, "verdict": "wrong values", "problems": ["cycle 0: 3 of 4096 engine weights differ"],
         "error": None}
ILLEGAL_TEXT = "RuntimeError: CUDA error: an illegal memory access was encountered"


@pytest.mark.parametrize(("code", "failed", "error"), [
    (_line("phase", "trial") + _line("result", {"warm_up": CLEAN, "trial": CLEAN}), False, None),
    (_line("result", {"warm_up": None, "trial": CLEAN}), False, None),
    (_line("result", {"warm_up": WRONG, "trial": CLEAN}), False, None),  # the warm-up's values are not counted
    (_line("result", {"warm_up": CLEAN, "trial": WRONG}), True, "wrong values; cycle 0: 3 of 4096 engine weights"),
    (_line("result", {"warm_up": CLEAN, "trial": {"clean": False, "error": ILLEGAL_TEXT}}), True, ILLEGAL_TEXT),
    (_line("result", {"warm_up": {"clean": False, "error": "ValueError: x"}, "trial": None}), True,
     "in the warm-up: ValueError: x"),
    (_line("result", {"setup": "the memory saver is not active"}), None, "the memory saver is not active"),
    (_line("result", {"warm_up": CLEAN, "trial": None}), True, "the child printed no trial's result"),
    # a child the illegal access killed: the first line naming it, and the phase it died in
    (_line("phase", "setup") + _line("phase", "warm-up")
     + f"print({ILLEGAL_TEXT!r}, file=sys.stderr, flush=True)\nprint('c10::Error frame #0', file=sys.stderr)\n"
     "sys.stderr.flush()\nos.abort()\n", True, f"illegal memory access in the warm-up: {ILLEGAL_TEXT}"),
    (_line("phase", "setup") + "print('NCCL failed', file=sys.stderr)\nsys.exit(3)\n", True,
     "the child died (exit 3) in the setup: NCCL failed"),
    (_line("phase", "trial") + "os.kill(os.getpid(), 9)\n", True, "the child died (killed by signal 9) in the trial"),
    ("print('FIDELITY-RESULT {not json', flush=True)\nsys.exit(1)\n", True, "the child died (exit 1) in the setup"),
])
def test_a_childs_exit_and_output_are_its_trial(code: str, failed: bool | None, error: str | None) -> None:
    trial = fid.run_trial(_fake(code), dict(os.environ), 60)
    assert trial["failed"] is failed
    if error is None:
        assert trial["error"] is None
    else:
        assert trial["error"].startswith(error), trial["error"]


def test_a_child_past_its_limit_is_a_hang_and_killed_with_its_own_children(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild"
    code = (_line("phase", "trial") + "import subprocess\n"
            f"p = subprocess.Popen(['sleep', '60'])\nopen({str(pid_file)!r}, 'w').write(str(p.pid))\ntime.sleep(60)\n")
    t0 = time.monotonic()
    trial = fid.run_trial(_fake(code), dict(os.environ), 2)
    assert time.monotonic() - t0 < 30
    assert trial == {"failed": True, "error": "hung in the trial: killed past 2 s"}
    stat = Path(f"/proc/{pid_file.read_text()}/stat")
    for _ in range(50):  # killed with the child's process group: gone, or a zombie until something reaps it
        if not stat.exists() or stat.read_text().split()[2] in ("Z", "X"):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the child's own child outlived it: {stat.read_text()}")


@pytest.fixture(scope="module")
def missing_saver(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """PYTHONPATH with a torch_memory_saver that does not import first: the library missing, whether it is installed
    here or not."""
    package = tmp_path_factory.mktemp("missing") / "torch_memory_saver"
    package.mkdir()
    (package / "__init__.py").write_text('raise ImportError("torch_memory_saver is not installed (test)")\n')
    return {"PYTHONPATH": os.pathsep.join([str(package.parent), os.environ.get("PYTHONPATH", "")])}


def _plan(tmp_path: Path, *schedules: str) -> Path:
    rows = [{"variant": s.split(":")[0], "schedule": s, "sim_fails": False, "sim_verdict": "clean",
             "deadlock": False} for s in schedules]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"seed": 0, "per_variant": 1, "profile": "default", "rows": rows}))
    return path


@pytest.mark.parametrize(("schedules", "resumed", "message"), [
    ([MEMSAVER, "offload_reload/racy"], [],
     "the plan has 1 memsaver_guard schedule(s) to replay, whose GPU runs need torch_memory_saver, and it does not "
     "import (ImportError: torch_memory_saver is not installed (test)): pip install"),
    (["offload_reload/racy"], [], "the gpu step needs a CUDA GPU"),  # no memsaver schedule: the library not needed
    ([MEMSAVER, "offload_reload/racy"], [MEMSAVER], "the gpu step needs a CUDA GPU"),  # replayed already
])
def test_a_missing_memory_saver_is_one_line_and_exit_2_before_anything_runs(
        tmp_path: Path, missing_saver: dict[str, str], schedules: list[str], resumed: list[str], message: str) -> None:
    plan = _plan(tmp_path, *schedules)
    resume = tmp_path / "done.json"
    resume.write_text(json.dumps({"meta": {}, "results": [{"schedule": s, "gpu_fails": False} for s in resumed]}))
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", **missing_saver)
    p = subprocess.run([sys.executable, str(SCRIPT), "gpu", str(plan), "--resume", str(resume),
                        "-o", str(tmp_path / "r.json")], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 2
    assert p.stderr.startswith(f"fidelity: error: {message}"), p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r.json").exists()


def test_the_table_counts_schedules_not_run_apart_from_deadlocks(tmp_path: Path) -> None:
    rows = [
        {"variant": "x/a", "schedule": "x/a", "sim_fails": False, "gpu_fails": False, "sim_verdict": "clean",
         "gpu_failed_trials": 0, "trials": 2},
        {"variant": "x/a", "schedule": "x/a:k=1", "sim_fails": False, "gpu_fails": None, "deadlock": False,
         "note": "not run: the memory saver is not active"},
        {"variant": "x/b", "schedule": "x/b", "sim_fails": True, "gpu_fails": None, "deadlock": True,
         "note": "deadlock: not replayed"},
    ]
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"meta": {"device": "GPU", "torch": "t", "trials": 2, "date": "d", "seed": 0},
                                "results": rows}))
    p = _run("table", str(path))
    assert p.returncode == 0, p.stderr
    assert "overall: 1/1 agree (100.0%); 1 deadlock schedule(s) not replayed; 1 other(s) not run" in p.stdout
    assert "\n  not run: the memory saver is not active\n" in p.stdout


def test_a_childs_measured_steps_come_back_with_its_trial() -> None:
    costs = {"host": [5, 7]}
    for trial, failed in ((CLEAN, False), (WRONG, True)):
        got = fid.run_trial(_fake(_line("result", {"warm_up": CLEAN, "trial": {**trial, "host_costs": costs}})),
                            dict(os.environ), 60)
        assert (got["failed"], got["host_costs"]) == (failed, costs)


def test_gpu_keeps_each_in_process_trials_outcome_and_measured_steps(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The gpu step's loop for the programs that run in its own process, with a fake GPU: every trial's outcome
    and its host's steps (those of a trial that raised too, up to where it raised); a warm-up that raises is one
    failure, with its steps."""
    import signal
    import types

    import torch

    import reference.cuda
    from simdevice.search.targets import ProgramTarget

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda _: "fake GPU")
    monkeypatch.setattr(signal, "signal", lambda *_: None)
    runs: list[str] = []
    raising = {"activation_offload/FIXED:seed=2", "offload_reload/correct"}

    def run(self: ProgramTarget, schedule: Any, backend: str = "sim") -> Any:
        assert backend == "cuda"
        runs.append(str(schedule))
        if reference.cuda._TRACED:  # a device the trial made, timed
            n = len(runs)
            counter = types.SimpleNamespace(host_costs=lambda: {"host": (n, n)}, starts={"worker0": 10 * n})
            reference.cuda._TRACED[-1].append(types.SimpleNamespace(counter=counter))
        if str(schedule) in raising:
            raise RuntimeError("Chunk mismatch")
        return types.SimpleNamespace(clean=False)

    monkeypatch.setattr(ProgramTarget, "run", run)
    plan, out = _plan(tmp_path, "activation_offload/FIXED", "offload_reload/correct"), tmp_path / "r.json"
    args = fid.argparse.Namespace(plan=str(plan), resume=None, trials=3, budget_s=600, hang_factor=5,
                                  child_timeout_s=1.0, output=str(out))
    assert fid.gpu(args) == 0
    fixed, correct = json.loads(out.read_text())["results"]
    # warm-up (seed 0), trial 1 fails, trial 2 raises: the trials stop there
    assert runs[:3] == [f"activation_offload/FIXED:seed={k}" for k in range(3)]
    assert fixed["trials_failed"] == [True, True]
    assert fixed["host_traces"] == [{"host": [2, 2]}, {"host": [3, 3]}]
    assert (fixed["gpu_fails"], fixed["gpu_failed_trials"]) == (True, 2)
    assert fixed["errors"] == ["RuntimeError: Chunk mismatch"]
    assert fixed["trial_schedules"] == ["activation_offload/FIXED:seed=1", "activation_offload/FIXED:seed=2"]
    assert fixed["host_starts"] == [{"worker0": 20}, {"worker0": 30}]  # when each trial's process first stepped
    # a program without a seed whose warm-up raised: that run is the one failing trial, with its steps
    assert (correct["trials_failed"], correct["host_traces"], correct["gpu_failed_trials"]) == ([True],
                                                                                              [{"host": [4, 4]}], 1)
    assert correct["trial_schedules"] == ["offload_reload/correct"]


def test_gpu_replays_a_memsaver_schedule_a_process_per_trial_with_the_same_result_fields(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The gpu step's loop, with a fake GPU and fake trial processes: each trial a process of its own started with
    the hook (its warm-up first), the other programs' fields, and a child whose saver is inactive: not run."""
    import signal

    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda _: "fake GPU")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(signal, "signal", lambda *_: None)
    monkeypatch.setattr(fid, "memsaver_missing", lambda: None)
    import reference.cuda

    monkeypatch.setattr(reference.cuda, "memory_saver_preload", lambda: "/pkg/hook.so")
    monkeypatch.setattr(reference.cuda, "cuda_runtime_dirs", lambda: [])
    inactive = "memsaver_guard/memsaver-connect-unguarded:cycles=3,kib=16"
    calls: list[tuple[list[str], dict[str, str], float]] = []

    def run_trial(command: list[str], env: dict[str, str], limit: float) -> dict[str, Any]:
        calls.append((command, env, limit))
        if command[3] == inactive:
            return {"failed": None, "error": "the memory saver is not active"}
        if len(calls) == 2:
            return {"failed": True, "error": "illegal memory access in the trial: boom"}
        return {"failed": False, "error": None, "host_costs": {"host": [len(calls)]}}

    monkeypatch.setattr(fid, "run_trial", run_trial)
    plan, out = _plan(tmp_path, MEMSAVER, inactive), tmp_path / "r.json"
    args = fid.argparse.Namespace(plan=str(plan), resume=None, trials=3, budget_s=600, hang_factor=5,
                                  child_timeout_s=77.0, output=str(out))
    assert fid.gpu(args) == 0
    assert [c[0] for c in calls[:3]] == [fid.child_command(MEMSAVER, MEMSAVER)] * 3  # warm-up, then the trial
    assert all(env["TMS_INIT_ENABLE"] == "1" and env["LD_PRELOAD"] == "/pkg/hook.so" for _, env, _ in calls)
    assert all(limit == 77.0 for *_, limit in calls)
    first, second = json.loads(out.read_text())["results"]
    assert first["gpu_fails"] is True
    assert first["gpu_failed_trials"] == 1
    assert first["trials"] == 3
    assert first["errors"] == ["trial 2: illegal memory access in the trial: boom"]
    assert isinstance(first["seconds"], float)
    assert first["trials_failed"] == [False, True, False]
    assert first["host_traces"] == [{"host": [1]}, {}, {"host": [3]}]  # each trial's host, where it printed one
    assert second["gpu_fails"] is None
    assert second["note"] == "not run: the memory saver is not active"

    # resumed: the schedule not run is tried again, the one replayed is kept
    monkeypatch.setattr(fid, "run_trial", lambda *_: {"failed": False, "error": None})
    again = tmp_path / "again.json"
    assert fid.gpu(fid.argparse.Namespace(**{**vars(args), "resume": str(out), "output": str(again)})) == 0
    kept, retried = json.loads(again.read_text())["results"]
    assert kept == first
    assert retried["schedule"] == inactive
    assert retried["gpu_fails"] is False


def test_the_cold_pinned_experiment_judges_the_activation_rows_twice(tmp_path: Path) -> None:
    """scripts/fidelity-cold-pinned: the warm model and the cold one, each against the GPU's verdicts, on the
    activation_offload rows only (here one, which fails either way: the pool is reserved before the first D2H);
    a results file it cannot read is one line and exit 2."""
    import subprocess
    import sys

    rows = [{"variant": "activation_offload/offload-inline-no-wait", "gpu_fails": True,
             "schedule": "activation_offload/offload-inline-no-wait"},
            {"variant": "offload_reload/racy", "gpu_fails": True, "schedule": "offload_reload/racy::d2h#0+1"}]
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"meta": {"profile": "default"}, "results": rows}))
    script = str(ROOT / "scripts" / "fidelity-cold-pinned")
    out = subprocess.run([sys.executable, script, str(path), "--sync"], capture_output=True, text=True, cwd=ROOT,
                         check=True).stdout.splitlines()
    assert out == ["warm (the simulator): 1/1 agree with the GPU", "cold + sync: 1/1 agree with the GPU"]
    bad = subprocess.run([sys.executable, script, str(tmp_path / "none.json")], capture_output=True, text=True)
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1


@pytest.mark.parametrize(("args", "message"), [
    (["timeline"], "gpu-campaign: timeline needs at least one schedule"),
    (["bogus"], "gpu-campaign: unknown step 'bogus' (plan, run, zcc, sitting, table, timeline)"),
])
def test_the_campaign_scripts_bad_steps_are_one_line_and_exit_2(args: list[str], message: str) -> None:
    out = subprocess.run(["bash", str(ROOT / "scripts" / "gpu-campaign"), *args], capture_output=True, text=True,
                         timeout=60)
    assert (out.returncode, out.stderr.strip(), out.stdout) == (2, message, "")


@pytest.mark.parametrize(
    ("schedule", "values", "shows"),
    [
        # the prefetch, delayed, copies the bucket after the gather landed: a stale read (newer data than the
        # program's order gives it) whose values are right, as a GPU ran it clean in both trials (seed 9)
        ("param_readiness/param-prefetch-no-ready:bucket=4,evaluate=0,iters=1,ranks=1:rank0.prefetch#0+5", True, False),
        # race-only: no values, so the stale read is what predicts the GPU
        ("param_readiness/param-prefetch-no-ready:bucket=4,evaluate=0,iters=1,ranks=1:rank0.prefetch#0+5", False, True),
        ("offload_reload/racy::d2h#0+1", True, True),  # wrong values
        ("offload_reload/racy", True, False),  # clean
    ],
)
def test_a_plans_verdict_is_what_a_gpu_would_show(schedule: str, values: bool, shows: bool) -> None:
    from reference.schedule import Schedule
    from simdevice.programs import REGISTRY, load_all
    from simdevice.runtime.config import overridden
    from simdevice.search.targets import ProgramTarget

    load_all()
    s = Schedule.parse(schedule)
    with overridden(values=values):
        out = ProgramTarget(REGISTRY[s.program], s.variant).run(s)
    assert out.shows_on_gpu is shows, out.verdict()
    if not shows and s.delays:
        assert out.corrupted  # a search still counts it: the stale read is a real ordering bug


def test_the_campaign_plans_with_a_named_profile_on_any_machine(tmp_path: Path) -> None:
    """``plan SEED PER PER_ZCC PER_MEMSAVER PROFILE``: no calibration (no GPU needed), every variant planned with
    that profile; a profile it does not know is one line and exit 2, and nothing is written."""
    (tmp_path / "scripts").mkdir()
    for name in ("gpu-campaign", "fidelity"):
        (tmp_path / "scripts" / name).write_text((ROOT / "scripts" / name).read_text())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    script = str(tmp_path / "scripts" / "gpu-campaign")
    bad = subprocess.run(["bash", script, "plan", "3", "1", "1", "1", "nosuch"], capture_output=True, text=True,
                         env=env, timeout=120)
    assert (bad.returncode, bad.stderr.count("\n"), bad.stdout) == (2, 1, "")
    assert "no cost profile 'nosuch'" in bad.stderr
    assert not (tmp_path / ".fid").exists()
    p = subprocess.run(["bash", script, "plan", "3", "1", "1", "1", "h200-torch2.11"], capture_output=True,
                       text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr
    plan = json.loads((tmp_path / ".fid" / "plan.json").read_text())
    zplan = json.loads((tmp_path / ".fid" / "zplan.json").read_text())
    assert not (tmp_path / ".fid" / "profile.json").exists()  # nothing calibrated
    assert (plan["profile"], zplan["profile"]) == ("h200-torch2.11", "h200-torch2.11")
    assert len(plan["rows"]) == 11  # nine variants and memsaver_guard's two, one schedule each
    assert len(zplan["rows"]) == 4
    # FID: another folder (a sitting's own); PER_ZCC and PER_MEMSAVER 0: those families left out
    elsewhere = tmp_path / "sitting"
    p = subprocess.run(["bash", script, "plan", "3", "1", "0", "0", "h200-torch2.11"], capture_output=True,
                       text=True, env={**env, "FID": str(elsewhere)}, timeout=600)
    assert p.returncode == 0, p.stderr
    assert sorted(f.name for f in elsewhere.iterdir()) == ["plan.json"]
    assert len(json.loads((elsewhere / "plan.json").read_text())["rows"]) == 9


def test_the_campaigns_replay_steps_pass_their_trials_on(tmp_path: Path) -> None:
    """``run BUDGET TRIALS`` and ``zcc BUDGET TRIALS`` replay with that many trials (zcc one by default, under the
    watchdog at 3 x), then print the table: a fake ``scripts/fidelity`` records what it was asked."""
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "gpu-campaign").write_text((ROOT / "scripts" / "gpu-campaign").read_text())
    log = tmp_path / "calls.txt"
    (tmp_path / "scripts" / "fidelity").write_text(
        f"import sys\nopen({str(log)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n")
    script = str(tmp_path / "scripts" / "gpu-campaign")
    for args in (["zcc", "5"], ["zcc", "5", "2"], ["run", "7", "3"]):
        p = subprocess.run(["bash", script, *args], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "FID": str(tmp_path / "fid")})
        assert p.returncode == 0, p.stderr
    gpu, zcc2, run = [line for line in log.read_text().splitlines() if line.startswith("gpu ")]
    assert gpu.split()[1].endswith("zplan.json")
    assert "--trials 1 --hang-factor 3 --budget-s 5" in gpu
    assert "--trials 2 --hang-factor 3 --budget-s 5" in zcc2
    assert run.split()[1].endswith("/plan.json")
    assert "--trials 3 --budget-s 7" in run
    assert sum(line.startswith("table ") for line in log.read_text().splitlines()) == 3


def test_spawned_takes_a_spawned_processs_start_and_step_from_a_campaigns_fixed_trials(tmp_path: Path) -> None:
    """The FIXED trials' workers (the actors their starts name): the median start and step, on top of the given
    profile's costs; a buggy variant's trials and the trainer's steps are not the workers'."""
    from simdevice.runtime.profiles import load

    def row(variant: str, steps: list[int], start: int) -> dict[str, Any]:
        return {"variant": f"zcc/{variant}", "schedule": f"zcc/{variant}", "trials_failed": [False],
                "host_traces": [{"host": [90_000] * 4, "worker0": steps}], "host_starts": [{"worker0": start}]}

    results = tmp_path / "z.json"
    results.write_text(json.dumps({"meta": {}, "results": [
        row("FIXED", [150_000, 170_000], 4_000_000_000), row("FIXED", [190_000], 5_000_000_000),
        row("zcc-late-barrier", [999_000] * 9, 9_000_000_000),
        {"variant": "zcc/FIXED", "schedule": "zcc/FIXED:steps=2", "deadlock": False, "gpu_fails": False}]}))
    out = tmp_path / "p.json"
    p = _run("spawned", str(results), "--profile", "h200-torch2.11", "-o", str(out))
    assert p.returncode == 0, p.stderr
    profile = load(str(out))
    shipped = load("h200-torch2.11")
    assert profile.name == "h200-torch2.11-spawned"
    assert profile.fields == {**shipped.fields, "spawned_host_step_ns": 170_000, "spawn_start_ns": 4_500_000_000}
    assert profile.programs == shipped.programs
    assert profile.measured["spawned"]["from"] == str(results)
    p = _run("spawned", str(results), "--profile", "h200-torch2.11", "-o", str(tmp_path))  # a folder: one line
    assert (p.returncode, len(p.stderr.strip().splitlines())) == (2, 1), p.stderr
    assert "cannot write" in p.stderr
    # nothing to take them from, or no such profile: one line, exit 2, nothing written
    results.write_text(json.dumps({"meta": {}, "results": [row("zcc-late-barrier", [1], 1)]}))
    for args, why in ((["--profile", "h200-torch2.11"], "no FIXED trial"), (["--profile", "nope"], "no cost profile")):
        out.unlink(missing_ok=True)
        p = _run("spawned", str(results), *args, "-o", str(out))
        assert (p.returncode, len(p.stderr.strip().splitlines())) == (2, 1), p.stderr
        assert why in p.stderr
        assert not out.exists()
