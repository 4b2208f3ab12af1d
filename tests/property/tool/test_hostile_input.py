"""Hostile input at the command line: every malformed input is one line on stderr naming the problem, exit 2, no
traceback; valid but extreme input gets its documented behaviour (a step-limit report, an out-of-memory report, a
refusal naming the limit, a note for a delay that never applied, a clean run for the longest stall).

The commands run in-process (the ``run_cli`` fixture), in a folder holding a few files of a user's: ``ok.py`` (a
function target), ``notprog.py`` (no function), ``broken.py`` (a syntax error), ``weird.py`` and ``weirdimport.py``
(an exception whose ``str()`` raises, from a function and at import), ``notes.txt`` (no FILE.py) and the folders
``somedir`` and ``pydir.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

L = "offload_reload/correct"

MALFORMED = [
    # a run that ends early with an error of many long lines (torch's dispatcher's): one line, cut short
    (['replay', 'manylines.py::fn::nosuch#0+1'], "delay nosuch#0+1 names actor 'nosuch', which manylines.py::fn does "
                                                 "not have (its run without delays ended early"),
    (['replay'], 'the following arguments are required: schedule'),
    (['replay', ''], 'empty schedule: expected'),
    (['replay', ' '], 'empty schedule: expected'),
    (['replay', 'offload_reload'], "bad schedule target 'offload_reload': expected"),
    (['replay', 'nope/racy'], "unknown program 'nope'; known:"),
    (['replay', 'offload_reload/nope'], "unknown variant 'nope' of offload_reload;"),
    (['replay', L + '::gpu#0+1'], "delay gpu#0+1 names actor 'gpu', which"),
    (['replay', L + '::host#0+0'], 'units must be in 1..1000000, got 0'),
    (['replay', L + '::host#-1+1'], "bad delay 'host#-1+1': expected"),
    (['replay', L + '::host#0+x'], "bad delay 'host#0+x': expected"),
    (['replay', L + '::host#0'], "bad delay 'host#0': expected ACTOR#INDEX+UNITS,"),
    (['replay', L + '::host0+1'], "bad delay 'host0+1': expected"),
    (['replay', L + '::#0+1'], "bad delay '#0+1': expected ACTOR#INDEX+UNITS,"),
    (['replay', L + '::host#0+1,'], "bad delay '': expected ACTOR#INDEX+UNITS, e.g."),
    (['replay', L + '::host#0+1,,host#1+1'], "bad delay '': expected ACTOR#INDEX+UNITS, e.g."),
    (['replay', L + '::host#0+1,host#0+2'], 'two delays name the same actor and operation'),
    (['replay', L + ':kib=abc'], "configuration kib='abc' is not an integer"),
    (['replay', L + ':kib=0'], 'kib must be in 1..1048576, got 0'),
    (['replay', L + ':kib=-4'], 'kib must be in 1..1048576, got -4'),
    (['replay', L + ':kib=1_6'], "configuration kib='1_6' is not an integer"),
    (['replay', L + ':nosuch=1'], "unknown configuration key 'nosuch'; known:"),
    (['replay', L + ':kib'], "bad configuration item 'kib': expected KEY=VALUE"),
    (['replay', L + ':kib=4,kib=8'], "configuration key repeated in ['kib', 'kib']"),
    (['replay', L + ':kib=99999999999'], 'kib must be in 1..1048576, got 99999999999'),
    (['replay', L + '::alloc#0~-1'], "bad choice 'alloc#0~-1': expected"),
    (['replay', L, '--trials', '0'], '--trials must be >= 1, got 0'),
    (['replay', L, '--trials', '-5'], '--trials must be >= 1, got -5'),
    (['replay', L, '--trials', 'x'], "argument --trials: invalid int value: 'x'"),
    (['replay', L, '--max-steps', '0'], '--max-steps must be >= 1, got 0'),
    (['replay', L, '--max-steps', '-3'], '--max-steps must be >= 1, got -3'),
    (['replay', L, '--device-memory', '0'], '--device-memory must be a size such as 512M, 8G'),
    (['replay', L, '--device-memory', 'lots'], '--device-memory must be a size such as 512M, 8G'),
    (['replay', L, '--device-memory', '-1G'], 'argument --device-memory: expected one argument'),
    (['replay', L, '--edge', 'nonsense'], "bad edge 'nonsense': expected"),
    (['replay', L, '--edge', 'a@b.py:1->'], "bad edge 'a@b.py:1->': expected"),
    (['replay', L, '--perfetto', '/nonexistent/dir/x.json'], "--perfetto '/nonexistent/dir/x.json': not a"),
    (['replay', L, '--gpu', '--edge', 'd2h@x.py:1->default@x.py:2'], '--edge inserts a synchronization on the'),
    (['replay', L, '--nosuchflag'], 'unrecognized arguments: --nosuchflag'),
    (['replay', 'xxxxxxxxxxxxxxxxxxxx' + 'x' * 9980], 'schedule of 10000 characters: too long to be one'),
    (['replay', 'nothere.py::fn'], "no file 'nothere.py'"),
    (['replay', 'notprog.py::fn'], "notprog.py has no function 'fn'"),
    (['replay', 'broken.py::fn'], "importing 'broken.py' failed: SyntaxError:"),
    (['replay', 'ok.py::nofn'], "ok.py has no function 'nofn'"),
    (['replay', 'ok.py::fn:n=abc'], "configuration n='abc': expected an integer, as"),
    (['replay', 'ok.py::fn:zz=1'], "ok.py::fn has no parameter 'zz' (parameters: n)"),
    (['replay', 'ok.py::fn::nosuch#0+1'], "delay nosuch#0+1 names actor 'nosuch', which"),
    (['replay', 'ok.py'], "bad schedule target 'ok.py': expected"),
    (['replay', 'somedir::fn'], "'somedir' is a folder, not a file: name a FILE.py in it"),
    # a folder, or a file that is no FILE.py, where a target's file goes: said so (before, 'check somedir' was a "bad
    # schedule target", 'list somedir' listed "no function" and exit 0, 'list .' failed with Python's TypeError of a
    # relative import, 'check pydir.py' said "no file" of a folder there, 'list notes.txt' "No module named 'notes'")
    (['check', 'somedir'], "'somedir' is a folder, not a file: name a FILE.py in it"),
    (['check', '.'], "'.' is a folder, not a file: name a FILE.py in it"),
    (['check', 'pydir.py'], "'pydir.py' is a folder, not a file: name a FILE.py in it"),
    (['check', 'pydir.py::fn'], "'pydir.py' is a folder, not a file: name a FILE.py in it"),
    (['check', 'notes.txt'], "'notes.txt' is not a Python file: name a FILE.py"),
    (['replay', 'somedir'], "'somedir' is a folder, not a file: name a FILE.py in it"),
    (['replay', 'notes.txt::fn'], "'notes.txt' is not a Python file: name a FILE.py"),
    (['exhaust', 'somedir'], "'somedir' is a folder, not a file: name a FILE.py in it"),
    (['list', 'somedir'], "'somedir' is a folder, not a file: name a FILE.py in it"),
    (['list', '.'], "'.' is a folder, not a file: name a FILE.py in it"),
    (['list', 'pydir.py'], "'pydir.py' is a folder, not a file: name a FILE.py in it"),
    (['list', 'notes.txt'], "'notes.txt' is not a Python file: name a FILE.py"),
    (['check', '--examples', '0'], '--examples must be >= 1, got 0'),
    (['check', '--examples', '-1'], '--examples must be >= 1, got -1'),
    (['check', '--examples', 'many'], "argument --examples: invalid int value: 'many'"),
    (['check', '--budget', '-1'], '--budget must be > 0 seconds, got -1.0'),
    (['check', '--budget', '0'], '--budget must be > 0 seconds, got 0.0'),
    (['check', '--budget', 'nan'], '--budget must be > 0 seconds, got nan'),
    (['check', '--budget', 'inf'], '--budget must be > 0 seconds, got inf'),
    (['check', '--program', 'nope'], "unknown program 'nope'; known:"),
    (['check', '--db', 'ok.py'], "--db 'ok.py' is a file, not a directory"),
    (['check', '--db', 'ok.py/db'], "--db 'ok.py/db': its folder does not exist"),
    (['check', '--db', 'nothere/db'], "--db 'nothere/db': its folder does not exist"),
    (['check', '--db', '/proc/simdevice-db'], "--db '/proc/simdevice-db': cannot make the directory ("),
    (['check', L + '::host#0+1'], 'check draws the delays itself; drop them from'),
    (['check', 'nothere.py::fn'], "no file 'nothere.py'"),
    (['check', 'ok.py::nofn'], "ok.py has no function 'nofn'"),
    (['check', '--max-steps', '0'], '--max-steps must be >= 1, got 0'),
    (['check', '--device-memory', '1Q'], '--device-memory must be a size such as 512M, 8G'),
    (['exhaust', 'zcc/FIXED', '--delays', '4'], 'too many schedules: at least '),
    (['exhaust', L, '--delays', '9'], '--delays must be in 0..4, got 9'),
    (['exhaust', L, '--delays', '-1'], '--delays must be in 0..4, got -1'),
    (['exhaust', L, '--units', '0'], "--units must be >= 1, got '0'"),
    (['exhaust', L, '--units', 'a,b'], '--units must be integers separated by commas,'),
    (['exhaust', L, '--units', '1,2000000'], "--units must be in 1..1000000, got '1,2000000'"),
    (['replay', L, '--png', 'noext'], "--png 'noext': not a .png file name"),
    (['replay', L, '--png', ''], "--png '': not a file in an existing folder"),
    (['replay', L, '--png', 'somedir'], "--png 'somedir': a folder; name the file to write in it (--png "
                                        "'somedir/run.png')"),
    (['replay', L, '--perfetto', 'somedir'], "--perfetto 'somedir': a folder; name the file to write in it "
                                             "(--perfetto 'somedir/run.json')"),
    (['replay', L, '--png', '/proc/x.png', '--no-fix'], "--png '/proc/x.png': cannot write it ("),
    # a trace named as a picture (the picture's own name too): refused; before, the JSON trace was written there
    (['replay', L, '--perfetto', 'run.png'], "--perfetto 'run.png': a trace is JSON, not a picture: name a .json"),
    (['replay', L, '--png', 'run.PNG', '--perfetto', './run.PNG'], "--perfetto './run.PNG': a trace is JSON, not a"),
    (['replay', L, '--perfetto', '/proc/x.json', '--no-fix'], "--perfetto '/proc/x.json': cannot write it ("),
    (['check', L, '--world-size', '2'], "--world-size is for a function target (FILE.py::FUNCTION)"),
    (['check', '--world-size', '2'], "--world-size is for a function target (check FILE.py::FUNCTION"),
    (['check', 'ok.py::fn', '--program', 'zcc'], "--program picks the built-in programs of check's table; with"),
    (['exhaust', L, '--units', ''], '--units must be integers separated by commas,'),
    (['exhaust', L, '--max-steps', '0'], '--max-steps must be >= 1, got 0'),
    (['exhaust', L + '::host#0+1'], 'exhaust draws the delays itself; drop them from'),
    (['exhaust', 'nothere.py::fn'], "no file 'nothere.py'"),
    (['list', 'nothere.py'], "no file 'nothere.py'"),
    (['list', 'broken.py'], "importing 'broken.py' failed: SyntaxError:"),
    (['nosuchcommand'], 'argument COMMAND: invalid choice:'),
    (['replay', L + ':kib=+16'], "bad value '+16' for configuration key 'kib'"),
    (['replay', L, '--perfetto', 'x.json', '--gpu'], '--perfetto and --png draw the simulator'),
    (['replay', L + '::host#0+1' + '0' * 310], 'units must be in 1..1000000, got'),
    (['replay', L + '::host#1000000001+1'], 'index must be in 0..1000000000, got 1000000001'),
    (['replay', L + '::host#\u0663+1'], "bad delay 'host#\u0663+1': expected"),
    (['replay', L + ':kib=\u0664'], "bad value '\u0664' for configuration key 'kib'"),
    # an import raising an exception of the program's whose str() raises
    (['replay', 'weirdimport.py::fn'], "importing 'weirdimport.py' failed: Weird: (its text could not be made: its"),
]


@pytest.fixture
def user_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "ok.py").write_text(
        'import torch\n\n\ndef fn(dev=None, n=4):\n    torch.ones(n, device="cuda").add_(1)\n')
    (tmp_path / "notprog.py").write_text("x = 1\n")
    (tmp_path / "manylines.py").write_text(
        'import torch\n\n\ndef fn():\n    torch.ones(4, device="cuda")\n'
        '    raise RuntimeError("the first line " + "x" * 500 + "\\nthe second\\nthe third")\n')
    (tmp_path / "broken.py").write_text("def f(:\n")
    weird = 'class Weird(Exception):\n    def __str__(self):\n        raise ValueError("no text")\n\n\n'
    (tmp_path / "weird.py").write_text(
        'import torch\n\n\n' + weird + 'def fn():\n    torch.ones(4, device="cuda")\n    raise Weird()\n')
    (tmp_path / "weirdimport.py").write_text(weird + 'raise Weird()\n\n\ndef fn():\n    pass\n')
    (tmp_path / "somedir").mkdir()
    (tmp_path / "pydir.py").mkdir()
    (tmp_path / "notes.txt").write_text("def fn():\n    pass\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_table_is_large_enough() -> None:
    assert len(MALFORMED) >= 60


@pytest.mark.parametrize(("argv", "message"), MALFORMED, ids=[f"{i}" for i in range(len(MALFORMED))])
def test_malformed_input_is_one_line_and_exit_2(argv: list[str], message: str, user_dir: Path, run_cli: Any) -> None:
    p = run_cli(argv, user_dir)
    assert p.returncode == 2
    out, err = p.stdout, p.stderr
    assert err.startswith(f"simdevice: error: {message}"), err
    assert err.count("\n") == 1, err
    assert len(err) < 400, err  # a long input is not echoed in full
    assert "Traceback" not in out + err
    assert sorted(p.name for p in user_dir.iterdir()) == ["broken.py", "manylines.py", "notes.txt", "notprog.py",
                                                           "ok.py", "pydir.py", "somedir", "weird.py",
                                                           "weirdimport.py"]


EXTREME = [
    # (argv, exit code, what the output says)
    (["replay", L, "--max-steps", "10"], 2, "step limit at "),
    (["replay", L + ":kib=4096", "--device-memory", "8M"], 1, "OutOfMemoryError: simulated device out of memory"),
    (["replay", L + "::host#0+1000000", "--no-fix"], 0, "on sim: clean"),
    (["replay", "zcc/FIXED::worker2#0+1"], 0, "delays never applied (their operation never came): worker2#0+1"),
    (["replay", L + "::host#0~1"], 0, "delays never applied (their operation never came): host#0~1"),
    # a line pasted with the quotes check prints around it
    (["replay", f'"{L}::host#0+1000000"', "--no-fix"], 0, "on sim: clean"),
    # the program raised an exception of its own whose str() raises: its host error, named by type
    (["replay", "weird.py::fn", "--no-fix"], 1,
     "host raised Weird (its text could not be made: str() raised ValueError: no text) (weird.py:"),
]


@pytest.mark.parametrize(("argv", "code", "says"), EXTREME)
def test_extreme_but_valid_input_gets_its_documented_behaviour(argv: list[str], code: int, says: str, user_dir: Path,
                                                              run_cli: Any) -> None:
    p = run_cli(argv, user_dir)
    assert p.returncode == code
    out, err = p.stdout, p.stderr
    assert says in out, out
    assert "Traceback" not in out + err
