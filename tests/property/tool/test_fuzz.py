"""Your own protocol through every entry point: ``simdevice check FILE::FN``, ``simdevice.explore`` and pytest with
``@simdevice.fuzz`` agree on the verdict and the shrunk schedule; pins run first; nothing is written where the user
did not ask; the plugin's options, marker and fixture; pytest-xdist.

The user's file (``USER``) holds a racy and a correct reload protocol in both styles: plain torch.cuda code and
contract code ``fn(dev)``. Every pytest run here is a subprocess in an empty directory (``pytester``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import simdevice

USER = textwrap.dedent('''
    """A user's offload protocols (plain torch.cuda, and the same against the device contract)."""
    import torch


    def _plain(wait: bool, n: int) -> None:
        act = torch.arange(n, dtype=torch.float32, device="cuda")
        pinned = torch.empty(n, pin_memory=True)
        d2h = torch.cuda.Stream()
        scratch = torch.zeros(16 * n, device="cuda")
        d2h.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(d2h):
            pinned.copy_(act, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
        for _ in range(4):
            scratch.mul_(0.5)
        if wait:
            torch.cuda.current_stream().wait_event(done)
        back = torch.empty_like(act).copy_(pinned, non_blocking=True)
        assert torch.equal(back.cpu(), torch.arange(n, dtype=torch.float32)), "stale reload"


    def _contract(dev, wait: bool, n: int) -> None:
        act = torch.arange(n, dtype=torch.float32, device=dev.device)
        pinned = torch.empty(n, pin_memory=True)
        d2h = dev.Stream(name="d2h")
        scratch = torch.zeros(16 * n, device=dev.device)
        d2h.wait_stream(dev.current_stream())
        with dev.stream(d2h):
            pinned.copy_(act, non_blocking=True)
            done = dev.Event()
            done.record()
        for _ in range(4):
            scratch.mul_(0.5)
        if wait:
            dev.current_stream().wait_event(done)
        back = torch.empty_like(act).copy_(pinned, non_blocking=True)
        assert torch.equal(back.cpu(), torch.arange(n, dtype=torch.float32)), "stale reload"


    def plain_racy(n: int = 1024) -> None:
        _plain(False, n)


    def plain_correct(n: int = 1024) -> None:
        _plain(True, n)


    def contract_racy(dev, n: int = 1024) -> None:
        _contract(dev, False, n)


    def contract_correct(dev, n: int = 1024) -> None:
        _contract(dev, True, n)
''')

TESTS = textwrap.dedent('''
    import simdevice
    import protocols

    test_plain_racy = simdevice.fuzz(protocols.plain_racy)
    test_plain_correct = simdevice.fuzz(protocols.plain_correct)
    test_contract_racy = simdevice.fuzz(protocols.contract_racy)
    test_contract_correct = simdevice.fuzz(protocols.contract_correct)


    @simdevice.example("d2h#0+7")
    @simdevice.fuzz
    def test_pinned(n: int = 1024) -> None:
        protocols.plain_racy(n)


    def test_with_the_fixture(simdevice):
        simdevice.explore(protocols.plain_correct, max_examples=10)
''')

FUNCTIONS = ("plain_racy", "plain_correct", "contract_racy", "contract_correct")


def _user_dir(pytester: pytest.Pytester) -> Path:
    pytester.makepyfile(protocols=USER, test_user=TESTS)
    return Path(pytester.path)


def _cli(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "simdevice", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, check=False)


def _clean_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HYPOTHESIS_STORAGE_DIRECTORY", "HYPOTHESIS_PROFILE")}
    env["XDG_CACHE_HOME"] = str(tmp_path / "user-cache")  # where the tool may keep Hypothesis's own files
    return env


def _pytest(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "--hypothesis-seed=0", *args)


def test_check_explore_and_pytest_agree_on_verdict_and_schedule(pytester: pytest.Pytester, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch, run_cli: Any) -> None:
    here = _user_dir(pytester)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user-cache"))
    monkeypatch.chdir(here)
    monkeypatch.syspath_prepend(str(here))
    cli, api = {}, {}
    for fn in FUNCTIONS:  # the command line in this process (test_nothing_is_written... starts real ones)
        p = run_cli(["check", f"protocols.py::{fn}", "--json", "--examples", "60", "--no-fix"], here)
        doc = json.loads(p.stdout)
        cli[fn] = (p.returncode, doc["schedule"])
        found = simdevice.explore(f"protocols.py::{fn}", max_examples=60)
        api[fn] = (1 if found.failure is not None else 0, found.schedule)
    assert cli == api
    assert cli["plain_racy"] == (1, "protocols.py::plain_racy::d2h#0+1")
    assert cli["contract_racy"] == (1, "protocols.py::contract_racy::d2h#0+1")
    assert cli["plain_correct"] == cli["contract_correct"] == (0, None)

    result = _pytest(pytester, "-k", "plain or contract")
    result.assert_outcomes(passed=2, failed=2)
    out = result.stdout.str()
    for fn in ("plain_racy", "contract_racy"):
        assert f"simdevice: test_user.py::test_{fn} fails under a schedule" in out
        assert f'schedule "{cli[fn][1]}" on sim: ' in out
        assert f'replay: simdevice replay "{cli[fn][1]}" [--gpu]' in out
    p = run_cli(["replay", cli["plain_racy"][1]], here)  # the printed line replays
    assert p.returncode == 1
    assert "stale reload" in p.stdout


def test_a_pinned_schedule_runs_first_and_is_reported_as_pinned(pytester: pytest.Pytester) -> None:
    _user_dir(pytester)
    result = _pytest(pytester, "-k", "pinned")
    result.assert_outcomes(failed=1)
    assert 'schedule "test_user.py::test_pinned::d2h#0+7" on sim' in result.stdout.str()  # explicit: not shrunk


def test_the_fixture_explores_from_an_ordinary_test(pytester: pytest.Pytester) -> None:
    _user_dir(pytester)
    _pytest(pytester, "-k", "fixture").assert_outcomes(passed=1)


def test_the_marker_selects_the_fuzz_tests(pytester: pytest.Pytester) -> None:
    _user_dir(pytester)
    result = _pytest(pytester, "-m", "simdevice", "--collect-only", "-q")
    listed = [line for line in result.stdout.lines if "::" in line]
    assert sorted(x.split("::")[1] for x in listed) == sorted(
        [f"test_{f}" for f in FUNCTIONS] + ["test_pinned"]
    )


def test_nothing_is_written_where_the_user_did_not_ask(pytester: pytest.Pytester, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user-cache"))  # pytester makes HOME the test's folder
    here = _user_dir(pytester)
    before = sorted(p.name for p in here.iterdir())
    env = _clean_env(tmp_path)
    commands = (
        ["check", "protocols.py::plain_racy", "--examples", "20", "--no-fix"],
        ["replay", "protocols.py::plain_racy"],  # with the suggested fix checked: its search writes nothing either
        ["exhaust", "protocols.py::plain_correct", "--units", "1"],
        ["check", "--program", "offload_reload", "--examples", "10", "-q"],
    )
    for args in commands:
        assert _cli(args, here, env).returncode in (0, 1)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-k", "plain")
    result.assert_outcomes(passed=1, failed=1)
    # Python's own __pycache__, and pytester's files and folders for the runs it makes, aside
    harness = {"__pycache__", "stdout", "stderr"}
    after = sorted(p.name for p in here.iterdir() if p.name not in harness and not p.name.startswith("runpytest"))
    assert after == before


def test_the_database_and_trace_options_write_where_asked(pytester: pytest.Pytester, tmp_path: Path,
                                                         run_cli: Any) -> None:
    here = _user_dir(pytester)
    db, traces = tmp_path / "db", tmp_path / "traces"
    # no --hypothesis-seed here: with a seed given, Hypothesis keeps no database
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-k", "plain_racy", f"--simdevice-db={db}",
                                           f"--simdevice-trace={traces}")
    result.assert_outcomes(failed=1)
    trace, timeline = sorted(traces.iterdir(), key=lambda p: p.suffix != ".txt")
    assert trace.read_text().startswith("# protocols.py::plain_racy::d2h#0+1\n")
    assert timeline.name.endswith(".perfetto.json")
    assert json.loads(timeline.read_text())["metadata"]["schedule"] == "protocols.py::plain_racy::d2h#0+1"
    assert f"trace: {trace}" in result.stdout.str()
    assert any(db.rglob("*"))  # the failure is saved, to be replayed first next time
    cli_db = tmp_path / "cli-db"
    assert run_cli(["check", "protocols.py::plain_racy", "--db", str(cli_db), "--no-fix"], here).returncode == 1
    assert any(cli_db.rglob("*"))
    p = run_cli(["check", "protocols.py::plain_racy", "--db", str(trace)], here)
    assert p.returncode == 2
    assert "is a file, not a directory" in p.stderr
    for option in ("--simdevice-db", "--simdevice-trace"):  # a file where a folder goes: pytest's usage error
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-k", "plain_racy", f"{option}={trace}")
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines([f"*{option} '{trace}': not a directory*"])
        # a folder below a file cannot be made: a usage error too (it was an INTERNALERROR at the first failure,
        # and the session's other tests never ran)
        below = trace / "sub"
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-k", "plain_racy", f"{option}={below}")
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines([f"*{option} '{below}': cannot be made*"])


def test_a_trace_folder_that_cannot_be_written_leaves_the_failure_reported(pytester: pytest.Pytester) -> None:
    """A folder that looked writable (as root, access() says yes even to /proc) but is not: the failure is reported
    with a line saying the trace was not written (it was an INTERNALERROR that lost the failure and the rest of the
    session). Without root, /proc is refused up front, as a usage error."""
    _user_dir(pytester)
    result = _pytest(pytester, "-k", "plain_racy", "--simdevice-trace=/proc/simdevice-trace")
    out = result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in out
    if result.ret == pytest.ExitCode.USAGE_ERROR:
        assert "--simdevice-trace '/proc/simdevice-trace': cannot be made" in out
        return
    result.assert_outcomes(failed=1)
    assert 'replay: simdevice replay "protocols.py::plain_racy::d2h#0+1"' in out
    assert "trace: not written ('/proc/simdevice-trace': " in out


@pytest.mark.skipif(importlib.util.find_spec("xdist") is None, reason="pytest-xdist is not installed")
def test_pytest_xdist_spreads_the_fuzz_tests_over_workers(pytester: pytest.Pytester) -> None:
    _user_dir(pytester)
    result = _pytest(pytester, "-n", "2", "-k", "plain or contract")
    result.assert_outcomes(passed=2, failed=2)
    assert 'schedule "protocols.py::plain_racy::d2h#0+1" on sim' in result.stdout.str()


def test_list_shows_the_functions_of_a_file_with_their_actors(pytester: pytest.Pytester, run_cli: Any) -> None:
    here = _user_dir(pytester)
    p = run_cli(["list", "protocols.py"], here)
    assert p.returncode == 0
    assert p.stdout.splitlines()[:2] == [
        "protocols.py::plain_racy  [plain torch.cuda](n=1024)",
        "  operations: d2h 1, default 8, host 11",
    ]
    assert "protocols.py::contract_correct  [contract (dev)](n=1024)" in p.stdout
    assert "_plain" not in p.stdout  # private helpers are no targets
    p = run_cli(["list", "test_user.py"], here)
    assert "test_user.py::test_pinned  [plain torch.cuda](n=1024)" in p.stdout  # a @fuzz test stands for its function
    # a fuzz test made here of a function imported (the README's ``test_x = simdevice.fuzz(x)``): listed, as pytest
    # collects it and check runs it (it was left out, "defined elsewhere"); the function imported itself is not
    assert "test_user.py::test_plain_racy  [plain torch.cuda](n=1024)" in p.stdout
    assert "test_user.py::plain_racy" not in p.stdout


def test_a_local_functions_failure_says_how_it_replays_and_that_replays_it() -> None:
    import torch

    def racy(n: int = 64) -> None:  # defined inside the test: no command can import it
        side = torch.cuda.Stream()
        x = torch.ones(n, device="cuda")
        with torch.cuda.stream(side):
            y = x * 2
        assert y.sum().item() == 2 * n

    found = simdevice.explore(racy, max_examples=20)
    assert found.failure is not None
    line = str(found.schedule)
    assert line.split("::")[1].endswith(".racy")
    replay = found.failure.text().splitlines()[-1]
    assert replay.startswith(f'  replay: simdevice.explore(racy, examples=["{line}"])'), replay
    assert "simdevice replay" not in replay
    again = simdevice.explore(racy, examples=[line])
    assert again.examples == 1  # the pin, and nothing more: it failed
    assert again.failure is not None
    assert again.failure.verdict() == found.failure.verdict()
    assert again.failure.races == found.failure.races  # (the host error's text holds the objects' addresses)
    assert simdevice.FuzzFailure(found.failure).block().splitlines()[-1] == replay
    assert found.replay is not None
    assert replay.startswith(f"  replay: {found.replay}")


def test_a_fuzzed_failure_names_its_shortest_line() -> None:
    """A drawn value equal to its parameter's default is left out of the failing line, as check leaves it out."""
    import torch
    from hypothesis import strategies as st

    def ring(steps: int = 2, width: int = 3) -> None:
        side = torch.cuda.Stream()
        x = torch.ones(width, device="cuda")
        for _ in range(steps):
            with torch.cuda.stream(side):
                y = x * 2
        assert y.sum().item() == 2 * width

    test = simdevice.fuzz(steps=st.integers(1, 2), width=st.just(3), max_examples=10)(ring)
    with pytest.raises(simdevice.FuzzFailure) as failed:
        test()
    assert "width=3" not in failed.value.schedule


def _small() -> None:
    import torch

    torch.ones(4, device="cuda").mul_(2)


def test_a_fuzz_test_runs_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A second call of the same test (a rerun of a failure, pytest-repeat, a notebook) raised Hypothesis's "has
    already been decorated with a settings object": each call put its settings and pins on the one Hypothesis test.
    It runs, with its pins once each."""
    from simdevice.search.targets import FunctionTarget

    real, ran = FunctionTarget.run, []

    def run(self: FunctionTarget, schedule: Any, backend: str = "sim") -> Any:
        ran.append(str(schedule))
        return real(self, schedule, backend)

    monkeypatch.setattr(FunctionTarget, "run", run)
    test = simdevice.example("default#0+7")(simdevice.fuzz(max_examples=2)(_small))
    for _ in range(3):
        ran.clear()
        test()
        assert sum(s.endswith("default#0+7") for s in ran) == 1, ran


@pytest.mark.parametrize("where", ["above", "below"])
def test_a_settings_decorator_applies_to_a_fuzz_test(where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``@settings(max_examples=3)`` on a ``@simdevice.fuzz`` test, as on any Hypothesis test: it was ignored (the
    loaded profile's 100 schedules ran), above ``@fuzz`` or below it."""
    from hypothesis import settings

    from simdevice.search.targets import FunctionTarget

    real, ran = FunctionTarget.run, []

    def run(self: FunctionTarget, schedule: Any, backend: str = "sim") -> Any:
        ran.append(str(schedule))
        return real(self, schedule, backend)

    monkeypatch.setattr(FunctionTarget, "run", run)

    def small() -> None:
        _small()

    test = settings(max_examples=3)(simdevice.fuzz(small)) if where == "above" else simdevice.fuzz(
        settings(max_examples=3)(small))
    test()
    assert len(ran) < 20, ran  # (the probes and the default schedule too; the profile would run 100)


def test_a_local_function_on_ranks_replays_on_as_many() -> None:
    import torch
    import torch.distributed as dist

    def gather_racy(n: int = 16) -> None:  # defined inside the test, run on two ranks
        full = torch.zeros(n * dist.get_world_size(), device="cuda")
        work = dist.all_gather_into_tensor(full, torch.full((n,), dist.get_rank() + 1.0, device="cuda"),
                                           async_op=True)
        seen = full.cpu()  # before work.wait()
        work.wait()
        assert torch.equal(seen, torch.arange(1.0, 3.0).repeat_interleave(n))

    found = simdevice.explore(gather_racy, world_size=2, max_examples=30)
    assert found.failure is not None
    replay = found.failure.text().splitlines()[-1]
    assert replay.startswith(f'  replay: simdevice.explore(gather_racy, world_size=2, examples=["{found.schedule}"])')
    again = simdevice.explore(gather_racy, world_size=2, examples=[str(found.schedule)])
    assert again.failure is not None
    assert again.failure.verdict() == found.failure.verdict()


def test_a_budget_ends_a_search_that_found_nothing() -> None:
    """``budget_s`` (``--budget``) ends the search, not only its runs: past it Hypothesis draws no more schedules.
    (Each schedule then counted as passing, and a search of many examples went on drawing them for minutes.)"""
    import torch

    def clean(n: int = 64) -> None:
        x = torch.ones(n, device="cuda")
        assert x.sum().item() == n

    from hypothesis import strategies as st

    drawn: list[int] = []  # a schedule drawn by Hypothesis, run or not
    config = st.just(64).map(lambda n: drawn.append(n) or {"n": n})
    result = simdevice.explore(clean, max_examples=20_000, budget_s=0.5, config=config)
    assert result.failure is None
    assert 0 < result.examples <= len(drawn) < 20_000


def test_an_example_naming_an_actor_the_function_lacks_is_refused() -> None:
    """As ``simdevice replay`` refuses it (a delay that can never apply makes a pin that says nothing)."""
    import torch

    from simdevice.search.targets import TargetError

    def small(n: int = 8) -> None:
        torch.ones(n, device="cuda").add_(1)

    with pytest.raises(TargetError, match=r"delay nosuch#0\+1 names actor 'nosuch', which .* does not have"):
        simdevice.explore(small, examples=["nosuch#0+1"], max_examples=1)
    assert simdevice.explore(small, examples=["default#0+1"], max_examples=1).failure is None


@pytest.mark.parametrize(("option", "message"), [
    ({"max_examples": 0}, "max_examples must be >= 1, got 0"),
    ({"max_delays": -1}, "max_delays must be >= 0, got -1"),
    ({"budget_s": 0}, "budget_s must be > 0 seconds, got 0"),
    ({"budget_s": float("nan")}, "budget_s must be > 0 seconds, got nan"),
])
def test_explore_refuses_a_bad_bound_in_one_line(option: dict[str, Any], message: str) -> None:
    """As ``@simdevice.fuzz`` and ``check`` refuse them: the first two were Hypothesis's own errors from inside
    the search ("Invalid size max_size=-1 < 0"), and a budget of 0 or NaN ended the search at once, clean."""
    import torch

    def small(n: int = 8) -> None:
        torch.ones(n, device="cuda").add_(1)

    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        simdevice.explore(small, **option)


def test_explore_refuses_one_schedule_line_given_for_its_list_of_examples() -> None:
    """``examples="d2h#0+1"``: a str was taken a character at a time, and refused as "bad schedule target 'd'"."""
    import torch

    def small(n: int = 8) -> None:
        torch.ones(n, device="cuda").add_(1)

    with pytest.raises(TypeError, match=re.escape("examples is a list of schedule lines, not one: "
                                                  "examples=['default#0+1']")):
        simdevice.explore(small, examples="default#0+1", max_examples=1)


STRATEGIES = textwrap.dedent('''
    import torch
    from hypothesis import strategies as st

    import simdevice


    @simdevice.fuzz(wait=st.booleans(), max_examples=30)
    def test_reload(wait: bool = True, n: int = 256) -> None:
        act = torch.arange(n, dtype=torch.float32, device="cuda")
        pinned = torch.empty(n, pin_memory=True)
        d2h = torch.cuda.Stream()
        d2h.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(d2h):
            pinned.copy_(act, non_blocking=True)
        if wait:
            d2h.synchronize()
        assert torch.equal(pinned, torch.arange(n, dtype=torch.float32)), "read before the copy landed"
''')


def test_check_and_explore_of_a_fuzz_test_draw_from_its_strategies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_cli: Any
) -> None:
    """``check FILE.py::test_fn`` and ``simdevice.explore(test_fn)`` of a ``@simdevice.fuzz`` test draw its
    parameters from the test's strategies, as pytest does: the failure only ``wait=False`` shows is found (they ran
    the defaults alone, clean)."""
    (tmp_path / "test_strategies.py").write_text(STRATEGIES)
    p = run_cli(["check", "test_strategies.py::test_reload", "--json", "--no-fix", "--examples", "30"], tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    assert json.loads(p.stdout)["schedule"].startswith("test_strategies.py::test_reload:wait=0")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    spec = importlib.util.spec_from_file_location("test_strategies", tmp_path / "test_strategies.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    found = simdevice.explore(module.test_reload, max_examples=30)
    assert found.failure is not None
    assert "wait=0" in str(found.schedule)


BROKEN = """
import torch
from hypothesis import strategies as st

import simdevice


def needs_n(n: int) -> None:
    torch.ones(n, device="cuda")


def fine(n: int = 4) -> None:
    torch.ones(n, device="cuda")


test_needs_n = simdevice.fuzz(n=st.integers(1, 8))(needs_n)
test_fine = simdevice.fuzz(max_examples=3)(fine)
test_bad_pin = simdevice.example("nosuch#0+1")(simdevice.fuzz(max_examples=3)(fine))
test_not_a_function = simdevice.fuzz(3)
test_unknown_strategy = simdevice.fuzz(m=st.integers(1, 8))(fine)
test_negative_delays = simdevice.fuzz(max_delays=-1)(fine)
"""


def test_a_fuzz_test_it_cannot_run_fails_alone_in_one_line(pytester: pytest.Pytester) -> None:
    """A function without a default, or a pinned schedule naming an actor it lacks: that test fails with the one
    line (the first stopped the whole module's collection; the second showed the tool's traceback)."""
    pytester.makepyfile(test_broken=BROKEN)
    result = _pytest(pytester)
    result.assert_outcomes(passed=1, failed=5)
    out = result.stdout.str()
    assert "@simdevice.fuzz: test_broken.py::needs_n has a parameter 'n' without a default" in out
    assert "@simdevice.example('nosuch#0+1'): delay nosuch#0+1 names actor 'nosuch'" in out
    assert "During handling of the above exception" not in out  # the one line, not the error it came from too
    # (the first stopped the module's collection; the other two were Hypothesis's tracebacks)
    assert "@simdevice.fuzz: 3 is not a function" in out
    assert "@simdevice.fuzz: a strategy for 'm', which test_broken.py::fine has no parameter of" in out
    assert "@simdevice.fuzz: max_delays must be >= 0, got -1" in out
    assert "fuzzing.py" not in out


IN_A_CLASS = """
import pytest
import torch

import simdevice


class TestReload:
    @simdevice.fuzz(max_examples=3)
    def test_method(self, n: int = 4) -> None:
        torch.ones(n, device="cuda")

    @staticmethod
    @simdevice.fuzz
    def test_static(n: int = 64) -> None:
        act = torch.arange(n, dtype=torch.float32, device="cuda")
        pinned = torch.empty(n, pin_memory=True)
        d2h = torch.cuda.Stream()
        d2h.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(d2h):
            pinned.copy_(act, non_blocking=True)
        back = torch.empty_like(act).copy_(pinned, non_blocking=True)
        assert torch.equal(back.cpu(), torch.arange(n, dtype=torch.float32))


def test_plain() -> None:
    pass


@pytest.mark.skip(reason="later")
@simdevice.fuzz
def test_skipped(n: int = 4) -> None:
    torch.ones(n, device="cuda")
"""


def test_a_fuzz_test_in_a_test_class(pytester: pytest.Pytester, run_cli: Any) -> None:
    """A method (``self``) fails alone, in one line saying what to do (it was pytest's TypeError traceback: the
    test took no argument, and pytest passed it the instance); a ``@staticmethod`` runs, and its replay line is the
    command, which replays it (it said the line replays only through the function object, as a local function's).
    pytest places each fuzz test at its own file and line (every one was at simdevice/fuzzing.py's)."""
    pytester.makepyfile(test_cls=IN_A_CLASS)
    result = _pytest(pytester, "-rs")
    result.assert_outcomes(passed=1, failed=2, skipped=1)
    out = result.stdout.str()
    # where pytest says a fuzz test is: its own file and line (it was simdevice/fuzzing.py's, for every fuzz test)
    assert "SKIPPED [1] test_cls.py:" in out, out
    assert "@simdevice.fuzz: test_cls.py::TestReload.test_method is a method" in out
    assert "TypeError" not in out
    assert "fuzzing.py" not in out
    # a class's attribute, unlike a local function, is found by the command line: its replay line is the command
    assert 'replay: simdevice replay "test_cls.py::TestReload.test_static::d2h#0+1"' in out, out
    p = run_cli(["replay", "test_cls.py::TestReload.test_static::d2h#0+1", "--no-fix"], Path(pytester.path))
    assert p.returncode == 1, p.stderr
    assert 'replay: simdevice replay "test_cls.py::TestReload.test_static::d2h#0+1"' in p.stdout


PARAMETRIZED = '''
import pytest
import torch
import simdevice


@pytest.mark.parametrize("n", [64, 4096])
@simdevice.fuzz
def test_param(n: int = 64) -> None:
    side = torch.cuda.Stream()
    x = torch.zeros(n, device="cuda")
    if n > 1000:
        with torch.cuda.stream(side):
            x.add_(1)  # no wait for the fill: a race in the large case only
    torch.cuda.synchronize()


@pytest.mark.parametrize(("n", "reps"), [(64, 2)])
@simdevice.fuzz
def test_unknown(n: int = 64) -> None:
    torch.ones(n, device="cuda")


def test_other() -> None:
    pass
'''


def test_a_parametrized_fuzz_test_holds_each_case_s_values(pytester: pytest.Pytester, run_cli: Any) -> None:
    """``@pytest.mark.parametrize`` on a fuzz test: each case searches with its values held in the configuration,
    and its replay line carries them; a name the function has no parameter of fails that case alone, in one line.
    Before, pytest refused the marker at collection ("function uses no argument 'n'"), and the module's other tests
    never ran."""
    pytester.makepyfile(test_param=PARAMETRIZED)
    result = _pytest(pytester)
    result.assert_outcomes(passed=2, failed=2)
    out = result.stdout.str()
    assert "FAILED test_param.py::test_param[4096]" in out, out
    assert 'replay: simdevice replay "test_param.py::test_param:n=4096"' in out, out
    assert "a parametrized 'reps', which test_param.py::test_unknown has no parameter of" in out, out
    p = run_cli(["replay", "test_param.py::test_param:n=4096", "--no-fix"], Path(pytester.path))
    assert p.returncode == 1, p.stderr


def test_a_parametrized_fuzz_test_that_cannot_run_fails_each_case_in_one_line(pytester: pytest.Pytester) -> None:
    """``@pytest.mark.parametrize`` on a fuzz test whose function has a parameter without a default (a case's value
    does not make one): each case fails with the one line that says so, and the module's other tests run. Before,
    the test ``fuzz`` made for it was no fuzz test to the plugin: pytest refused the marker at collection
    ("function uses no argument 'n'"), and no test of the module ran."""
    pytester.makepyfile(test_nodefault="""
import pytest
import torch
import simdevice


@pytest.mark.parametrize("n", [4, 8])
@simdevice.fuzz
def test_param(n: int) -> None:
    torch.ones(n, device="cuda")


def test_other() -> None:
    pass
""")
    result = _pytest(pytester)
    result.assert_outcomes(passed=1, failed=2)
    out = result.stdout.str()
    assert "function uses no argument" not in out, out
    failed = [line for line in out.splitlines() if line.startswith("FAILED test_nodefault.py::test_param[")]
    assert len(failed) == 2, out  # (pytest's summary, a line a case, cut to the terminal's width outside CI)
    # each case's failure says it (once, and once more in the summary where CI=true leaves its lines whole)
    assert out.count("@simdevice.fuzz: test_nodefault.py::test_param has a parameter 'n' without a default") >= 2, out
