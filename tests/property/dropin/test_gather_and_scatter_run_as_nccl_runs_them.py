"""Rule (dropin.distributed.gather, scatter, gather_object, scatter_object_list): the rooted list collectives run as
ProcessGroupNCCL runs them, on the rank's ``nccl`` stream after the calling stream: ``gather`` reads every rank's
tensor there and writes only the destination's ``gather_list``; ``scatter`` reads the source's ``scatter_list``
there and writes each rank's output with its own piece. A gathered list or a scattered output read before
``work.wait()`` is a race, and so is a tensor the collective reads written before it: the source's
``scatter_list`` overwritten, a rank's input to ``gather``. torch's argument checks (a list on the root alone, one
dtype) and ProcessGroupNCCL's (the root a rank of the world, one tensor per rank, each of the root's sizes) raise as
theirs do. ``gather_object`` and ``scatter_object_list`` pickle at the call, as ``all_gather_object`` does. Before,
each of the four raised NotImplementedError (no verdict)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist

import simdevice
from simdevice import Race

HERE = "test_gather_and_scatter_run_as_nccl_runs_them.py:"


def _gather(mode: str = "ok", got: dict[int, Any] | None = None) -> None:
    """Rank r sends 4 elements of 10 r + k (k-th element) to the last rank, which gathers them; ``mode`` leaves out
    the wait before the last rank reads what rank 0 sent (``no-wait``), or has rank 0 write its input before it
    waits (``overwrite-input``)."""
    r, w = dist.get_rank(), dist.get_world_size()
    dst = w - 1
    t = torch.arange(4, dtype=torch.float32, device="cuda") + 10 * r
    gathered = [torch.full((4,), -1.0, device="cuda") for _ in range(w)] if r == dst else None
    work = dist.gather(t, gathered, dst=dst, async_op=True)
    assert work is not None
    if mode == "overwrite-input" and r == 0:
        t.zero_()  # before the wait: NCCL may not have sent it yet
    if mode != "no-wait":
        work.wait()  # wait: the gathered pieces must have landed before they are read
    seen = gathered[0].cpu().tolist() if gathered is not None else None
    work.wait()
    if got is not None:
        got[r] = seen if gathered is None else [g.cpu().tolist() for g in gathered]
    if mode == "ok" and gathered is not None:
        assert seen == [10.0 * 0 + k for k in range(4)], seen


def _scatter(mode: str = "ok", got: dict[int, Any] | None = None) -> None:
    """The last rank scatters to rank q a tensor of 4 elements of 100 q + k; ``mode`` leaves out the wait before a
    rank other than the source reads its piece (``no-wait``), or has the source write rank 0's piece before it
    waits (``overwrite-input``)."""
    r, w = dist.get_rank(), dist.get_world_size()
    src = w - 1
    pieces = ([torch.arange(4, dtype=torch.float32, device="cuda") + 100 * q for q in range(w)] if r == src
              else None)
    out = torch.full((4,), -1.0, device="cuda")
    work = dist.scatter(out, pieces, src=src, async_op=True)
    assert work is not None
    if mode == "overwrite-input" and pieces is not None:
        pieces[0].zero_()  # before the wait: NCCL may not have sent it yet
    if mode != "no-wait" or r == src:  # (the source's own piece is copied on its calling stream)
        work.wait()  # wait: this rank's piece must have landed before it is read
    seen = out.cpu().tolist()
    work.wait()
    if got is not None:
        got[r] = seen
    if mode == "ok":
        assert seen == [100.0 * r + k for k in range(4)], seen


@pytest.mark.parametrize("world", [1, 2, 3])
def test_a_gather_lands_every_rank_s_tensor_in_the_destination_s_list_alone(world: int) -> None:
    got: dict[int, Any] = {}
    s = simdevice.cuda()
    s.run(_gather, "ok", got, world_size=world)
    s.assert_clean()
    expected: dict[int, Any] = dict.fromkeys(range(world - 1))
    expected[world - 1] = [[10.0 * q + k for k in range(4)] for q in range(world)]
    assert got == expected


@pytest.mark.parametrize("world", [1, 2, 3])
def test_a_scatter_lands_each_rank_s_piece_of_the_source_s_list(world: int) -> None:
    got: dict[int, Any] = {}
    s = simdevice.cuda()
    s.run(_scatter, "ok", got, world_size=world)
    s.assert_clean()
    assert got == {r: [100.0 * r + k for k in range(4)] for r in range(world)}


@pytest.mark.parametrize("program", [_gather, _scatter])
@pytest.mark.parametrize("schedule", ["rank0.nccl#0+20", "rank1.nccl#0+20", "rank0#3+20", "rank1#3+20"])
def test_a_waited_piece_is_clean_however_either_rank_is_stalled(program: Callable[..., None], schedule: str) -> None:
    s = simdevice.cuda(schedule)
    s.run(program, world_size=2)
    s.assert_clean()


def test_blocking_calls_with_roots_given_as_ranks_of_the_group() -> None:
    """The blocking forms (the current stream waits for the receive) and ``group_dst`` / ``group_src``."""
    got: dict[int, Any] = {}

    def program() -> None:
        r = dist.get_rank()
        gathered = [torch.empty(2, 3, device="cuda") for _ in range(2)] if r == 0 else []
        dist.gather(torch.full((2, 3), float(r + 1), device="cuda"), gathered, group_dst=0)
        out = torch.empty(5, dtype=torch.int64, device="cuda")
        pieces = [torch.full((5,), 7 + q, dtype=torch.int64, device="cuda") for q in range(2)] if r == 1 else None
        dist.scatter(out, pieces, group_src=1)
        got[r] = [[g.sum().item() for g in gathered], out.tolist()]

    s = simdevice.cuda()
    s.run(program, world_size=2)
    s.assert_clean()
    assert got == {0: [[6.0, 12.0], [7] * 5], 1: [[], [8] * 5]}


@pytest.mark.parametrize("program", [_gather, _scatter])
@pytest.mark.parametrize("mode", ["no-wait", "overwrite-input"])
def test_a_piece_read_or_a_sent_tensor_written_before_the_wait_is_a_race(program: Callable[..., None],
                                                                         mode: str) -> None:
    s = simdevice.cuda()
    s.run(program, mode, world_size=2)
    races = [str(r) for r in s.reports if isinstance(r, Race)]
    assert races, s.text()
    assert all("rank0.nccl" in r or "rank1.nccl" in r for r in races), races
    what = f"{program.__name__[1:]} (receive)" if mode == "no-wait" else f"{program.__name__[1:]} (send)"
    assert all(what in r for r in races), races


def _a_non_destination_reads_its_sent_tensor_early() -> None:
    """A rank other than the destination only reads its tensor: reading it itself before the wait is no race, and
    nothing of it is written."""
    r = dist.get_rank()
    t = torch.full((4,), float(r), device="cuda")
    work = dist.gather(t, [torch.empty(4, device="cuda") for _ in range(2)] if r == 0 else None, dst=0,
                       async_op=True)
    assert work is not None
    total = t.sum().item()  # a read beside NCCL's read of it
    work.wait()
    assert total == 4.0 * r


def test_gather_writes_nothing_on_the_other_ranks() -> None:
    s = simdevice.cuda()
    s.run(_a_non_destination_reads_its_sent_tensor_early, world_size=2)
    s.assert_clean()


def _gather_list_on_a_non_destination() -> None:
    dist.gather(torch.ones(4, device="cuda"), [torch.empty(4, device="cuda")] * 2, dst=0)


def _no_gather_list_on_the_destination() -> None:
    dist.gather(torch.ones(4, device="cuda"), None, dst=dist.get_rank())


def _short_gather_list() -> None:
    dist.gather(torch.ones(4, device="cuda"), [torch.empty(4, device="cuda")], dst=dist.get_rank())


def _gather_list_of_another_size() -> None:
    dist.gather(torch.ones(4, device="cuda"), [torch.empty(4, device="cuda"), torch.empty(2, 2, device="cuda")],
                dst=dist.get_rank())


def _gather_of_two_dtypes() -> None:
    dist.gather(torch.ones(4, device="cuda"), [torch.empty(4, device="cuda", dtype=torch.float16)] * 2,
                dst=dist.get_rank())


def _gather_of_no_tensor() -> None:
    dist.gather([torch.ones(4, device="cuda")], None, dst=0)  # type: ignore[arg-type]


def _gather_to_a_rank_outside_the_world() -> None:
    dist.gather(torch.ones(4, device="cuda"), None, dst=2)


def _gather_to_a_root_given_both_ways() -> None:
    dist.gather(torch.ones(4, device="cuda"), None, dst=0, group_dst=0)


def _gather_of_a_host_tensor() -> None:
    dist.gather(torch.ones(4), [torch.empty(4, device="cuda")] * 2 if dist.get_rank() == 0 else None, dst=0)


def _scatter_list_on_a_non_source() -> None:
    dist.scatter(torch.empty(4, device="cuda"), [torch.ones(4, device="cuda")] * 2, src=1 - dist.get_rank())


def _no_scatter_list_on_the_source() -> None:
    dist.scatter(torch.empty(4, device="cuda"), [], src=dist.get_rank())


def _short_scatter_list() -> None:
    dist.scatter(torch.empty(4, device="cuda"), [torch.ones(4, device="cuda")] * 3, src=dist.get_rank())


def _scatter_list_of_another_size() -> None:
    dist.scatter(torch.empty(4, device="cuda"), [torch.ones(4, device="cuda"), torch.ones(5, device="cuda")],
                 src=dist.get_rank())


def _scatter_of_two_dtypes() -> None:
    dist.scatter(torch.empty(4, device="cuda"), [torch.ones(4, device="cuda", dtype=torch.int32)] * 2,
                 src=dist.get_rank())


def _scatter_from_a_rank_outside_the_world() -> None:
    dist.scatter(torch.empty(4, device="cuda"), None, src=-1)


def _scatter_of_a_strided_output() -> None:
    m = torch.empty(4, 4, device="cuda")
    dist.scatter(m[:, 0], [torch.ones(4, device="cuda")] * 2 if dist.get_rank() == 0 else None, src=0)


def _raises_at_the_call(program: Callable[[], None], error: str) -> None:
    """``program`` on two ranks raises ``error`` on a rank, at its own line."""
    s = simdevice.cuda()
    s.run(program, world_size=2)
    errors = [str(r) for r in s.reports]
    assert errors, f"{program.__name__} ran clean"
    assert all(f"rank0 raised {error}" in e or f"rank1 raised {error}" in e for e in errors), errors
    assert all(HERE in e for e in errors), errors


@pytest.mark.parametrize(("program", "error"), [
    (_gather_list_on_a_non_destination,
     "ValueError: Argument ``gather_list`` must NOT be specified on non-destination ranks."),
    (_no_gather_list_on_the_destination, "ValueError: Argument ``gather_list`` must be specified on destination rank."),
    (_short_gather_list, "ValueError: ProcessGroupNCCL::gather: Incorrect output list size 1. Output list size should "
                         "be 2, same as size of the process group."),
    (_gather_list_of_another_size,
     "ValueError: ProcessGroupNCCL::gather: invalid tensor size at index 1 (expected (4), got (2, 2))"),
    (_gather_of_two_dtypes, "ValueError: Invalid usage of tensors with different dtypes"),
    (_gather_of_no_tensor, "TypeError: Invalid function argument. Expected parameter `tensor` of type torch.Tensor"),
    (_gather_to_a_rank_outside_the_world, "ValueError: ProcessGroupNCCL::gather: invalid root rank: 2"),
    (_gather_to_a_root_given_both_ways, "ValueError: Can't specify both group_rank and global_rank"),
    (_gather_of_a_host_tensor, "ValueError: Tensors must be CUDA and dense"),
    (_scatter_list_on_a_non_source,
     "ValueError: Argument ``scatter_list`` must NOT be specified on non-source ranks."),
    (_no_scatter_list_on_the_source, "ValueError: Argument ``scatter_list`` must be specified on source rank."),
    (_short_scatter_list, "ValueError: ProcessGroupNCCL::scatter: Incorrect input list size 3. Input list size should "
                          "be 2, same as size of the process group."),
    (_scatter_list_of_another_size,
     "ValueError: ProcessGroupNCCL::scatter: invalid tensor size at index 1 (expected (4), got (5))"),
    (_scatter_of_two_dtypes, "ValueError: Invalid usage of tensors with different dtypes"),
    (_scatter_from_a_rank_outside_the_world, "ValueError: ProcessGroupNCCL::scatter: invalid root rank: -1"),
    (_scatter_of_a_strided_output, "ValueError: Tensors must be contiguous"),
])
def test_wrong_arguments_raise_at_the_call_as_torch_raises(program: Callable[[], None], error: str) -> None:
    _raises_at_the_call(program, error)


def _scatter_to_an_output_of_another_size() -> None:
    r = dist.get_rank()
    dist.scatter(torch.empty(4 if r == 0 else 3, device="cuda"), [torch.ones(4, device="cuda")] * 2 if r == 0 else None,
                 src=0)
    torch.cuda.synchronize()


def _gather_of_inputs_of_two_sizes() -> None:
    r = dist.get_rank()
    dist.gather(torch.ones(4 if r == 0 else 5, device="cuda"), [torch.empty(4, device="cuda")] * 2 if r == 0 else None,
                dst=0)
    torch.cuda.synchronize()


@pytest.mark.parametrize(("program", "error"), [
    (_scatter_to_an_output_of_another_size, "the ranks disagree on what they exchange: rank 0 sends 4 elements to "
                                            "rank 1, which receives 3 from rank 0"),
    (_gather_of_inputs_of_two_sizes, "the ranks passed tensors of different sizes (4, 5 elements, by rank)"),
])
def test_ranks_whose_pieces_disagree_in_size_are_told_so(program: Callable[[], None], error: str) -> None:
    # (each rank's own arguments pass its checks: only the root's list is checked against its own tensor, as
    # ProcessGroupNCCL checks it; on a GPU the receive of the wrong size takes the wrong bytes, or waits forever)
    s = simdevice.cuda()
    s.run(program, world_size=2)
    text = s.text()
    assert f"raised RuntimeError: {error}" in text, text
    assert HERE in text.split(error)[1], text


def test_object_gathers_and_scatters_send_pickled_copies() -> None:
    got: dict[int, list[Any]] = {}

    def program() -> None:
        r, w = dist.get_rank(), dist.get_world_size()
        mine = {"rank": r}
        gathered: list[Any] | None = [None] * w if r == 1 else None
        dist.gather_object(mine, gathered, dst=1)
        mine["rank"] = -1  # the sender changes its object after sending it: not what was sent
        configs = [{"lr": 0.1 * q} for q in range(w)] if r == 2 else None
        out: list[Any] = [None]
        dist.scatter_object_list(out, configs, group_src=2)
        if configs is not None:
            configs[r]["lr"] = 5.0  # the source changes its own object afterwards: not what it kept
        got[r] = [gathered, out]

    s = simdevice.cuda()
    s.run(program, world_size=3)
    s.assert_clean()
    assert got == {
        0: [None, [{"lr": 0.0}]],
        1: [[{"rank": 0}, {"rank": 1}, {"rank": 2}], [{"lr": 0.1}]],
        2: [None, [{"lr": 0.2}]],
    }


def test_object_gathers_and_scatters_take_rank_0_by_default() -> None:
    got: dict[int, list[Any]] = {}

    def program() -> None:
        r = dist.get_rank()
        gathered: list[Any] | None = [None, None] if r == 0 else None
        dist.gather_object(f"from {r}", gathered)
        out: list[Any] = ["unset"]
        dist.scatter_object_list(out, ["a", "b"] if r == 0 else None)
        got[r] = [gathered, out]

    s = simdevice.cuda()
    s.run(program, world_size=2)
    s.assert_clean()
    assert got == {0: [["from 0", "from 1"], ["a"]], 1: [None, ["b"]]}


def _object_list_on_a_non_destination() -> None:
    dist.gather_object("x", [None, None], dst=0)


def _no_object_list_on_the_destination() -> None:
    dist.gather_object("x", None, dst=dist.get_rank())


def _no_output_list_to_scatter_into() -> None:
    dist.scatter_object_list([], ["a", "b"] if dist.get_rank() == 0 else None)


def _no_objects_on_the_source() -> None:
    dist.scatter_object_list([None], None, src=dist.get_rank())


def _objects_for_three() -> None:
    dist.scatter_object_list([None], ["a", "b", "c"], src=dist.get_rank())


@pytest.mark.parametrize(("program", "error"), [
    (_object_list_on_a_non_destination,
     "ValueError: Argument ``gather_list`` must NOT be specified on non-destination ranks."),
    (_no_object_list_on_the_destination,
     "ValueError: Argument ``gather_list`` must be specified on destination rank."),
    (_no_output_list_to_scatter_into,
     "ValueError: Expected argument scatter_object_output_list to be a list of size at least 1."),
    (_no_objects_on_the_source, "ValueError: source rank must provide non-None scatter_object_input_list"),
    (_objects_for_three, "ValueError: ProcessGroupNCCL::scatter: Incorrect input list size 3. Input list size should "
                         "be 2, same as size of the process group."),
])
def test_wrong_object_arguments_raise_at_the_call_as_torch_raises(program: Callable[[], None], error: str) -> None:
    _raises_at_the_call(program, error)
