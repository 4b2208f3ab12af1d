"""Rule (``Collectives``, race-only): between ranks, a collective's receive moves no bytes without values, and finds
what it finds with them. Each collective below, on two ranks, its output read after its work's ``wait()`` or not,
with the first rank's NCCL stream stalled: the race-only run (``--no-values``) gives the value run's reports, a
race where the read does not wait, none where it does. Before the rule's test, a mutation that combined the ranks'
sends without values (none were kept) raised a host error on the NCCL stream, and no test failed."""

from __future__ import annotations

import attrs
import pytest
import torch
import torch.distributed as dist

from reference.schedule import Schedule
from simdevice.search.targets import resolve

N = 256
CALLS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "a2a_single", "send_recv")


def collective(call: str = "all_reduce", wait: bool = True) -> float:
    """One collective of ``call`` on every rank, its output read after its work's ``wait()`` or not."""
    rank, world = dist.get_rank(), dist.get_world_size()
    inp = torch.full((N,), float(rank + 1), device="cuda")
    out = torch.zeros(N, device="cuda")
    if call == "all_reduce":
        out.copy_(inp)
        works = [dist.all_reduce(out, async_op=True)]
    elif call == "all_gather":
        out = torch.zeros(N * world, device="cuda")
        works = [dist.all_gather_into_tensor(out, inp, async_op=True)]
    elif call == "reduce_scatter":
        works = [dist.reduce_scatter_tensor(out, torch.ones(N * world, device="cuda"), async_op=True)]
    elif call == "broadcast":
        out.copy_(inp)
        works = [dist.broadcast(out, 0, async_op=True)]
    elif call == "a2a_single":
        works = [dist.all_to_all_single(out, inp, async_op=True)]
    else:
        peer = (rank + 1) % world
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, inp, peer), dist.P2POp(dist.irecv, out, peer)])
    if wait:
        for work in works:
            work.wait()
    total = out.sum().item()
    for work in works:
        work.wait()
    return float(total)


def _reports(call: str, wait: bool, values: bool) -> list[str]:
    s = Schedule.parse(
        f"tests/property/dropin/test_collectives_between_ranks_run_race_only.py::collective:"
        f"call={call},wait={int(wait)}:rank0.nccl#0+20")
    target = attrs.evolve(resolve(s.program, 2), values=values)
    return sorted(str(r) for r in target.run(s).run.reports)


@pytest.mark.parametrize("call", CALLS)
def test_a_collective_between_ranks_finds_without_values_what_it_finds_with_them(call: str) -> None:
    for wait in (True, False):
        with_values = _reports(call, wait, True)
        assert _reports(call, wait, False) == with_values, (call, wait)
        assert any(r.startswith("race:") for r in with_values) != wait, (call, wait, with_values)
