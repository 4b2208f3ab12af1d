"""Rule (FunctionTarget._run_cuda): on the GPU (``replay --gpu``, ``backend="cuda"``) a target runs as it is
written, as on the simulator: plain torch.cuda code (no ``dev`` parameter) through ``CudaDevice.run_plain`` and
called with its configuration alone; contract code (``fn(dev, ...)``) through ``CudaDevice.run``, given the
device. (No GPU here: ``reference.cuda.CudaDevice`` is replaced by a stand-in that records which way it was
asked to run the function and runs it that way.)"""

from __future__ import annotations

import functools
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest

import reference.cuda
from reference.contract import Run
from simdevice.search import targets
from simdevice.search.targets import from_function, resolve

ROOT = Path(__file__).resolve().parents[3]


class FakeCudaDevice:
    """``CudaDevice``'s surface that ``_run_cuda`` uses, without a GPU."""

    calls: ClassVar[list[str]] = []

    def __init__(self, schedule: Any, cycles_per_ms: float | None = None) -> None:
        self.schedule = schedule
        self.cycles_per_ms = cycles_per_ms or 1.0

    def run(self, program: Any, *args: Any) -> Run:
        self.calls.append("run")
        return Run(result=program(self, *args))

    def run_plain(self, fn: Any, *args: Any, world_size: int | None = None, **kwargs: Any) -> Run:
        self.calls.append("run_plain")
        return Run(result=fn(*args, **kwargs))


def plain(n: int = 4) -> tuple[str, int]:
    return "plain", n


def contract(dev: Any, n: int = 4) -> tuple[str, int]:
    assert isinstance(dev, FakeCudaDevice), f"contract code was given {dev!r}, not the device"
    return "contract", n


@pytest.mark.parametrize(("fn", "way"), [(plain, "run_plain"), (contract, "run")])
def test_a_gpu_run_calls_the_function_in_its_own_style(monkeypatch: pytest.MonkeyPatch, fn: Any, way: str) -> None:
    monkeypatch.setattr(reference.cuda, "CudaDevice", FakeCudaDevice)
    monkeypatch.setattr(FakeCudaDevice, "calls", [])
    monkeypatch.setattr(targets, "_CYCLES", [])
    target = from_function(fn, name=f"t.py::{fn.__name__}")
    assert target.style == fn.__name__
    out = target.run(target.schedule({"n": 7}), backend="cuda")
    assert FakeCudaDevice.calls == [way], f"{fn.__name__} code ran through CudaDevice.{FakeCudaDevice.calls}"
    assert out.problems == (), out.problems
    assert out.run.result == (fn.__name__, 7)


def test_plain_code_on_ranks_reaches_each_rank_as_a_function_it_can_load(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """On ranks (``--world-size N``) each rank runs in a process of its own, which gets the function by pickle: a
    function loaded from the user's file lives in a module no other process can import by name, so it goes as its
    target text and folder, and is loaded again there (from another working directory too)."""
    (tmp_path / "prog.py").write_text("def fn(n: int = 4):\n    return ('ran', n)\n")
    got: list[tuple[Any, int | None]] = []

    class Ranks(FakeCudaDevice):
        def run_plain(self, fn: Any, *args: Any, world_size: int | None = None, **kwargs: Any) -> Run:
            got.append((pickle.dumps(functools.partial(fn, *args, **kwargs)), world_size))
            return Run(result=None)

    monkeypatch.setattr(reference.cuda, "CudaDevice", Ranks)
    monkeypatch.setattr(targets, "_CYCLES", [])
    monkeypatch.chdir(tmp_path)
    target = resolve("prog.py::fn", world_size=2)
    out = target.run(target.schedule({"n": 7}), backend="cuda")
    assert out.problems == (), out.problems
    (blob, world), = got
    assert world == 2
    p = subprocess.run([sys.executable, "-c", "import pickle, sys; print(pickle.loads(sys.stdin.buffer.read())())"],
                       input=blob, capture_output=True, cwd=ROOT / "simdevice", check=False,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    assert p.stdout.decode().strip() == "('ran', 7)"


def test_a_function_of_the_user_s_file_reaches_a_child_process_the_program_starts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """What the program itself hands a child process (the function ``torch.multiprocessing.spawn`` or a
    ``Process`` starts, a class of its arguments) is of the module the tool imported the user's file as, which the
    child cannot import by that name: ``reference.cuda.dumps`` sends the file along, and ``loads`` in the child
    imports it from there under the same name (from another working directory too)."""
    (tmp_path / "helper.py").write_text("SCALE = 3\n")
    (tmp_path / "prog.py").write_text(
        "import dataclasses\nfrom helper import SCALE\n\n@dataclasses.dataclass\nclass Args:\n    n: int\n\n"
        "def rank(i, args):\n    return ('rank', i, args.n * SCALE)\n\ndef fn():\n    pass\n"
    )
    monkeypatch.chdir(tmp_path)
    target = resolve("prog.py::fn")
    module = sys.modules[target.fn.__module__]
    assert module.__name__ != "prog", "the file was imported under its plain name: nothing here to test"
    blob = reference.cuda.dumps((module.rank, module.Args(5), len))
    p = subprocess.run(
        [sys.executable, "-c", "import sys; from reference.cuda import loads; fn, args, n = loads("
         "sys.stdin.buffer.read()); print(fn(1, args), n is len, fn.__module__ == type(args).__module__)"],
        input=blob, capture_output=True, cwd=ROOT / "simdevice", check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    assert p.stdout.decode().strip() == "('rank', 1, 15) True True"
