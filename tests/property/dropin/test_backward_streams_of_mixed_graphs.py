"""Backward's streams where a graph's nodes are on several streams (``simdevice.dropin.facade._Engine``): the engine
runs each node, with its hooks, on the stream current when it was made, also where other nodes of the same graph
are on the stream ``backward()`` is called on; a leaf's ``AccumulateGrad`` runs on the stream of the forward op that
used the leaf first (its least sequence number), and keeps that stream while the node lives, also in a later
graph that reaches it. Each program is plain ``torch.cuda``; each hook records the current stream it sees."""

from __future__ import annotations

import torch

import simdevice

N = 1024


def _seen(fn: object, *args: object) -> object:
    s = simdevice.cuda()
    s.run(fn, *args)  # type: ignore[arg-type]
    s.assert_clean()
    assert s.result is not None
    return s.result.result


def _name() -> str:
    return torch.cuda.current_stream().name  # type: ignore[attr-defined]


def side_node_default_loss() -> list[str]:
    """``h = w * x`` in a side stream's block, its sum on the default stream, ``backward()`` on the default stream:
    the sum's node runs on the default stream, the product's on ``s``."""
    s = torch.cuda.Stream()
    w = torch.ones(N, device="cuda", requires_grad=True)
    x = torch.full((N,), 2.0, device="cuda")
    seen: list[str] = []
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        h = w * x
    torch.cuda.current_stream().wait_stream(s)
    loss = h.sum()
    loss.grad_fn.register_prehook(lambda g: seen.append("sum:" + _name()))
    h.grad_fn.register_prehook(lambda g: seen.append("mul:" + _name()))
    loss.backward()
    assert torch.equal(w.grad, x)
    return seen


def test_a_graph_with_nodes_on_the_calling_stream_runs_its_side_stream_nodes_on_their_stream() -> None:
    """One node on ``s``, one on the calling stream: each node's hook sees its own node's stream (a simulator that
    models the engine's streams only where no node is on the calling stream ran the product's on the default)."""
    assert _seen(side_node_default_loss) == ["sum:default", "mul:s"]


def leaf_used_on_two_streams(first: str) -> list[str]:
    """A leaf used by a product in a side stream's block and by one on the default stream, ``first`` of the two made
    first; its post-accumulate-grad hook records the stream its ``AccumulateGrad`` runs on."""
    s = torch.cuda.Stream()
    w = torch.ones(N, device="cuda", requires_grad=True)
    seen: list[str] = []
    w.register_post_accumulate_grad_hook(lambda p: seen.append(_name()))
    s.wait_stream(torch.cuda.current_stream())
    if first == "default":
        b = w * 3.0
    with torch.cuda.stream(s):
        a = w * 2.0
    if first == "s":
        b = w * 3.0
    torch.cuda.current_stream().wait_stream(s)
    (a + b).sum().backward()
    torch.cuda.synchronize()
    assert torch.equal(w.grad.cpu(), torch.full((N,), 5.0))
    return seen


def test_accumulate_grad_runs_on_the_stream_of_the_leaf_s_first_use() -> None:
    """The leaf's ``AccumulateGrad`` is made by the first op that used it: its stream is that op's, not the later
    one's, whichever stream comes first."""
    assert _seen(leaf_used_on_two_streams, "s") == ["s"]
    assert _seen(leaf_used_on_two_streams, "default") == ["default"]


def accumulate_grad_kept_by_a_live_graph() -> list[str]:
    """A leaf first used in a side stream's block, that graph's backward with ``retain_graph=True`` (the graph, and
    the leaf's ``AccumulateGrad`` with it, stays alive); then a second graph on the default stream uses the leaf
    and its backward runs. The same ``AccumulateGrad`` runs both times, on ``s``."""
    s = torch.cuda.Stream()
    w = torch.ones(N, device="cuda", requires_grad=True)
    seen: list[str] = []
    w.register_post_accumulate_grad_hook(lambda p: seen.append(_name()))
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        first = (w * 2.0).sum()
    torch.cuda.current_stream().wait_stream(s)
    first.backward(retain_graph=True)
    second = (w * 3.0).sum()
    second.backward()
    torch.cuda.synchronize()
    assert torch.equal(w.grad.cpu(), torch.full((N,), 5.0))
    del first
    return seen


def test_a_live_accumulate_grad_keeps_its_stream_in_a_later_graph() -> None:
    """The engine's ``AccumulateGrad`` of a leaf is one node while any graph holds it: a later graph made on the
    default stream reaches it and runs it on the stream it was made on (``s``)."""
    assert _seen(accumulate_grad_kept_by_a_live_graph) == ["s", "s"]


def backward_of_a_leaf_in_a_side_stream_s_block() -> list[str]:
    """``w.backward(g)`` of a leaf itself, in a side stream's block: the leaf's ``AccumulateGrad`` is the root, made
    there (no forward op used the leaf), and runs on the calling stream ``s``."""
    s = torch.cuda.Stream()
    w = torch.ones(N, device="cuda", requires_grad=True)
    seen: list[str] = []
    w.register_post_accumulate_grad_hook(lambda p: seen.append(_name()))
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        w.backward(torch.full((N,), 2.0, device="cuda"))
    torch.cuda.current_stream().wait_stream(s)
    assert torch.equal(w.grad.cpu(), torch.full((N,), 2.0))
    return seen


def test_a_leaf_s_own_backward_accumulates_on_the_calling_stream() -> None:
    """A root ``AccumulateGrad`` has no consumer to take a stream from: the stream ``backward()`` is called on."""
    assert _seen(backward_of_a_leaf_in_a_side_stream_s_block) == ["s"]


def two_roots_made_in_a_side_stream_s_block() -> list[str]:
    """Two losses made in a side stream's block, ``torch.autograd.backward([l1, l2])`` on the default stream: the
    engine's graph root makes both ready at once, and each root's node, hooks first, runs on ``s``."""
    s = torch.cuda.Stream()
    w = torch.ones(N, device="cuda", requires_grad=True)
    seen: list[str] = []
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        l1 = (w * 2.0).sum()
        l2 = (w * 3.0).sum()
    l1.grad_fn.register_prehook(lambda g: seen.append("l1:" + _name()))
    l2.grad_fn.register_prehook(lambda g: seen.append("l2:" + _name()))
    torch.cuda.current_stream().wait_stream(s)
    torch.autograd.backward([l1, l2])
    assert torch.equal(w.grad.cpu(), torch.full((N,), 5.0))
    return seen


def test_roots_made_ready_by_the_graph_root_run_their_hooks_on_their_stream() -> None:
    """Several roots: the engine's ``GraphRoot`` feeds them, and the one of greatest sequence number runs first; a
    hook the program put on each sees ``s``, as the node it belongs to runs there."""
    assert _seen(two_roots_made_in_a_side_stream_s_block) == ["l2:s", "l1:s"]


def grad_of_a_side_stream_forward() -> None:
    """The forward in a side stream's block, ``torch.autograd.grad`` on the default stream, and the gradient it
    returns copied to pinned memory on the default stream: the engine's capture of ``w``'s gradient (made on ``s``)
    makes the calling stream wait for ``s`` at the end, so the copy reads it ordered."""
    s = torch.cuda.Stream()
    w = torch.ones(N, device="cuda", requires_grad=True)
    x = torch.full((N,), 2.0, device="cuda")
    pinned = torch.empty(N, pin_memory=True)
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        loss = (w * x).sum()
    torch.cuda.current_stream().wait_stream(s)
    (g,) = torch.autograd.grad(loss, [w])
    pinned.copy_(g, non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(pinned, torch.full((N,), 2.0))
    assert w.grad is None


def test_grad_s_captured_gradient_is_ordered_before_the_calling_stream() -> None:
    """``torch.autograd.grad(loss, [w])`` runs no ``AccumulateGrad``: the engine captures ``w``'s gradient, and the
    calling stream waits at the end for the stream the capture came from (clean; without that wait, a race)."""
    s = simdevice.cuda()
    s.run(grad_of_a_side_stream_forward)
    s.assert_clean()
    assert simdevice.explore(grad_of_a_side_stream_forward, max_examples=20).failure is None


def backward_with_inputs_of_a_side_stream_forward() -> list[str]:
    """The forward in a side stream's block, ``loss.backward(inputs=[w])`` on the default stream: the engine runs
    ``w``'s ``AccumulateGrad`` (``inputs=`` with accumulation), on ``s``, the stream its first use was on; the
    other leaf ``v`` gets no gradient."""
    s = torch.cuda.Stream()
    w = torch.ones(N, device="cuda", requires_grad=True)
    v = torch.ones(N, device="cuda", requires_grad=True)
    seen: list[str] = []
    w.register_post_accumulate_grad_hook(lambda p: seen.append(_name()))
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        loss = (w * v * 2.0).sum()
    torch.cuda.current_stream().wait_stream(s)
    loss.backward(inputs=[w])
    torch.cuda.synchronize()
    assert torch.equal(w.grad.cpu(), torch.full((N,), 2.0))
    assert v.grad is None
    return seen


def test_backward_with_inputs_runs_the_input_s_accumulate_grad_on_its_stream() -> None:
    """``backward(inputs=[w])`` accumulates into ``w.grad``: its ``AccumulateGrad`` runs, with its hooks, on ``s``."""
    assert _seen(backward_with_inputs_of_a_side_stream_forward) == ["s"]


def grad_with_a_hook_of_a_side_stream_forward(input_kind: str) -> list[str]:
    """The forward in a side stream's block, ``torch.autograd.grad`` of a leaf (or of the product, a non-leaf) on the
    default stream, with a pre-hook on the loss's node: the node runs on ``s``, its hook with it."""
    s = torch.cuda.Stream()
    w = torch.ones(N, device="cuda", requires_grad=True)
    seen: list[str] = []
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        h = w * 2.0
        loss = h.sum()
    loss.grad_fn.register_prehook(lambda g: seen.append(_name()))
    torch.cuda.current_stream().wait_stream(s)
    (g,) = torch.autograd.grad(loss, [w if input_kind == "leaf" else h])
    assert torch.equal(g.cpu(), torch.full((N,), 2.0 if input_kind == "leaf" else 1.0))
    return seen


def test_grad_runs_the_nodes_before_a_captured_input_on_their_streams() -> None:
    """``torch.autograd.grad(loss, [w])``: the engine runs every node on the way to a captured input (its
    ``should_execute`` is ``needed_ || captures_``), each on its stream: the loss's node on ``s``. (Found by a
    mutant sweep: nodes before a captured input were not run as the engine's, so they ran on the calling stream.)"""
    assert _seen(grad_with_a_hook_of_a_side_stream_forward, "leaf") == ["s"]
    assert _seen(grad_with_a_hook_of_a_side_stream_forward, "product") == ["s"]


def two_roots_with_tensor_hooks() -> list[str]:
    """Two losses, ``l1`` made on the default stream, ``l2`` after it in a side stream's block, each with a tensor
    hook; ``torch.autograd.backward([l1, l2])`` on the default stream. The engine's graph root makes both ready; its
    ready queue gives ``l2`` first (greatest sequence number), and a tensor hook runs under its node's stream guard,
    before the node's pre-hooks."""
    s = torch.cuda.Stream()
    w = torch.ones(N, device="cuda", requires_grad=True)
    seen: list[str] = []
    l1 = (w * 2.0).sum()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        l2 = (w * 3.0).sum()
    l1.register_hook(lambda g: seen.append("l1:" + _name()))
    l2.register_hook(lambda g: seen.append("l2:" + _name()))
    torch.cuda.current_stream().wait_stream(s)
    torch.autograd.backward([l1, l2])
    torch.cuda.synchronize()
    assert torch.equal(w.grad.cpu(), torch.full((N,), 5.0))
    return seen


def test_the_ready_queue_gives_the_node_of_greatest_sequence_number_first() -> None:
    """A tensor hook of a root sees its own node's stream: the engine model makes current the stream of the ready
    node of greatest sequence number, the one the engine runs next (a model taking the least ran ``l2``'s hook on
    the default stream)."""
    assert _seen(two_roots_with_tensor_hooks) == ["l2:s", "l1:default"]


class _NoGradient(torch.autograd.Function):
    """Doubles its input; its backward gives its input no gradient (None)."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        return x * 2.0

    @staticmethod
    def backward(ctx: object, g: torch.Tensor) -> None:
        return None


def grad_captured_at_a_node_that_also_runs() -> None:
    """``w`` first used on ``s2``; on ``s`` a node (``_NoGradient``) made from it and the loss; ``torch.autograd.grad
    (loss, [h, w])`` on the default stream. ``h``'s node both runs (``w``'s capture is after it) and captures ``h``'s
    gradient, which ``s``'s sum backward made; the node gives ``w`` no gradient, so no stream after it waits for
    ``s``. The calling stream's copy of the captured gradient is ordered by the wait for the leaf streams at the end,
    ``s`` among them."""
    s, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    w = torch.ones(N, device="cuda", requires_grad=True)
    pinned = torch.empty(N, pin_memory=True)
    s2.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s2):
        w2 = w * 1.0
    s.wait_stream(s2)
    with torch.cuda.stream(s):
        h = _NoGradient.apply(w2)
        loss = (h * 3.0).sum()
    torch.cuda.current_stream().wait_stream(s)
    g_h, g_w = torch.autograd.grad(loss, [h, w], allow_unused=True)
    assert g_w is None
    pinned.copy_(g_h, non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(pinned, torch.full((N,), 3.0))


def test_a_node_that_runs_and_captures_is_a_leaf_stream() -> None:
    """The engine puts a capturing node's stream among the leaf streams also where the node runs (it is on the way
    to another input): clean, where a model that made only capture-only nodes leaf streams reports the calling
    stream's copy of the captured gradient as a race with ``s``'s backward."""
    s = simdevice.cuda()
    s.run(grad_captured_at_a_node_that_also_runs)
    s.assert_clean()


def two_leaves_first_used_on_two_side_streams() -> None:
    """``w1`` first used on ``s1``, ``w2`` on ``s2``; ``backward()`` on the default stream, then the default stream
    reads both gradients: each leaf's ``AccumulateGrad`` ran on its own stream, and the calling stream waited for
    both leaf streams at the end."""
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    w1 = torch.ones(N, device="cuda", requires_grad=True)
    w2 = torch.ones(N, device="cuda", requires_grad=True)
    s1.wait_stream(torch.cuda.current_stream())
    s2.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s1):
        a = w1 * 2.0
    with torch.cuda.stream(s2):
        b = w2 * 3.0
    torch.cuda.current_stream().wait_stream(s1)
    torch.cuda.current_stream().wait_stream(s2)
    (a.sum() + b.sum()).backward()
    assert torch.equal((w1.grad + w2.grad).cpu(), torch.full((N,), 5.0))


def test_the_calling_stream_waits_for_every_leaf_stream() -> None:
    """Two leaf streams: the calling stream waits for each at the end (clean; a race where it waits for one)."""
    s = simdevice.cuda()
    s.run(two_leaves_first_used_on_two_side_streams)
    s.assert_clean()


def grad_of_a_root_itself() -> None:
    """A loss made on ``s`` (the default stream does not wait for it), ``torch.autograd.grad(h, [h])`` on the default
    stream: no node runs, the engine captures the root's gradient at ``h``'s node, on ``s``, and the calling
    stream waits for ``s`` (a leaf stream) at the end, so it may then read ``h``."""
    s = torch.cuda.Stream()
    w = torch.ones(N, device="cuda", requires_grad=True)
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        h = (w * 2.0).sum()
    (g,) = torch.autograd.grad(h, [h])
    assert float((h + g).cpu()) == 2.0 * N + 1.0


def test_a_backward_that_only_captures_still_waits_for_the_leaf_streams() -> None:
    """No node's hook runs where the engine only captures, and still the engine's end makes the calling stream wait
    for the capture's stream (clean; without it the default stream's read of ``h`` races with ``s``'s sum)."""
    s = simdevice.cuda()
    s.run(grad_of_a_root_itself)
    s.assert_clean()


def backward_into_a_non_leaf(read_on: str) -> str:
    """``h = w * x`` in a side stream's block, ``loss.backward(inputs=[h])`` on the default stream, ``h.grad`` read
    on ``read_on`` after it: the engine runs ``h``'s node (``needed_``, as every input's node of ``backward(inputs=)``)
    on ``s``, where ``h``'s ``retain_grad`` hook writes ``h.grad``; that node returns gradients, so ``s`` is no leaf
    stream and the calling stream does not wait for it. ``s`` is stalled before the backward, so no allocation's
    query sees it done first. Returns the stream ``h``'s node's hook ran on."""
    s = torch.cuda.Stream()
    w = torch.ones(N, device="cuda", requires_grad=True)
    x = torch.full((N,), 2.0, device="cuda")
    seen: list[str] = []
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        h = w * x
    torch.cuda.current_stream().wait_stream(s)
    loss = (h * 3.0).sum()
    h.grad_fn.register_prehook(lambda g: seen.append(_name()))
    with torch.cuda.stream(s):
        torch.cuda._sleep(10_000_000)  # (``h.grad`` not written yet when the host reads it, unless it waits)
    loss.backward(inputs=[h])
    if read_on == "s":
        torch.cuda.current_stream().wait_stream(s)
    total = h.grad.sum().item()
    assert w.grad is None
    if read_on == "s":
        assert total == 3.0 * N
    return seen[0]


def test_backward_into_a_non_leaf_runs_its_node_which_is_no_leaf_stream() -> None:
    """Waited for, clean, the node on ``s``; not waited for, the calling stream's read of ``h.grad`` races with the
    node's write of it on ``s`` (a model that took the input's node for a capture made ``s`` a leaf stream and
    called it clean)."""
    assert _seen(backward_into_a_non_leaf, "s") == "s"
    run = simdevice.cuda()
    run.run(backward_into_a_non_leaf, "default")
    assert [r.kind for r in run.result.reports if r.kind == "race"], [str(r) for r in run.result.reports]
