"""Rule (``Collectives.collective``'s ``land_early``): NCCL's copy on a world of one rank knows its bytes from its
start, so a copy that trails it over a part and completes first reads that part as landed (the part lands early, at the
trailing copy's completion). An operation in flight that reads those bytes, started before they landed, still
computes from what was there at its start: the early landing keeps its reads first (``in_flight.before_write``), as
the collective's own landing does. Here a kernel (``cat``) reads a quarter of an all-gather's output while the gather
lands, and a device copy of that quarter trails the gather and completes first: the kernel's quarter holds the zeros
it started on, the copy the gathered values; both race the gather, and are reported. Mutation: ``land_early``'s
``before_write`` removed: the kernel computes from the early-landed values."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from reference.schedule import Schedule
from simdevice.search.targets import resolve

ROOT = Path(__file__).resolve().parents[3]
N = 1 << 20


def early_landing(n: int = N, big: int = 1 << 24) -> tuple[float, float]:
    inp = torch.arange(n, dtype=torch.float32, device="cuda") + 1
    out = torch.zeros(n, device="cuda")
    extra = torch.zeros(big, device="cuda")  # (a long kernel: in flight past the trailing copy's completion)
    quarter = torch.zeros(n // 4, device="cuda")
    a, b = torch.cuda.Stream(), torch.cuda.Stream()
    torch.cuda.synchronize()
    work = dist.all_gather_into_tensor(out, inp, async_op=True)
    with torch.cuda.stream(b):
        y = torch.cat([out[: n // 4], extra])  # reads out while the gather lands
    with torch.cuda.stream(a):
        quarter.copy_(out[: n // 4])  # trails the gather over a quarter, done before it
    work.wait()
    torch.cuda.synchronize()
    return y[: n // 4].sum().item(), quarter.sum().item()


def no_early_landing(n: int = N) -> float:
    """Between ranks: a copy of a quarter of an all-reduce's output to pinned memory trails the all-reduce and
    completes first."""
    out = torch.ones(n, device="cuda")
    quarter = torch.zeros(n // 4, pin_memory=True)
    a = torch.cuda.Stream()
    torch.cuda.synchronize()
    work = dist.all_reduce(out, async_op=True)
    with torch.cuda.stream(a):
        quarter.copy_(out[: n // 4], non_blocking=True)
    work.wait()
    torch.cuda.synchronize()
    return float(quarter.sum().item())


def test_between_ranks_no_part_of_a_collective_lands_early(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rule (``recv.sweeps``): the early landing is the one-rank copy's alone; between ranks a collective's receive
    lands in ring order, whole at its end, so a copy trailing it that completes first reads the bytes from before it
    (its input's ones, not the sum) and is a stale read. Mutation: every one-input receive sweeping (``or`` for
    ``and``): the copy read the sum."""
    monkeypatch.chdir(ROOT)
    s = Schedule.parse(f"{Path(__file__).relative_to(ROOT)}::no_early_landing")
    out = resolve(s.program, 2).run(s)
    q = N // 4
    assert out.run.result == [float(q), float(q)], out.run.result
    stale = [r for r in out.run.reports if r.kind == "stale-read"]
    assert {(r.read.actor, r.read.op) for r in stale} == {("rank0.a", "copy_ (D2H)"), ("rank1.a", "copy_ (D2H)")}


def test_a_kernel_in_flight_keeps_what_it_started_on_where_a_part_lands_early(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    s = Schedule.parse(f"{Path(__file__).relative_to(ROOT)}::early_landing")
    out = resolve(s.program, 1).run(s)
    q = N // 4
    # (rank 0's result:) the kernel's zeros, the copy's gathered values
    assert out.run.result == [(0.0, q * (q + 1) / 2)], out.run.result
    trace = [what for _, actor, what in out.run.trace if actor in ("rank0.a", "rank0.nccl")]
    assert trace.index("done copy_ #0") < trace.index("done all_gather (receive)")  # (the copy did finish first)
    races = [r for r in out.run.reports if r.kind == "race"]
    assert {r.current.where().split(" (")[0] for r in races} == {"cat on stream rank0.b #0",
                                                                 "copy_ on stream rank0.a #0"}
    stale = [r for r in out.run.reports if r.kind == "stale-read"]
    assert [r.read.where().split(" (")[0] for r in stale] == ["cat on stream rank0.b #0"]  # (the copy read it landed)


def test_a_part_landed_early_is_found_without_values_as_with_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """Race-only (``--no-values``): the same program finds without values the races and stale reads it finds with
    them (without values no part lands early: no bytes move, and the reads are judged by the versions alone)."""
    import attrs

    monkeypatch.chdir(ROOT)
    s = Schedule.parse(f"{Path(__file__).relative_to(ROOT)}::early_landing")
    target = resolve(s.program, 1)
    with_values = sorted(str(r) for r in target.run(s).run.reports)
    without = attrs.evolve(target, values=False).run(s)
    assert sorted(str(r) for r in without.run.reports) == with_values
    assert any(r.startswith("race:") for r in with_values)
