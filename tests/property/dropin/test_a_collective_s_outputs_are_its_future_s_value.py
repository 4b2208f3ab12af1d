"""A collective's work gives its output tensors as ProcessGroupNCCL's does (``outputs_``): ``result()`` and its
future's value are every output tensor of a collective with a list of outputs (``gather``'s list on its root,
``all_to_all``'s output list), and none of its inputs. A callback's error is raised by its future's ``value()`` as
by its ``wait()``. torch 2.13's one-tensor all-gather and reduce-scatter, called on a group the rank is not a member
of, warn with torch's name for them (``all_gather_single``, ``reduce_scatter_single``: the deprecated names call
those). Mutations caught (a sweep of the twenty-ninth and thirtieth sittings' rules): ``gather``'s and
``all_to_all``'s work holding their first output alone, ``value()`` giving None where the callback raised, the
warning naming ``all_gather_into_tensor``."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed as dist

import simdevice

W = 2


def _outputs() -> None:
    r = dist.get_rank()
    mine = torch.full((2,), float(r), device="cuda")
    gathered = [torch.zeros(2, device="cuda") for _ in range(W)]
    work = dist.gather(mine, gathered if r == 0 else None, dst=0, async_op=True)
    assert work is not None
    if r == 0:
        assert [x is y for x, y in zip(work.result(), gathered, strict=True)] == [True] * W
        assert [x.cpu().tolist() for x in work.get_future().wait()] == [[float(q)] * 2 for q in range(W)]
    outs = [torch.zeros(2, device="cuda") for _ in range(W)]
    ins = [torch.full((2,), float(10 * r + q), device="cuda") for q in range(W)]
    work = dist.all_to_all(outs, ins, async_op=True)
    assert work is not None
    assert [x is y for x, y in zip(work.result(), outs, strict=True)] == [True] * W
    got = work.get_future().wait()
    assert [x.cpu().tolist() for x in got] == [[float(10 * q + r)] * 2 for q in range(W)]


def test_a_collective_s_work_holds_each_of_its_outputs() -> None:
    s = simdevice.cuda()
    s.run(_outputs, world_size=W)
    s.assert_clean()


def test_a_callback_s_error_is_raised_by_its_future_s_value_too() -> None:
    def program() -> None:
        fut = dist.all_reduce(torch.ones(4, device="cuda"), async_op=True).get_future()

        def fails(f: object) -> None:
            raise ValueError("the hook failed")

        with pytest.raises(RuntimeError, match=r"^Got the following error when running the callback: ValueError"):
            fut.then(fails).value()

    s = simdevice.cuda()
    s.run(program, world_size=W)
    s.assert_clean()


def test_a_call_outside_its_group_warns_with_torch_s_name_for_it() -> None:
    messages: list[list[str]] = []

    def program() -> None:
        r = dist.get_rank()
        others = [dist.new_group([0]), dist.new_group([1])][1 - r]
        t = torch.ones(4, device="cuda")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert dist.all_gather_into_tensor(torch.empty(8, device="cuda"), t, group=others) is None
            assert dist.all_gather_single(torch.empty(8, device="cuda"), t, group=others) is None
            assert dist.reduce_scatter_tensor(torch.empty(2, device="cuda"), t, group=others) is None
            assert dist.reduce_scatter_single(torch.empty(2, device="cuda"), t, group=others) is None
        messages.append([str(w.message) for w in caught if "does not belong" in str(w.message)])

    s = simdevice.cuda()
    s.run(program, world_size=W)
    s.assert_clean()
    assert len(messages) == W
    for got in messages:
        assert [m.split(" on global rank")[0] for m in got] == [
            "Running all_gather_single", "Running all_gather_single", "Running reduce_scatter_single",
            "Running reduce_scatter_single"], got
