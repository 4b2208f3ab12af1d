"""Plain torch.cuda code allocates its own sizes, on the simulator as on a GPU: the caching allocator pools, rounds
and splits them with CUDA's own sizes (512-byte blocks, requests up to 1 MiB from 2 MiB segments, ...), so a freed
block goes to the allocations a GPU gives it to. Before, the allocator's sizes were 1,024 times smaller (those of
the registered programs, whose tensors stand for 1,024 times as many bytes): a 1.5 KiB tensor came from a large
segment and a 1 KiB one from a small one, so the second never took the first's freed block, where on a GPU it
does; the race of that reuse was missed, a clean verdict on a racy program. A tensor of no bytes takes no block
(CUDA's allocator gives it a null pointer)."""

from __future__ import annotations

import torch

import simdevice
from simdevice import Race


def _freed_while_read(record: bool) -> None:
    side = torch.cuda.Stream()
    x = torch.ones(384, device="cuda")  # 1.5 KiB: a small block, as the 1 KiB one below
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        total = x.sum()
    if record:
        x.record_stream(side)
    del x
    torch.zeros(256, device="cuda")  # takes x's block on a GPU, unless record_stream holds it
    torch.cuda.current_stream().wait_stream(side)
    del total


def test_a_small_block_freed_while_another_stream_reads_it_is_taken_by_the_next_small_allocation() -> None:
    s = simdevice.cuda()
    s.run(_freed_while_read, False)
    assert any(isinstance(r, Race) for r in s.reports), s.text()
    s = simdevice.cuda()
    s.run(_freed_while_read, True)
    s.assert_clean()


def test_the_statistics_are_a_gpu_s() -> None:
    with simdevice.cuda() as sim:
        a = torch.empty(100, dtype=torch.uint8, device="cuda")
        small = (torch.cuda.memory_allocated(), torch.cuda.memory_reserved())
        b = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
        large = (torch.cuda.memory_allocated(), torch.cuda.memory_reserved())
        c = torch.empty(19 << 20, dtype=torch.uint8, device="cuda")  # a segment of its own, 20 MiB
        d = torch.empty(17 << 20, dtype=torch.uint8, device="cuda")  # b's segment, 17 of its 17 MiB left: unsplit
        split = torch.cuda.memory_allocated() - large[0]
        del a, b, c, d
    sim.assert_clean()
    assert small == (512, 2 << 20)
    assert large == (512 + (3 << 20), (2 << 20) + (20 << 20))
    assert split == (20 << 20) + (17 << 20)


def _placeholder_between(record: bool) -> None:
    side = torch.cuda.Stream()
    x = torch.ones(128, device="cuda")  # 512 bytes: one block
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        total = x.sum()
    if record:
        x.record_stream(side)
    del x
    placeholder = torch.empty(0, device="cuda")  # no bytes: a null pointer on a GPU, no block
    torch.zeros(128, device="cuda")  # takes x's block on a GPU, unless record_stream holds it
    torch.cuda.current_stream().wait_stream(side)
    del total, placeholder


def test_a_tensor_of_no_bytes_takes_no_block_and_counts_nothing() -> None:
    """CUDA's allocator gives a request of no bytes a null pointer, no block. Before, such a tensor took a
    512-byte block: it counted in the statistics, and took the freed block the next allocation takes on a GPU, so
    that allocation's race with a stream still reading the block was missed."""
    s = simdevice.cuda()
    s.run(_placeholder_between, False)
    assert any(isinstance(r, Race) for r in s.reports), s.text()
    s = simdevice.cuda()
    s.run(_placeholder_between, True)
    s.assert_clean()
    with simdevice.cuda() as sim:
        empties = [torch.empty(0, device="cuda"), torch.zeros(3, 0, device="cuda"),
                   torch.ones(4, device="cuda")[:0].clone()]
        stats = torch.cuda.memory_stats()
        counted = (stats["allocated_bytes.all.current"], stats["allocation.all.current"],
                   stats["reserved_bytes.all.current"])
        grown = empties[0].resize_(10).fill_(2.0).sum().item()
        del empties
    sim.assert_clean()
    assert counted == (0, 0, 2 << 20)  # (the ones(4) whose empty slice was cloned made the one segment)
    assert grown == 20.0
