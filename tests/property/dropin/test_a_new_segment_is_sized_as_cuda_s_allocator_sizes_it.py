"""Rule (``allocator.segment_size``, with CUDA's own sizes in the drop-in): a request the caching allocator cannot serve
from its cache gets a new segment as c10's ``CUDACachingAllocator`` sizes it: up to 1 MiB a 2 MiB segment
(``kSmallBuffer``), below 10 MiB (``kMinLargeAlloc``) a 20 MiB one (``kLargeBuffer``), from 10 MiB on (10 MiB
itself too) the request rounded up to 2 MiB (``kRoundLarge``); a 512 KiB request after the 1 MiB one fits in its
segment's remainder. Seen through ``torch.cuda.memory_reserved()``; the order of the requests keeps each larger one
from the one before's remainder. And two neighbouring blocks freed are one free block again (``Allocator``'s merge
with the free block before a freed one): a request of both their sizes takes their segment, no new one. Mutations
of the rules passed every other test: the 10 MiB bound's comparison flipped or made inclusive, the 1 MiB one's made
strict, the merge's size left out."""

from __future__ import annotations

import torch

import simdevice

MiB = 1 << 20


def reserved_per_request() -> list[int]:
    grown = []
    keep = []
    for n in (10 * MiB, 12 * MiB + 1, 4 * MiB, MiB, 512 * 1024):
        before = torch.cuda.memory_reserved()
        keep.append(torch.empty(n, dtype=torch.uint8, device="cuda"))
        grown.append(torch.cuda.memory_reserved() - before)
    return grown


def test_each_new_segment_has_cuda_s_size() -> None:
    s = simdevice.cuda()
    s.run(reserved_per_request)
    assert s.result is not None
    assert s.result.reports == (), s.result.reports
    assert s.result.result == [10 * MiB, 14 * MiB, 20 * MiB, 2 * MiB, 0], s.result.result


def merged_neighbours() -> int:
    a = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")  # a 20 MiB segment: a, b, and the rest
    b = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
    rest = torch.empty(14 * MiB, dtype=torch.uint8, device="cuda")  # the segment's remainder, taken
    before = torch.cuda.memory_reserved()
    del a
    del b  # freed after a: merged into the free block before it
    both = torch.empty(6 * MiB, dtype=torch.uint8, device="cuda")
    del both, rest
    return torch.cuda.memory_reserved() - before


def test_two_neighbouring_blocks_freed_serve_a_request_of_both_their_sizes() -> None:
    s = simdevice.cuda()
    s.run(merged_neighbours)
    assert s.result is not None
    assert s.result.reports == (), s.result.reports
    assert s.result.result == 0, s.result.result
