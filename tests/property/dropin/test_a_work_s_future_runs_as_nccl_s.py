"""``Work.get_future()`` and ``Work.result()`` of a collective, as ProcessGroupNCCL gives them: the future is done as
the collective is issued, its value the output tensors (``result()`` too), which NCCL's stream may still be
writing; ``wait()`` makes the current stream wait for it (the host goes on), ``value()`` does not wait, and
``then(fn)`` calls ``fn`` at once with a new stream current that waits first, its future's value written on that
stream. Before, ``get_future()`` and ``result()`` raised ``NotImplementedError`` (no verdict). A read of the value
without a wait is a race with the collective, or with the callback's stream."""

from __future__ import annotations

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
