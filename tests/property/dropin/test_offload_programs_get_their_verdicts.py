"""Small plain torch.cuda offloading programs, each correct and with one synchronization wrong: the correct one runs
clean, the wrong one races at the default schedule (what CUDA's stream semantics say of each). Layer-by-layer
weight streaming, a KV cache offloaded and reloaded between decode steps, gradients offloaded from a
post-accumulate-grad hook to a CPU optimizer step, non-reentrant checkpointing inside activation offload, ping-pong
device buffers, adjacent slices of one pinned buffer, an optimizer step on a side stream, and a high-priority copy
stream polled with ``query()`` and timed with events."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import torch

import simdevice

N = 256
LAYERS = 4


def weight_streaming(mode: str = "ok") -> None:
    """Inference streaming each layer's weight H2D from pinned memory on a side stream while the layer before
    computes, an event per layer. ``mode``: ``ok``; ``early`` (layer i waits for layer i-1's event, the off-by-one);
    ``no-record`` (a weight allocated on the copy stream is freed after the compute stream used it without
    ``record_stream``, so a later prefetch takes its block)."""
    host = [torch.full((N, N), float(i + 1) / N) for i in range(LAYERS)]
    pinned = [h.pin_memory() for h in host]
    copy = torch.cuda.Stream()
    events: list[torch.cuda.Event] = []
    weights: list[torch.Tensor] = []

    def prefetch(i: int) -> None:
        with torch.cuda.stream(copy):
            w = torch.empty(N, N, device="cuda")
            w.copy_(pinned[i], non_blocking=True)
            ev = torch.cuda.Event()
            ev.record()
        weights.append(w)
        events.append(ev)

    x = torch.ones(8, N, device="cuda")
    prefetch(0)
    for i in range(LAYERS):
        if i + 1 < LAYERS:
            prefetch(i + 1)
        torch.cuda.current_stream().wait_event(events[i - 1 if mode == "early" and i else i])
        w = weights[i]
        if mode != "no-record":
            w.record_stream(torch.cuda.current_stream())
        x = x @ w
        weights[i] = None  # type: ignore[call-overload]
        del w
    want = torch.ones(8, N)
    for h in host:
        want = want @ h
    assert torch.allclose(x.cpu(), want), "the output differs from the host's"


def weight_streaming_staging(sync: bool = True) -> None:
    """One pinned staging buffer: the host refills it for the next layer, which must first synchronize on the
    event of the copy that last read it."""
    host = [torch.full((N,), float(i + 1)) for i in range(LAYERS)]
    staging = torch.empty(N, pin_memory=True)
    copy = torch.cuda.Stream()
    read = torch.cuda.Event()
    outs = []
    for i in range(LAYERS):
        if sync:
            read.synchronize()
        staging.copy_(host[i])
        with torch.cuda.stream(copy):
            outs.append(torch.empty(N, device="cuda").copy_(staging, non_blocking=True))
            read.record()
    torch.cuda.current_stream().wait_stream(copy)
    assert [o.sum().item() for o in outs] == [float(i + 1) * N for i in range(LAYERS)]


def kv_offload(mode: str = "ok") -> None:
    """Decode steps offload the oldest KV block D2H into a pinned slot on a side stream and reload it later.
    ``mode``: ``ok``; ``reuse`` (the host clears the pinned slot for the next block without synchronizing on the
    reload that reads it); ``reload`` (the reload H2D on the compute stream does not wait for the offload's event)."""
    off = torch.cuda.Stream()
    slots = [torch.empty(N, pin_memory=True) for _ in range(2)]
    done = [torch.cuda.Event(), torch.cuda.Event()]
    used = [False, False]
    back, kvs = [], []
    for step in range(4):
        kv = torch.full((N,), float(step + 1), device="cuda") * 1.0  # this step's block
        slot = step % 2
        if used[slot]:
            if mode != "reload":
                torch.cuda.current_stream().wait_event(done[slot])
            back.append(slots[slot].to("cuda", non_blocking=True))  # reload the block from two steps back
            if mode != "reuse":
                torch.cuda.current_stream().synchronize()  # the reload read the slot
            slots[slot].zero_()  # the host clears the slot before the next offload
        off.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(off):
            slots[slot].copy_(kv, non_blocking=True)
            done[slot].record()
        kvs.append(kv)  # the cache keeps its blocks on the device too
        used[slot] = True
    torch.cuda.synchronize()
    assert [b.sum().item() for b in back] == [float(s + 1) * N for s in range(2)], "a reloaded block is wrong"


def grad_offload(mode: str = "ok") -> None:
    """Each gradient goes D2H into pinned memory on a side stream from a post-accumulate-grad hook; an SGD step on
    the CPU reads the pinned gradients. ``mode``: ``ok``; ``no-sync`` (the CPU step without synchronizing on the
    events); ``zero`` (``zero_grad(set_to_none=False)`` zeroes ``p.grad`` on the compute stream while the D2H may
    read it, where the others free ``p.grad`` in the hook); ``free`` (the hook sets ``p.grad = None`` without
    ``record_stream``, so the rest of backward takes its block under the D2H)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(N, N), torch.nn.Tanh(), torch.nn.Linear(N, N)).cuda()
    ref = torch.nn.Sequential(torch.nn.Linear(N, N), torch.nn.Tanh(), torch.nn.Linear(N, N))
    ref.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    side = torch.cuda.Stream()
    pinned = {p: torch.empty(p.shape, pin_memory=True) for p in model.parameters()}
    master = {p: p.detach().cpu() for p in model.parameters()}
    events: dict[torch.nn.Parameter, torch.cuda.Event] = {}

    def hook(p: torch.nn.Parameter) -> None:
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            pinned[p].copy_(p.grad, non_blocking=True)
            events[p] = torch.cuda.Event()
            events[p].record()
        if mode != "zero":
            if mode != "free":
                p.grad.record_stream(side)  # type: ignore[union-attr]
            p.grad = None  # offloaded: the device gradient is not kept

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)
    xs = [torch.randn(4, N) for _ in range(2)]
    for x in xs:
        model(x.cuda()).pow(2).mean().backward()
        if mode == "zero":
            model.zero_grad(set_to_none=False)  # on the compute stream, while the D2H may still read it
        with torch.no_grad():
            for p in model.parameters():
                if mode != "no-sync":
                    events[p].synchronize()
                master[p].sub_(0.1 * pinned[p])
                p.copy_(master[p], non_blocking=False)
        ref(x).pow(2).mean().backward()
        with torch.no_grad():
            for q in ref.parameters():
                q.sub_(0.1 * q.grad)  # type: ignore[operator]
                q.grad = None
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        assert torch.allclose(p.detach().cpu(), q, atol=1e-5), "a weight differs from the host's"


def checkpoint_offload(mode: str = "ok") -> None:
    """Activations outside a non-reentrant ``checkpoint`` offloaded D2H on a side stream by saved-tensor hooks and
    reloaded in backward; the checkpointed block is recomputed. ``mode``: ``ok``; ``no-d2h-wait`` (the offload
    stream does not wait for the compute stream); ``no-h2d-wait`` (the reload does not wait for the offload)."""
    torch.manual_seed(0)
    s = torch.cuda.Stream()
    w1, w2, w3 = (torch.randn(N, N) / N**0.5 for _ in range(3))
    dw = [w.cuda().requires_grad_() for w in (w1, w2, w3)]
    x = torch.randn(8, N)

    def pack(t: torch.Tensor) -> object:
        if t.requires_grad and t.is_leaf:
            return t
        p = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        if mode != "no-d2h-wait":
            s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            p.copy_(t, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record()
        t.record_stream(s)
        return p, ev

    def unpack(packed: object) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        p, ev = packed  # type: ignore[misc]
        if mode != "no-h2d-wait":
            torch.cuda.current_stream().wait_event(ev)
        return p.to("cuda", non_blocking=True)

    def block(h: torch.Tensor) -> torch.Tensor:
        return torch.tanh(h @ dw[1]) * 2.0

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        a = torch.tanh(x.cuda() @ dw[0])
        b = torch.utils.checkpoint.checkpoint(block, a, use_reentrant=False)
        loss = torch.tanh(b @ dw[2]).pow(2).sum()
    loss.backward()
    rw = [w.clone().requires_grad_() for w in (w1, w2, w3)]
    torch.tanh(torch.tanh(torch.tanh(x @ rw[0]) @ rw[1]) * 2.0 @ rw[2]).pow(2).sum().backward()
    for d, r in zip(dw, rw, strict=True):
        assert torch.allclose(d.grad.cpu(), r.grad, rtol=1e-4, atol=1e-5), "a gradient differs"  # type: ignore[union-attr]


def ping_pong(mode: str = "ok") -> None:
    """Two device buffers filled alternately by H2D on a copy stream and consumed on the compute stream, an event
    per buffer each way. ``mode``: ``ok``; ``refill`` (the refill of a buffer waits for the consumption of the other
    one: the classic off-by-one); ``fill`` (the compute waits for the other buffer's latest fill, the previous
    chunk's, before the next chunk's fill re-records it)."""
    chunks = [torch.full((N,), float(i + 1)).pin_memory() for i in range(6)]
    copy = torch.cuda.Stream()
    bufs = [torch.empty(N, device="cuda") for _ in range(2)]
    filled = [torch.cuda.Event(), torch.cuda.Event()]
    consumed = [torch.cuda.Event(), torch.cuda.Event()]
    copy.wait_stream(torch.cuda.current_stream())

    def fill(i: int) -> None:
        b = i % 2
        copy.wait_event(consumed[(b + 1) % 2 if mode == "refill" else b])
        with torch.cuda.stream(copy):
            bufs[b].copy_(chunks[i], non_blocking=True)
            filled[b].record()

    acc = torch.zeros(N, device="cuda")
    fill(0)
    for i in range(len(chunks)):
        b = i % 2
        if mode == "fill" and i:
            torch.cuda.current_stream().wait_event(filled[(b + 1) % 2])  # chunk i-1's fill, not chunk i's
        if i + 1 < len(chunks):
            fill(i + 1)
        if mode != "fill":
            torch.cuda.current_stream().wait_event(filled[b])
        acc.add_(bufs[b])
        consumed[b].record()
    assert acc.sum().item() == float(sum(range(1, 7)) * N), "the sum differs"


def pinned_slices(mode: str = "ok") -> None:
    """Several tensors offloaded into adjacent slices of one pinned buffer, each on its own stream with its own
    event (odd lengths of float16, so that the slices meet inside a 4-byte word). ``mode``: ``ok`` (the host reads
    each slice after its own event); ``overlap`` (the second slice starts one element early, inside the first);
    ``whole`` (the host reads the whole buffer after the first event alone)."""
    n = 7
    big = torch.zeros(3 * n, dtype=torch.float16, pin_memory=True)
    srcs = [torch.full((n,), float(i + 1), dtype=torch.float16, device="cuda") for i in range(3)]
    streams = [torch.cuda.Stream() for _ in range(3)]
    events = []
    for i, (src, s) in enumerate(zip(srcs, streams, strict=True)):
        start = i * n - (1 if mode == "overlap" and i == 1 else 0)
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            big[start:start + n].copy_(src, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record()
        src.record_stream(s)
        events.append(ev)
    if mode == "whole":
        events[0].synchronize()
        assert big.sum().item() == float(6 * n)
    events[0].synchronize()
    first = big[:n].clone()
    events[1].synchronize()
    second = big[n:2 * n].clone()
    events[2].synchronize()
    third = big[2 * n:].clone()
    assert [first.sum().item(), second.sum().item(), third.sum().item()] == [float(n), 2.0 * n, 3.0 * n]


def optimizer_on_a_side_stream(mode: str = "ok", impl: str = "foreach") -> None:
    """The optimizer step on a side stream after ``wait_stream``; the next forward on the default stream waits for
    it. ``mode``: ``ok``; ``no-wait`` (the next forward without waiting for the step); ``no-step-wait`` (the step
    without waiting for backward). ``impl``: ``foreach``, ``fused`` or ``for-loop`` (``torch.optim.Adam``), or
    ``sgd`` (``torch.optim.SGD``, foreach, momentum)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(N, N).cuda()
    ref = torch.nn.Linear(N, N)
    ref.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})

    def make(params: Any, cuda: bool) -> torch.optim.Optimizer:
        if impl == "sgd":
            return torch.optim.SGD(params, lr=0.1, momentum=0.9, foreach=cuda)
        kw = {"fused": True} if impl == "fused" and cuda else {"foreach": impl == "foreach" and cuda}
        return torch.optim.Adam(params, lr=0.01, **kw)

    opt, ref_opt = make(model.parameters(), True), make(ref.parameters(), False)
    side = torch.cuda.Stream()
    xs = [torch.randn(4, N) for _ in range(3)]
    for x in xs:
        if mode != "no-wait":
            torch.cuda.current_stream().wait_stream(side)
        model(x.cuda()).pow(2).mean().backward()
        if mode != "no-step-wait":
            side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            opt.step()
            opt.zero_grad(set_to_none=False)
        ref(x).pow(2).mean().backward()
        ref_opt.step()
        ref_opt.zero_grad()
    torch.cuda.current_stream().wait_stream(side)
    assert torch.allclose(model.weight.detach().cpu(), ref.weight, atol=1e-5), "the weights differ from the host's"


def priority_copy(mode: str = "ok") -> None:
    """A high-priority copy stream, polled with ``query()``, timed with events. ``mode``: ``ok``; ``poll-default``
    (the host polls the default stream, not the copy stream, before reading the copy's result); ``early-elapsed``
    (``elapsed_time`` before the end event completed: CUDA raises ``cudaErrorNotReady``)."""
    copy = torch.cuda.Stream(priority=-1)
    start = torch.cuda.Event(interprocess=False, enable_timing=True)
    end = torch.cuda.Event(interprocess=False, enable_timing=True)
    src = torch.arange(N, dtype=torch.float32, device="cuda")
    dst = torch.empty(N, pin_memory=True)
    copy.wait_stream(torch.cuda.current_stream())
    start.record(copy)
    with torch.cuda.stream(copy):
        dst.copy_(src, non_blocking=True)
    end.record(copy)
    src.record_stream(copy)
    if mode == "early-elapsed":
        start.elapsed_time(end)
    polled = torch.cuda.current_stream() if mode == "poll-default" else copy
    while not polled.query():
        time.sleep(1e-4)
    assert dst.sum().item() == float(N * (N - 1) // 2)
    end.synchronize()
    assert start.elapsed_time(end) >= 0.0


#: (program, its arguments) of each correct program
CORRECT: dict[str, tuple[Callable[..., None], tuple[Any, ...]]] = {
    "weight streaming": (weight_streaming, ()),
    "weight streaming through one staging buffer": (weight_streaming_staging, ()),
    "KV cache offload": (kv_offload, ()),
    "gradient offload from a hook": (grad_offload, ()),
    "checkpoint inside activation offload": (checkpoint_offload, ()),
    "ping-pong buffers": (ping_pong, ()),
    "adjacent pinned slices": (pinned_slices, ()),
    "Adam (foreach) on a side stream": (optimizer_on_a_side_stream, ("ok", "foreach")),
    "Adam (fused) on a side stream": (optimizer_on_a_side_stream, ("ok", "fused")),
    "SGD (foreach) on a side stream": (optimizer_on_a_side_stream, ("ok", "sgd")),
    "a high-priority copy stream polled": (priority_copy, ()),
}

#: (program, its arguments) of each program with one synchronization wrong
RACY: dict[str, tuple[Callable[..., None], tuple[Any, ...]]] = {
    "a layer waits for the previous layer's event": (weight_streaming, ("early",)),
    "a streamed weight freed without record_stream": (weight_streaming, ("no-record",)),
    "the staging buffer refilled under its copy": (weight_streaming_staging, (False,)),
    "a KV slot cleared under its reload": (kv_offload, ("reuse",)),
    "a KV block reloaded before its offload": (kv_offload, ("reload",)),
    "the CPU step without the events": (grad_offload, ("no-sync",)),
    "zero_grad under the gradient's D2H": (grad_offload, ("zero",)),
    "the gradient freed in the hook without record_stream": (grad_offload, ("free",)),
    "an offload before the activation is computed": (checkpoint_offload, ("no-d2h-wait",)),
    "a reload before its offload, around a checkpoint": (checkpoint_offload, ("no-h2d-wait",)),
    "a buffer refilled after the other one's consumption": (ping_pong, ("refill",)),
    "a buffer consumed after the previous fill": (ping_pong, ("fill",)),
    "pinned slices overlapping by one element": (pinned_slices, ("overlap",)),
    "the whole pinned buffer read after one event": (pinned_slices, ("whole",)),
    "the forward without waiting for the step (fused)": (optimizer_on_a_side_stream, ("no-wait", "fused")),
    "the step without waiting for backward": (optimizer_on_a_side_stream, ("no-step-wait", "sgd")),
    "the default stream polled for the copy stream's work": (priority_copy, ("poll-default",)),
}


@pytest.mark.parametrize("case", list(CORRECT))
def test_the_correct_program_is_clean(case: str) -> None:
    program, args = CORRECT[case]
    run = simdevice.cuda()
    run.run(program, *args)
    run.assert_clean()


@pytest.mark.parametrize("case", list(RACY))
def test_the_wrong_program_races(case: str) -> None:
    program, args = RACY[case]
    run = simdevice.cuda()
    run.run(program, *args)
    assert run.result is not None
    assert "race" in {r.kind for r in run.result.reports}, run.text()


def test_elapsed_time_before_the_end_event_completed_raises_as_cuda_does() -> None:
    run = simdevice.cuda()
    run.run(priority_copy, "early-elapsed")
    assert run.result is not None
    assert [r.kind for r in run.result.reports] == ["host-error"], run.text()
    assert "has not completed" in run.text()
