"""``Work.get_future()`` and ``Work.result()`` of a collective, as ProcessGroupNCCL gives them: the future is done as
the collective is issued, its value the output tensors (``result()`` too), which NCCL's stream may still be
writing; ``wait()`` makes the current stream wait for it (the host goes on), ``value()`` does not wait, and
``then(fn)`` calls ``fn`` at once with a new stream current that waits first, its future's value written on that
stream. Before, ``get_future()`` and ``result()`` raised ``NotImplementedError`` (no verdict). A read of the value
without a wait is a race with the collective, or with the callback's stream."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

import simdevice
from simdevice import Race, StaleRead


def _all_reduce_future(read: str) -> None:
    r, w = dist.get_rank(), dist.get_world_size()
    t = torch.full((4,), float(r + 1), device="cuda")
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    assert fut.done()
    assert work.result()[0] is t
    total = float(sum(range(1, w + 1)))
    if read == "value":  # no wait: the current stream reads what NCCL's may still be writing
        assert (fut.value()[0] * 2).cpu().tolist() == [2 * total] * 4
        return
    if read == "wait":
        assert (fut.wait()[0] * 2).cpu().tolist() == [2 * total] * 4
        return
    mean = fut.then(lambda f: f.value()[0].div_(w))  # (a DDP comm hook's form)
    got = mean.value() if read == "then-value" else mean.wait()
    assert (got * 1).cpu().tolist() == [total / w] * 4


def _all_gather_future() -> None:
    w = dist.get_world_size()
    outs = [torch.zeros(2, device="cuda") for _ in range(w)]
    fut = dist.all_gather(outs, torch.full((2,), float(dist.get_rank()), device="cuda"), async_op=True).get_future()
    got = fut.wait()
    assert len(got) == w
    assert [x.cpu().tolist() for x in got] == [[float(q)] * 2 for q in range(w)]


@pytest.mark.parametrize("read", ["wait", "then-wait"])
def test_a_future_waited_for_is_clean_and_holds_the_outputs(read: str) -> None:
    s = simdevice.cuda()
    s.run(_all_reduce_future, read, world_size=2)
    s.assert_clean()


@pytest.mark.parametrize("read", ["value", "then-value"])
def test_a_future_s_value_read_without_a_wait_is_a_race(read: str) -> None:
    s = simdevice.cuda()
    s.run(_all_reduce_future, read, world_size=2)
    assert any(isinstance(r, (Race, StaleRead)) for r in s.reports), s.text()


def test_an_all_gather_s_future_holds_its_list() -> None:
    s = simdevice.cuda()
    s.run(_all_gather_future, world_size=2)
    s.assert_clean()


def test_what_a_callback_raises_is_its_future_s_to_raise() -> None:
    def program() -> None:
        t = torch.ones(4, device="cuda")
        fut = dist.all_reduce(t, async_op=True).get_future()

        def fails(f: object) -> None:
            raise ValueError("the hook failed")

        child = fut.then(fails)
        # (an H100's words: docs/confirmations.md, fifty-fifth run)
        with pytest.raises(RuntimeError, match=r"^Got the following error when running the callback: ValueError: "
                                               r"the hook failed$"):
            child.wait()

    s = simdevice.cuda()
    s.run(program, world_size=2)
    s.assert_clean()


def _value_freed_under_its_callback(n: int = 1 << 18) -> float:
    """The future's value is dropped as soon as the callback is queued, and its block taken by the next allocation on
    the default stream, while the callback's copy (on its pool stream, stalled by the schedule) may still read it."""
    t = torch.full((n,), float(dist.get_rank() + 1), device="cuda")
    out = torch.zeros(n, device="cuda")
    fut = dist.all_reduce(t, async_op=True).get_future()
    done = fut.then(lambda f: out.copy_(f.value()[0]))
    del t, fut
    time.sleep(0.003)  # (the host wakes after the all-reduce, before the stalled callback's copy)
    reuse = torch.zeros(n, device="cuda")  # (the dropped value's block, where nothing holds it)
    got = done.wait()
    return float(got.sum().item()) + float(reuse.sum().item())


def test_a_future_s_value_is_held_by_the_stream_its_callback_reads_it_on() -> None:
    """Rule (``SimWorkFuture._held_by_current``): a future records its value on the stream that waits for it (the
    callback's, and ``wait()``'s current stream), as torch's future does (``recordDataPtrOnStream``): the caching
    allocator hands its block on only once that stream is past the wait. Stalled, the callback's copy reads the
    reduced values, and nothing races. Mutation: the record left out: the block is handed to ``reuse`` and zeroed
    under the stalled copy, a race."""
    s = simdevice.cuda("rank0.s1#0+5")
    s.run(_value_freed_under_its_callback, world_size=2)
    s.assert_clean()
    assert s.result is not None
    assert s.result.result == [3.0 * (1 << 18)] * 2


def _value_freed_under_a_side_stream_s_read(n: int = 1 << 18) -> float:
    """The same, for ``wait()``: a side stream waits for the future and reads its value (stalled), and the value is
    dropped and its block taken on the default stream meanwhile."""
    t = torch.full((n,), float(dist.get_rank() + 1), device="cuda")
    fut = dist.all_reduce(t, async_op=True).get_future()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        doubled = fut.wait()[0] * 2
    del t, fut
    time.sleep(0.003)
    reuse = torch.zeros(n, device="cuda")
    torch.cuda.synchronize()
    return float(doubled.sum().item()) + float(reuse.sum().item())


def test_a_future_s_value_is_held_by_the_stream_that_waits_for_it() -> None:
    """Mutation: ``wait()``'s record left out: the block is handed to ``reuse`` under the side stream's read."""
    s = simdevice.cuda("rank0.side#0+5")
    s.run(_value_freed_under_a_side_stream_s_read, world_size=2)
    s.assert_clean()
    assert s.result is not None
    assert s.result.result == [6.0 * (1 << 18)] * 2
