"""``scripts/fidelity``: the plan samples deterministic schedules with the simulator's verdicts, the table counts
agreement, and bad input is one line and exit 2 (the GPU step itself runs on a GPU: docs/fidelity.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "fidelity"


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
        p = _run("plan", "--per-variant", "6", "--seed", "1", "--where", "ranks=1", "--variant",
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
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    p = _run(*args)
    assert p.returncode == 2
    assert message in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


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
