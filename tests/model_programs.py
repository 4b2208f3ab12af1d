"""Plain torch.cuda programs for models that had no GPU case, run unchanged on the simulator
(``tests/property/dropin/test_model_programs.py``: the verdicts) and on a GPU
(``tests/gpu/test_model_programs_gpu.py``: the rates and the streams seen, compared with those verdicts).

Each program stalls a stream with ``torch.cuda._sleep(cycles)`` where the race it may have would show on a GPU, and
returns what it saw: the streams its hooks ran on (by name: ``default``, ``side``) and whether it read right.
``streams``: the side streams to use (the GPU test passes the same ones to every trial: the caching allocator keeps
its blocks by stream, and a new stream's first allocation comes from ``cudaMalloc``, which may synchronize the device
and hide a race); None makes them (the simulator's runs).

- ``pause_while_a_kernel_may_run``: a ``torch_memory_saver`` pause with a kernel on the region's memory stalled on a
  side stream, with or without ``torch.cuda.synchronize()`` before the pause; the host then waits for the side
  stream while paused (on a GPU the kernel touches unmapped memory: an illegal memory access) and resumes;
- ``set_stream_forward``: ops made under ``torch.cuda.set_stream(s)``: their node's tensor hook and the leaf's
  post-accumulate-grad hook;
- ``module_hooks``: a module's full backward hook and pre-hook, the forward in a side stream's block (backward on
  the default stream) or on the default stream (backward in the side stream's block);
- ``backward_into_a_non_leaf``: ``backward(inputs=[h])`` of a non-leaf ``h`` made on a side stream, ``h.grad`` read on
  the calling stream with or without a wait for the side stream;
- ``grad_capture``: ``torch.autograd.grad(loss, [w])`` with ``w * x`` made on a side stream, the node's tensor hook
  stalling it; the gradient read on the calling stream (ordered by the engine's final wait for the capture's
  stream) or on another stream that waits for nothing (a race);
- ``child_writes_and_ends``: a child process writes a device buffer it was passed, on its current stream behind a
  stall, and returns without synchronizing; the parent reads the buffer after ``join()`` (the child's received
  tensor dies as its interpreter ends: torch's deleter synchronizes the child's current stream first);
- ``fsdp2_side_stream``: torch's FSDP2 on a layer whose forward computes on a side stream, the calling stream (where
  FSDP2 copies the unsharded weight out of its all-gather) stalled, with or without the side stream's wait for it;
- ``asyncio_offload``: asyncio's default executor offloads a device tensor into pinned memory on a side stream
  stalled before its copy (``loop.run_in_executor(None, fn)``), the worker synchronizing the side stream or not;
  the event loop reads the pinned buffer once the worker has returned;
- ``drop_a_received_tensor``: a consumer process reads a device tensor another process sent it (CUDA IPC) behind a
  stall, drops it and tells the producer, which collects what its consumers let go (``torch.cuda.ipc_collect()``)
  and allocates the block again: torch's deleter of a received storage synchronizes the consumer's *current* stream
  first, so a read there is done by then, one on a side stream is not (with ``record_stream`` or without: torch's
  caching allocator skips a pointer it did not allocate), unless the tensor was the last the consumer held of the
  producer's segment: then the deleter unmaps the segment, which waits for all the consumer's streams.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.multiprocessing as mp

N = 1 << 20


def _names(side: torch.cuda.Stream) -> dict[int, str]:
    return {torch.cuda.default_stream().cuda_stream: "default", side.cuda_stream: "side"}


def _recorder(seen: list[tuple[str, int]], what: str) -> Any:
    def record(*args: Any) -> None:
        seen.append((what, torch.cuda.current_stream().cuda_stream))

    return record


def pause_while_a_kernel_may_run(cycles: int = 1000, wait: bool = False) -> bool:
    """Returns True (on a GPU the racy case faults before it returns)."""
    from torch_memory_saver import torch_memory_saver as tms

    with tms.region("train"):
        w = torch.zeros(N, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(cycles)
        w.add_(1)  # a step's kernel on the region's memory, still queued behind the stall
    if wait:
        torch.cuda.synchronize()  # the fix: the kernel is done before the pause unmaps its memory
    tms.pause("train")
    side.synchronize()  # the kernel runs while its memory is unmapped, unless it ran before
    tms.resume("train")
    torch.cuda.synchronize()
    return True


def set_stream_forward(streams: tuple[torch.cuda.Stream, ...] | None = None) -> list[str]:
    """``y = w * x`` made under ``torch.cuda.set_stream(side)``, the loss on the default stream, ``backward()`` called
    on the default stream. Returns the streams ``y``'s hook (MulBackward's pre-hook) and ``w``'s
    post-accumulate-grad hook ran on."""
    (side,) = streams or (torch.cuda.Stream(),)
    seen: list[tuple[str, int]] = []
    w = torch.randn(N, device="cuda", requires_grad=True)
    x = torch.randn(N, device="cuda")
    w.register_post_accumulate_grad_hook(_recorder(seen, "accumulate"))
    default = torch.cuda.current_stream()
    side.wait_stream(default)
    torch.cuda.set_stream(side)
    y = w * x
    torch.cuda.set_stream(default)
    y.register_hook(_recorder(seen, "y-hook"))
    default.wait_stream(side)
    y.sum().backward()
    names = _names(side)
    return sorted(f"{what}@{names.get(s, s)}" for what, s in seen)


def module_hooks(forward_on_side: bool, cycles: int = 1000,
                 streams: tuple[torch.cuda.Stream, ...] | None = None) -> list[str]:
    """A ``Linear`` with a full backward pre-hook and hook. ``forward_on_side``: the forward in the side stream's block,
    ``backward()`` on the default stream; else the forward on the default stream, ``backward()`` in the side stream's
    block. Returns the streams the hooks ran on."""
    (side,) = streams or (torch.cuda.Stream(),)
    seen: list[tuple[str, int]] = []
    lin = torch.nn.Linear(64, 64).cuda()
    lin.register_full_backward_pre_hook(_recorder(seen, "pre"))
    lin.register_full_backward_hook(_recorder(seen, "full"))
    x = torch.randn(8, 64, device="cuda", requires_grad=True)
    default = torch.cuda.current_stream()
    side.wait_stream(default)
    if forward_on_side:
        with torch.cuda.stream(side):
            y = lin(x)
        default.wait_stream(side)
        y.pow(2).sum().backward()
    else:
        loss = lin(x).pow(2).sum()
        with torch.cuda.stream(side):
            torch.cuda._sleep(cycles)
            loss.backward()
    torch.cuda.synchronize()
    names = _names(side)
    return sorted({f"{what}@{names.get(s, s)}" for what, s in seen})


def grad_capture(read_on: str, cycles: int = 1000, seed: int = 0,
                 streams: tuple[torch.cuda.Stream, ...] | None = None) -> tuple[bool, list[str]]:
    """``torch.autograd.grad(loss, [w])`` on the default stream, ``y = w * x`` made on the side stream, ``y``'s hook
    stalling the stream it runs on. ``read_on``: ``calling`` reads the gradient on the default stream (the engine's
    final wait for the capture's stream orders it), ``other`` on a third stream that waits for nothing. Returns
    (the read got ``x``, the gradient; the streams ``y``'s hook ran on)."""
    side, other = streams or (torch.cuda.Stream(), torch.cuda.Stream())
    seen: list[tuple[str, int]] = []
    g = torch.Generator().manual_seed(seed)  # a seed a trial: a stale read does not find the trial before's values
    w = torch.randn(N, generator=g).cuda().requires_grad_()
    x = torch.randn(N, generator=g).cuda()
    default = torch.cuda.current_stream()
    side.wait_stream(default)
    with torch.cuda.stream(side):
        y = w * x

    def stall(grad: torch.Tensor) -> None:
        seen.append(("y-hook", torch.cuda.current_stream().cuda_stream))
        torch.cuda._sleep(cycles)

    y.register_hook(stall)
    default.wait_stream(side)
    (gw,) = torch.autograd.grad(y.sum(), [w])
    if read_on == "calling":
        got = gw.clone()
    else:
        with torch.cuda.stream(other):
            got = gw.clone()
    torch.cuda.synchronize()
    names = _names(side)
    return bool(torch.equal(got.cpu(), x.cpu())), sorted({f"{what}@{names.get(s, s)}" for what, s in seen})


def backward_into_a_non_leaf(wait: bool, cycles: int = 1000, seed: int = 0,
                             streams: tuple[torch.cuda.Stream, ...] | None = None) -> tuple[bool, list[str]]:
    """``h = w * x`` made on the side stream, ``loss.backward(inputs=[h])`` on the default stream, a hook on ``h``
    stalling the stream it runs on (before ``retain_grad``'s hook writes ``h.grad``), ``h.grad`` read on the default
    stream, after it waits for the side stream or (``wait`` False) not: the engine runs ``h``'s node
    (``backward(inputs=)`` sets ``needed_`` on it), where ``h``'s ``retain_grad`` hook writes ``h.grad``; the node
    returns gradients, so its stream is no leaf stream and the calling stream does not wait for it. Returns (the
    read got the gradient, ``3 + seed``; the streams the hook ran on)."""
    (side,) = streams or (torch.cuda.Stream(),)
    seen: list[tuple[str, int]] = []
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, generator=g).cuda().requires_grad_()
    x = torch.randn(N, generator=g).cuda()
    default = torch.cuda.current_stream()
    side.wait_stream(default)
    with torch.cuda.stream(side):
        h = w * x
    default.wait_stream(side)
    factor = 3.0 + seed  # (the gradient, a trial's own: a block a trial before left behind does not hold it)
    loss = (h * factor).sum()

    def stall(grad: torch.Tensor) -> None:  # (a tensor hook: it runs before retain_grad's, which writes h.grad)
        seen.append(("h-node", torch.cuda.current_stream().cuda_stream))
        torch.cuda._sleep(cycles)

    h.register_hook(stall)
    loss.backward(inputs=[h])
    if wait:
        default.wait_stream(side)
    got = h.grad.clone()
    torch.cuda.synchronize()
    names = _names(side)
    right = bool(torch.equal(got.cpu(), torch.full((N,), factor)))
    return right, sorted({f"{what}@{names.get(s, s)}" for what, s in seen})


#: torchao's driver at the stalls the GPU test uses: the unmodified optimizer and each mutant
def _reuse_when_let_go(q: Any, let_go: Any, reused: Any, read: Any) -> None:
    xs = [torch.full((N,), 5.0, device="cuda") for _ in range(2)]  # (one segment: CUDA IPC maps it as a whole)
    torch.cuda.synchronize()
    q.put(xs)
    del xs  # held for the consumer (torch's limbo) while it holds the tensors
    let_go.wait()
    torch.cuda.ipc_collect()  # the consumer let go of the first: its block goes back to this process's allocator
    y = torch.empty(N, device="cuda")  # the block it sent first
    y.fill_(7.0)
    torch.cuda.synchronize()
    reused.set()
    read.wait()  # (this process holds the memory until the consumer has read)


def drop_a_received_tensor(read_on: str, keep: bool = True, cycles: int = 1000,
                           streams: tuple[torch.cuda.Stream, ...] | None = None) -> bool:
    """The producer sends two tensors of one segment; the consumer reads the first behind a stall and drops it,
    keeping the second (``keep``) or not. ``read_on``: ``current`` (the read on the consumer's current stream),
    ``side`` (on a side stream) or ``side-recorded`` (and ``x.record_stream(side)`` before the drop). Whether the
    consumer read what was sent: the drop waits for the current stream, or for every stream where it is the
    segment's last tensor (``cudaIpcCloseMemHandle``)."""
    ctx = mp.get_context("spawn")
    q, let_go, reused, read = ctx.Queue(), ctx.Event(), ctx.Event(), ctx.Event()
    p = ctx.Process(target=_reuse_when_let_go, args=(q, let_go, reused, read), name="producer")
    p.start()
    x, other = q.get()
    if not keep:
        del other
    (side,) = streams or (torch.cuda.Stream(),)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(torch.cuda.current_stream() if read_on == "current" else side):
        torch.cuda._sleep(cycles)
        total = x.sum()
    if read_on == "side-recorded":
        x.record_stream(side)
    del x  # torch's deleter synchronizes the current stream (or unmaps the segment), then lets the block go
    let_go.set()
    reused.wait()
    torch.cuda.current_stream().wait_stream(side)
    right = total.item() == 5.0 * N
    read.set()
    p.join()
    return right


def _write_and_end(buf: torch.Tensor, cycles: int) -> None:
    torch.cuda._sleep(cycles)
    buf.fill_(7.0)  # on the child's current stream, behind the stall; no synchronize before it returns


def child_writes_and_ends(cycles: int = 1000) -> bool:
    """The parent passes a device buffer to a child process (CUDA IPC), which writes it on its current stream behind
    a stall and returns without synchronizing; the parent joins it and reads the buffer. Whether the read saw the
    write: the child's received tensor dies as its interpreter ends, and torch's deleter synchronizes its current
    stream first, so the join comes after the write."""
    ctx = mp.get_context("spawn")
    buf = torch.zeros(N, device="cuda")
    torch.cuda.synchronize()
    p = ctx.Process(target=_write_and_end, args=(buf, cycles), name="writer")
    p.start()
    p.join()
    return bool(buf.sum().item() == 7.0 * N)


def _one_rank_group() -> None:
    """On a GPU, a process group of this process alone for FSDP2's mesh (a run of the simulator has its default
    group from the start)."""
    import os

    import torch.distributed as dist

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29531")
        dist.init_process_group("nccl", rank=0, world_size=1)


class SideLinear(torch.nn.Linear):
    """A linear layer (no bias) whose output is computed on a side stream, after a wait for the calling stream or
    (``wait`` False) not."""

    def __init__(self, n: int, side: torch.cuda.Stream, wait: bool) -> None:
        super().__init__(n, n, bias=False)
        self.side, self.wait = side, wait

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.wait:
            self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side):
            y = torch.nn.functional.linear(x, self.weight)
        torch.cuda.current_stream().wait_stream(self.side)
        return y


def trained_beside_a_plain_copy(model: torch.nn.Module, wrap: Any, steps: int = 2) -> tuple[Any, torch.nn.Module]:
    """``model`` (on the device) wrapped by ``wrap`` (FSDP1's class, FSDP2's ``fully_shard`` applied by a function)
    and a plain copy of it, trained ``steps`` SGD steps side by side: the wrapped one on this rank's batch, the copy on
    the mean of every rank's loss (as data parallelism averages the gradients). The two, to be compared."""
    import copy

    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    ref = copy.deepcopy(model)
    wrapped = wrap(model)
    opt, ref_opt = torch.optim.SGD(wrapped.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    xs = [torch.randn(8, 16, device="cuda") + r for r in range(world)]
    for _ in range(steps):
        wrapped(xs[rank]).sum().backward()
        opt.step()
        opt.zero_grad()
        (sum(ref(x).sum() for x in xs) / world).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    return wrapped, ref


def fsdp2_side_stream(wait: bool, cycles: int = 1000, seed: int = 0,
                      streams: tuple[torch.cuda.Stream, ...] | None = None) -> tuple[bool, list[str]]:
    """torch's FSDP2 (``fully_shard``, a mesh of one rank) on a layer that computes on a side stream: the calling
    stream stalled, then the forward, in which FSDP2 all-gathers the weight and copies it out on the calling stream
    (behind the stall); the side stream reads the unsharded weight after a wait for the calling stream or
    (``wait`` False) not. Returns (the output was right, the side stream's name)."""
    from torch.distributed.fsdp import fully_shard

    _one_rank_group()
    (side,) = streams or (torch.cuda.Stream(),)
    n = 256
    g = torch.Generator().manual_seed(seed)
    layer = SideLinear(n, side, wait)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(n, n, generator=g))
    weight = layer.weight.detach().clone()
    x = torch.randn(4, n, generator=g)
    expected = x @ weight.T
    layer = layer.cuda()
    fully_shard(layer)
    x = x.cuda()
    side.wait_stream(torch.cuda.current_stream())  # (the input ready: the race is the weight's alone)
    torch.cuda._sleep(cycles)  # the calling stream stalled: FSDP2's unshard comes after it
    with torch.no_grad():
        out = layer(x)
    right = bool(torch.allclose(out.cpu(), expected, rtol=1e-4, atol=1e-4))
    torch.cuda.synchronize()
    return right, sorted(_names(side).values())


def asyncio_offload(wait: bool, cycles: int = 1000, seed: int = 0,
                    streams: tuple[torch.cuda.Stream, ...] | None = None) -> tuple[bool, list[str]]:
    """asyncio's default executor copies a device tensor into zeroed pinned memory on a side stream, stalled before
    the copy; the worker synchronizes the side stream (``wait``) or returns at once; the event loop then reads the
    pinned buffer. Returns (the read was right, the side stream's name)."""
    import asyncio

    (side,) = streams or (torch.cuda.Stream(),)
    expected = torch.randn(N // 16, generator=torch.Generator().manual_seed(seed))
    x = expected.cuda()
    pinned = torch.zeros(N // 16, pin_memory=True)

    def offload() -> None:
        side.wait_stream(torch.cuda.default_stream())  # (the source ready: the race is the pinned buffer's alone)
        with torch.cuda.stream(side):
            torch.cuda._sleep(cycles)
            pinned.copy_(x, non_blocking=True)
        if wait:
            side.synchronize()

    async def main() -> torch.Tensor:
        await asyncio.get_running_loop().run_in_executor(None, offload)
        return pinned.clone()

    right = bool(torch.equal(asyncio.run(main()), expected))
    torch.cuda.synchronize()
    return right, sorted(_names(side).values())


def graph_copy_in(wait: bool, cycles: int = 1000, seed: int = 0,
                  streams: tuple[torch.cuda.Stream, ...] | None = None) -> tuple[bool, list[str]]:
    """A CUDA graph captured over a static input (``out = static_in * 2``); the next input copied into the static
    input from pinned memory on a copy stream, stalled before the copy; the current stream waits for the copy
    (``wait``) or not, then replays the graph. Returns (the output was right, the copy stream's name)."""
    (copy,) = streams or (torch.cuda.Stream(),)
    expected = torch.randn(N // 16, generator=torch.Generator().manual_seed(seed))
    host = expected.pin_memory()
    static_in = torch.zeros(N // 16, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_out = static_in * 2
    copy.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(copy):
        torch.cuda._sleep(cycles)
        static_in.copy_(host, non_blocking=True)
    if wait:
        torch.cuda.current_stream().wait_stream(copy)
    g.replay()
    right = bool(torch.equal(static_out.cpu(), expected * 2))
    torch.cuda.synchronize()
    return right, sorted(_names(copy).values())


def graph_freed_input(keep: bool, cycles: int = 0, seed: int = 0,
                      streams: tuple[torch.cuda.Stream, ...] | None = None) -> tuple[bool, list[str]]:
    """A CUDA graph captured over ``x`` (``out = x * 3``); the program drops ``x`` (``keep`` False: the graph holds
    no reference to it) and makes a tensor of its size on its stream, which takes its block; then replays the graph.
    Returns (the output was right, no stream: ``cycles`` and ``streams`` unused)."""
    torch.cuda.empty_cache()  # (an earlier call's free blocks given back: ``x``'s block is the one of its size)
    expected = torch.randn(N // 16, generator=torch.Generator().manual_seed(seed))
    x = expected.cuda()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = x * 3
    if not keep:
        del x
    y = torch.full((N // 16,), 7.0, device="cuda")
    g.replay()
    right = bool(torch.allclose(out.cpu(), expected * 3))
    assert torch.equal(y.cpu(), torch.full((N // 16,), 7.0))
    torch.cuda.synchronize()
    return right, []


TORCHAO = "tests/upstream/torchao_offload.py"
TORCHAO_LINES = {
    "train_without_backward_wait": "train::default#7+20",  # the forward's first op, after the batch's H2D syncs
    "train_without_event_sync": "train::stream#0+20",  # the first gradient D2H
    "train_without_stream_sync": "train::stream#2+20",  # the first parameter H2D
    "train_without_record_stream": "train:offload_gradients=1:stream#0+20",
}


#: torchao's optimizer unmodified under torch's ``GradScaler("cuda")``, its first gradient D2H stalled: the scaler
#: unscales the pinned gradients on the host before they land (racy), against the same stall without a scaler
TORCHAO_SCALED_LINES = [(f"{TORCHAO}::train_scaled::stream#0+20", True), (f"{TORCHAO}::train::stream#0+20", False)]


def torchao_lines() -> list[tuple[str, bool]]:
    """(line, racy) for each mutant at its stall and the unmodified optimizer at the same stall."""
    out = []
    for mutant, fixed in TORCHAO_LINES.items():
        config_and_stall = fixed.split(":", 1)[1]
        out += [(f"{TORCHAO}::{mutant}:{config_and_stall.removeprefix('offload_gradients=1')}", True),
                (f"{TORCHAO}::{fixed}", False)]
    return out
