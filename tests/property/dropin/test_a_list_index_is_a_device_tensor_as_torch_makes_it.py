"""A list or a NumPy array indexing a device tensor (``table[[1, 3]]``) is made a tensor on the indexed tensor's
device, as torch's ``sequenceToVariable`` makes it: a list by a blocking copy below the dispatch modes (no operation
a GPU run counts), a NumPy array by ``.to()`` (an ``_to_copy`` a GPU run's mode sees and counts). Autograd saves the
device index, so backward's ``index_put`` takes it as it is and the host waits for nothing there. The simulator made
them host tensors, which the index op moved to the device unseen (``Dispatcher._move_indices``): a NumPy index
counted one operation fewer than a GPU's run, and backward moved the saved host indices again, the host waiting for
the stream where a GPU's does not, which hid a race. (Seen on an H100, torch 2.11: ``t[[1, 3]]`` dispatched
``lift_fresh`` on a CUDA tensor, then ``index`` with CUDA indices, and its ``grad_fn._saved_indices`` were CUDA
tensors; ``t[np.array([1, 3])]`` dispatched ``_to_copy`` first.) ``tests/gpu/test_dropin_gpu.py`` runs
``tests/hazards.py::list_index_backward`` on a GPU."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import simdevice
from reference.schedule import Schedule
from simdevice import Race
from simdevice.search.targets import resolve

PROGRAM = "tests/hazards.py::list_index_backward"


def _host_steps(run: Any) -> list[str]:
    return [what for _, who, what in run.trace if who == "host"]


@pytest.mark.parametrize(("wait", "races"), [(0, True), (1, False)])
def test_backward_through_a_list_index_waits_for_nothing(wait: int, races: bool) -> None:
    """The H2D from pinned memory before the backward, stalled: the host refills the buffer under it, unless it
    synchronized the stream (backward's ``index_put`` with the saved device indices did not)."""
    s = Schedule.parse(f"{PROGRAM}:wait={wait}:default#7+20")
    out = resolve(s.program).run(s)
    assert any(isinstance(r, Race) for r in out.run.reports) == races, out.problems
    assert out.clean != races


def test_a_list_index_is_no_operation_and_a_numpy_index_one() -> None:
    def program() -> list[list[float]]:
        t = torch.arange(8.0, device="cuda")
        got = [t[[1, 3]], t[np.array([2, 5])], t[[True, False] * 4]]
        t[[0, 7]] = torch.tensor(-1.0)  # (a host value: a number is made a tensor on the device here, not on a GPU)
        return [g.cpu().tolist() for g in got] + [t.cpu().tolist()]

    run = simdevice.cuda().run(program)
    assert not run.reports, run.reports
    assert run.result == [[1.0, 3.0], [2.0, 5.0], [0.0, 2.0, 4.0, 6.0], [-1.0, 1, 2, 3, 4, 5, 6, -1.0]]
    assert _host_steps(run) == ["arange", "index", "_to_copy", "index", "index", "index_put_", "_to_copy",
                                "_to_copy", "_to_copy", "_to_copy"]


def test_autograd_saves_the_device_index() -> None:
    def program() -> list[str]:
        table = torch.zeros(4, 2, device="cuda", requires_grad=True)
        rows = table[[1, 3]]
        return [str(i.device) for i in rows.grad_fn._saved_indices]

    run = simdevice.cuda().run(program)
    assert run.result == ["cuda:0"]
