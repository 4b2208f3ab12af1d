"""A swap-in writes some blocks of a paged KV cache with ``index_copy_``, ``cache[idx] = staged`` or ``scatter_`` on
a swap stream, while the compute stream writes another block: on a GPU the two kernels touch different rows, and
neither races. The simulator computed the indexed write on a copy of the whole destination and landed all of it, so the
other stream's row, landed meanwhile, was put back as it was (a wrong value no GPU shows); and it took the source
still being copied (the staged blocks' H2D) for an index not known yet, so it counted the write as covering the whole
cache and reported a race on the other row too."""

from __future__ import annotations

import pytest
import torch
from hypothesis import strategies as st

import simdevice

NB, BS, D = 8, 4, 16


def _swap_in_beside_a_decode_write(how: str = "index_copy_", staged_first: bool = False) -> None:
    """Blocks 3-5 swapped in on ``swap``; block 0 written on the compute stream meanwhile, unordered with it;
    ``staged_first``: the staged blocks have landed before the indexed write is issued."""
    cache = torch.zeros(NB, BS, D, device="cuda")
    host = torch.full((3, BS, D), 7.0).pin_memory()
    dst = torch.tensor([3, 4, 5], device="cuda")
    swap = torch.cuda.Stream()
    swap.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(swap):
        staged = host.to("cuda", non_blocking=True)
        if staged_first:
            swap.synchronize()
        if how == "index_copy_":
            cache.index_copy_(0, dst, staged)
        elif how == "scatter_":
            cache.view(NB, -1).scatter_(0, dst.view(3, 1).expand(3, BS * D), staged.view(3, -1))
        else:
            cache[dst] = staged
        done = swap.record_event()
    cache[0].add_(1.0)
    torch.cuda.current_stream().wait_event(done)
    staged.record_stream(torch.cuda.current_stream())
    assert cache.sum().item() == BS * D * (1.0 + 3 * 7.0)


@pytest.mark.parametrize("how", ["index_copy_", "index_put_", "scatter_"])
@pytest.mark.parametrize("staged_first", [False, True])
def test_another_stream_s_row_stays(how: str, staged_first: bool) -> None:
    for schedule in ("", "swap#1+1", "default#0+1"):
        run = simdevice.cuda(schedule) if schedule else simdevice.cuda()
        run.run(_swap_in_beside_a_decode_write, how, staged_first)
        run.assert_clean()
    found = simdevice.explore(_swap_in_beside_a_decode_write, max_examples=60,
                              config=st.just({"how": how, "staged_first": staged_first})).failure
    assert found is None, found.text()


def _swap_in_racing_its_own_rows() -> None:
    """The compute stream writes a block the swap-in writes too: that race is still found."""
    cache = torch.zeros(NB, BS, D, device="cuda")
    host = torch.full((3, BS, D), 7.0).pin_memory()
    dst = torch.tensor([3, 4, 5], device="cuda")
    swap = torch.cuda.Stream()
    swap.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(swap):
        staged = host.to("cuda", non_blocking=True)
        cache.index_copy_(0, dst, staged)
    cache[4].add_(1.0)
    torch.cuda.synchronize()


def test_a_write_to_a_swapped_in_row_still_races() -> None:
    found = simdevice.explore(_swap_in_racing_its_own_rows, max_examples=20).failure
    assert found is not None
    assert any(r.kind == "race" for r in found.run.reports), found.text()
