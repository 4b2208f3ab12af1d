"""Two of the drop-in's models on a real GPU, plain torch.cuda and torch.distributed, streams stalled with
``torch.cuda._sleep``:

- ``dist.barrier(async_op=True).wait()`` blocks the host until the current stream is done, where the barrier is not
  done by then (``tests/property/dropin/test_barrier_blocks_the_host.py``; ``simdevice.runtime.Runtime.work_wait``).
  A real NCCL group of this one process (a world of one: NCCL takes one GPU a rank, so one GPU can check one rank;
  what is checked is that rank's own host and streams, ``WorkNCCL::wait``). torch's ``WorkNCCL::wait``, as the
  simulator, synchronizes the current stream only while the barrier's all-reduce is not done (``isBarrierOp_ &&
  !isCompleted()``), so each case prints whether it was done when ``wait()`` was called, and one case makes it done
  first;
- ``loss.backward()`` in a side stream's block runs the backward of default-stream forward ops on the default
  stream, and the leaves' ``AccumulateGrad`` there too (``tests/property/dropin/test_streams.py``): a custom
  autograd Function and a post-accumulate-grad hook record the stream current where the engine runs them. (A custom
  Function made in a side stream's block: the last case, a difference from the simulator found on the way.)

Run: ``NCCL_NVLS_ENABLE=0 python -m pytest -q -s tests/gpu/test_models_gpu.py`` on a CUDA machine. Each case prints
``RATE``; ``MODELS_GPU_TRIALS`` sets the trials (default 5).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import torch.distributed as dist  # noqa: E402

from reference.cuda import calibrate_sleep_cycles_per_ms  # noqa: E402

pytestmark = pytest.mark.gpu

TRIALS = int(os.environ.get("MODELS_GPU_TRIALS", "5"))
N = 1 << 20
STALL_MS = 100


def _where() -> str:
    return f"(torch {torch.__version__}, {torch.cuda.get_device_name()})"


@pytest.fixture(scope="module")
def cycles() -> int:
    return int(STALL_MS * calibrate_sleep_cycles_per_ms())


@pytest.fixture(scope="module")
def world_of_one(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A real NCCL process group of this one process (a FileStore), its communicator made before the trials (its
    set-up synchronizes the device)."""
    if dist.is_initialized():
        pytest.skip("a process group exists already in this process")
    torch.cuda.set_device(0)
    store = dist.FileStore(str(tmp_path_factory.mktemp("nccl") / "store"), 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1)
    try:
        dist.all_reduce(torch.zeros(1, device="cuda"))
        dist.barrier(async_op=True).wait()
        torch.cuda.synchronize()
        yield
    finally:
        dist.destroy_process_group()


def _barrier_then_host_read(cycles: int, stall: str) -> tuple[bool, bool]:
    """A D2H into pinned memory queued after ``dist.barrier(async_op=True)``'s call, on the current stream or a side
    one, then ``work.wait()`` and the host reads the buffer. ``stall``:

    - ``before``: the current stream stalled before the barrier's call (the barrier's all-reduce waits for it: not
      done at ``wait()``), the D2H on the current stream;
    - ``after``: the current stream stalled after the barrier's call, before the D2H; the host waits, without
      synchronizing anything, until the barrier reports itself done, then calls ``wait()``;
    - ``side``: the current stream stalled a quarter as long before the barrier's call, the D2H on a side stream
      stalled the whole time.

    Returns (the host read the D2H's values, the barrier was done when ``wait()`` was called)."""
    x = torch.arange(N, dtype=torch.float32, device="cuda") * 2
    want = torch.arange(N, dtype=torch.float32) * 2
    pinned = torch.zeros(N, pin_memory=True)
    cur = torch.cuda.current_stream()
    s = torch.cuda.Stream() if stall == "side" else cur
    torch.cuda.synchronize()
    if stall == "side":
        s.wait_stream(cur)
    if stall in ("before", "side"):
        torch.cuda._sleep(cycles // 4 if stall == "side" else cycles)
    work = dist.barrier(async_op=True)
    with torch.cuda.stream(s):
        if stall in ("after", "side"):
            torch.cuda._sleep(cycles)
        pinned.copy_(x, non_blocking=True)
    if stall == "after":
        deadline = time.monotonic() + 5
        while not work.is_completed() and time.monotonic() < deadline:
            time.sleep(0.001)
    done = bool(work.is_completed())
    work.wait()
    right = bool(torch.equal(pinned, want))  # the host reads at once
    torch.cuda.synchronize()
    return right, done


def _barrier_rate(cycles: int, stall: str) -> tuple[int, int]:
    _barrier_then_host_read(cycles, stall)  # warm-up, not counted
    right = done = 0
    for _ in range(TRIALS):
        r, d = _barrier_then_host_read(cycles, stall)
        right += r
        done += d
    print(f"RATE barrier(async_op=True).wait(), then the host reads a D2H queued after the barrier's call ({stall}): "
          f"read right {right}/{TRIALS}, the barrier done at wait() {done}/{TRIALS}, world of one {_where()}",
          flush=True)
    return right, done


def test_a_barrier_s_wait_blocks_the_host_until_the_current_stream_is_done(world_of_one: None, cycles: int) -> None:
    """The simulator test's program, the barrier waiting for a stall of the current stream: ``wait()`` synchronizes
    the current stream, the D2H queued after the barrier's call included."""
    right, done = _barrier_rate(cycles, "before")
    assert done == 0, "the barrier was done before wait(): the case does not show the synchronization"
    assert right == TRIALS, "wait() returned before the current stream's D2H"


def test_a_barrier_s_wait_does_not_block_the_host_where_the_barrier_is_done(world_of_one: None, cycles: int) -> None:
    """torch's ``WorkNCCL::wait`` (2.x) synchronizes the current stream only ``if (isBarrierOp_ &&
    !isCompleted())``, and so does the simulator's ``Runtime.work_wait``: where the barrier's all-reduce is done by
    then (it waited for nothing stalled) and a D2H queued after the call is stalled, the host's read comes first."""
    right, done = _barrier_rate(cycles, "after")
    assert done == TRIALS, "the barrier was not done before wait() (the case needs it done)"
    assert right < TRIALS, "wait() of a barrier done before it synchronized the current stream"


def test_a_barrier_s_wait_does_not_synchronize_another_stream(world_of_one: None, cycles: int) -> None:
    """A D2H on a side stream stalled past the current stream's stall: ``wait()`` synchronizes the current stream
    only; the host reads the side stream's buffer stale."""
    right, done = _barrier_rate(cycles, "side")
    assert done == 0, "the barrier was done before wait(): the case does not show the synchronization"
    assert right < TRIALS, "wait() synchronized the side stream too"


class _Probe(torch.autograd.Function):
    """The identity, recording in ``seen`` the stream current where the engine runs its backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, seen: list[tuple[str, int]]) -> torch.Tensor:
        ctx.seen = seen
        return x.clone()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.seen.append(("probe", torch.cuda.current_stream().cuda_stream))
        return g, None


def _backward_in_a_side_block(forward_on_side: bool, cycles: int, seed: int,
                              s: torch.cuda.Stream) -> tuple[bool, list[str]]:
    """The simulator test's program (``_backward_on_a_side_stream``), the side stream stalled at the start of
    ``backward()``'s block, a probe after the gelu and a post-accumulate-grad hook on the weight. Returns (the
    weight's gradient read on the default stream, with no wait for the side stream, was the final one; the streams
    the probe's backward and the weight's AccumulateGrad ran on, by name). One side stream for every trial: the
    caching allocator keeps its blocks by stream, and a new stream's first allocations in backward would come from
    ``cudaMalloc``, which may synchronize the device and hide the race."""
    torch.manual_seed(seed)  # a seed a trial: a stale read does not find the trial before's values
    seen: list[tuple[str, int]] = []
    lin = torch.nn.Linear(8, 8).cuda()
    lin.weight.register_post_accumulate_grad_hook(
        lambda p: seen.append(("accumulate", torch.cuda.current_stream().cuda_stream)))
    x = torch.randn(4, 8).cuda().mul(2.0)
    torch.cuda.synchronize()
    s.wait_stream(torch.cuda.current_stream())
    if forward_on_side:
        with torch.cuda.stream(s):
            loss = _Probe.apply(torch.nn.functional.gelu(lin(x)), seen).pow(2).mean()
    else:
        loss = _Probe.apply(torch.nn.functional.gelu(lin(x)), seen).pow(2).mean()  # on the default stream
    with torch.cuda.stream(s):
        torch.cuda._sleep(cycles)
        loss.backward()
    assert lin.weight.grad is not None
    got = lin.weight.grad.mul(1.0).cpu()  # read on the default stream
    torch.cuda.synchronize()
    names = {torch.cuda.default_stream().cuda_stream: "default", s.cuda_stream: "side"}
    return bool(torch.equal(got, lin.weight.grad.cpu())), [f"{what}@{names.get(st, st)}" for what, st in seen]


@pytest.mark.parametrize("forward_on_side", [False, True])
def test_backward_in_a_side_stream_s_block_runs_each_node_on_its_forward_s_stream(forward_on_side: bool,
                                                                                   cycles: int) -> None:
    """A forward on the default stream, ``backward()`` in a side stream's block: the probe's backward and the
    weight's AccumulateGrad run on the default stream, after the side stream's stall (the engine makes the default
    stream wait for the initial gradient made on the side stream), so the default stream's read of the gradient is
    right. A forward in the side stream's block (the simulator test's control): the AccumulateGrad runs on the side
    stream, and the same read races. (The probe's stream there is printed, not asserted here: see the test after.)"""
    s = torch.cuda.Stream()
    _backward_in_a_side_block(forward_on_side, cycles, 0, s)  # warm-up, not counted
    right = 0
    streams: set[str] = set()
    for trial in range(TRIALS):
        r, seen = _backward_in_a_side_block(forward_on_side, cycles, trial + 1, s)
        right += r
        streams.update(seen)
    forward = "side" if forward_on_side else "default"
    print(f"RATE backward() in a side stream's block, forward on the {forward} stream: gradient read right on the "
          f"default stream {right}/{TRIALS}, nodes ran on {sorted(streams)} {_where()}", flush=True)
    assert {x for x in streams if x.startswith("accumulate@")} == {f"accumulate@{forward}"}
    if forward_on_side:
        assert right < TRIALS, "the default stream's read of a side stream's gradient came after it (no race seen)"
    else:
        assert streams == {"probe@default", "accumulate@default"}
        assert right == TRIALS


@pytest.mark.parametrize("called_in_the_block", [False, True])
def test_a_custom_function_made_in_a_side_stream_s_block_runs_its_backward_there(called_in_the_block: bool,
                                                                                 cycles: int) -> None:
    """Not one of the models waiting for a device: a difference found writing the case above. PyTorch's engine runs
    a custom ``autograd.Function``'s backward on the stream current at its forward, as any node's (the stream its
    input metadata recorded). The simulator ran it on the default stream, whether ``backward()`` was called in the
    side stream's block or after it on the default stream (it tagged only the nodes torch-function calls made in a
    side stream's block); it now gives each node the stream current when it was made, by sequence number
    (``dropin.facade._mark``), and runs this backward on ``s``
    (tests/property/dropin/test_backward_streams_of_custom_functions.py). This case asserts what a GPU is expected
    to do, so a pass here confirms the simulator's model."""
    seen_all: set[str] = set()
    s = torch.cuda.Stream()
    for trial in range(TRIALS):
        torch.manual_seed(trial)
        seen: list[tuple[str, int]] = []
        lin = torch.nn.Linear(8, 8).cuda()
        x = torch.randn(4, 8).cuda()
        torch.cuda.synchronize()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            loss = _Probe.apply(lin(x), seen).pow(2).mean()
        if called_in_the_block:
            with torch.cuda.stream(s):
                torch.cuda._sleep(cycles // 10)
                loss.backward()
        else:
            torch.cuda.current_stream().wait_stream(s)
            loss.backward()
        torch.cuda.synchronize()
        names = {torch.cuda.default_stream().cuda_stream: "default", s.cuda_stream: "side"}
        seen_all.update(f"{what}@{names.get(st, st)}" for what, st in seen)
    where = "in the side stream's block" if called_in_the_block else "on the default stream"
    print(f"RATE custom autograd.Function made in a side stream's block, backward() called {where}: its backward "
          f"ran on {sorted(seen_all)} over {TRIALS} trials {_where()}", flush=True)
    assert seen_all == {"probe@side"}, "the engine ran a custom Function's backward off its forward's stream"
