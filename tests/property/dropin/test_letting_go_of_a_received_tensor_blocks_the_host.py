"""A process that lets go of a device tensor another process sent it runs torch's deleter of the received storage
(``THPStorage_newSharedCuda``): ``cudaIpcCloseMemHandle`` where it was the last tensor of the sender's segment there
(which waits for every stream of the process), then ``cudaStreamSynchronize`` of its current stream. Both block the
process's host, so what it does after the drop, a handshake or its own end (which the parent's ``join`` waits
for), comes after that stream's work on the tensor. Once these were missed: a drop that was not the segment's last
let the host go on at once, and a drop just before the process returned left its end unordered, so a parent that
joined a child which wrote into a buffer it was given, then let go of it, was reported racing with that write.
A child's arguments die with its interpreter, so they are let go of as it ends (here the parent's ``Process`` object
held the child's copies: a child that wrote into a buffer given as its argument and returned raced with the
parent's read after the join)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

import simdevice

N = 256


def _write_and_drop(q: Any, done: Any, side: bool, early: bool) -> None:
    x, other = q.get()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s if side else torch.cuda.current_stream()):
        x.fill_(4.0)
    if early:
        done.set()  # wrong: told before the drop, nothing waited for the write
    del x  # not the segment's last: the deleter synchronizes the current stream
    if not early:
        done.set()
    q.get()
    del other  # the segment's last: the deleter unmaps it, which waits for every stream


def drop_one_then_tell(side: bool = False, early: bool = False) -> None:
    """The child writes a received tensor, lets go of it (another of the segment still held) and tells the parent,
    which reads it: ordered on the child's current stream; not on a side stream, nor told before the drop."""
    ctx = mp.get_context("spawn")
    q, done = ctx.Queue(), ctx.Event()
    x, other = torch.zeros(N, device="cuda"), torch.zeros(N, device="cuda")  # (one segment)
    p = ctx.Process(target=_write_and_drop, args=(q, done, side, early), name="child")
    p.start()
    q.put((x, other))
    done.wait()
    assert x.sum().item() == 4 * N
    q.put(None)
    p.join()


def _write_and_exit(q: Any, side: bool, keep: list[Any]) -> None:
    x = q.get()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s if side else torch.cuda.current_stream()):
        x.fill_(4.0)
    keep.append(x)
    keep.clear()  # the segment's last tensor here: the deleter unmaps it and waits for every stream; then it ends


def write_then_exit(side: bool = False) -> None:
    """The child writes a received tensor, lets go of it and ends; the parent joins it and reads the tensor."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    x = torch.zeros(N, device="cuda")
    p = ctx.Process(target=_write_and_exit, args=(q, side, []), name="child")
    p.start()
    q.put(x)
    p.join()
    assert x.sum().item() == 4 * N


def _reports(fn: Any, kwargs: dict[str, Any], schedule: str | None = None) -> list[str]:
    run = simdevice.cuda(schedule).run(fn, **kwargs)
    return [str(r) for r in run.reports]


@pytest.mark.parametrize(("fn", "kwargs", "stall"), [
    (drop_one_then_tell, {}, "child.default#0+5"),
    (write_then_exit, {}, "child.default#0+5"),
    (write_then_exit, {"side": True}, "child.s#0+5"),
])
def test_what_follows_the_drop_is_ordered_after_the_write(fn: Any, kwargs: dict[str, Any], stall: str) -> None:
    assert _reports(fn, kwargs) == []
    assert _reports(fn, kwargs, stall) == []


@pytest.mark.parametrize("kwargs", [{"side": True}, {"early": True}])
def test_a_drop_orders_the_current_stream_alone_and_only_from_where_it_comes(kwargs: dict[str, Any]) -> None:
    reports = _reports(drop_one_then_tell, kwargs)
    assert any(r.startswith("race") and "fill_" in r for r in reports), reports


def _write_argument(x: torch.Tensor, done: Any, side: bool) -> None:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s if side else torch.cuda.current_stream()):
        x.fill_(4.0)
    done.set()  # (a parent that reads after this, not after the join, races with the write)


def write_argument_then_exit(side: bool = False, join: bool = True) -> None:
    """The parent hands a child an output buffer as its argument; the child writes it and returns, and its
    interpreter's end lets go of its arguments (torch's deleter of each received storage): a parent that joins it
    reads the write."""
    ctx = mp.get_context("spawn")
    done = ctx.Event()
    x = torch.zeros(N, device="cuda")
    p = ctx.Process(target=_write_argument, args=(x, done, side), name="child")
    p.start()
    if join:
        p.join()
    else:
        done.wait()
    assert x.sum().item() == 4 * N
    p.join()


@pytest.mark.parametrize(("side", "stall"), [(False, "child.default#0+5"), (True, "child.s#0+5")])
def test_a_child_s_end_lets_go_of_its_arguments(side: bool, stall: str) -> None:
    assert _reports(write_argument_then_exit, {"side": side}) == []
    assert _reports(write_argument_then_exit, {"side": side}, stall) == []
    reports = _reports(write_argument_then_exit, {"side": side, "join": False})
    assert any(r.startswith("race") and "fill_" in r for r in reports), reports


def _write_and_drop_in_the_block(q: Any, done: Any) -> None:
    x, other = q.get()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        x.fill_(4.0)
        del x  # not the segment's last, in the block: the deleter synchronizes ``s``, the current stream
    done.set()
    q.get()
    del other


def drop_in_a_side_stream_block() -> None:
    ctx = mp.get_context("spawn")
    q, done = ctx.Queue(), ctx.Event()
    x, other = torch.zeros(N, device="cuda"), torch.zeros(N, device="cuda")  # (one segment)
    p = ctx.Process(target=_write_and_drop_in_the_block, args=(q, done), name="child")
    p.start()
    q.put((x, other))
    done.wait()
    assert x.sum().item() == 4 * N
    q.put(None)
    p.join()


def test_a_drop_in_a_stream_block_orders_that_stream() -> None:
    # (the current stream as the drop comes, not the process's default: a mutant that synchronized the default
    # stream let the parent read under the side stream's write)
    assert _reports(drop_in_a_side_stream_block, {}) == []
    assert _reports(drop_in_a_side_stream_block, {}, "child.s#0+5") == []
