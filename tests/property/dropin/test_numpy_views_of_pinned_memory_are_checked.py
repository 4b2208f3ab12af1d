"""``t.numpy()`` of pinned memory gives the host its bytes without the dispatcher: what the program then reads and
writes through the array is checked as the host's access of the bytes it touches (``simdevice.dropin.arrays``).
Before, a staging buffer filled through a NumPy view while the last step's H2D still read it, or a D2H's pinned
destination summed through NumPy before the copy was done, ran clean where the program checked no value, and where
it did, gave wrong values with no race to name and no fix."""

from __future__ import annotations

import numpy as np
import torch

import simdevice
from simdevice.explain import suggest
from simdevice.search.explore import as_target

N = 1024


def staging(wait: bool = False, steps: int = 3) -> list[float]:
    """An inference loop's input staging, as vLLM's model runner keeps it: a pinned buffer and a NumPy view of it made
    once; each step the host fills the view, then copies it to the device without blocking. ``wait``: the host
    waits for the last step's copy before it fills the buffer again."""
    buf = torch.zeros(N, pin_memory=True)
    view = buf.numpy()
    copied = None
    sums = []
    for step in range(steps):
        if wait and copied is not None:
            copied.synchronize()
        view[:] = np.arange(N, dtype=np.float32) + step
        ids = buf.to("cuda", non_blocking=True)
        copied = torch.cuda.Event()
        copied.record()
        sums.append((ids * 2).sum())
    return [s.item() for s in sums]


def staging_waits() -> list[float]:
    return staging(wait=True)


def expected_sums(steps: int = 3) -> list[float]:
    return [float(((np.arange(N, dtype=np.float32) + step) * 2).sum()) for step in range(steps)]


def test_filling_a_staging_view_while_its_last_copy_reads_it_races() -> None:
    run = simdevice.cuda().run(staging)
    races = [r for r in run.reports if isinstance(r, simdevice.Race)]
    assert races, run.reports
    text = str(races[0])
    assert text.startswith("race: numpy __setitem__ on host host ("), text
    assert "writes pinned#" in text, text
    assert "which _to_copy (H2D) on stream default #" in text, text
    waits = simdevice.cuda()
    waits.run(staging, True)
    waits.assert_clean()
    assert waits.result is not None
    assert waits.result.result == expected_sums()


def test_the_fix_is_the_wait_before_the_host_fills_the_view() -> None:
    found = simdevice.explore(staging, max_examples=20).failure
    assert found is not None
    fix = suggest(as_target(staging), found, schedules=20)
    assert fix.checked, fix.lines()
    assert "after `_to_copy (H2D)`" in fix.advice[0], fix.advice
    assert "before `numpy __setitem__` on the host" in fix.advice[0], fix.advice
    assert simdevice.explore(staging_waits, max_examples=20).failure is None


def double_buffered() -> list[float]:
    """Two halves of one pinned buffer in turn: the host fills one half through its view while the other half's
    copy may still run, and waits only for the copy of the half it fills. The views' bytes are told apart, so this
    is clean."""
    buf = torch.zeros(2, N, pin_memory=True)
    halves = [buf[0].numpy(), buf.numpy()[1]]  # (a view of the tensor's row, and a row of the whole's view)
    copied: list[torch.cuda.Event | None] = [None, None]
    sums = []
    for step in range(4):
        half = step % 2
        event = copied[half]
        if event is not None:
            event.synchronize()
        halves[half][:] = np.arange(N, dtype=np.float32) + step
        ids = buf[half].to("cuda", non_blocking=True)
        copied[half] = torch.cuda.Event()
        copied[half].record()
        sums.append((ids * 2).sum())
    return [s.item() for s in sums]


def test_views_of_other_bytes_do_not_race() -> None:
    s = simdevice.cuda("default#1+20")  # (the first half's copy stalled while the host fills the second)
    s.run(double_buffered)
    s.assert_clean()
    assert s.result is not None
    assert s.result.result == expected_sums(4)


def readback(sync: bool, how: str) -> float:
    """A D2H into pinned memory, read back through NumPy: ``how`` is the read (a reduction, an element, a slice's
    method, a NumPy function, an in-place operator, iteration)."""
    x = torch.arange(N, dtype=torch.float32, device="cuda") * 2
    host = torch.empty(N, pin_memory=True)
    arr = host.numpy()
    window = arr[10:20]  # a view: no read
    host.copy_(x, non_blocking=True)
    if sync:
        torch.cuda.current_stream().synchronize()
    if how == "sum":
        return float(arr.sum())
    if how == "element":
        return float(arr[7])
    if how == "tolist":
        return float(sum(window.tolist()))
    if how == "concatenate":
        return float(np.concatenate([window, window]).sum())
    if how == "iadd":
        arr += 1.0
        return float(host[0].item())
    assert how == "iterate"
    return float(sum(v for v in window))


HOWS = ("sum", "element", "tolist", "concatenate", "iadd", "iterate")


def test_reads_through_the_view_before_the_copy_is_done_race() -> None:
    for how in HOWS:
        run = simdevice.cuda().run(readback, False, how)
        races = [r for r in run.reports if isinstance(r, simdevice.Race)]
        assert races, (how, run.reports)
        assert "on host host" in str(races[0]), (how, str(races[0]))
        assert "copy_ (D2H)" in str(races[0]), (how, str(races[0]))
        synced = simdevice.cuda()
        synced.run(readback, True, how)
        synced.assert_clean()


def test_a_copy_of_the_view_and_the_view_outside_a_run_are_plain_arrays() -> None:
    def program() -> np.ndarray:
        host = torch.empty(N, pin_memory=True)
        host.copy_(torch.ones(N, device="cuda"), non_blocking=True)
        torch.cuda.synchronize()
        copy = host.numpy().copy()  # read after the synchronize: clean
        host.copy_(torch.zeros(N, device="cuda"), non_blocking=True)
        assert copy.sum() == N  # the copy's own bytes: not the pinned buffer's
        torch.cuda.synchronize()
        return host.numpy()

    s = simdevice.cuda()
    s.run(program)
    s.assert_clean()
    assert s.result is not None
    kept = s.result.result
    assert float(kept.sum()) == 0.0  # after the run: NumPy's own reads
    kept[:] = 3.0
    assert float(kept[1]) == 3.0


class _Runner:
    """A model runner kept from one run to the next (a test's fixture, a server's object), with its staging buffer
    and the buffer's NumPy view made once, in the first run."""

    def __init__(self) -> None:
        self.buf: torch.Tensor | None = None
        self.view: np.ndarray | None = None

    def step(self, wait: bool) -> float:
        if self.buf is None:
            self.buf = torch.zeros(N, pin_memory=True)
            self.view = self.buf.numpy()
        assert self.view is not None
        self.view[:] = 1.0
        first = self.buf.to("cuda", non_blocking=True)
        if wait:
            torch.cuda.current_stream().synchronize()
        self.view[:] = 2.0  # the next step's
        return float(first.sum().item())


def test_a_view_kept_from_an_earlier_run_is_checked_in_the_next() -> None:
    runner = _Runner()
    first = simdevice.cuda()
    first.run(runner.step, True)
    first.assert_clean()
    again = simdevice.cuda().run(runner.step, False)
    assert any(isinstance(r, simdevice.Race) for r in again.reports), again.reports
