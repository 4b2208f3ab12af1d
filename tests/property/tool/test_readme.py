"""The README's tutorial, run as written: every block marked ``<!-- tutorial: ... -->``, in order, in an empty folder.

- ``file NAME``: the next code block is written to NAME (a later block of the same name replaces it);
- ``run`` / ``run gpu``: each line of the next block is a shell command (``gpu``: only where CUDA is present);
- ``python``: the next block runs in a fresh interpreter in that folder;
- ``output``: the next block is what the step before printed (stdout), line by line; a line ``...`` stands for
  any lines, and durations (``1.4s``) may differ.

A step that prints something else fails with both texts. Without CUDA the GPU steps are skipped (and counted).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
MARK = re.compile(r"<!-- tutorial: (file (?P<file>\S+)|run gpu|run|python|output) -->\n```[a-z]*\n(?P<body>.*?)```",
                  re.S)
DURATION = re.compile(r"\b\d+(\.\d+)?s\b")


def steps(text: str) -> list[tuple[str, str, str]]:
    """(kind, file name or "", block) for each marked block of the README, in order."""
    out = []
    for m in MARK.finditer(text):
        kind = m.group(1).split()[0] if m.group("file") else m.group(1)
        out.append((kind, m.group("file") or "", m.group("body")))
    return out


def matches(expected: str, actual: str) -> bool:
    """Whether ``actual`` has the lines of ``expected`` in order, ``...`` standing for any lines, durations
    aside."""
    want = [DURATION.sub("Ns", line).rstrip() for line in expected.splitlines()]
    got = [DURATION.sub("Ns", line).rstrip() for line in actual.splitlines()]

    def at(i: int, j: int) -> bool:
        if i == len(want):
            return j == len(got)
        if want[i] == "...":
            return any(at(i + 1, k) for k in range(j, len(got) + 1))
        return j < len(got) and got[j] == want[i] and at(i + 1, j + 1)

    return at(0, 0)


def _has_cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def test_the_tutorial_runs_as_written(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    plan = steps(readme)
    assert [k for k, _, _ in plan].count("output") >= 5, "the README's tutorial markers are gone"
    here = tmp_path / "tutorial"
    here.mkdir()
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"), COLUMNS="80",
               PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
               PYTHONPATH=os.pathsep.join([str(here), str(ROOT)]))
    env.pop("HYPOTHESIS_PROFILE", None)  # the user's folder registers no profiles
    gpu = _has_cuda()
    printed: str | None = None
    skipped = 0
    for kind, name, body in plan:
        if kind == "file":
            (here / name).write_text(body)
        elif kind in ("run", "run gpu"):
            if kind == "run gpu" and not gpu:
                printed, skipped = None, skipped + 1
                continue
            printed = ""
            for line in body.splitlines():
                if line.strip() and not line.startswith("#"):
                    proc = subprocess.run(line, shell=True, cwd=here, env=env, capture_output=True, text=True,
                                          timeout=300)
                    assert proc.returncode in (0, 1), f"{line}: exit {proc.returncode}\n{proc.stderr}"
                    printed += proc.stdout
        elif kind == "python":
            proc = subprocess.run([sys.executable, "-c", body], cwd=here, env=env, capture_output=True, text=True,
                                  timeout=300)
            assert proc.returncode == 0, proc.stderr
            printed = proc.stdout
        else:  # output
            if printed is None:
                continue  # a GPU step skipped here
            assert matches(body, printed), f"the README shows:\n{body}\nthe run printed:\n{printed}"
            printed = None
    if skipped:
        print(f"{skipped} GPU steps skipped (no CUDA)")


@pytest.mark.parametrize(("expected", "actual", "ok"), [
    ("a\nb\n", "a\nb\n", True),
    ("a\n...\nc\n", "a\nb\nb\nc\n", True),
    ("a\n...\n", "a\n", True),
    ("done (1.4s)\n", "done (12.03s)\n", True),
    ("a\nb\n", "a\nc\n", False),
    ("a\n", "a\nb\n", False),
    ("...\nc\n", "a\nb\n", False),
])
def test_output_matching_is_by_line_with_ellipses_and_durations_aside(expected: str, actual: str, ok: bool) -> None:
    assert matches(expected, actual) is ok
