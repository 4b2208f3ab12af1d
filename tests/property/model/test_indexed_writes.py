"""An in-place op that writes its destination only where an index or a mask says (``index_copy_``, ``index_add_``,
``index_put_`` / ``dst[idx] = src``, ``scatter_``, ``index_fill_``, ``masked_fill_``) reads and writes those
elements alone, where its index has landed when it is issued (its bytes are then what the op reads); where it is
still being computed, the whole destination, with a note. Before, every such op covered its whole destination: a
copy of a row it does not write, on another stream, was a race and a stale read on a correct program.

Each case offloads one row of a destination on a side stream, delayed past the indexed write, and checks its
values; the row is one the write leaves alone (clean) or one it writes (a race, and wrong values)."""

from __future__ import annotations

import pytest
import torch

import simdevice

OPS = ["index_copy_", "index_add_", "index_put_", "scatter_", "index_fill_", "masked_fill_"]


def _offload_a_row_while_written(op: str, row: int, computed_index: bool = False) -> None:
    dst = torch.zeros(16, 64, device="cuda")
    src = torch.ones(4, 64, device="cuda")
    mask = torch.tensor([[k in (1, 5, 9, 13)] for k in range(16)], device="cuda")
    if computed_index:
        idx = torch.arange(4, device="cuda") * 4 + 1  # computed on the stream: not landed when the write is issued
    else:
        idx = torch.tensor([1, 5, 9, 13], device="cuda")  # a blocking copy from the host: landed
    pinned = torch.empty(64, pin_memory=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        pinned.copy_(dst[row], non_blocking=True)
    if op == "index_copy_":
        dst.index_copy_(0, idx, src)
    elif op == "index_add_":
        dst.index_add_(0, idx, src)
    elif op == "index_put_":
        dst[idx] = src
    elif op == "scatter_":
        dst.scatter_(0, idx.view(4, 1).expand(4, 64), src)
    elif op == "index_fill_":
        dst.index_fill_(0, idx, 1.0)
    else:
        dst.masked_fill_(mask, 1.0)
    side.synchronize()
    dst.record_stream(side)
    assert torch.equal(pinned, torch.zeros(64)), "the offloaded row holds the indexed write's values"


def _run(op: str, row: int, computed_index: bool = False) -> tuple[list[str], tuple[str, ...]]:
    # the offload starts after the indexed write has been issued and run; where the index is computed, its first
    # op (``arange``, the default stream's #3) is delayed, so that the write is issued before the index lands
    s = simdevice.cuda("default#3+1" if computed_index else "side#0+1")
    s.run(_offload_a_row_while_written, op, row, computed_index)
    assert s.result is not None
    return [r.kind for r in s.result.reports], s.result.notes


@pytest.mark.parametrize("op", OPS)
def test_a_row_the_indexed_write_leaves_alone_is_no_race(op: str) -> None:
    kinds, _ = _run(op, 0)
    assert kinds == []


@pytest.mark.parametrize("op", OPS)
def test_a_row_the_indexed_write_writes_is_a_race_and_wrong(op: str) -> None:
    kinds, _ = _run(op, 5)
    assert "race" in kinds
    assert "host-error" in kinds


def test_an_index_still_being_computed_counts_the_whole_destination_with_a_note() -> None:
    kinds, notes = _run("index_copy_", 0, computed_index=True)
    assert "race" in kinds  # conservative: the row it leaves alone is counted
    assert "host-error" not in kinds  # (the values are right: the op wrote rows 1, 5, 9 and 13 alone)
    assert any(n.startswith("index_copy_ (") and "its whole destination" in n for n in notes), notes


def _a_whole_write_after_an_indexed_one() -> None:
    dst = torch.zeros(16, 64, device="cuda")
    idx = torch.tensor([1, 5, 9, 13], device="cuda")  # landed
    dst.index_fill_(0, idx, 1.0)  # rows 1, 5, 9 and 13
    dst.mul_(2.0)  # every row
    pinned = torch.empty(64, pin_memory=True)
    side = torch.cuda.Stream()  # no wait for the default stream
    with torch.cuda.stream(side):
        pinned.copy_(dst[0], non_blocking=True)
    side.synchronize()
    torch.cuda.synchronize()


def test_the_narrowing_of_an_indexed_write_ends_with_it() -> None:
    """The bytes an indexed write's accesses cover are its own: the op after it on the same destination covers what
    it touches. A mutant that kept the narrowing past its op counted the ``mul_`` after the write as touching only
    the indexed rows, and missed the race of a row it writes, read on another stream."""
    s = simdevice.cuda()
    s.run(_a_whole_write_after_an_indexed_one)
    assert s.result is not None
    races = [r for r in s.result.reports if r.kind == "race"]
    assert any("mul_" in str(r) for r in races), s.result.reports


def _offload_the_row_after_a_long_indexed_write() -> None:
    dst = torch.zeros(4, 2048, device="cuda")
    idx = torch.tensor([0, 1, 2], device="cuda")  # rows 0 to 2: 6,144 elements in a row, one run of bytes
    pinned = torch.empty(2048, pin_memory=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        pinned.copy_(dst[3], non_blocking=True)
    dst.index_fill_(0, idx, 1.0)
    side.synchronize()
    dst.record_stream(side)
    assert torch.equal(pinned, torch.zeros(2048))


def test_consecutive_elements_an_indexed_write_writes_are_one_piece() -> None:
    """Rule (``memory.footprint``): the elements an indexed write writes are counted as runs of consecutive
    elements, so 6,144 of them in a row are one piece, not one each (past ``MAX_PIECES`` pieces the op counts its
    whole destination, and the row it leaves alone, read on another stream, was a race). Mutation: a run's end
    found where the next offset is not one less (every element a run of its own)."""
    s = simdevice.cuda("side#0+1")
    s.run(_offload_the_row_after_a_long_indexed_write)
    assert s.result is not None
    assert s.result.reports == (), s.result.reports
    assert not any("whole destination" in n for n in s.result.notes), s.result.notes
