"""A node's backward stream is the stream current when it was made (``simdevice.dropin.facade._mark``), and the
engine's stream guard is such a change of the current stream, both ways: a node made while the engine runs another
node's backward (``create_graph=True``) is made on that node's stream, and a node made after ``backward()``
returned is made on the stream current then (the calling one), not on the last stream the engine guarded. Each
program is plain ``torch.cuda``; a hook reports the stream its node runs on."""

from __future__ import annotations

import torch

import simdevice

N = 1024


def _double_backward_of_a_side_stream_node() -> list[str]:
    """``w.exp()`` on a side stream; ``grad(..., create_graph=True)`` called on the default stream makes the
    gradient's graph (a multiplication by the result) while the engine runs the exponential's backward, with the
    side stream current."""
    s = torch.cuda.Stream()
    w = torch.ones(N, device="cuda", requires_grad=True)
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y = w.exp()
    torch.cuda.current_stream().wait_stream(s)
    (g,) = torch.autograd.grad(y.sum(), w, create_graph=True)
    seen: list[str] = []
    assert g.grad_fn is not None
    g.grad_fn.register_prehook(lambda grads: seen.append(torch.cuda.current_stream().name))  # type: ignore[attr-defined]
    g.sum().backward()
    torch.cuda.synchronize()
    assert torch.allclose(w.grad.cpu(), torch.full((N,), torch.e))
    return seen


def test_a_node_made_during_a_side_stream_node_s_backward_runs_on_that_stream() -> None:
    """The engine's stream guard makes the side stream current for the exponential's backward: the nodes that
    backward makes (``create_graph=True``) are made on it, and the second backward runs them there (they ran on
    the default stream where the guard was not taken for a change of the current stream)."""
    sim = simdevice.cuda()
    sim.run(_double_backward_of_a_side_stream_node)
    sim.assert_clean()
    assert sim.result is not None
    assert sim.result.result == ["s"], sim.result.result


def _a_default_stream_forward_after_a_side_stream_backward() -> list[str]:
    """A first backward runs a node on a side stream; then a forward made entirely on the default stream (no stream
    block) and its backward."""
    s = torch.cuda.Stream()
    w = torch.ones(N, device="cuda", requires_grad=True)
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        h = w * 2.0
    torch.cuda.current_stream().wait_stream(s)
    h.sum().backward()
    v = torch.ones(N, device="cuda", requires_grad=True)
    seen: list[str] = []
    h2 = v * 3.0
    h2.register_hook(lambda g: seen.append(torch.cuda.current_stream().name))  # type: ignore[attr-defined]
    h2.sum().backward()
    torch.cuda.synchronize()
    assert torch.equal(v.grad.cpu(), torch.full((N,), 3.0))
    return seen


def test_a_node_made_after_backward_returned_is_made_on_the_calling_stream() -> None:
    """As ``backward()`` ends, the engine's guard gives the calling stream back, and nodes made from then on are made
    on it: the second forward's nodes are the default stream's, and its hook runs there (it ran on the side stream
    where the guard's end was not taken for a change of the current stream)."""
    sim = simdevice.cuda()
    sim.run(_a_default_stream_forward_after_a_side_stream_backward)
    sim.assert_clean()
    assert sim.result is not None
    assert sim.result.result == ["default"], sim.result.result


def _grad_of_a_leaf_used_twice_on_a_side_stream(create_graph: bool) -> None:
    """``w * w`` on a side stream: the multiplication's backward gives two gradients to ``w``, which the engine adds
    on ``w``'s stream (the side one) and ``grad()`` captures there; the calling stream reads the result."""
    s = torch.cuda.Stream()
    w = torch.ones(N, device="cuda", requires_grad=True)
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y = w * w
    torch.cuda.current_stream().wait_stream(s)
    (g,) = torch.autograd.grad(y.sum(), w, create_graph=create_graph)
    assert g.sum().item() == 2.0 * N


def test_a_captured_gradient_added_up_by_the_last_node_is_waited_for_at_the_end() -> None:
    """The engine captures ``w``'s gradient at its node on its stream, and the calling stream waits for that leaf
    stream at the end, also where the last node to run added the gradient up (two of its outputs go to ``w``) and
    no node ran after it. Clean, as on a GPU; with ``create_graph=True`` the simulator called the calling stream's
    read of the gradient a race (the capture was never taken from the ready queue: no wait at the end)."""
    for create_graph in (False, True):
        sim = simdevice.cuda()
        sim.run(_grad_of_a_leaf_used_twice_on_a_side_stream, create_graph)
        sim.assert_clean()


def test_a_stream_a_custom_backward_sets_is_put_back_after_its_node() -> None:
    """``tests/hazards.py::backward_sets_its_stream`` (also run on a GPU, tests/gpu): every node made on the default
    stream, one custom Function's backward calling ``set_stream(side)`` with nothing to put it back. The engine's
    stream guard ends with the node: the next node and the caller run on the default stream. Before, where every
    node was the calling stream's the simulator ran the backward unguarded: the next node ran on ``side`` and the
    caller's ``add_`` of the gradient raced with it (a false race), and ``side`` stayed current after
    ``backward()`` (the program's own check failed). A GPU ran it clean, the default stream current after it."""
    from reference.schedule import Schedule
    from simdevice.search.targets import resolve

    line = "tests/hazards.py::backward_sets_its_stream"
    target = resolve(line)
    for tail in ("", "::side#1+20", "::default#2+20", "::side#0+5"):
        out = target.run(Schedule.parse(line + tail))
        assert out.clean, (tail, out.text())
    assert target.run(Schedule.parse(line)).run.op_counts["side"] == 1
