"""``FILE.py::__main__``: a script's ``if __name__ == "__main__":`` block is a target, run as ``python FILE`` runs it
(``runpy.run_path``: the file's code in a namespace made anew at each run, then the block; ``sys.argv`` the file's
alone, so an ``argparse`` main takes its defaults). A protocol written at a script's top level, a ``torchrun``
script (with ``--world-size N``) or a ``torch.multiprocessing.spawn`` script is checked, replayed and fixed with no
change to it; before, only a function of the file could be named.

Each rule with a test a mutation fails: the block runs (a racy one is found, its line replays it, its fix is
checked); each run starts from a new namespace (a module-level list the block appends to holds one item in every
run); the script's arguments are its own; ``sys.modules["__main__"]`` stays the tool's (``runpy.run_path``'s swap
of it, made by two ranks at once, was undone out of order and left the script there); a file with no such block,
one that does not compile, a module's name and a parameter are one line, exit 2."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

Cli = Callable[[list[str], Path], subprocess.CompletedProcess[str]]

RACY = '''
import argparse
import sys
import torch

RUNS = []


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=4096)
    n = parser.parse_args().n
    RUNS.append(n)
    assert RUNS == [4096], (RUNS, sys.argv)
    x = torch.arange(n, dtype=torch.float32, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    host = torch.empty(n, pin_memory=True)
    with torch.cuda.stream(side):
        host.copy_(x, non_blocking=True)
    {wait}
    assert torch.equal(host, torch.arange(n, dtype=torch.float32)), "read before the D2H landed"
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
'''

TORCHRUN = '''
import os
import torch
import torch.distributed as dist

dist.init_process_group("nccl")
rank = int(os.environ["LOCAL_RANK"])
x = torch.full((1024,), float(rank + 1), device="cuda")
work = dist.all_reduce(x, async_op=True)
{wait}
total = x.sum().item()
work.wait()
if __name__ == "__main__":
    assert total == 3 * 1024, total
'''


def _script(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


@pytest.mark.parametrize("wait", [False, True], ids=["racy", "waited"])
def test_a_script_s_main_block_is_checked_replayed_and_fixed(wait: bool, tmp_path: Path, run_cli: Cli) -> None:
    _script(tmp_path, "offload.py", RACY.format(wait="side.synchronize()" if wait else ""))
    out = run_cli(["check", "offload.py::__main__", "-q"], tmp_path)
    if wait:
        assert out.returncode == 0, out.stdout + out.stderr
        assert "offload.py::__main__: clean" in out.stdout
        return
    assert out.returncode == 1, out.stdout + out.stderr
    assert 'simdevice replay "offload.py::__main__"' in out.stdout, out.stdout
    assert "race: equal on host host (offload.py:22)" in out.stdout, out.stdout
    assert "checked: with it inserted" in out.stdout, out.stdout
    again = run_cli(["replay", "offload.py::__main__", "--no-fix"], tmp_path)
    assert again.returncode == 1, again.stdout + again.stderr
    assert "host raised AssertionError: read before the D2H landed (offload.py:22)" in again.stdout, again.stdout


@pytest.mark.parametrize("wait", [False, True], ids=["racy", "waited"])
def test_a_torchrun_script_runs_on_ranks(wait: bool, tmp_path: Path, run_cli: Cli) -> None:
    _script(tmp_path, "train.py", TORCHRUN.format(wait="work.wait()" if wait else ""))
    main = sys.modules["__main__"]
    out = run_cli(["check", "train.py::__main__", "--world-size", "2", "-q", "--no-fix"], tmp_path)
    assert out.returncode == (0 if wait else 1), out.stdout + out.stderr
    # (two ranks ran the script at once: runpy's swap of ``__main__``, undone out of order, left the script there,
    # and the next fork server started it as its main)
    assert sys.modules["__main__"] is main, sys.modules["__main__"]
    if not wait:
        assert "race: sum on stream rank" in out.stdout, out.stdout
        assert '"train.py::__main__" --world-size 2' in out.stdout, out.stdout


@pytest.mark.parametrize(("name", "text", "said"), [
    ("nomain.py", "import torch\n\ndef f():\n    pass\n", 'nomain.py has no `if __name__ == "__main__":` block'),
    ("broken.py", "def f(:\n", "broken.py does not compile: SyntaxError"),
    ("json", None, "json::__main__: a script's main block is named by its file"),
    ("absent.py", None, "no file 'absent.py'"),
    ("offload.py", RACY.format(wait=""), "offload.py::__main__ has no parameter 'n' (parameters: none)"),
])
def test_what_names_no_main_block_is_one_line_and_exit_2(name: str, text: str | None, said: str, tmp_path: Path,
                                                         run_cli: Cli) -> None:
    if text is not None:
        _script(tmp_path, name, text)
    target = f"{name}::__main__" + (":n=3" if name == "offload.py" else "")
    out = run_cli(["check", target, "-q"], tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.count("\n") == 1, out.stderr
    assert said in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_a_file_of_no_function_but_a_main_block_names_the_block(tmp_path: Path, run_cli: Cli) -> None:
    _script(tmp_path, "script.py", 'import torch\n\nif __name__ == "__main__":\n    torch.ones(3, device="cuda")\n')
    out = run_cli(["check", "script.py", "-q"], tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.strip().endswith("its main block: script.py::__main__"), out.stderr
    listed = run_cli(["list", "script.py"], tmp_path)
    assert "its main block: script.py::__main__" in listed.stdout, listed.stdout
