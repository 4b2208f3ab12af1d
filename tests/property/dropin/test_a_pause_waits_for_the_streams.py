"""A ``torch_memory_saver`` pause is a host step that does not wait for the streams: a kernel issued before it on
region memory, that the host did not wait for, may still be in flight when its memory is unmapped. That is a race
between the kernel and the pause (``Memory.issue_unmap``), found under every schedule, with the missing
synchronization named and checked as any race's fix is. Before, it was found only where the values came out wrong,
and the explanation said no two accesses raced (or, resumed before the kernel landed, not at all)."""

from __future__ import annotations

import torch

import simdevice
from simdevice.explain import suggest
from simdevice.search.explore import as_target


def sleep_while_a_step_runs(synchronize: bool = False) -> None:
    from torch_memory_saver import torch_memory_saver as tms

    with tms.region("train"):
        w = torch.zeros(1 << 16, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        w.add_(1)  # a step's kernel on the region's memory
    if synchronize:
        torch.cuda.synchronize()  # wait: the step must finish before the pause unmaps its memory
    tms.pause("train")
    tms.resume("train")


def test_a_pause_while_a_kernel_may_be_in_flight_is_a_race_naming_the_pause() -> None:
    run = simdevice.cuda().run(sleep_while_a_step_runs)  # the default schedule: the kernel is in flight
    assert [r.kind for r in run.reports] == ["race"]
    text = str(run.reports[0])
    assert text.startswith("race: memory_saver.pause('train') on host host (")
    assert "unmaps seg#1, whose device#1[0:262144] add_ on stream " in text
    assert "may still be in flight when the pause unmaps its memory" in text
    assert "torch.cuda.synchronize() before the pause" in text
    assert not simdevice.cuda().run(sleep_while_a_step_runs, synchronize=True).reports


def test_the_fix_names_the_missing_wait_and_is_checked() -> None:
    target = as_target(sleep_while_a_step_runs)
    found = simdevice.explore(sleep_while_a_step_runs, max_examples=20).failure
    assert found is not None
    fix = suggest(target, found, schedules=30)
    assert fix.checked, fix.lines()
    assert len(fix.edges) == 1
    edge = fix.edges[0]
    assert edge.before.actor == "host"
    assert "before `memory_saver.pause('train')` on the host" in fix.advice[0]
    assert simdevice.explore(synchronized, max_examples=30).failure is None


def synchronized() -> None:
    sleep_while_a_step_runs(synchronize=True)


def pause_after_freeing_what_a_kernel_in_flight_wrote() -> None:
    from torch_memory_saver import torch_memory_saver as tms

    with tms.region("train"):
        w = torch.zeros(1 << 16, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        w.add_(1)
    del w  # freed while the side stream's kernel may still run (no record_stream)
    tms.pause("train")
    tms.resume("train")


def test_a_pause_racing_with_a_freed_tensor_s_kernel_names_no_reuse() -> None:
    """A pause unmaps the segment's bytes; it hands no block on: its race with a kernel on a tensor freed before it
    is the pause's (``Memory._race`` looks up no free for an unmap), and the free the kernel was not ordered before
    stays a note of its own (no reuse raced with it), not taken for the race's reuse."""
    run = simdevice.cuda().run(pause_after_freeing_what_a_kernel_in_flight_wrote)
    (race,) = run.reports
    assert race.kind == "race"
    assert race.freed is None
    assert str(race).startswith("race: memory_saver.pause('train') on host host (")
    assert any("no reuse raced with it in this run" in n for n in run.notes), run.notes
