"""A copy between pinned memory and the device that is no single memcpy goes through temporaries, as ATen's CUDA copy
makes it (``copy_kernel_cuda``, ``copy_requires_temporaries``: a different dtype, or layouts that do not coalesce
into one contiguous run, e.g. a column of a pinned matrix):

- host to device: the host makes the pinned source contiguous (``src.expand_as(dst).contiguous()``; for a blocking
  copy also its dtype conversion) *at issue*, into pageable memory the copy then stages. So the host reads the
  pinned buffer then: a D2H still filling it races even where the copying stream waited for that D2H's event, and
  the host may overwrite the buffer right after the call. A mutant that reads the strided source on the stream, as
  a contiguous one is read, misses the first race and reports the second overwrite; one that takes a copy of another
  dtype for one memcpy misses the blocking conversion's read (a non-blocking one converts on the device: no read).
- device to host, non-blocking, into a pinned view that is not contiguous: the copy lands in a pageable temporary
  (synchronous, as CUDA's copy into pageable memory is) that the host then copies into the view: the host may read
  it at once. A mutant that keeps it asynchronous reports that read.

The contiguous forms stay asynchronous (the controls).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from simdevice import Race, SimDevice

N = 1024


def _d2h_then_waited(shape: tuple[int, ...], h2d: Any) -> Any:
    """A program: a D2H into a pinned buffer of ``shape`` on a side stream, the current stream waiting for its event
    (the host does not), then ``h2d(dev, pinned)`` on the current stream."""

    def program(dev: Any) -> None:
        x = torch.full(shape, 1.5, device=dev.device)
        pinned = torch.empty(*shape, pin_memory=True)
        side = dev.Stream(name="side")
        side.wait_stream(dev.current_stream())
        with dev.stream(side):
            pinned.copy_(x, non_blocking=True)
            done = dev.Event()
            done.record()
        dev.current_stream().wait_event(done)  # the stream waits: the host does not
        h2d(dev, pinned)
        dev.synchronize()

    return program


def _d2h_then_waited_h2d(strided: bool) -> Any:
    def h2d(dev: Any, pinned: torch.Tensor) -> None:
        y = torch.empty(N, device=dev.device)
        y.copy_(pinned[:, 0] if strided else pinned.view(-1)[:N], non_blocking=True)

    return _d2h_then_waited((N, 2), h2d)


def _d2h_then_waited_converting_h2d(non_blocking: bool) -> Any:
    def h2d(dev: Any, pinned: torch.Tensor) -> None:
        y = torch.empty(N, dtype=torch.float64, device=dev.device)
        y.copy_(pinned, non_blocking=non_blocking)  # float32 into float64

    return _d2h_then_waited((N,), h2d)


def _h2d_then_overwrite(strided: bool) -> Any:
    def program(dev: Any) -> None:
        pinned = torch.full((N, 2), 2.0, pin_memory=True)
        y = torch.empty(N, device=dev.device)
        y.copy_(pinned[:, 0] if strided else pinned.view(-1)[:N], non_blocking=True)
        pinned.fill_(7.0)  # the host's next use of its staging buffer
        dev.synchronize()

    return program


def _d2h_then_read(strided: bool) -> Any:
    def program(dev: Any) -> float:
        x = torch.full((N,), 3.0, device=dev.device)
        pinned = torch.zeros(N, 2, pin_memory=True)
        view = pinned[:, 0] if strided else pinned.view(-1)[:N]
        view.copy_(x, non_blocking=True)
        got = float(view.sum())  # at once, no synchronization
        dev.synchronize()
        return got

    return program


def _races(program: Any) -> list[Race]:
    return [r for r in SimDevice().run(program).reports if isinstance(r, Race)]


def test_a_strided_pinned_source_is_read_by_the_host_at_issue_a_stream_wait_orders_nothing() -> None:
    races = _races(_d2h_then_waited_h2d(strided=True))
    assert [(r.current.on, r.previous.actor) for r in races] == [("host", "side")]
    assert _races(_d2h_then_waited_h2d(strided=False)) == []


def test_a_blocking_copy_from_pinned_memory_into_another_dtype_converts_on_the_host_at_issue() -> None:
    races = _races(_d2h_then_waited_converting_h2d(non_blocking=False))
    assert [(r.current.on, r.previous.actor) for r in races] == [("host", "side")]
    assert _races(_d2h_then_waited_converting_h2d(non_blocking=True)) == []


def test_a_strided_pinned_source_may_be_overwritten_right_after_the_copy() -> None:
    assert _races(_h2d_then_overwrite(strided=True)) == []
    assert len(_races(_h2d_then_overwrite(strided=False))) == 1


@pytest.mark.parametrize("strided", [True, False])
def test_a_non_blocking_copy_into_a_strided_pinned_view_is_synchronous(strided: bool) -> None:
    run = SimDevice().run(_d2h_then_read(strided))
    if strided:
        assert run.reports == ()
        assert run.result == 3.0 * N
    else:
        assert any(isinstance(r, Race) for r in run.reports)
