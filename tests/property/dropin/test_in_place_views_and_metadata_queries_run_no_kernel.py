"""In-place views (``squeeze_``, ``unsqueeze_``, ``t_``, ``transpose_``, ``swapdims_``, ``swapaxes_``,
``as_strided_``) change the device tensor's own shape, strides and offset, as on a GPU, with no kernel; and the
metadata queries (``is_same_size``, ``is_set_to``, ``dense_dim``, ``sparse_dim``) read no bytes and wait for no
stream. Before, each was a stream operation: an in-place view changed the bytes' alias alone, so the tensor kept
its old shape and the next operation raised on the stream (``quantile`` of a number, which ends in ``squeeze_``,
gave a shape of ``(1,)`` for ``()``); a query read both tensors' bytes on the current stream (a race reported with a
side stream's write, a GPU reads none) and made the host wait for it (a wait a GPU does not make, which could hide
a race). ``tests/hazards.py::inplace_views_reload`` runs on a GPU in ``tests/gpu/test_dropin_gpu.py``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from hazard_checks import races_only_unwaited

import simdevice

VIEWS: dict[str, Callable[[torch.Tensor], Any]] = {
    "squeeze_": lambda t: t.view(1, 12).squeeze_(),
    "squeeze_ dim": lambda t: t.view(1, 12).squeeze_(0),
    "squeeze_ dims": lambda t: t.view(1, 12, 1).squeeze_((0, 2)),
    "unsqueeze_": lambda t: t.unsqueeze_(1),
    "t_": lambda t: t.view(3, 4).t_(),
    "transpose_": lambda t: t.view(3, 4).transpose_(0, 1),
    "swapdims_": lambda t: t.view(2, 6).swapdims_(0, 1),
    "swapaxes_": lambda t: t.view(2, 6).swapaxes_(0, 1),
    "as_strided_": lambda t: t.as_strided_((3, 2), (1, 3), 2),
    "a view's unsqueeze_": lambda t: t[4:10].unsqueeze_(0),
}


def _run(program: Callable[[], Any]) -> Any:
    s = simdevice.cuda()
    s.run(program)
    assert s.result is not None
    assert not s.result.reports, [str(r) for r in s.result.reports]
    return s.result


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_an_in_place_view_changes_the_tensor_s_own_layout_with_no_kernel(name: str) -> None:
    want = VIEWS[name](torch.arange(12.0))
    got: list[Any] = []

    def program() -> None:
        t = torch.arange(12.0, device="cuda")
        before = t * 1.0  # (a kernel on the stream: the count below starts after it)
        out = VIEWS[name](t)
        got.append((tuple(out.shape), out.stride(), out.storage_offset(), out.cpu(), (out * 2.0).cpu(), before))

    run = _run(program)
    shape, stride, offset, values, doubled, _ = got[0]
    assert (shape, stride, offset) == (tuple(want.shape), want.stride(), want.storage_offset())
    assert torch.equal(values, want)
    assert torch.equal(doubled, want * 2.0)
    # arange, the mul before, the copy of the view back, the mul after and its copy back: no in-place view
    assert run.op_counts["default"] == 5


def test_quantile_of_a_number_is_a_0_d_tensor() -> None:
    got: list[Any] = []
    _run(lambda: got.append(torch.quantile(torch.arange(16.0, device="cuda"), 0.25).shape))
    assert got == [torch.quantile(torch.arange(16.0), 0.25).shape] == [torch.Size([])]


QUERIES: dict[str, Callable[[torch.Tensor, torch.Tensor], Any]] = {
    "is_same_size": lambda x, y: y.is_same_size(x),
    "is_same_size of a host tensor": lambda x, y: y.is_same_size(torch.empty(y.shape)),
    "is_set_to": lambda x, y: y.is_set_to(x),
    "dense_dim": lambda x, y: y.dense_dim(),
    "sparse_dim": lambda x, y: y.sparse_dim(),
}


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_a_metadata_query_reads_no_bytes_and_waits_for_no_stream(name: str) -> None:
    """``y`` is written on a side stream with no wait by the current one: a query of it reads nothing (no race),
    and the host goes on without waiting, so its read of the side stream's D2H still races."""
    got: list[Any] = []

    def program() -> None:
        x = torch.arange(1 << 12, dtype=torch.float32, device="cuda")
        pinned = torch.empty(1 << 12, pin_memory=True)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            pinned.copy_(x, non_blocking=True)
            y = x * 1.0
        got.append(QUERIES[name](x, y))
        pinned.sum()  # (the host's read of the D2H's destination)

    s = simdevice.cuda()
    s.run(program)
    assert s.result is not None
    races = [str(r) for r in s.result.reports if r.kind == "race"]
    assert len(races) == 1, races
    assert races[0].startswith("race: sum on host host "), races
    assert "default" not in s.result.op_counts or s.result.op_counts["default"] == 1  # arange alone
    x, y = torch.arange(1 << 12, dtype=torch.float32), torch.arange(1 << 12, dtype=torch.float32) * 1.0
    assert got == [QUERIES[name](x, y)]


def test_the_reshaped_tensor_s_output_races_only_unwaited() -> None:
    """``tests/hazards.py::inplace_views_reload`` (what tests/gpu runs on a GPU)."""
    races_only_unwaited("inplace_views_reload", "side#0+20")
