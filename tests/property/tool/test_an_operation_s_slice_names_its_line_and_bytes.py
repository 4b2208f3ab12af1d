"""An operation is noted with the program's line that issued it and the bytes it touches, so a timeline's slice of it
(``simdevice.timeline.slices``: the picture, the Perfetto trace) names that line and its size and takes its place in
the issue order. Rules: a collective's counted operation (its send on the communication stream) is noted as every
other operation is (``Runtime._collective_site``); a copy between pinned memory and the device counts the bytes of
both sides, as a kernel counts its inputs' and outputs' (``Dispatcher.issue`` leaves an op that touches host memory
to ``Runtime.enqueue``'s count). Mutations: the collective's note left out (no line, no bytes, no issue order); the
copy's bytes counted on the device side alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from reference.schedule import Schedule
from simdevice.search.targets import resolve
from simdevice.timeline import slices

ROOT = Path(__file__).resolve().parents[3]
N = 1024


def gathered() -> float:
    inp = torch.ones(N, device="cuda")
    out = torch.empty(N, device="cuda")
    dist.all_gather_into_tensor(out, inp)
    return out.sum().item()


def test_a_collective_s_slice_has_its_line_its_bytes_and_its_place(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    here = Path(__file__).relative_to(ROOT)
    out = resolve(f"{here}::gathered", 1).run(Schedule.parse(f"{here}::gathered"))
    assert out.clean, out.text()
    [send] = [s for s in slices(out) if s.actor == "rank0.nccl" and s.name.startswith("all_gather (send)")]
    line = gathered.__code__.co_firstlineno + 3
    assert send.source == f"{here}:{line}"
    assert send.nbytes == 2 * N * 4  # (the output and the input, on a world of one)
    assert send.issued >= 0


def copied_in() -> float:
    pinned = torch.ones(N, pin_memory=True)
    x = torch.empty(N, device="cuda")
    x.copy_(pinned, non_blocking=True)
    return x.sum().item()


def test_a_copy_s_slice_counts_the_bytes_of_both_sides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    here = Path(__file__).relative_to(ROOT)
    out = resolve(f"{here}::copied_in").run(Schedule.parse(f"{here}::copied_in"))
    assert out.clean, out.text()
    [copy] = [s for s in slices(out) if s.kind == "op" and s.name.startswith("copy_ (H2D)")]
    assert copy.source == f"{here}:{copied_in.__code__.co_firstlineno + 3}"
    assert copy.nbytes == 2 * N * 4  # (the pinned source and the device destination)
