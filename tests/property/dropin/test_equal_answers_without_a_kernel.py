"""``torch.equal`` of two device tensors answers on the host where ATen's ``cuda_equal`` does, with no kernel and no
wait: two shapes (False), no elements (True), the same view of the same bytes (True). The simulator compared their
values on the stream and made the host wait for the answer every time, which hid a race a GPU shows: a program that
reads a copy's destination after such an ``equal`` read it before the copy landed on a GPU (an H100 flagged none of
these as synchronizing: ``tests/hazards.py``'s ``SYNC_DEBUG_CASES``, docs/confirmations.md). Two tensors of one
shape are compared on the stream, the host waiting, as before."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import simdevice
from simdevice import Race


def _read_after_equal(pick: Any) -> Any:
    def program() -> None:
        x = torch.arange(4096, dtype=torch.float32, device="cuda")
        host = torch.empty(4096, pin_memory=True)
        host.copy_(x, non_blocking=True)
        pick(x)  # the only thing between the copy and the host's read
        assert float(host[-1]) == 4095.0

    run = simdevice.cuda()
    run.run(program)
    return run.result


@pytest.mark.parametrize(("pick", "answer"), [
    (lambda x: torch.equal(x, x), True),
    (lambda x: torch.equal(x, x.view(64, 64).view(4096)), True),
    (lambda x: torch.equal(x, x[:8]), False),
    (lambda x: torch.equal(x[:0], x[4:4]), True),
], ids=["itself", "the same view", "two shapes", "no elements"])
def test_an_answer_without_a_kernel_makes_no_wait(pick: Any, answer: bool) -> None:
    seen: list[bool] = []
    result = _read_after_equal(lambda x: seen.append(pick(x)))
    assert seen == [answer]
    assert any(isinstance(r, Race) for r in result.reports)  # the host read the pinned buffer unordered


@pytest.mark.parametrize("pick", [lambda x: torch.equal(x, x + 0), lambda x: torch.equal(x[:8], x[8:16]),
                                  lambda x: torch.equal(x, x.to(torch.float64).to(torch.float32))],
                         ids=["another tensor", "another view", "a copy"])
def test_values_compared_on_the_stream_make_the_host_wait(pick: Any) -> None:
    result = _read_after_equal(pick)
    assert not result.reports
