"""Rule (distributed: ``functional_collective``): torch's functional collectives (``torch.ops._c10d_functional``:
DTensor's redistribution, ``torch.distributed._functional_collectives``, FSDP2's ``full_tensor()``) run as
ProcessGroupNCCL runs them: the output made on the current stream, the collective on the group's stream, and
``wait_tensor`` of the output the current stream's wait for it; a read of the output before it races. A group is
given by its name (``"0"``: the default one) or as the group. Before, each raised in C++, which knows no simulated
group (no verdict)."""

from __future__ import annotations

import torch
import torch.distributed as dist

import simdevice
from simdevice.search.explore import explore

_F = torch.ops._c10d_functional


def unwaited() -> None:
    x = torch.full((4,), float(dist.get_rank()), device="cuda")
    out = _F.all_gather_into_tensor(x, dist.get_world_size(), "0")
    total = out.sum()  # before wait_tensor: the all-gather may still be writing it
    _F.wait_tensor(out)
    total.item()


def waited() -> None:
    x = torch.full((4,), float(dist.get_rank()), device="cuda")
    out = _F.all_gather_into_tensor(x, dist.get_world_size(), "0")
    _F.wait_tensor(out)
    assert out.tolist() == [0.0] * 4 + [1.0] * 4


def test_a_read_of_an_output_before_its_wait_races_and_after_it_is_clean() -> None:
    found = explore(unwaited, max_examples=10, world_size=2)
    assert found.failure is not None
    text = found.failure.text()
    assert "reads device" in text, text
    assert "which all_gather (receive) on stream" in text, text
    clean = explore(waited, max_examples=20, world_size=2)
    assert clean.failure is None, clean.failure.text()


def through_the_python_api() -> list[list[float]]:
    import torch.distributed._functional_collectives as funcol

    r, world = dist.get_rank(), dist.get_world_size()
    group = dist.group.WORLD
    assert group is not None
    assert group.group_name == "0"
    summed = funcol.all_reduce(torch.full((2,), float(r + 1), device="cuda"), "sum", group)
    scattered = funcol.reduce_scatter_tensor(torch.arange(4.0, device="cuda") * (r + 1), "sum", 0, group)
    gathered = funcol.all_gather_tensor(torch.full((1,), float(r), device="cuda"), 0, group)
    maxed = funcol.all_reduce(torch.full((1,), float(r), device="cuda"), "max", group)
    swapped = funcol.all_to_all_single(torch.arange(2.0, device="cuda") + 10 * r, None, None, group)
    sent = funcol.broadcast(torch.full((1,), float(r + 7), device="cuda"), 1, group)
    assert world == 2
    return [t.tolist() for t in (summed, scattered, gathered, maxed, swapped, sent)]


def test_the_functional_api_s_values_are_nccl_s() -> None:
    s = simdevice.cuda()
    s.run(through_the_python_api, world_size=2)
    assert not s.reports, s.text()
    assert s.result.result == [
        [[3.0, 3.0], [0.0, 3.0], [0.0, 1.0], [1.0], [0.0, 10.0], [8.0]],
        [[3.0, 3.0], [6.0, 9.0], [0.0, 1.0], [1.0], [1.0, 11.0], [8.0]],
    ]


def unknown_group() -> None:
    _F.all_reduce(torch.ones(2, device="cuda"), "sum", "no-such-group")


def test_a_name_no_group_has_is_the_program_s_error() -> None:
    s = simdevice.cuda()
    s.run(unknown_group, world_size=2)
    assert "Could not resolve the process group registered under the name no-such-group" in s.text()
