"""A copy moves its bytes in order at a constant rate, so a copy that starts while another copy is still writing
its source, and never overtakes it, reads what that copy wrote (on an H200 an H2D issued right behind the D2H of
the same pinned buffer reads the offloaded values; docs/fidelity.md). The race is still a race: only the values
and the stale-read report follow the bytes. Rules, each with a test a mutation of it fails:

- a copy trailing a copy of the same bytes reads its data (no stale read), and the race is reported;
- one that starts first, or overtakes it on some byte (it reads the far end of the range sooner than the writer
  gets there), reads what had landed, as before;
- a kernel reading the bytes a copy is landing is not a sweep: it reads what had landed;
- the trailing copy must complete after the writer: a reader done first saw what had landed;
- a copy behind a kernel writing its source is not a sweep (a kernel's writes land at its completion).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from reference.schedule import Delay, Schedule
from simdevice import SimDevice, peek
from simdevice.runtime import memory

N = 1 << 14


def _offload_reload(dev: Any, part: slice = slice(None), kernel: bool = False) -> torch.Tensor:
    """D2H of ``src`` into a pinned buffer on ``d2h``; on ``h2d``, without waiting for it, the buffer (or ``part``
    of it) back to the device, both behind the kernel that made ``src``."""
    src = torch.arange(N, dtype=torch.float32, device=dev.device) + 1
    pinned = torch.empty(N, dtype=torch.float32, pin_memory=True)
    d2h, h2d = dev.Stream(name="d2h"), dev.Stream(name="h2d")
    d2h.wait_stream(dev.current_stream())
    h2d.wait_stream(dev.current_stream())
    with dev.stream(d2h):
        pinned.copy_(src, non_blocking=True)
    with dev.stream(h2d):
        back = torch.zeros(N, dtype=torch.float32, device=dev.device)[part]
        if kernel:
            back = pinned[part].to(dev.device, non_blocking=True) * 1  # read on the device by a kernel
        else:
            back.copy_(pinned[part], non_blocking=True)
    dev.synchronize()
    return back.cpu()


def _run(*delays: Delay, **kw: Any) -> tuple[set[str], bool]:
    """The run's report kinds, and whether what came back is what was offloaded."""
    schedule = Schedule("t", "v", (), tuple(delays)) if delays else None
    run = SimDevice(schedule).run(lambda dev: _offload_reload(dev, **kw))
    want = (torch.arange(N, dtype=torch.float32) + 1)[kw.get("part", slice(None))]
    return {r.kind for r in run.reports}, torch.equal(peek(run.result), want)


def test_a_copy_trailing_a_copy_reads_its_bytes_and_the_race_is_still_reported() -> None:
    kinds, right = _run()
    assert right
    assert kinds == {"race"}
    kinds, right = _run(Delay("h2d", 1, 1))  # later still: trails further behind
    assert right
    assert "stale-read" not in kinds


def test_a_copy_that_starts_before_the_writer_reads_what_had_landed() -> None:
    kinds, right = _run(Delay("d2h", 0, 1))  # the D2H starts a unit late: the H2D is ahead of it
    assert not right
    assert {"race", "stale-read"} <= kinds


def test_a_copy_that_overtakes_the_writer_on_some_byte_reads_what_had_landed() -> None:
    """Reading only the second half, starting with the writer: it reaches the middle byte at once, the writer
    half-way through its run."""
    kinds, right = _run(part=slice(N // 2, None))
    assert not right
    assert "stale-read" in kinds


def test_a_kernel_reading_a_landing_copy_is_not_a_sweep() -> None:
    kinds, right = _run(kernel=True)
    assert not right
    assert "stale-read" in kinds


def test_the_trailing_rule_is_what_makes_the_values_right(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant: no copy trails another; the first test's run reads what had landed."""
    monkeypatch.setattr(memory, "trails", lambda *a: False)
    kinds, right = _run()
    assert not right
    assert "stale-read" in kinds


@pytest.mark.parametrize(("writer", "reader", "span", "want"), [
    ((0, 100, 0, 100), (0, 100, 0, 100), (0, 100), True),     # side by side at one rate
    ((0, 100, 0, 100), (10, 110, 0, 100), (0, 100), True),    # behind it
    ((10, 110, 0, 100), (0, 100, 0, 100), (0, 100), False),   # ahead of it
    ((0, 100, 0, 100), (0, 50, 50, 100), (50, 100), False),   # the second half at once: ahead at byte 50
    ((0, 100, 0, 100), (50, 100, 50, 100), (50, 100), True),  # the second half when the writer gets there
    ((0, 100, 0, 100), (5, 60, 0, 100), (0, 100), False),     # faster: overtakes before the end
])
def test_trails_compares_both_ends_of_the_range(writer: Any, reader: Any, span: Any, want: bool) -> None:
    assert memory.trails(writer, reader, *span) is want


def test_side_by_side_copies_are_judged_consistently() -> None:
    """Reader and writer released by the same event, the same size: both end at one moment, and the reader's stream
    (made first) completes first. It must not count as trailing (it would read the old bytes at its completion
    with no stale read reported); the values and the report agree."""

    def program(dev: Any) -> torch.Tensor:
        src = torch.arange(N, dtype=torch.float32, device=dev.device) + 1
        pinned = torch.empty(N, dtype=torch.float32, pin_memory=True)
        back = torch.zeros(N, dtype=torch.float32, device=dev.device)
        torch.ones(N * 64, device=dev.device).mul_(2)  # the default stream busy while both copies are issued
        h2d, d2h = dev.Stream(name="h2d"), dev.Stream(name="d2h")
        h2d.wait_stream(dev.current_stream())
        d2h.wait_stream(dev.current_stream())
        with dev.stream(d2h):
            pinned.copy_(src, non_blocking=True)
        with dev.stream(h2d):
            back.copy_(pinned, non_blocking=True)
        dev.synchronize()
        return back.cpu()

    run = SimDevice().run(program)
    starts = {who: t for t, who, what in run.trace if what.startswith("start copy_")}
    assert starts["h2d"] == starts["d2h"]  # side by side indeed
    right = torch.equal(peek(run.result), torch.arange(N, dtype=torch.float32) + 1)
    stale = any(r.kind == "stale-read" for r in run.reports)
    assert right != stale  # wrong values always come with the stale read that explains them
    assert "race" in {r.kind for r in run.reports}


def _copied_behind_a_kernel(dev: Any) -> torch.Tensor:
    src = torch.ones(N, dtype=torch.float32, device=dev.device)
    pinned = torch.empty(N, dtype=torch.float32, pin_memory=True)
    k, d2h = dev.Stream(name="k"), dev.Stream(name="d2h")
    k.wait_stream(dev.current_stream())
    d2h.wait_stream(dev.current_stream())
    with dev.stream(k):
        src.mul_(2.0)  # a kernel writing the source
    with dev.stream(d2h):
        pinned.copy_(src, non_blocking=True)  # started while it runs, done after it
    dev.synchronize()
    return pinned.clone()


def test_a_copy_behind_a_kernel_writing_its_source_is_not_a_sweep() -> None:
    """A kernel's writes land at its completion, not in order at a rate: a copy that starts while it runs reads what
    had landed (the ones), a stale read. Mutation: a kernel's write recorded as landing in order as a copy's
    (``Memory.start``'s landing record kept for every write): the copy read the kernel's twos, no stale read."""
    run = SimDevice().run(_copied_behind_a_kernel)
    assert {r.kind for r in run.reports} == {"race", "stale-read"}, run.reports
    assert torch.equal(run.result, torch.ones(N)), run.result
