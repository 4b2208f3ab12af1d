"""CUDA IPC as the simulated ``multiprocessing`` models it (``simdevice/dropin/processes.py``), on a real GPU with
spawned processes.

The producer stalls its default stream (``torch.cuda._sleep``), writes a device buffer behind the stall and puts it
on a ``multiprocessing`` queue without synchronizing; the consumer reads it. torch records an interprocess event as
the queue's feeder thread pickles the tensor (on the default stream) and the consumer's stream waits for it where it
maps the storage, the first time only (``storage_from_cache``):

- the first receipt reads the written values in every trial;
- the same storage sent again, rewritten behind a stall, is read stale where the consumer still holds the first
  tensor or a tensor made from it (no wait), and correctly where it dropped it first (mapped again: a wait);
- a child forked once CUDA is in use fails at its first CUDA call.

Run: ``python -m pytest -q -s tests/gpu/test_ipc_gpu.py`` on a CUDA machine (a few seconds a trial: each spawns a
process). Each case prints ``RATE``; ``IPC_GPU_TRIALS`` sets the trials (default 5).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import torch.multiprocessing as mp  # noqa: E402

from reference.cuda import calibrate_sleep_cycles_per_ms  # noqa: E402

pytestmark = pytest.mark.gpu

TRIALS = int(os.environ.get("IPC_GPU_TRIALS", "5"))
N = 1 << 20
#: how long the producer's stream is stalled before each write
STALL_MS = 200


def _consumer(q: Any, out: Any, hold: str) -> None:
    first = q.get()
    out.put(float(first.sum().item()))
    kept = first.detach() if hold == "detached" else first if hold == "held" else None
    del first  # the mapping goes with the last tensor of it: the next receipt maps it again, and waits
    again = q.get()
    out.put(float(again.sum().item()))
    del kept


def _trial(hold: str, cycles: int) -> tuple[bool, bool]:
    """(first receipt read right, second receipt read right)."""
    ctx = mp.get_context("spawn")
    q, out = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_consumer, args=(q, out, hold))
    p.start()
    x = torch.zeros(N, device="cuda")
    torch.cuda.synchronize()
    torch.cuda._sleep(cycles)
    x.fill_(1.0)
    q.put(x)  # no synchronize: the IPC event orders the first receipt
    first = out.get()
    torch.cuda._sleep(cycles)
    x.fill_(2.0)
    q.put(x)  # the same storage again, no synchronize
    second = out.get()
    p.join()
    torch.cuda.synchronize()
    return first == float(N), second == 2.0 * N


@pytest.mark.parametrize("hold", ["held", "detached", "dropped"])
def test_ipc_orders_the_first_mapping_only(hold: str) -> None:
    """``detached``: the consumer keeps only ``first.detach()``, a tensor of the same storage (the simulator keeps
    the mapping through it, ``SimTensor._ipc``: no wait at the second receipt)."""
    cycles = int(STALL_MS * calibrate_sleep_cycles_per_ms())
    results = [_trial(hold, cycles) for _ in range(TRIALS)]
    first_wrong = sum(not a for a, _ in results)
    second_wrong = sum(not b for _, b in results)
    print(f"RATE ipc consumer {hold} the first tensor: first receipt wrong "
          f"{first_wrong}/{TRIALS}, second receipt wrong {second_wrong}/{TRIALS} "
          f"(torch {torch.__version__}, {torch.cuda.get_device_name()})", flush=True)
    assert first_wrong == 0
    if hold != "dropped":
        assert second_wrong > 0, "a storage received again while held waited for the producer's stream"
    else:
        assert second_wrong == 0


def _uses_cuda(x: Any, out: Any) -> None:
    """``x`` is a CUDA tensor the child inherited, or ``None``: then it makes a new one (through ``torch.cuda``)."""
    try:
        y = torch.ones(N, device="cuda") if x is None else x
        out.put(("ok", float(y.sum().item())))
    except RuntimeError as e:
        out.put(("error", str(e)))


@pytest.mark.parametrize(("inherited", "expected"), [
    (True, "CUDA error: initialization error"),  # a kernel on the parent's tensor: the driver refuses it
    (False, "Cannot re-initialize CUDA in forked subprocess"),  # torch.cuda's lazy init refuses first
])
def test_a_child_forked_once_cuda_is_in_use_fails_at_its_first_cuda_call(inherited: bool, expected: str) -> None:
    """What the simulator's note on a forked process says (``simdevice/dropin/processes.py``)."""
    import multiprocessing

    x = torch.ones(N, device="cuda")
    torch.cuda.synchronize()
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    p = ctx.Process(target=_uses_cuda, args=(x if inherited else None, out))
    p.start()
    kind, what = out.get(timeout=60)
    p.join()
    print(f"FORK child's first CUDA call ({'inherited tensor' if inherited else 'new tensor'}): {kind}: "
          f"{what[:120]!r}", flush=True)
    assert kind == "error"
    assert expected in what


def _host_only(x: Any, out: Any) -> None:
    out.put(("ok", float(x.sum())))


def test_a_child_forked_once_cuda_is_in_use_runs_where_it_never_uses_cuda() -> None:
    """A forked worker that works on host tensors alone (a ``DataLoader``'s) runs: the simulator notes a fork only
    where the child then uses CUDA itself."""
    import multiprocessing

    torch.ones(N, device="cuda")
    torch.cuda.synchronize()
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    p = ctx.Process(target=_host_only, args=(torch.ones(N), out))
    p.start()
    kind, what = out.get(timeout=60)
    p.join()
    print(f"FORK child on host tensors alone: {kind}: {what!r}", flush=True)
    assert (kind, what) == ("ok", float(N))


def _slow_saver(staging: Any, q: Any, acks: Any) -> None:
    import time

    while True:
        step = q.get()
        if step is None:
            break
        time.sleep(0.05)  # (a saver that writes to disk: slower than a training step)
        acks.put(float(staging.sum()))


def _snapshot_trial(ack: bool, steps: int = 3) -> bool:
    """The trainer copies its weights (a blocking D2H) into a pageable shared snapshot at each step and tells the
    saver; with ``ack`` it waits for the saver's acknowledgement of the last one first. Whether each step's was
    saved."""
    ctx = mp.get_context("spawn")
    staging = torch.zeros(N).share_memory_()
    q, acks = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_slow_saver, args=(staging, q, acks))
    p.start()
    w = torch.zeros(N, device="cuda")
    got = []
    for step in range(steps):
        w.add_(1.0)
        if ack and step:
            got.append(acks.get(timeout=60))
        staging.copy_(w)
        q.put(step)
    got += [acks.get(timeout=60) for _ in range(steps - len(got))]
    q.put(None)
    p.join()
    return got == [float(N * (k + 1)) for k in range(steps)]


@pytest.mark.parametrize("ack", [False, True], ids=["no ack", "ack"])
def test_a_shared_snapshot_overwritten_before_the_saver_read_it_is_saved_wrong(ack: bool) -> None:
    """What the simulator reports for pageable memory shared between processes
    (``tests/property/dropin/test_a_race_between_two_hosts_gets_a_handshake.py``): overwritten without the saver's
    acknowledgement, the saved values are wrong; with it, right (the handshake the fix names)."""
    wrong = sum(not _snapshot_trial(ack) for _ in range(TRIALS))
    print(f"RATE shared snapshot ({'ack' if ack else 'no ack'}): saved wrong {wrong}/{TRIALS} "
          f"(torch {torch.__version__}, {torch.cuda.get_device_name()})", flush=True)
    assert wrong == (0 if ack else TRIALS)
