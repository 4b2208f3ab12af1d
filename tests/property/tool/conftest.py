"""``run_cli``: the command line in this process, as a test of its output needs it (a real process costs about 3 s
of start-up each; the tests that are about processes, signals and files written start real ones)."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from simdevice.cli import main


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    out, err = io.StringIO(), io.StringIO()
    here = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(args)
            except SystemExit as e:  # argparse's own errors
                code = int(e.code or 0)
    finally:
        os.chdir(here)
    return subprocess.CompletedProcess(["simdevice", *args], code, out.getvalue(), err.getvalue())


@pytest.fixture
def run_cli() -> Callable[[list[str], Path], subprocess.CompletedProcess[str]]:
    """``run_cli(ARGS, CWD)``: ``simdevice ARGS`` run in CWD in this process; its exit code, stdout and stderr."""
    return _run


@pytest.fixture(autouse=True, scope="session")
def _own_user_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The commands these tests run keep what they may keep between runs (Hypothesis's constants) in a folder of
    the session's, not the user's: nothing a user's own commands left there reaches a test, and nothing of the
    tests' is left behind."""
    before = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("user-cache"))
    yield
    if before is None:
        del os.environ["XDG_CACHE_HOME"]
    else:
        os.environ["XDG_CACHE_HOME"] = before
