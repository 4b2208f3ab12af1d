"""``torch.cuda.empty_cache()`` gives the caching allocator's entirely free segments back to CUDA with ``cudaFree``,
which waits for the whole device first: an implicit synchronization. On an H100 (docs/confirmations.md, thirty-sixth
run) a D2H into pinned memory on a side stream, stalled, had always landed when the host read it right after an
``empty_cache`` that gave a segment back, and never where there was none to give back. Before, the simulator waited
only for the streams recorded with freed blocks (``synchronize_and_free_events``) and reported the first a race."""

from __future__ import annotations

import torch

import simdevice
from reference.schedule import Schedule
from simdevice.search.targets import resolve

LINE = "tests/hazards.py::emptied_cache_read"


def test_a_read_after_an_empty_cache_that_gave_a_segment_back_is_clean_under_any_stall() -> None:
    target = resolve(LINE)
    for tail in (":release=1", ":release=1:side#0+20", ":release=1:default#1+20"):
        out = target.run(Schedule.parse(LINE + tail))
        assert out.clean, (tail, out.text())


def test_a_read_after_an_empty_cache_with_nothing_to_give_back_races() -> None:
    out = resolve(LINE).run(Schedule.parse(LINE + ":release=0:side#0+20"))
    assert out.corrupted, out.text()
    assert out.races, out.text()


def test_a_segment_given_back_in_a_session_makes_the_host_wait_for_its_streams() -> None:
    """The same in a ``simdevice.cuda()`` session, unstalled: the scratch block (3 MiB, a large segment of its own)
    dropped, then ``empty_cache``: the host reads the copy after the side stream finished."""
    with simdevice.cuda() as sim:
        side = torch.cuda.Stream()
        x = torch.ones(1 << 16, device="cuda")
        scratch = torch.zeros(3 << 18, device="cuda")
        pinned = torch.empty(1 << 16, pin_memory=True)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            pinned.copy_(x, non_blocking=True)
        del scratch
        torch.cuda.empty_cache()
        assert bool((pinned == 1).all())
    sim.assert_clean()
