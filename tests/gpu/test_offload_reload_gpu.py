"""The demonstration on a real GPU: the schedule the simulator shrank corrupts; the correct form never does.

Run: ``python -m pytest -q -s tests/gpu/test_offload_reload_gpu.py`` on a CUDA machine. Each case prints
``RATE <schedule> corrupted K/N``; record the lines in docs/confirmations.md.
"""

import pytest
import torch

from reference.schedule import Schedule
from simdevice.programs.offload_reload import PROGRAM
from simdevice.search import execute

TRIALS = 20


def rate(text: str) -> int:
    s = Schedule.parse(text)
    bad = sum(execute(s, backend="cuda").corrupted for _ in range(TRIALS))
    print(f"RATE {text} corrupted {bad}/{TRIALS} (torch {torch.__version__}, {torch.cuda.get_device_name()})")
    return bad


def test_shrunk_racy_schedule_corrupts() -> None:
    assert rate(PROGRAM.pinned["racy"][0]) >= 1


def test_racy_form_with_no_copy_to_hide_behind() -> None:
    rate("offload_reload/racy:work=0")  # informational: CUDA corrupts here with no stall at all


@pytest.mark.parametrize("text", ["offload_reload/correct::d2h#0+1", "offload_reload/correct:work=0:d2h#0+5",
                                  "offload_reload/correct"])
def test_correct_form_never_corrupts(text: str) -> None:
    assert rate(text) == 0


def test_cuda_counts_operations_as_the_simulator_does() -> None:
    s = Schedule.parse("offload_reload/correct")
    sim, gpu = execute(s), execute(s, backend="cuda")
    assert sim.run.op_counts == {k: v for k, v in gpu.run.op_counts.items() if k in sim.run.op_counts}
    assert set(gpu.run.op_counts) <= set(sim.run.op_counts)
