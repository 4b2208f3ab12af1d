"""Backward's streams as torch 2.9-2.13's autograd engine runs them on a GPU (``simdevice.dropin.facade._Engine``):
each node, with all its hooks, runs with its own stream current (its forward op's; a leaf's ``AccumulateGrad``: the
stream of the first forward op that used the leaf), a consumer's stream waits for its producer's where they differ,
and the calling stream waits for the leaf streams at the end only. Each program is plain ``torch.cuda``; the
verdict is the one a GPU gives."""

from __future__ import annotations

import torch

import simdevice
from simdevice import Race

N = 1024


def _hook_on_a_default_stream_node(hook_kind: str, record_on: str) -> list[str]:
    """A forward on the default stream, ``backward()`` in a side stream's block. A hook on a default-stream node
    copies a gradient to pinned memory on the current stream (on a GPU the default one, the node's) and records
    an event on ``record_on``; the host waits for it and reads the copy."""
    s = torch.cuda.Stream()
    w = torch.ones(N, device="cuda", requires_grad=True)
    pinned = torch.empty(N, pin_memory=True)
    done = torch.cuda.Event()
    seen: list[str] = []

    def copy(g: torch.Tensor) -> None:
        seen.append(torch.cuda.current_stream().name)  # type: ignore[attr-defined]
        pinned.copy_(g, non_blocking=True)
        done.record(torch.cuda.default_stream() if record_on == "default" else s)

    h = w * 3.0
    if hook_kind == "tensor":
        h.register_hook(lambda g: copy(g))
    else:  # a pre-hook on the node that made h, registered before backward
        h.grad_fn.register_prehook(lambda grads: copy(grads[0]))
    loss = h.sum()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        loss.backward()
    done.synchronize()
    assert torch.equal(pinned, torch.ones(N)), "the host read the pinned grad before the copy finished"
    return seen


def test_a_hook_on_a_default_stream_node_runs_on_the_default_stream() -> None:
    """``backward()`` inside a side stream's block: a tensor hook or a pre-hook the program put on a node made on the
    default stream runs with the default stream current, as the engine's stream guard covers a node's hooks. An
    event recorded on the default stream then covers the hook's copy (clean; it raced where the hook saw the side
    stream), one recorded on the side stream does not (a race: the side stream waits for the node at the end only)."""
    for kind in ("tensor", "pre"):
        right = simdevice.cuda()
        right.run(_hook_on_a_default_stream_node, kind, "default")
        right.assert_clean()
        assert right.result is not None
        assert right.result.result == ["default"], kind
        racy = simdevice.cuda()
        racy.run(_hook_on_a_default_stream_node, kind, "s")
        assert any(isinstance(r, Race) for r in racy.reports), (kind, racy.text())


def _post_accumulate_hook(wait_for: str, steps: int = 1) -> list[str]:
    """The forward on a side stream ``s`` (the leaf's first use: its ``AccumulateGrad`` is made on ``s``),
    ``backward()`` on the default stream; the leaf's post-accumulate-grad hook sends its gradient to pinned memory
    on a comm stream that first waits for ``wait_for``; ``steps`` micro-batches accumulate into ``.grad``."""
    s = torch.cuda.Stream()
    comm = torch.cuda.Stream()
    w = torch.ones(N, device="cuda", requires_grad=True)
    x = torch.full((N,), 2.0, device="cuda")
    pinned = torch.empty(N, pin_memory=True)
    done = torch.cuda.Event()
    seen: list[str] = []

    def hook(p: torch.Tensor) -> None:
        seen.append(torch.cuda.current_stream().name)  # type: ignore[attr-defined]
        waited = {"default": torch.cuda.default_stream(), "current": torch.cuda.current_stream(), "s": s}[wait_for]
        comm.wait_stream(waited)
        with torch.cuda.stream(comm):
            pinned.copy_(p.grad, non_blocking=True)
            done.record()

    w.register_post_accumulate_grad_hook(hook)
    s.wait_stream(torch.cuda.current_stream())
    for _ in range(steps):
        with torch.cuda.stream(s):
            loss = (w * x).sum()
        loss.backward()
        done.synchronize()
    assert torch.equal(pinned, torch.full((N,), 2.0 * steps)), "the copy read the grad before it was written"
    return seen


def test_accumulate_grad_runs_on_the_stream_its_leaf_was_first_used_on() -> None:
    """A leaf first used in a side stream's block has its ``AccumulateGrad`` on that stream: its hooks see it, and
    a hook that orders its comm stream after the current stream is clean. One that orders it after the default
    stream (where ``backward()`` was called) races on a GPU: the engine makes the default stream wait for the side
    stream at the end of backward only, not after each node (found; the simulator made it wait after each)."""
    right = simdevice.cuda()
    right.run(_post_accumulate_hook, "current")
    right.assert_clean()
    assert right.result is not None
    assert right.result.result == ["s"]
    racy = simdevice.cuda()
    racy.run(_post_accumulate_hook, "default")
    assert any(isinstance(r, Race) for r in racy.reports), racy.text()


def test_gradients_accumulate_on_the_accumulate_grad_s_stream() -> None:
    """Two micro-batches: the second gradient is added into ``.grad`` on the ``AccumulateGrad``'s stream (the side
    stream the forward ran on), so a comm stream that waits for that stream reads it ordered (clean; the addition
    ran on the default stream and the read raced)."""
    s = simdevice.cuda()
    s.run(_post_accumulate_hook, "s", 2)
    s.assert_clean()
    assert s.result is not None
    assert s.result.result == ["s", "s"]


def _a_side_stream_gradient_read_on_the_default_stream() -> None:
    """``a = w * x`` on the default stream, the loss from it in a side stream's block, ``backward()`` on the default
    stream: ``a``'s gradient is made on ``s`` and read by the product's backward on the default stream. The program
    then allocates on ``s``: the caching allocator may hand out a block freed on ``s`` at once."""
    s = torch.cuda.Stream()
    w = torch.ones(N, device="cuda", requires_grad=True)
    x = torch.full((N,), 2.0, device="cuda")
    a = w * x
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        loss = (a * 3.0).sum()
    torch.cuda.current_stream().wait_stream(s)
    loss.backward()
    with torch.cuda.stream(s):
        kept = [torch.ones(N, device="cuda") for _ in range(4)]
    torch.cuda.synchronize()
    assert torch.equal(w.grad.cpu(), torch.full((N,), 6.0))
    del kept


def test_a_gradient_read_on_another_stream_is_recorded_on_it() -> None:
    """The engine ``record_stream``-s a gradient onto its consumer's stream where the producer's differs: its block,
    freed on ``s`` after the default stream's read, is not handed out on ``s`` before that read is done (clean;
    without the record, ``s``'s new tensors overwrite it under the read: a race naming the free)."""
    sim = simdevice.cuda()
    sim.run(_a_side_stream_gradient_read_on_the_default_stream)
    sim.assert_clean()


def _a_later_producer_on_a_side_stream() -> None:
    """``w`` first used on the default stream (its ``AccumulateGrad`` there), then on ``s``, then on the default
    stream again; ``v`` used on ``s2`` in between. ``backward()`` on the default stream: the products' backwards give
    ``w`` three gradients, the second from ``s``, a later producer's, added into ``w``'s buffer on the default
    stream while the ready queue holds ``v``'s node (on ``s2``) and the first product's."""
    s, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    w = torch.ones(N, device="cuda", requires_grad=True)
    v = torch.ones(N, device="cuda", requires_grad=True)
    p0 = w * 1.0
    s2.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s2):
        q = v * 5.0
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        p1 = w * 2.0
    p2 = w * 3.0
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.current_stream().wait_stream(s2)
    (p0 + q + p1 + p2).sum().backward()
    assert torch.equal(w.grad.cpu(), torch.full((N,), 6.0))
    torch.cuda.synchronize()


def test_a_later_producer_s_gradient_is_added_on_the_consumer_s_stream_after_it() -> None:
    """A second producer's gradient is added into the buffer on the consumer's stream, which waits for that
    producer's stream first (clean; a race where the addition does not wait for ``s``, or runs on the stream of the
    node the ready queue gives next, ``s2``)."""
    sim = simdevice.cuda()
    sim.run(_a_later_producer_on_a_side_stream)
    sim.assert_clean()
