"""A program's ``os.chdir`` is undone at its run's end, and the run's report names files from where it started.

The working directory is the process's: on a GPU a program that changes it does so in its own process, which ends
with it. Here its runs share the command's process, so a program that ran ``os.chdir("/")`` left the command there:
``replay --png run.png`` wrote ``/run.png``, the search's next run started elsewhere than the first (another run of
the same schedule), and the run's host error named its file relative to the new directory (``tmp/prog.py:7``
where the race's own lines said ``prog.py:7``). Mutations caught: the directory left as the program left it; the
error's line named from the current directory.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import simdevice
from simdevice import HostError


def _program(seen: list[str], to: str) -> None:
    seen.append(os.getcwd())
    os.chdir(to)
    x = torch.arange(4.0, device="cuda")
    host = torch.empty(4, pin_memory=True)
    host.copy_(x, non_blocking=True)
    assert host.tolist() == [0.0, 1.0, 2.0, 3.0]  # (no synchronize: the host reads the copy before it lands)


def test_each_run_starts_where_the_first_did_and_the_command_stays_there(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    seen: list[str] = []
    for _ in range(2):
        run = simdevice.cuda()
        run.run(_program, seen, str(elsewhere))
        assert any(isinstance(r, HostError) for r in run.result.reports), run.result.reports
        assert os.getcwd() == str(tmp_path)
    assert seen == [str(tmp_path)] * 2


def test_the_error_is_named_from_where_the_run_started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    here = Path(__file__).parent
    monkeypatch.chdir(here)
    run = simdevice.cuda()
    run.run(_program, [], "/")
    errors = [r for r in run.result.reports if isinstance(r, HostError)]
    assert len(errors) == 1, run.result.reports
    assert errors[0].source.startswith(Path(__file__).name + ":"), errors[0].source


def test_a_png_named_relative_to_the_command_is_written_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from simdevice.cli import main

    prog = tmp_path / "prog.py"
    prog.write_text(
        "import os\nimport torch\n\n\ndef f():\n    os.chdir('/')\n    torch.ones(4, device='cuda').add_(1)\n")
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.chdir(out)
    assert main(["replay", f"{prog}::f", "--no-fix", "--png", "run.png"]) == 0
    assert (out / "run.png").is_file()
    assert os.getcwd() == str(out)
