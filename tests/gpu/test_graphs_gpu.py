"""CUDA graphs and private pools on a real GPU: the programs of
``tests/property/dropin/test_cuda_graphs_capture_and_replay.py`` and ``test_a_mem_pool_keeps_its_blocks.py`` (plain
torch.cuda), each in a process of its own (a failed capture may leave its stream capturing), against what the
simulator says of the same program: the correct ones run to their end on both, with the values the simulator
computes (each program checks its own); those CUDA refuses raise the same CUDA error on both.

Run: ``PYTHONPATH=. python -m pytest -q -s tests/gpu/test_graphs_gpu.py``. Each case prints ``GRAPH``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

import simdevice  # noqa: E402

pytestmark = pytest.mark.gpu

MODULE = "property.dropin.test_cuda_graphs_capture_and_replay"
POOLS = "property.dropin.test_a_mem_pool_keeps_its_blocks"

#: the programs that run to their end (``module:name``, the graphs' module where none is named), and those CUDA
#: refuses, with the words of its error
RUN = ["_replays", "_nothing_runs_at_capture", "_random_replays", "_copied_in_ordered", "_temporaries_kept",
       "_pool_kept", "_pool_shared", "_fork_joined", "_graphed_callables",
       *(f"{POOLS}:{name}" for name in ("_routed", "_thread_local", "_kept_while_alive", "_graph_in_the_pool"))]
REFUSED = {
    "_item_in_capture": "operation not permitted when stream is capturing",
    "_sync_in_capture": "operation not permitted when stream is capturing",
    "_fork_unjoined": "capturing stream has unjoined work",
    "_outside_wait": "dependency created on uncaptured work in another stream",
    "_captured_event_query": "operation not permitted on an event last recorded in a capturing stream",
    "_pageable_copy_in_capture": "Cannot copy between CPU and CUDA tensors during CUDA graph capture",
    "_cpu_in_capture": "Cannot copy between CPU and CUDA tensors during CUDA graph capture",
    "_capture_on_the_default_stream": "CUDA graphs must be captured on a non-default stream",
}
MODES = ["global", "thread_local", "relaxed"]


def _on_gpu(call: str, module: str = MODULE) -> tuple[int, str]:
    """``call`` (a call of one of ``module``'s functions) in a child process: its exit code and what it printed to
    stderr (every traceback: a capture's exit raises its own error over the first)."""
    code = f"import sys; sys.path.insert(0, 'tests'); import {module} as m; m.{call}"
    child = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    return child.returncode, child.stderr.strip()


def _errors(err: str) -> str:
    """The lines of ``err`` that name an error (what a GRAPH line shows)."""
    return " | ".join(line for line in err.splitlines() if "Error" in line and not line.startswith(" "))


def _on_sim(program: object) -> str:
    sim = simdevice.cuda()
    sim.run(program)  # type: ignore[arg-type]
    return "clean" if sim.clean else sim.text()


def _program(name: str, module: str = MODULE) -> object:
    import importlib

    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("target", RUN)
def test_a_correct_graph_program_runs_to_its_end_on_both(target: str) -> None:
    module, _, name = target.rpartition(":")
    module = module or MODULE
    rc, err = _on_gpu(f"{name}()", module)
    sim = _on_sim(_program(name, module))
    print(f"GRAPH {name}: gpu rc {rc}{' ' + _errors(err) if rc else ''}; simulator {sim} (torch {torch.__version__}, "
          f"{torch.cuda.get_device_name()})", flush=True)
    assert rc == 0, err
    assert sim == "clean"


@pytest.mark.parametrize(("name", "error"), sorted(REFUSED.items()))
def test_what_cuda_refuses_in_a_capture_raises_the_same_error_on_both(name: str, error: str) -> None:
    rc, err = _on_gpu(f"{name}()")
    sim = _on_sim(_program(name))
    print(f"GRAPH {name}: gpu rc {rc}: {_errors(err)!r}; simulator: {sim!r} (torch {torch.__version__}, "
          f"{torch.cuda.get_device_name()})", flush=True)
    assert rc != 0
    assert error in err
    assert error in sim


def test_a_race_between_two_branches_of_a_graph_shows_on_both() -> None:
    """The capture stalls one branch (a captured ``_sleep``) before it writes what the other branch reads with no
    wait: on the GPU the reader sees the value before the write (the program's check fails), the simulator reports
    the race between the graph's two branch streams and the same wrong value."""
    rc, err = _on_gpu("_fork_race()")
    sim = _on_sim(_program("_fork_race"))
    print(f"GRAPH _fork_race: gpu rc {rc} {_errors(err)!r}; simulator {sim!r}", flush=True)
    assert rc != 0
    assert "AssertionError" in err
    assert "race:" in sim
    assert "on stream graph1-side" in sim


@pytest.mark.parametrize("mode", MODES)
def test_another_thread_s_sync_during_a_capture(mode: str) -> None:
    rc, err = _on_gpu(f"_other_thread_syncs({mode!r})")
    sim = _on_sim(lambda: _program("_other_thread_syncs")(mode))  # type: ignore[operator]
    print(f"GRAPH _other_thread_syncs({mode!r}): gpu rc {rc}{' ' + _errors(err) if rc else ''}; simulator {sim!r}",
          flush=True)
    assert rc == 0, err
    assert sim == "clean"
