"""``torch._foreach_copy_`` between host and device lists (a bucket of weights prefetched from pinned memory in one
call, or offloaded in one): CUDA's kernel takes its slow route there, ``copy_`` of each pair in turn, so the call is
one operation with each pair's copy semantics: a non-blocking copy from pinned memory is asynchronous, a pageable
source is staged at the call, a pageable destination makes the host wait, and a blocking one waits. Before, the
simulator refused it ("expected all tensors on the device"), a host error where torch runs the program."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import simdevice
from simdevice import Race

N = 1024


def _prefetch(wait: bool) -> None:
    pinned = [torch.full((N,), float(i + 1)).pin_memory() for i in range(3)]
    weights = [torch.empty(N, device="cuda") for _ in range(3)]
    copy = torch.cuda.Stream()
    copy.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(copy):
        torch._foreach_copy_(weights, pinned, non_blocking=True)
    if wait:
        torch.cuda.current_stream().wait_stream(copy)  # wait: the compute reads what the H2D writes
    assert [w.sum().item() for w in weights] == [float((i + 1) * N) for i in range(3)]


def _offload(sync: bool, pin: bool = True) -> None:
    grads = [torch.full((N,), float(i + 1), device="cuda") for i in range(3)]
    host = [torch.empty(N, pin_memory=pin) for _ in range(3)]
    torch._foreach_copy_(host, grads, non_blocking=True)
    if sync:
        torch.cuda.synchronize()  # the host reads what the D2H writes
    assert [h.sum().item() for h in host] == [float((i + 1) * N) for i in range(3)]


def _refill(non_blocking: bool) -> None:
    pinned = [torch.ones(N).pin_memory() for _ in range(2)]
    weights = [torch.empty(N, device="cuda") for _ in range(2)]
    torch._foreach_copy_(weights, pinned, non_blocking=non_blocking)
    for p in pinned:
        p.fill_(5.0)  # a blocking copy has read it: the host may refill it
    assert [w.sum().item() for w in weights] == [float(N)] * 2


@pytest.mark.parametrize(
    ("program", "races"),
    [
        (lambda: _prefetch(True), False),
        (lambda: _prefetch(False), True),
        (lambda: _offload(True), False),
        (lambda: _offload(False), True),
        (lambda: _offload(False, pin=False), False),
        (lambda: _refill(False), False),
        (lambda: _refill(True), True),
    ],
    ids=["prefetch waited", "prefetch not waited", "offload synchronized", "offload not", "offload to pageable",
         "blocking refill", "non-blocking refill"],
)
def test_a_foreach_copy_across_devices_is_each_pair_s_copy(program: Callable[[], None], races: bool) -> None:
    s = simdevice.cuda()
    s.run(program)
    if races:
        assert any(isinstance(r, Race) for r in s.reports), s.text()
    else:
        s.assert_clean()
