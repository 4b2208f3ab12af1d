"""``torch.tensor(data, device="cuda")`` of Python data (a list, a number; also ``as_tensor``, ``asarray``,
``t.new_tensor``, in a ``torch.cuda.stream`` block too): torch makes the tensor on the host and copies it to the
device with the dispatcher's Python keys excluded (``internal_new_from_data``, torch/csrc/utils/tensor_new.cpp), so a
GPU run's dispatch mode sees only ``lift_fresh``, a view: ``replay --gpu`` counts no operation. The simulator counted
a host step and a stream operation (``_to_copy (H2D)``), so every index of a schedule after one named another
operation on the GPU. A NumPy array or a tensor torch moves with ``.to()``, an ``_to_copy`` both count. (Seen on an
H100 and an H200, torch 2.11: the mode saw ``lift_fresh`` alone for each of the Python data above, and
``_to_copy`` for a NumPy array and a host tensor; with a 100 ms kernel queued, ``torch.tensor([1.0],
device="cuda")`` returned after 101 ms: the copy is blocking.) The copy keeps its semantics here: the host waits for
the current stream, whose write it is. ``tests/gpu/test_dropin_gpu.py`` runs the same program on a GPU."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import simdevice
from reference.schedule import Schedule
from simdevice import Race
from simdevice.search.targets import resolve

PROGRAM = "tests/hazards.py::python_data_on_device"


def _steps(trace: Any, actor: str) -> list[str]:
    return [what for _, who, what in trace if who == actor and not what.startswith(("done ", "stall "))]


def test_python_data_takes_no_step_and_no_operation_where_numpy_and_tensors_take_one() -> None:
    s = Schedule.parse(PROGRAM)
    out = resolve(s.program).run(s)
    assert out.clean, out.problems
    # what a GPU run's mode counts (tests/hazards.py::python_data_on_device): the arange, the NumPy array's and the
    # host tensor's moves, the D2H, the host's read of the pinned copy, the cat and its read; the lists' and the
    # numbers' copies none
    assert _steps(out.run.trace, "host") == ["arange", "_to_copy", "_to_copy", "copy_", "equal", "cat",
                                             "_to_copy"]
    assert _steps(out.run.trace, "default") == ["start arange #0", "start _to_copy (H2D) #1",
                                                "start _to_copy (H2D) #2", "start copy_ (D2H) #3", "start cat #4",
                                                "start _to_copy (D2H) #5"]
    assert {k: v for k, v in out.run.op_counts.items() if v} == {"host": 7, "default": 6}


@pytest.mark.parametrize(("wait", "races"), [(1, False), (0, True)])
def test_the_copy_waits_for_the_current_stream(wait: int, races: bool) -> None:
    """The D2H into pinned memory, stalled, has landed when the host reads it after a list is put on the device (the
    copy waited for its stream); without that copy the read races with the D2H."""
    s = Schedule.parse(f"{PROGRAM}:wait={wait}:default#3+20")
    out = resolve(s.program).run(s)
    assert any(isinstance(r, Race) for r in out.run.reports) == races, out.problems
    assert out.clean != races


def test_the_copy_in_a_side_stream_block_waits_for_that_stream_and_is_ordered_before_later_work() -> None:
    """In a ``torch.cuda.stream(side)`` block the copy is ``side``'s: the host waits for ``side``, so a D2H on it has
    landed when the host reads it, and the default stream's later read of the new tensor is ordered after the write
    (the host saw it done)."""
    n = 1 << 16

    def program() -> list[float]:
        side = torch.cuda.Stream()
        src = torch.arange(n, dtype=torch.float32, device="cuda")
        pinned = torch.empty(n, pin_memory=True)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            pinned.copy_(src, non_blocking=True)
            made = torch.tensor([3.0, 4.0], device="cuda")
        assert torch.equal(pinned, torch.arange(n, dtype=torch.float32))
        return (made * 2).cpu().tolist()

    run = simdevice.cuda().run(program)
    assert not run.reports, run.reports
    assert run.result == [6.0, 8.0]
    assert [k for k, v in run.op_counts.items() if v] == ["host", "default", "side"]
    assert run.op_counts["side"] == 1  # the D2H alone


def test_empty_data_waits_for_nothing() -> None:
    """A copy of no bytes returns at once on CUDA (``copy_`` of none): no wait for the stream."""

    def program() -> int:
        x = torch.ones(1 << 16, device="cuda")
        pinned = torch.empty(1 << 16, pin_memory=True)
        pinned.copy_(x, non_blocking=True)
        empty = torch.tensor([], device="cuda")
        pinned.sum()  # the host reads the D2H's destination: nothing waited for it
        return int(empty.numel())

    run = simdevice.cuda().run(program)
    assert run.result == 0
    assert any(isinstance(r, Race) for r in run.reports), run.reports


def test_asarray_of_a_numpy_scalar_is_moved_by_to_as_a_numpy_array_is() -> None:
    """``torch.asarray`` moves a NumPy scalar with ``.to()`` (as a NumPy array, not as Python data): an ``_to_copy``
    a GPU run's mode counts (a mutant that took it for Python data made it an unseen copy: no step)."""

    def program() -> float:
        return float(torch.asarray(np.float32(3.0), device="cuda").cpu().item())

    run = simdevice.cuda().run(program)
    assert not run.reports, run.reports
    assert run.result == 3.0
    assert _steps(run.trace, "host") == ["_to_copy", "_to_copy"]  # the move, then .cpu()


@pytest.mark.parametrize(("kind", "op", "waits"), [(0, "copy_ (H2D)", True), (1, "index_put_", True),
                                                   (2, "fill_", False), (3, "index_put_", False)])
def test_a_number_assigned_is_a_host_value_as_torch_makes_it_for_a_cuda_tensor(kind: int, op: str,
                                                                                waits: bool) -> None:
    """``t[0] = 2.0`` and its kin (``tests/hazards.py::assigned_numbers``): torch makes the number a host tensor
    for a CUDA tensor (the simulator made it a device ``scalar_tensor``, an operation a GPU run does not count, and
    copied it device to device without the host waiting). On an H100 (docs/confirmations.md, thirtieth run) the
    host waits for the stream at ``t[0] = 2.0`` (a blocking copy) and at ``t[idx] = 1.0`` (the kernel moves its
    value so), not at ``t[2:4] = 3.0`` nor at a mask's fill; each is one operation."""
    line = f"tests/hazards.py::assigned_numbers:kind={kind}:default#3+20"
    out = resolve("tests/hazards.py::assigned_numbers").run(Schedule.parse(line))
    assert _steps(out.run.trace, "host")[4] == op.split(" ")[0]
    assert out.run.op_counts["default"] == 5, out.run.op_counts  # (arange, zeros, lt, the D2H, the assignment)
    assert not any("scalar_tensor" in what for _, _, what in out.run.trace)
    assert out.clean == waits, out.problems
    if waits:
        assert f"start {op} #4" in _steps(out.run.trace, "default")


def block_table_into_a_block_still_read() -> None:
    """A swap-in on a side stream reads its destination rows from a device tensor the host then drops without
    ``record_stream``; the block table made next with ``torch.tensor(list, device="cuda")`` takes its block, and the
    current stream waits for the swap-in only after that."""
    cache = torch.zeros(8, 64, device="cuda")
    swap = torch.cuda.Stream()
    dst = torch.tensor([3, 4], device="cuda")
    swap.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(swap):
        cache.index_copy_(0, dst, torch.ones(2, 64, device="cuda"))
    del dst
    table = torch.tensor([5, 6], device="cuda")  # the uncounted copy: into dst's block
    torch.cuda.current_stream().wait_stream(swap)
    assert cache[table].sum().item() == 0.0


def test_a_fix_before_an_uncounted_copy_is_inserted_there_and_checked() -> None:
    """The race is the uncounted copy's write into a block the swap stream may still read; the fix makes the current
    stream wait before that copy. The edge matched no operation there (the copy is not counted), so the fix was
    found "not enough" though it is the fix."""
    from simdevice.explain import suggest
    from simdevice.search.explore import as_target

    found = simdevice.explore(block_table_into_a_block_still_read, max_examples=30).failure
    assert found is not None
    assert any(isinstance(r, Race) and r.current.op == "H2D" for r in found.run.reports), found.text()
    fix = suggest(as_target(block_table_into_a_block_still_read), found, schedules=20)
    assert fix.checked, fix.lines()
