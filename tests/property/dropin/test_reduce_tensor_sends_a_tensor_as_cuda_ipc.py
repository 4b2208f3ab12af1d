"""Rule (processes._reduce_tensor): ``torch.multiprocessing.reductions.reduce_tensor`` of a device tensor in a run
gives a rebuild function and its arguments, as torch's, which another process calls to get the tensor over the same
memory; the IPC event is recorded at ``reduce_tensor``, on the current stream, and the receiver's current stream
waits for it as it rebuilds the tensor. vLLM's RLHF weight sync and SGLang's weight updates send them so. Before,
``reduce_tensor`` reached ``Tensor.storage()`` of a simulated tensor: ``NotImplementedError``, no verdict.

``ForkingPickler`` (SGLang's ``MultiprocessingSerializer``) reduces a device tensor so too: its bytes, sent however
the program likes, load in the receiver as the tensor over the same memory. Before, it pickled the tensor's values
(as ``torch.save`` does), so the receiver's copy missed what the sender wrote after the send: a false host error."""

from __future__ import annotations

from multiprocessing.reduction import ForkingPickler
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from torch.multiprocessing.reductions import reduce_tensor

import simdevice

N = 256


def _run(fn: Any, *args: Any, schedule: str | None = None) -> Any:
    s = simdevice.cuda(schedule)
    s.run(fn, *args)
    assert s.result is not None
    return s.result


def _rebuild_and_read(q: Any, out: Any) -> None:
    func, args = q.get()
    out.put(func(*args).sum().item())


def weight_sync(mode: str) -> float:
    """The trainer updates the weights, reduces them and sends the pair to a worker process. ``ok``: the update
    is on the current stream before ``reduce_tensor``; ``side``: on a side stream the current one does not wait for;
    ``early``: ``reduce_tensor`` before the update."""
    ctx = mp.get_context("spawn")
    q, out = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_rebuild_and_read, args=(q, out), name="worker")
    p.start()
    w = torch.zeros(N, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    handle = reduce_tensor(w) if mode == "early" else None
    with torch.cuda.stream(side if mode == "side" else torch.cuda.current_stream()):
        w.add_(4.0)
    q.put(handle if handle is not None else reduce_tensor(w))
    got = out.get()
    p.join()
    assert got == 4.0 * N, got
    return float(got)


@pytest.mark.parametrize("schedule", [None, "default#1+5", "worker#0+5", "worker.default#0+5"])
def test_weights_reduced_after_their_update_are_clean(schedule: str | None) -> None:
    run = _run(weight_sync, "ok", schedule=schedule)
    assert run.reports == (), [str(r) for r in run.reports]
    assert run.result == 4.0 * N


@pytest.mark.parametrize("mode", ["side", "early"])
def test_weights_reduced_before_their_update_race_with_the_reader(mode: str) -> None:
    run = _run(weight_sync, mode, schedule="default#0+1" if mode == "early" else "side#0+1")
    assert "race" in [r.kind for r in run.reports], [str(r) for r in run.reports]


def test_reduce_tensor_of_a_host_tensor_is_torch_s() -> None:
    def host() -> Any:
        func, args = reduce_tensor(torch.ones(4))
        return func(*args).sum().item()

    assert _run(host).result == 4.0


def _load_later(q: Any, out: Any, go: Any) -> None:
    t = ForkingPickler.loads(q.get())
    go.wait()
    out.put(t.sum().item())


def serialized(sync: bool) -> float:
    """The tensor's ``ForkingPickler`` bytes go through a queue; the sender then updates it (``sync``: and
    synchronizes) before it lets the receiver read: the receiver's tensor is the same memory."""
    ctx = mp.get_context("spawn")
    q, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    p = ctx.Process(target=_load_later, args=(q, out, go), name="loader")
    p.start()
    w = torch.zeros(N, device="cuda")
    q.put(bytes(ForkingPickler.dumps(w)))
    w.add_(3.0)
    if sync:
        torch.cuda.synchronize()
    go.set()
    got = out.get()
    p.join()
    assert got == 3.0 * N, got
    return float(got)


@pytest.mark.parametrize("schedule", [None, "default#1+5", "loader#0+5"])
def test_forking_pickler_bytes_share_the_tensor_s_memory(schedule: str | None) -> None:
    run = _run(serialized, True, schedule=schedule)
    assert run.reports == (), [str(r) for r in run.reports]


def test_forking_pickler_bytes_read_before_the_update_is_done_race() -> None:
    run = _run(serialized, False, schedule="default#1+5")
    assert "race" in [r.kind for r in run.reports], [str(r) for r in run.reports]
