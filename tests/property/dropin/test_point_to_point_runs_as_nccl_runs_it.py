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


def send_then_batch_then_all_reduce(batched: bool) -> None:
    """A send's buffer written again after a later collective's wait, the send made in a ``batch_isend_irecv``
    (``batched``): the batch runs on the collectives' stream, in order with the collective, so the collective's wait
    orders it; a single ``isend`` runs on its pair's stream, which the collective's wait says nothing of."""
    r = dist.get_rank()
    buf = torch.full((N,), 1.0, device="cuda")
    z = torch.ones(N, device="cuda")
    op = dist.P2POp(dist.isend, buf, 1) if r == 0 else dist.P2POp(dist.irecv, buf, 0)
    works = dist.batch_isend_irecv([op]) if batched else [dist.isend(buf, 1) if r == 0 else dist.irecv(buf, 0)]
    dist.all_reduce(z)  # wait: the current stream waits for the collectives' stream
    if r == 0:
        buf.fill_(-1.0)
    for w in works:
        w.wait()


@pytest.mark.parametrize("schedule", [None, "rank0.nccl#0+5"])
def test_a_batch_runs_on_the_collectives_stream_so_a_collective_s_wait_orders_it(schedule: str | None) -> None:
    assert _reports(send_then_batch_then_all_reduce, True, schedule=schedule) == []
    assert "race" in _reports(send_then_batch_then_all_reduce, False, schedule="rank0.p2p1-nccl#0+5")


def send_a_temporary(wait: bool) -> None:
    """Rank 0 sends a temporary, drops it (and the work, unless it ``wait``s on it later) and allocates again:
    ProcessGroupNCCL keeps the tensors of a call in flight (it records them on its stream, or stashes them in the work
    its watchdog holds till the end), so the new tensor never gets the sent block while the send may read it."""
    r = dist.get_rank()
    if r == 0:
        tmp = torch.full((N,), 3.0, device="cuda")
        work = dist.isend(tmp, 1)
        del tmp
        if not wait:
            del work
        again = torch.empty(N, device="cuda")  # (the sent block, were it handed out again)
        again.fill_(-1.0)
        if wait:
            work.wait()
    else:
        buf = torch.empty(N, device="cuda")
        dist.recv(buf, 0)
        assert buf.sum().item() == 3 * N


@pytest.mark.parametrize("wait", [True, False])
@pytest.mark.parametrize("schedule", [None, "rank0.p2p1-nccl#0+5", "rank1#0+5"])
def test_a_send_s_tensor_is_kept_from_reuse_till_the_send_is_done(wait: bool, schedule: str | None) -> None:
    assert _reports(send_a_temporary, wait, schedule=schedule) == []


def send_then_reuse(blocking: bool) -> None:
    """Rank 0 writes the buffer again right after its ``send`` (``blocking``), or after an ``isend`` it does not wait
    for: ``send`` is ``isend`` and ``wait()``, so the current stream waits for the send and the write is ordered."""
    r = dist.get_rank()
    buf = torch.full((N,), 1.0, device="cuda")
    if r == 0:
        if blocking:
            dist.send(buf, 1)
        else:
            work = dist.isend(buf, 1)
        buf.fill_(-1.0)
        if not blocking:
            work.wait()
    else:
        dist.recv(buf, 0)
        assert buf.sum().item() == N


def test_a_blocking_send_orders_the_current_stream() -> None:
    assert _reports(send_then_reuse, True, schedule="rank0.p2p1-nccl#0+5") == []
    assert "race" in _reports(send_then_reuse, False, schedule="rank0.p2p1-nccl#0+5")


def fan_out(wait_all: bool) -> None:
    """Rank 0 sends one buffer to ranks 1 and 2 and waits for the send to rank 2 only (``wait_all``: for both) before
    it writes the buffer again: each pair of ranks has a stream of its own, so the send to rank 2 says nothing of the
    send to rank 1."""
    r = dist.get_rank()
    buf = torch.full((N,), 1.0, device="cuda")
    if r == 0:
        to_1, to_2 = dist.isend(buf, 1), dist.isend(buf, 2)
        to_2.wait()
        if wait_all:
            to_1.wait()
        buf.fill_(-1.0)
    else:
        dist.recv(buf, 0)
        assert buf.sum().item() == N


def test_each_pair_of_ranks_has_a_stream_of_its_own() -> None:
    s = simdevice.cuda("rank0.p2p1-nccl#0+5")
    s.run(fan_out, True, world_size=3)
    assert s.result is not None
    assert s.result.reports == ()
    assert {"rank0.p2p1-nccl", "rank0.p2p2-nccl", "rank1.p2p0-nccl", "rank2.p2p0-nccl"} <= set(s.result.op_counts)
    s = simdevice.cuda("rank0.p2p1-nccl#0+5")
    s.run(fan_out, False, world_size=3)
    assert s.result is not None
    assert "race" in {r.kind for r in s.result.reports}


@pytest.mark.parametrize("peer", [2, -1])
def test_a_peer_outside_the_world_is_refused(peer: int) -> None:
    def program() -> None:
        dist.isend(torch.zeros(N, device="cuda"), peer)

    s = simdevice.cuda()
    s.run(program, world_size=2)
    errors = [str(r) for r in s.reports]
    assert errors
    assert all(f"ValueError: Invalid destination rank {peer}" in e for e in errors), errors


def send_what_a_side_stream_wrote() -> None:
    """Rank 0 sends what a side stream wrote, its current stream waiting for nothing first: the send's stream waits
    for the calling stream only."""
    r = dist.get_rank()
    buf = torch.empty(N, device="cuda")
    if r == 0:
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            buf.fill_(2.0)
        dist.send(buf, 1)
        torch.cuda.current_stream().wait_stream(side)
    else:
        dist.recv(buf, 0)
        assert buf.sum().item() == 2 * N


def test_the_suggested_fix_before_a_send_waits_on_its_pair_s_stream_and_it_runs() -> None:
    """The fix is checked with its edge inserted where the send is issued, on the stream of its pair of ranks (the
    collectives' stream takes no edge at a send's line)."""
    found = simdevice.explore(send_what_a_side_stream_wrote, max_examples=20, world_size=2).failure
    assert found is not None
    fix = suggest(as_target(send_what_a_side_stream_wrote, world_size=2), found, schedules=20)
    assert fix.checked, fix.lines()
    assert [(e.after.actor, e.before.actor) for e in fix.edges] == [("rank0.side", "rank0.p2p1-nccl")], fix.edges


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


def all_to_all_by_sends(wait: bool) -> None:
    """An all-to-all written as one ``batch_isend_irecv`` of a send to and a receive from every rank, the rank itself
    among them (NCCL matches a send to itself with the group's receive from itself); the received rows read after the
    work's ``wait()``, or not."""
    r, w = dist.get_rank(), dist.get_world_size()
    send = torch.arange(w, dtype=torch.float32, device="cuda").repeat_interleave(N) + 10 * r
    recv = torch.empty(w * N, device="cuda")
    ops = [dist.P2POp(dist.isend, send[p * N:(p + 1) * N], p) for p in range(w)]
    ops += [dist.P2POp(dist.irecv, recv[p * N:(p + 1) * N], p) for p in range(w)]
    works = dist.batch_isend_irecv(ops)
    if wait:
        for work in works:
            work.wait()  # wait: the rows must have landed before they are read
    want = torch.tensor([10.0 * p + r for p in range(w)]).repeat_interleave(N)
    assert torch.equal(recv.cpu(), want), "read rows before they landed"


@pytest.mark.parametrize("world", [1, 2])
def test_a_batch_may_send_to_the_rank_itself(world: int) -> None:
    s = simdevice.cuda("rank0.nccl#0+5")
    s.run(all_to_all_by_sends, True, world_size=world)
    s.assert_clean()
    s = simdevice.cuda("rank0.nccl#0+5")
    s.run(all_to_all_by_sends, False, world_size=world)
    assert "race" in [r.kind for r in s.reports]


def test_a_send_to_the_rank_itself_alone_is_refused() -> None:
    def program() -> None:
        dist.isend(torch.ones(N, device="cuda"), dist.get_rank())

    s = simdevice.cuda()
    s.run(program, world_size=2)
    errors = [str(r) for r in s.reports]
    assert errors
    assert all("the rank itself outside a batch_isend_irecv is not simulated" in e for e in errors), errors


def all_to_all_by_sends_read_early() -> None:
    all_to_all_by_sends(False)


def test_the_fix_for_a_batch_names_the_batch_s_works_not_an_isend_s() -> None:
    """A read of a ``batch_isend_irecv``'s receive buffer before its works' ``wait()``: the fix names the batch's
    works (there is no blocking form of a batch), not an ``isend`` or ``irecv``, which would run on the pair's stream
    and not be ordered with the batch. Before, it said ``work.wait()`` of an ``isend`` or ``irecv``."""
    found = simdevice.explore(all_to_all_by_sends_read_early, max_examples=30, world_size=2).failure
    assert found is not None
    fix = suggest(as_target(all_to_all_by_sends_read_early, world_size=2), found, schedules=10)
    assert fix.checked, fix.lines()
    assert fix.advice, fix.lines()
    for advice in fix.advice:
        assert advice.startswith("wait for the `batch_isend_irecv`'s work on `"), advice
        assert "the `wait()` of each work the `batch_isend_irecv` returned," in advice, advice
        assert "isend` or `irecv" not in advice, advice
        assert "blocking call" not in advice, advice


def read_before_a_blocking_all_to_all_on_a_side_stream() -> None:
    """A blocking ``all_to_all_single`` called on a side stream, its output read on the default stream."""
    comm = torch.cuda.Stream()
    inp = torch.full((8,), float(dist.get_rank() + 1), device="cuda")
    out = torch.empty(8, device="cuda")
    comm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(comm):
        dist.all_to_all_single(out, inp)
    (out + 1.0).sum().item()


def test_the_ranks_a_fix_is_said_for_are_in_order() -> None:
    """The same fix in every rank is said once, for the ranks in their order, whichever rank's race the schedule
    showed first. Before, a schedule that ran rank 0 late said ``in each of rank1, rank0``."""
    found = simdevice.explore(read_before_a_blocking_all_to_all_on_a_side_stream, world_size=2,
                              examples=["rank0#0+1"]).failure
    assert found is not None
    fix = suggest(as_target(read_before_a_blocking_all_to_all_on_a_side_stream, world_size=2), found, schedules=10)
    (line, *_) = fix.lines()
    assert line.startswith("suggested fix (in each of rank0, rank1): "), line
