"""Rule (distributed.send/recv/isend/irecv/batch_isend_irecv, Collectives.point_to_point): point-to-point calls run
as ProcessGroupNCCL runs them. A call runs on the stream of its pair of ranks (``rank0.p2p1-nccl``), apart from the
collectives' stream, after the calling stream; the k-th send from rank i to rank j is the k-th receive on j from i;
the work's ``wait()`` (``send`` and ``recv`` call it) makes the current stream wait, the host goes on. A pipeline
that waits before it reuses the send buffer, and before it reads the received one, is clean; one that does not races.
Two ranks that each send first, in calls of their own, wait for each other forever (NCCL's send holds its stream until
the receive), where a ``batch_isend_irecv`` of both is one group and completes. Before, every one of these calls
raised NotImplementedError: a pipeline-parallel program got no verdict."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

import simdevice
from simdevice.explain import suggest
from simdevice.search.explore import as_target

N = 256


def _reports(fn: Any, *args: Any, schedule: str | None = None) -> list[str]:
    s = simdevice.cuda(schedule)
    s.run(fn, *args, world_size=2)
    assert s.result is not None
    return [r.kind for r in s.result.reports]


def pipeline(mode: str) -> None:
    """Two stages: rank 0 sends each microbatch's activations from one buffer, rank 1 receives and uses them.
    ``reuse``: rank 0 writes the buffer again before the send's wait; ``early``: rank 1 reads before the receive's."""
    r = dist.get_rank()
    buf = torch.empty(N, device="cuda")
    for mb in range(2):
        if r == 0:
            buf.fill_(float(mb + 1))
            work = dist.isend(buf, 1)
            if mode == "reuse":
                buf.fill_(-1.0)
            work.wait()  # wait: the send must have read the buffer before it is written again
        else:
            work = dist.irecv(buf, 0)
            if mode != "early":
                work.wait()  # wait: the receive must have landed before the stage reads it
            assert (buf * 2).sum().item() == 2 * (mb + 1) * N


@pytest.mark.parametrize("schedule", [None, "rank0.p2p1-nccl#0+5", "rank1#1+5", "rank0.default#1+5"])
def test_a_pipeline_that_waits_is_clean(schedule: str | None) -> None:
    assert _reports(pipeline, "ok", schedule=schedule) == []


@pytest.mark.parametrize("mode", ["reuse", "early"])
def test_a_pipeline_that_does_not_wait_races(mode: str) -> None:
    assert "race" in _reports(pipeline, mode, schedule="rank0.p2p1-nccl#0+5")


def exchange(batched: bool, ordered: bool) -> None:
    """Each rank sends its tensor to the other and receives the other's: blocking calls in opposite orders on the two
    ranks (``ordered``) or both sending first, or one ``batch_isend_irecv``."""
    r = dist.get_rank()
    x = torch.full((N,), float(r + 1), device="cuda")
    y = torch.empty(N, device="cuda")
    if batched:
        for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, x, 1 - r), dist.P2POp(dist.irecv, y, 1 - r)]):
            w.wait()
    elif r == 0 or not ordered:
        dist.send(x, 1 - r)
        assert dist.recv(y, 1 - r) == 1 - r
    else:
        assert dist.recv(y, 1 - r) == 1 - r
        dist.send(x, 1 - r)
    assert y.sum().item() == (2 - r) * N


def test_sends_posted_first_on_both_ranks_wait_forever_unless_batched() -> None:
    assert _reports(exchange, False, True) == []
    assert _reports(exchange, False, False) == ["deadlock"]
    assert _reports(exchange, True, False) == []


def send_then_all_reduce() -> None:
    """A send's buffer written again after a later collective's wait: the collective runs on another stream, so its
    wait says nothing of the send (as on a GPU: ProcessGroupNCCL's pair of ranks has a stream of its own)."""
    r = dist.get_rank()
    buf = torch.full((N,), 1.0, device="cuda")
    z = torch.ones(N, device="cuda")
    work = dist.isend(buf, 1) if r == 0 else dist.irecv(buf, 0)
    dist.all_reduce(z)
    if r == 0:
        buf.fill_(-1.0)
    work.wait()


def test_a_collective_s_wait_does_not_order_a_send_on_its_pair_s_stream() -> None:
    assert "race" in _reports(send_then_all_reduce)


def test_a_receive_from_any_source_is_refused_as_nccl_refuses_it() -> None:
    def program() -> None:
        dist.recv(torch.empty(N, device="cuda"))

    s = simdevice.cuda()
    s.run(program, world_size=2)
    errors = [str(r) for r in s.reports]
    assert errors
    assert all("ProcessGroupNCCL does not support recvAnysource" in e for e in errors), errors


def pipeline_reads_early() -> None:
    pipeline("early")


def test_the_fix_names_the_point_to_point_call_s_wait() -> None:
    """The suggested fix for a read of a receive's buffer before its wait names the point-to-point call's work and
    its asynchronous form, not a collective's (``async_op=True``)."""
    found = simdevice.explore(pipeline_reads_early, max_examples=30, world_size=2).failure
    assert found is not None
    fix = suggest(as_target(pipeline_reads_early, world_size=2), found, schedules=10)
    assert fix.checked, fix.lines()
    (advice,) = fix.advice
    assert advice.startswith("wait for the point-to-point call's work on `rank1.default` (`work.wait()` of an "
                             "`isend` or `irecv` with `rank1.default` current;"), advice
    assert "collective" not in advice, advice


def test_a_send_and_a_receive_of_different_sizes_are_named_as_such() -> None:
    def program() -> None:
        if dist.get_rank() == 0:
            dist.send(torch.ones(N, device="cuda"), 1)
        else:
            dist.recv(torch.empty(N // 2, device="cuda"), 0)

    s = simdevice.cuda()
    s.run(program, world_size=2)
    errors = [str(r) for r in s.reports]
    assert any(f"a send and its receive passed tensors of different sizes ({N}, {N // 2} elements, the sender's, "
               "then the receiver's): both must pass tensors of the same size" in e for e in errors), errors
