"""Rule (dispatch._classify, ``OpFacts.out_variant``; dispatch._not_read): an out= overload's output tensors are
written, not read, whatever the overload calls them: ``add.out``'s ``out``, ``max.dim_max``'s ``max`` and
``max_values``, ``max_pool2d_with_indices_backward.grad_input``'s ``grad_input``. Before, only an argument named
``out`` was taken as an output (the overload's schema name, ``aten::max``, never ends in "out"), so an op whose outputs
have other names counted as reading them: a fresh output's uninitialized bytes counted as read, and a race with its
buffer was reported as a read. An in-place op still reads what it updates."""

from __future__ import annotations

from typing import Any

import torch

from reference.schedule import Schedule
from simdevice import SimDevice
from simdevice.dispatch import _not_read, classify

aten = torch.ops.aten


def test_the_keyword_only_outputs_of_an_out_overload_are_not_read() -> None:
    x = torch.randn(8, 4)
    vals, idx = torch.empty(4), torch.empty(4, dtype=torch.long)
    facts = classify(aten.max.dim_max)
    assert facts.out_variant
    kwargs = {"max": vals, "max_values": idx}
    assert _not_read(facts, (x, 0), kwargs, [x, vals, idx], [vals, idx]) == {id(vals), id(idx)}
    assert classify(aten.add.out).out_variant
    assert not classify(aten.add_.Tensor).out_variant  # it reads what it updates
    assert not classify(aten.add.Tensor).out_variant


def test_a_named_output_written_over_another_stream_s_write_is_no_stale_read() -> None:
    """``torch.max(x, 0, out=(vals, idx))`` over another stream's unordered (and late) write of ``vals``: the race is
    of two writes, and nothing read the other's bytes (there was a stale read of ``vals`` by ``max``)."""

    def program(dev: Any) -> None:
        x = torch.randn(8, 4, device=dev.device)
        vals = torch.zeros(4, device=dev.device)
        idx = torch.zeros(4, dtype=torch.long, device=dev.device)
        side = dev.Stream(name="side")
        side.wait_stream(dev.current_stream())
        with dev.stream(side):
            vals.fill_(1.0)
        torch.max(x, 0, out=(vals, idx))  # no wait for side's write
        dev.synchronize()

    reports = SimDevice(Schedule.parse("x.py::f::side#0+5")).run(program).reports
    assert [r.kind for r in reports] == ["race"], reports
    assert " writes device#" in str(reports[0]), reports
    assert "which fill_ on stream side #0" in str(reports[0]), reports
