"""A device tensor indexed with indices on the host (``table[idx]``, ``table[mask] = 0``, ``index_put_``) runs as
ATen's advanced indexing runs it (``make_info``): a host mask expanded into its long indices on the host, each host
index moved to the device with a blocking copy on the current stream (the host waits for that stream), then the
kernel, launched as any other. Before, the simulator refused every such call ("expected all tensors on the
device"), a host error where torch runs the program: a wrong verdict. A list or a NumPy array as an index is made a
host tensor as torch makes it."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

import simdevice
from simdevice import Race

N = 1024


def _gathers(device: str) -> list[float]:
    table = torch.arange(64, dtype=torch.float32, device=device).view(16, 4)
    rows = table[torch.tensor([3, 7])]
    masked = table[torch.arange(16) < 2]
    table[torch.tensor([0, 1])] = 0.0
    table.index_put_((torch.tensor([2]),), torch.ones(4, device=device), accumulate=True)
    t = torch.zeros(4, 5, 6, device=device)
    m = torch.zeros(4, 5, dtype=torch.bool)
    m[1, 2] = m[3, 4] = True
    t[m] = 1.0
    t[:, torch.tensor([0, 4]), 1:3] += 2.0
    return [rows.sum().item(), masked.sum().item(), table.sum().item(), t.sum().item(), float(t[m, 1:2].numel())]


def _sequences(device: str) -> list[torch.Tensor]:
    t = torch.arange(32.0, device=device).view(8, 4)
    out = [t[[1, 3]], t[[True, False] * 4], t[([0, 2], [1, 3])], t[np.array([1, 2])], t[(np.array([1, 2]), [0, 1])],
           t[[0, 1], 1:3], t[:, [0, 3]], t[[1, 2], None], t[[[0], [1]], [0, 1]], t[np.array([True, False] * 4)],
           t[[]], t[list(range(8)) * 5]]
    t[[0, 2]] = 0.0
    t[:, [1]] += 1.0
    t[[True] * 8, 0] = 5.0
    return [o.cpu() for o in out] + [t.cpu()]


def _host_reads_after_an_index() -> None:
    """The index's blocking copy synchronized the current stream: the D2H before it has landed."""
    x = torch.arange(N, dtype=torch.float32, device="cuda")
    h = torch.empty(N, pin_memory=True)
    h.copy_(x, non_blocking=True)
    rows = x[torch.tensor([1, 2])]
    assert (h.sum().item(), rows.sum().item()) == (N * (N - 1) / 2, 3.0)


def _side_writes_after_an_index() -> None:
    """The host does not wait for the gather itself: a side stream's write of its table, unordered, races."""
    table = torch.arange(64, dtype=torch.float32, device="cuda").view(16, 4)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    rows = table[torch.tensor([3, 7])]
    with torch.cuda.stream(side):
        table.zero_()
    torch.cuda.current_stream().wait_stream(side)
    del rows


def _pinned_index_from_a_side_stream(wait: bool) -> None:
    """A pinned index a side stream's D2H fills: the move reads it, and must wait for that stream's event."""
    table = torch.arange(64, dtype=torch.float32, device="cuda").view(16, 4)
    dev_idx = torch.tensor([3, 7], device="cuda")
    idx = torch.empty(2, dtype=torch.long, pin_memory=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        idx.copy_(dev_idx, non_blocking=True)
        filled = torch.cuda.Event()
        filled.record()
    if wait:
        filled.synchronize()
    rows = table[idx]
    del rows


def _host_table_device_ids(device: str) -> list[float]:
    table = torch.arange(32.0).view(8, 4)
    ids = torch.tensor([1, 3], device=device)
    table[ids] = 0.0
    table.index_put_((ids,), torch.tensor(-1.0))
    return [table.sum().item()]


def _ids_from_a_side_stream(wait: bool) -> None:
    """A host table written at ids a side stream computes: the ids' D2H on the current stream must wait."""
    table = torch.arange(32.0).view(8, 4).pin_memory()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        ids = torch.arange(4, device="cuda") * 2
    if wait:
        torch.cuda.current_stream().wait_stream(side)
    table[ids] = 0.0


def _pinned_table_refilled_while_read(wait: bool) -> None:
    """The host's write of a pinned table at device ids waits for the current stream (the ids' blocking D2H): an
    H2D of the table on that stream is done by then; one on another stream is not."""
    table = torch.arange(32.0).view(8, 4).pin_memory()
    on_device = table.to("cuda", non_blocking=True)
    if not wait:
        copy = torch.cuda.Stream()
        with torch.cuda.stream(copy):
            again = table.to("cuda", non_blocking=True)
        del again
    table[torch.tensor([1, 3], device="cuda")] = 0.0  # (the host waited for the current stream: the H2D is done)
    del on_device


def test_a_host_tensor_written_at_device_indices_takes_them_to_the_host() -> None:
    """``cpu_table[ids] = 0`` with ``ids`` on the device: ATen moves the ids to the host (a blocking D2H on the
    current stream) and writes on the CPU. Before, the simulator refused it, a host error where torch runs."""
    with simdevice.cuda() as sim:
        got = _host_table_device_ids("cuda")
    sim.assert_clean()
    assert got == _host_table_device_ids("cpu")


def test_a_host_tensor_read_at_device_indices_is_refused_as_torch_refuses_it() -> None:
    """``cpu_table[ids]`` with ``ids`` on the device raises on a GPU ("indices should be either on cpu or on the
    same device as the indexed tensor (cpu)", an H100), where ``cpu_table[ids] = 0`` runs: so it does here."""

    def program() -> None:
        table = torch.arange(32.0).view(8, 4)
        table[torch.tensor([1, 3], device="cuda")]

    s = simdevice.cuda()
    s.run(program)
    errors = [str(r) for r in s.reports]
    assert len(errors) == 1, errors
    assert "indices should be either on cpu or on the same device as the indexed tensor (cpu)" in errors[0], errors


@pytest.mark.parametrize(
    ("program", "races"),
    [
        (lambda: _ids_from_a_side_stream(True), False),
        (lambda: _ids_from_a_side_stream(False), True),
        (lambda: _pinned_table_refilled_while_read(True), False),
        (lambda: _pinned_table_refilled_while_read(False), True),
    ],
    ids=["ids waited for", "ids not waited for", "the host waited for the stream", "another stream's H2D"],
)
def test_device_indices_of_a_host_tensor_are_a_blocking_d2h(program: Callable[[], None], races: bool) -> None:
    s = simdevice.cuda()
    s.run(program)
    if races:
        assert any(isinstance(r, Race) for r in s.reports), s.text()
    else:
        s.assert_clean()


def test_indexing_with_host_indices_computes_as_on_the_host() -> None:
    with simdevice.cuda() as sim:
        got = _gathers("cuda")
    sim.assert_clean()
    assert got == _gathers("cpu")


def test_lists_and_numpy_arrays_index_as_on_the_host() -> None:
    """torch's C++ makes a list or NumPy index into a tensor on the indexed tensor's device; the simulated tensor's
    shell is ``meta``, so the values were lost (before the host index was moved, such an index was refused): the
    simulated tensor makes them device tensors first, as torch makes them
    (test_a_list_index_is_a_device_tensor_as_torch_makes_it.py)."""
    with simdevice.cuda() as sim:
        got = _sequences("cuda")
    sim.assert_clean()
    want = _sequences("cpu")
    assert [g.shape for g in got] == [w.shape for w in want]
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


@pytest.mark.parametrize(
    ("program", "races"),
    [
        (_host_reads_after_an_index, False),
        (_side_writes_after_an_index, True),
        (lambda: _pinned_index_from_a_side_stream(True), False),
        (lambda: _pinned_index_from_a_side_stream(False), True),
    ],
    ids=["the host waits for the stream", "not for the gather", "a pinned index waited for", "one not waited for"],
)
def test_a_host_index_is_moved_by_a_blocking_copy(program: Callable[[], None], races: bool) -> None:
    s = simdevice.cuda()
    s.run(program)
    if races:
        assert any(isinstance(r, Race) for r in s.reports), s.text()
    else:
        s.assert_clean()
