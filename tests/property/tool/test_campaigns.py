"""HypoFuzz runs ``@simdevice.fuzz`` tests as they are: over one racy and one correct protocol it finds the racy
one (a shrunk failure in the shared example database) and not the correct one, which it ran ``RUNS`` schedules of.

Two tests. The default one drives HypoFuzz's own engine in this process: its collection (what it would fuzz, and
what it skips) and its fuzz targets, each run as a worker runs it, saving to the campaign's database. The ``slow``
one runs the whole ``hypothesis fuzz`` command (its hub process and a worker) for up to a minute; HypoFuzz's hub
ends a campaign whose worker has not reported within its first 60 s, which a loaded machine can miss, so that
one stays out of the default run (``python -m pytest -m slow tests/property/tool/test_campaigns.py``).

The campaign's database is a directory every worker writes to (``CAMPAIGN_DB``): several machines pool their
findings by sharing it (docs/campaigns.md). Skipped with the reason when HypoFuzz is not installed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("hypofuzz", reason="HypoFuzz is not installed (pip install hypofuzz)")

from hypofuzz.database import FailureState, HypofuzzDatabase
from hypothesis.database import DirectoryBasedExampleDatabase

ROOT = Path(__file__).resolve().parents[3]

#: the longest the campaign runs; the racy test is found in the first seconds
CAMPAIGN_S = 60
#: schedules the correct protocol must have run (and passed) before the campaign may stop
RUNS = 200

CONFTEST = textwrap.dedent('''
    import os

    from hypothesis import settings
    from hypothesis.database import DirectoryBasedExampleDatabase

    from simdevice.campaigns import hypofuzz_compat

    hypofuzz_compat()
    settings.register_profile("campaign", database=DirectoryBasedExampleDatabase(os.environ["CAMPAIGN_DB"]),
                              max_examples=int(os.environ.get("CAMPAIGN_EXAMPLES", "100")))
    settings.load_profile("campaign")
''')

CAMPAIGN = textwrap.dedent('''
    import simdevice
    from offload_plain import reload_correct, reload_racy

    test_reload_racy = simdevice.fuzz(reload_racy)
    test_reload_correct = simdevice.fuzz(reload_correct)
''')


def runs(hz: HypofuzzDatabase, key: bytes) -> int:
    """How many schedules HypoFuzz has run for a test (its latest progress report)."""
    return max((sum(r.status_counts.values()) for r in hz.reports.fetch(key)), default=0)


def _key(directory: Path, name: str) -> bytes:
    """The database key HypoFuzz files a test under: the digest of its inner test, told its node id."""
    from hypothesis.internal.reflection import function_digest

    sys.path.insert(0, str(directory))
    try:
        import importlib

        module = importlib.import_module("test_campaign")
        inner = getattr(module, name).hypothesis.inner_test
        inner._hypothesis_internal_add_digest = f"test_campaign.py::{name}".encode()
        return function_digest(inner)
    finally:
        sys.path.remove(str(directory))
        sys.modules.pop("test_campaign", None)
        sys.modules.pop("offload_plain", None)


def _campaign_dir(tmp_path: Path) -> Path:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_campaign.py").write_text(CAMPAIGN)
    (tmp_path / "offload_plain.py").write_text((ROOT / "examples" / "offload_plain.py").read_text())
    return tmp_path


def test_hypofuzz_s_engine_finds_the_racy_protocol_and_not_the_correct_one(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from hypofuzz.collection import collect_tests
    from hypothesis import settings

    here, db = _campaign_dir(tmp_path), tmp_path / "campaign-db"
    monkeypatch.setenv("CAMPAIGN_DB", str(db))
    monkeypatch.chdir(here)
    monkeypatch.syspath_prepend(str(here))
    profile = settings.get_current_profile_name()
    settings.load_profile("default")  # as the command starts: the suite's profile (ci: derandomized) is not fuzzed
    try:
        # what `hypothesis fuzz -- test_campaign.py` collects (the conftest loads the campaign's profile)
        collection = collect_tests(["-p", "no:cacheprovider", "test_campaign.py"])
        targets = {t.nodeid.rpartition("::")[2]: t for t in collection.fuzz_targets}
        assert sorted(targets) == ["test_reload_correct", "test_reload_racy"], collection.not_collected
        ran = {}
        for name, target in targets.items():
            target._enter_fixtures()
            try:
                ran[name] = 0
                while ran[name] < RUNS and not target.has_found_failure:
                    target.run_one()
                    ran[name] += 1
            finally:
                target._exit_fixtures()
        hz = HypofuzzDatabase(DirectoryBasedExampleDatabase(str(db)))
        racy, correct = targets["test_reload_racy"], targets["test_reload_correct"]
        assert racy.has_found_failure, f"the racy protocol was not found in {RUNS} schedules"
        assert list(hz.failures(state=FailureState.SHRUNK).fetch(racy.database_key))
        assert not correct.has_found_failure, "the correct protocol failed"
        assert ran["test_reload_correct"] == RUNS
        assert not list(hz.failures(state=FailureState.SHRUNK).fetch(correct.database_key))
    finally:
        settings.load_profile(profile)
        for module in ("test_campaign", "offload_plain", "conftest"):
            if getattr(sys.modules.get(module), "__file__", "").startswith(str(here)):
                del sys.modules[module]
    _replays_what_it_found(here, db, dict(os.environ))


def _replays_what_it_found(here: Path, db: Path, env: dict[str, str]) -> None:
    """pytest with the campaign's database replays what it found first: one example is enough to fail on the
    shrunk schedule (with an empty database, that one example is the default schedule)."""
    env = dict(env, PYTHONPATH=os.pathsep.join([str(here), str(ROOT)]))
    env.pop("HYPOTHESIS_PROFILE", None)
    for folder, replayed in ((db, True), (here / "empty-db", False)):
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_campaign.py", "-k", "racy"],
            cwd=here, env=dict(env, CAMPAIGN_DB=str(folder), CAMPAIGN_EXAMPLES="1"), capture_output=True,
            text=True, timeout=300)
        assert run.returncode == 1, run.stdout + run.stderr
        assert ("offload_plain.py::reload_racy::d2h_stream#" in run.stdout) is replayed, run.stdout


@pytest.mark.slow
def test_a_hypofuzz_campaign_finds_the_racy_protocol_and_not_the_correct_one(tmp_path: Path) -> None:
    _campaign_dir(tmp_path)
    db = tmp_path / "campaign-db"
    env = dict(os.environ, CAMPAIGN_DB=str(db), XDG_CACHE_HOME=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    env.pop("HYPOTHESIS_PROFILE", None)
    proc = subprocess.Popen(
        [sys.executable, "-c", "from hypothesis.extra.cli import main; main()", "fuzz", "--no-dashboard", "-n", "1",
         "--", "test_campaign.py"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    hz = HypofuzzDatabase(DirectoryBasedExampleDatabase(str(db)))
    racy, correct = _key(tmp_path, "test_reload_racy"), _key(tmp_path, "test_reload_correct")
    try:
        # stop once the racy test is found and the correct one has run RUNS schedules (or at CAMPAIGN_S)
        for _ in range(CAMPAIGN_S):
            if proc.poll() is not None:
                break
            if list(hz.failures(state=FailureState.SHRUNK).fetch(racy)) and runs(hz, correct) >= RUNS:
                break
            time.sleep(1)
    finally:
        with contextlib.suppress(ProcessLookupError):  # it may have ended on its own (its output says why)
            os.killpg(proc.pid, signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
    assert "using 1 process to fuzz 2 tests" in out, out

    assert list(hz.failures(state=FailureState.SHRUNK).fetch(racy)), f"the racy protocol was not found:\n{out}"
    assert not list(hz.failures(state=FailureState.SHRUNK).fetch(correct)), "the correct protocol failed"
    assert not list(hz.failures(state=FailureState.UNSHRUNK).fetch(correct)), "the correct protocol failed"
    assert runs(hz, correct) >= RUNS, f"the correct protocol ran {runs(hz, correct)} schedules, not {RUNS}"

    _replays_what_it_found(tmp_path, db, env)
