"""``run_cli``: the command line in this process, as a test of its output needs it (a real process costs about 3 s
of start-up each; the tests that are about processes, signals and files written start real ones)."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
from collections.abc import Callable
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
