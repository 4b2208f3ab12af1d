"""What a program keeps from one run to the next (a pool in a class or another module, a cached stream): each run is
a process of its own on a GPU, where such state is made anew, except that the tool runs them in one interpreter.

Rules, each with a test a mutation of it fails:

- pinned memory an earlier run made is pinned memory of the later run too, from its first use there
  (``Memory.lookup``): its accesses are checked, a non-blocking copy from it is asynchronous, ``is_pinned()`` says
  so; as on a GPU, where the buffer is still pinned;
- a stream, an event or a device tensor an earlier run made gives no verdict (``RuntimeError`` with the
  ``simdevice:`` prefix that ``explain`` reads as "not run"), naming that, whichever of the call's objects it is.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

import simdevice
from simdevice import Race
from simdevice.explain import not_run

N = 1024


class _Pool:
    """A staging pool kept across runs, as a helper module's would be."""

    buffers: ClassVar[dict[int, torch.Tensor]] = {}

    @classmethod
    def staging(cls, n: int) -> torch.Tensor:
        if n not in cls.buffers:
            cls.buffers[n] = torch.empty(n, pin_memory=True)
        return cls.buffers[n]


def _uploads(synchronize: bool) -> None:
    buf = _Pool.staging(N)
    total = torch.zeros(N, device="cuda")
    for k in range(3):
        buf.fill_(float(k + 1))  # the host rewrites the buffer the last H2D may still read
        total.add_(buf.to("cuda", non_blocking=True))
        if synchronize:
            torch.cuda.current_stream().synchronize()
    assert total.sum().item() == 6.0 * N


def _pool_racy() -> None:
    _uploads(False)


def _pool_ok() -> None:
    _uploads(True)


def test_a_pinned_pool_kept_across_runs_is_checked_in_every_run() -> None:
    _Pool.buffers.clear()
    for _ in range(2):  # the second search's runs all reuse the pool the first one made
        found = simdevice.explore(_pool_racy, max_examples=10)
        assert found.failure is not None
        assert any(isinstance(r, Race) and "pinned" in str(r) for r in found.failure.run.reports)
    assert simdevice.explore(_pool_ok, max_examples=10).failure is None


def test_a_pinned_buffer_kept_across_runs_is_still_pinned() -> None:
    _Pool.buffers.clear()
    seen: list[bool] = []
    for _ in range(2):
        s = simdevice.cuda()
        s.run(lambda: seen.append(_Pool.staging(N).is_pinned()))
        s.assert_clean()
    assert seen == [True, True]


class _Cache:
    side: Any = None
    event: Any = None
    tensor: Any = None


def _uses_a_kept_stream() -> None:
    if _Cache.side is None:
        _Cache.side = torch.cuda.Stream()
    torch.ones(N, device="cuda")
    _Cache.side.wait_stream(torch.cuda.current_stream())  # the kept stream's own method, this run's argument


def _uses_a_kept_event() -> None:
    if _Cache.event is None:
        _Cache.event = torch.cuda.Event()
    torch.ones(N, device="cuda")
    _Cache.event.record()


def _uses_a_kept_tensor() -> None:
    if _Cache.tensor is None:
        _Cache.tensor = torch.ones(N, device="cuda")
    assert (_Cache.tensor * 2).sum().item() == 2.0 * N


def test_streams_events_and_tensors_kept_across_runs_give_no_verdict() -> None:
    for program in (_uses_a_kept_stream, _uses_a_kept_event, _uses_a_kept_tensor):
        _Cache.side = _Cache.event = _Cache.tensor = None
        first = simdevice.explore(program, max_examples=5)
        assert first.failure is not None, program.__name__
        error = not_run(first.failure)
        assert error is not None, (program.__name__, first.failure.run.reports)
        if program is _uses_a_kept_tensor:
            assert "a tensor of another simulated run" in error.error, error.error
        else:  # the kept object is the one whose method was called, not its argument (this run's current stream)
            assert "a stream, event or tensor made by an earlier run was used" in error.error, error.error


def test_a_tensor_without_a_storage_is_no_pinned_memory() -> None:
    """Once a run made pinned memory, a host tensor's lookup reads its storage's address: a sparse tensor has none
    (torch raises NotImplementedError), and is simply not pinned memory."""
    kept: list[torch.Tensor] = []
    s = simdevice.cuda()
    s.run(lambda: kept.append(torch.empty(4, pin_memory=True)))  # kept: its address stays known as pinned
    got: list[list[float]] = []

    def sparse() -> None:
        i = torch.sparse_coo_tensor(torch.tensor([[0, 1]]), torch.tensor([1.0, 2.0]), (4,), check_invariants=True)
        got.append((torch.ones(4, device="cuda") + i.to_dense().cuda()).cpu().tolist())

    s = simdevice.cuda()
    s.run(sparse)
    s.assert_clean()
    assert got == [[2.0, 3.0, 1.0, 1.0]]
    from simdevice.runtime.memory import Memory
    from simdevice.runtime.reports import ReportSink

    sparse_t = torch.sparse_coo_tensor(torch.tensor([[0]]), torch.tensor([1.0]), (2,), check_invariants=True)
    assert Memory(ReportSink()).lookup(sparse_t) is None
