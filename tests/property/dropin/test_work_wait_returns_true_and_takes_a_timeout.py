"""Rule (api.SimWork.wait): a work handle's ``wait()`` answers True, as ``torch.distributed.Work.wait`` does (code
that asserts on it, or that branches on it, ran differently here: it got None), and takes torch's ``timeout``
(a ``timedelta``: ProcessGroupNCCL then blocks the host until the collective is done, besides making the current
stream wait); before, ``wait(timeout=...)`` raised TypeError, and a run that uses it got a host error of the
simulator's own making."""

from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as dist

import simdevice


def test_wait_answers_true_as_torch_s_work_does() -> None:
    answers: dict[int, object] = {}

    def program() -> None:
        t = torch.ones(4, device="cuda")
        answers[dist.get_rank()] = dist.all_reduce(t, async_op=True).wait()

    s = simdevice.cuda()
    s.run(program, world_size=2)
    s.assert_clean()
    assert answers == {0: True, 1: True}


def test_a_timed_wait_blocks_the_host_until_the_collective_is_done() -> None:
    """With a timeout the host waits too: a host that then only polls the work sees it done (an untimed wait
    returns at once, leaving the host ahead of the collective, which a rank that comes late holds back)."""
    seen: dict[tuple[int, bool], bool] = {}

    def program(timed: bool) -> None:
        r = dist.get_rank()
        if r == 1:
            time.sleep(0.005)  # the peer comes late: the collective cannot complete before it does
        t = torch.ones(4, device="cuda")
        work = dist.all_reduce(t, async_op=True)
        assert work.wait(timeout=datetime.timedelta(seconds=30)) if timed else work.wait()
        seen[(r, timed)] = work.is_completed()
        assert t.cpu().tolist() == [2.0] * 4

    for timed in (True, False):
        s = simdevice.cuda()
        s.run(program, timed, world_size=2)
        s.assert_clean()
    assert seen[(0, True)]
    assert seen[(1, True)]
    assert not seen[(0, False)], "an untimed wait blocked the host (ProcessGroupNCCL's only makes the stream wait)"
