"""Rule (Runtime.engine_leave): when a backward node that ran on its forward op's side stream is done, the stream
``backward()`` was called on is current again, so after ``loss.backward()`` the program's current stream is the
one it was before (and what it issues next goes there, not to the side stream)."""

from __future__ import annotations

import torch

import simdevice


def _backward_of_a_side_stream_forward() -> tuple[str, str, str]:
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8, device="cuda")
    x = torch.randn(4, 8, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    before = torch.cuda.current_stream()
    with torch.cuda.stream(side):
        loss = torch.nn.functional.gelu(lin(x)).pow(2).mean()
    loss.backward()  # its nodes run on the side stream
    return str(before), str(torch.cuda.current_stream()), str(side)


def test_the_current_stream_after_backward_is_the_one_before() -> None:
    s = simdevice.cuda()
    s.run(_backward_of_a_side_stream_forward)
    s.assert_clean()
    assert s.result is not None
    before, after, side = s.result.result
    assert before != side
    assert after == before
