"""Backward's streams for the autograd nodes a side stream's ops make without a torch function: a custom
``torch.autograd.Function.apply``, a module's full backward hooks (a ``BackwardHookFunction`` made through
``Function.apply``), and forwards under ``torch.cuda.set_stream(s)``. A GPU's engine runs each such node, and its
hooks, on the stream current when it was made (its input metadata's, ``Node::stream()``), as any other
(tests/gpu/test_models_gpu.py ``test_a_custom_function_made_in_a_side_stream_s_block_runs_its_backward_there``).
Before, the simulator ran them on the stream current outside the blocks. Each program is plain ``torch.cuda``."""

from __future__ import annotations

from typing import Any

import torch

import simdevice
from simdevice import Race

N = 1024


class _Offload(torch.autograd.Function):
    """The identity; its backward copies the gradient to pinned memory on the current stream (the stream the
    engine runs it on) and records ``ctx.done`` on ``ctx.record_on`` (``current``: the current stream)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, box: dict[str, Any]) -> torch.Tensor:
        ctx.box = box
        return x.clone()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        box = ctx.box
        box["seen"].append(torch.cuda.current_stream().name)
        box["pinned"].copy_(g, non_blocking=True)
        box["done"].record(box["record_on"]())
        return g, None


def _custom_function(record_on: str, how: str = "block", backward_in_block: bool = False) -> list[str]:
    """A forward through ``_Offload`` on a side stream ``s`` (in a ``torch.cuda.stream(s)`` block, or after
    ``torch.cuda.set_stream(s)``), ``backward()`` on the default stream after it waited for ``s`` (or in the block);
    the host waits for the backward's event and reads the pinned gradient."""
    s = torch.cuda.Stream()
    w = torch.ones(N, device="cuda", requires_grad=True)
    box: dict[str, Any] = {"seen": [], "pinned": torch.empty(N, pin_memory=True), "done": torch.cuda.Event(),
                           "record_on": {"s": lambda: s, "default": torch.cuda.default_stream,
                                         "current": torch.cuda.current_stream}[record_on]}
    s.wait_stream(torch.cuda.current_stream())
    if how == "block":
        with torch.cuda.stream(s):
            loss = _Offload.apply(w * 2.0, box).sum()
            if backward_in_block:
                loss.backward()
    else:
        torch.cuda.set_stream(s)
        loss = _Offload.apply(w * 2.0, box).sum()
        if backward_in_block:
            loss.backward()
        torch.cuda.set_stream(torch.cuda.default_stream())
    if not backward_in_block:
        torch.cuda.current_stream().wait_stream(s)
        loss.backward()
    box["done"].synchronize()
    assert torch.equal(box["pinned"], torch.ones(N)), "the host read the pinned grad before the copy finished"
    return box["seen"]


def _verdict(fn: Any, *args: Any) -> tuple[bool, Any]:
    r = simdevice.cuda()
    r.run(fn, *args)
    raced = any(isinstance(x, Race) for x in r.reports)
    return raced, (r.result.result if r.result is not None and not raced else r.text())


def test_a_custom_function_made_in_a_side_stream_s_block_runs_its_backward_there() -> None:
    """``_Offload.apply`` in a side stream's block: its backward sees ``s`` current, whether ``backward()`` is
    called after the block (on the default stream) or in it. An event recorded on ``s`` then covers the backward's
    copy (clean; before, the copy ran on the default stream and raced); one recorded on the default stream does not
    (a race: the default stream waits for ``s`` at the end of backward only; before, clean)."""
    for in_block in (False, True):
        raced, seen = _verdict(_custom_function, "s", "block", in_block)
        assert not raced, seen
        assert seen == ["s"], (in_block, seen)
    raced, text = _verdict(_custom_function, "default", "block", False)
    assert raced, text


def test_a_forward_under_set_stream_runs_its_backward_on_that_stream() -> None:
    """``torch.cuda.set_stream(s)`` before the forward (rather than a block): its nodes, the custom function's
    too, run their backward on ``s``, as the engine runs them on a GPU (before, on the default stream)."""
    for in_block in (False, True):
        raced, seen = _verdict(_custom_function, "s", "set_stream", in_block)
        assert not raced, seen
        assert seen == ["s"], (in_block, seen)
    raced, text = _verdict(_custom_function, "default", "set_stream", False)
    assert raced, text


def _module_hooks(record_on: str, kind: str) -> list[str]:
    """A ``Linear`` with a full backward hook (or pre-hook) whose forward runs in a side stream's block,
    ``backward()`` on the default stream: the hook copies the gradient to pinned memory on the current stream and
    records an event on ``record_on``; the host waits for it and reads the copy."""
    s = torch.cuda.Stream()
    lin = torch.nn.Linear(N, N, bias=False).cuda()
    x = torch.ones(2, N, device="cuda")
    pinned = torch.empty(2, N, pin_memory=True)
    done = torch.cuda.Event()
    seen: list[str] = []

    def copy(g: torch.Tensor) -> None:
        seen.append(torch.cuda.current_stream().name)  # type: ignore[attr-defined]
        pinned.copy_(g, non_blocking=True)
        done.record(s if record_on == "s" else torch.cuda.default_stream())

    if kind == "hook":
        lin.register_full_backward_hook(lambda m, gi, go: copy(go[0]))
    else:
        lin.register_full_backward_pre_hook(lambda m, go: copy(go[0]))
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        loss = lin(x).sum()
    torch.cuda.current_stream().wait_stream(s)
    loss.backward()
    done.synchronize()
    assert torch.equal(pinned, torch.ones(2, N)), "the host read the pinned grad before the copy finished"
    return seen


def test_a_module_s_full_backward_hooks_run_on_its_forward_s_stream() -> None:
    """``register_full_backward_hook`` and ``register_full_backward_pre_hook`` on a module whose forward ran in a
    side stream's block: the hooks see ``s`` current, as on a GPU (their node, a ``BackwardHookFunction``, was made
    on ``s``), so an event recorded on ``s`` covers the hook's copy and one on the default stream does not."""
    for kind in ("hook", "pre"):
        raced, seen = _verdict(_module_hooks, "s", kind)
        assert not raced, (kind, seen)
        assert set(seen) == {"s"}, (kind, seen)
        raced, text = _verdict(_module_hooks, "default", kind)
        assert raced, (kind, text)


def _nested_default_block(record_on: str) -> list[str]:
    """A side stream's block holds a ``torch.cuda.stream(default)`` block, in which a tensor hook's node is made;
    ``backward()`` on the default stream: the hook copies the gradient to pinned memory on the current stream and
    records an event on ``record_on``."""
    s = torch.cuda.Stream()
    w = torch.ones(N, device="cuda", requires_grad=True)
    pinned = torch.empty(N, pin_memory=True)
    done = torch.cuda.Event()
    seen: list[str] = []

    def copy(g: torch.Tensor) -> None:
        seen.append(torch.cuda.current_stream().name)  # type: ignore[attr-defined]
        pinned.copy_(g, non_blocking=True)
        done.record(s if record_on == "s" else torch.cuda.default_stream())

    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        h = w * 2.0
        with torch.cuda.stream(torch.cuda.default_stream()):
            torch.cuda.current_stream().wait_stream(s)
            y = h * 3.0
            y.register_hook(copy)
        torch.cuda.current_stream().wait_stream(torch.cuda.default_stream())
        loss = y.sum()
    torch.cuda.current_stream().wait_stream(s)
    loss.backward()
    done.synchronize()
    assert torch.equal(pinned, torch.ones(N)), "the host read the pinned grad before the copy finished"
    return seen


def test_a_default_stream_block_inside_a_side_stream_s_block_makes_default_stream_nodes() -> None:
    """Nodes made in a ``torch.cuda.stream(default)`` block nested in a side stream's block are the default
    stream's: the hook on one sees the default stream, so an event recorded there covers its copy and one recorded
    on ``s`` does not (before, the side block's tagging reached into the nested block: the reverse)."""
    raced, seen = _verdict(_nested_default_block, "default")
    assert not raced, seen
    assert seen == ["default"], seen
    raced, text = _verdict(_nested_default_block, "s")
    assert raced, text
