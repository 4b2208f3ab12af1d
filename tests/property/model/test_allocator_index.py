"""The caching allocator's index of free blocks (``simdevice.runtime.allocator``) against a walk over every block.

Rule, with a test a mutation of it fails: the blocks a request may take are the free blocks of its pool's live
(not released) segments of its kind (small or large) made for its stream, in best-fit order (size, segment,
offset), whatever the program did before: allocations on several streams and pools, frees that merge neighbours,
splits, ``empty_cache``. ``CachingAllocator.fitting`` answers from an index kept as blocks change; here every
answer is compared with the walk the allocator made before it had one, and so is the block an allocation takes
with each pick (``_FreeBlocks.take``: the pick-th fitting block, modulo their number, or none).
"""

from __future__ import annotations

import contextlib
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from simdevice import SimDevice
from simdevice.runtime.allocator import ROUND, SMALL_REQUEST, Block, CachingAllocator

STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.sampled_from([16, 200, 1000, 3000, 9000, 30000]), st.integers(0, 1),
                  st.booleans()),
        st.tuples(st.just("free"), st.integers(0, 40)),
        st.tuples(st.just("empty_cache"),),
    ),
    max_size=40,
)


def walk(alloc: CachingAllocator, pool: Any, small: bool, stream: Any, size: int) -> list[Block]:
    fits = [b for seg in alloc.segments(pool) if seg.small == small and not seg.released and seg.stream is stream
            for b in seg.blocks if b.free and b.nbytes >= size]
    return sorted(fits, key=lambda b: (b.nbytes, b.segment.id, b.offset))


def check(alloc: CachingAllocator, streams: list[Any]) -> None:
    for pool in [None, "train"]:
        for small in (True, False):
            for stream in streams:
                for size in (ROUND, SMALL_REQUEST, 4096, 1 << 16):
                    fits = walk(alloc, pool, small, stream, size)
                    assert alloc.fitting(pool, small, stream, size) == fits
                    for pick in (0, 1, 2, 5, -1):
                        taken = alloc._free.take(pool, small, stream, size, pick)
                        assert taken is (fits[pick % len(fits)] if fits else None)
                        if taken is not None:
                            alloc._free.add(taken)  # put back as it was


@given(STEPS)
def test_the_index_answers_as_a_walk_over_every_block(steps: list[tuple[Any, ...]]) -> None:
    def body(dev: Any) -> None:
        import torch

        rt = dev.runtime
        alloc = rt.memsaver.allocator
        side = dev.Stream(name="side")
        streams = [rt.current_stream(), dev.stream_of(side)]
        live: list[Any] = []
        for step in steps:
            if step[0] == "alloc":
                _, nbytes, on, region = step
                on_side = dev.stream(side) if on else contextlib.nullcontext()
                in_region = dev.memory_saver.region("train") if region else contextlib.nullcontext()
                with on_side, in_region:
                    live.append(torch.empty(nbytes // 4, device=dev.device))
            elif step[0] == "free" and live:
                live.pop(step[1] % len(live))
            elif step[0] == "empty_cache":
                dev.empty_cache()
            alloc.collect()
            check(alloc, streams)

    run = SimDevice().run(body)
    assert not run.reports, run.reports



def test_a_request_of_the_small_size_itself_is_small() -> None:
    """As torch's ``size <= kSmallSize``: a request of exactly ``SMALL_REQUEST`` bytes is served from a small segment,
    one byte more from a large one (a mutant taking the boundary request as large survived every other test)."""
    import torch

    from simdevice.dispatch import storage_of

    def sizes(dev: Any) -> list[bool]:
        out = []
        for nbytes in (SMALL_REQUEST, SMALL_REQUEST + ROUND):
            t = torch.empty(nbytes // 4, device=dev.device)
            out.append(dev.runtime.memsaver.allocator._by_storage[storage_of(t).id].segment.small)
        return out

    run = SimDevice().run(sizes)
    assert run.reports == ()
    assert run.result == [True, False]
