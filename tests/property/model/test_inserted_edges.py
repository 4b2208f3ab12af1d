"""Inserted edges (``Options.edges``, ``simdevice.runtime.inserted``): a synchronization the simulator adds to a
program, as a suggested fix would, without editing it.

Rules, each with a test a mutation of it fails:

- an edge A@L1->B@L2 makes every operation of B issued at line L2 wait for the latest operation of A issued at
  line L1 before it (a marker, as ``wait_event`` on an event recorded after it): the race is gone and the values
  are right under every schedule;
- the marker is not counted: operation counts, so schedule indices, stay what they were;
- an edge whose first site has issued nothing yet is a no-op, as a wait on a never-recorded event is;
- an edge into a host step makes the host wait (as ``event.synchronize``);
- an edge into a collective orders its communication stream, one out of it waits for the collective's work.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from hypothesis import given
from hypothesis import strategies as st

from reference.naming import short_path
from reference.schedule import Delay, Schedule
from simdevice import SimDevice
from simdevice.runtime import Edge, Options, Site, inserted
from simdevice.runtime.reports import Race

N = 1024
HERE = short_path(__file__)


def _line(fn: Any, text: str) -> str:
    """``HERE:N`` of the line of ``fn`` that contains ``text``."""
    lines, first = inspect.getsourcelines(fn)
    return f"{HERE}:{first + next(i for i, line in enumerate(lines) if text in line)}"


def unordered(dev: Any) -> torch.Tensor:
    """The reload does not wait for the offload."""
    x = torch.arange(N, dtype=torch.float32, device=dev.device)
    pinned = torch.empty(N, pin_memory=True)
    side = dev.Stream(name="side")
    side.wait_stream(dev.current_stream())
    with dev.stream(side):
        pinned.copy_(x, non_blocking=True)  # offload
    y = torch.empty_like(x)
    y.copy_(pinned, non_blocking=True)  # reload
    return y.cpu()


EDGE = Edge(Site("side", _line(unordered, "# offload")), Site("default", _line(unordered, "# reload")))


def run(program: Any, edges: tuple[Edge, ...] = (), delays: tuple[Delay, ...] = ()) -> tuple[Any, Any]:
    dev = SimDevice(Schedule("test", "t", (), delays), options=Options(edges=edges))
    r = dev.run(program)
    return r, dev


def test_without_the_edge_the_reload_races() -> None:
    r, _ = run(unordered, delays=(Delay("side", 0, 1),))
    assert any(isinstance(x, Race) for x in r.reports)
    assert not torch.equal(r.result, torch.arange(N, dtype=torch.float32))


@given(st.lists(st.tuples(st.sampled_from(["host", "default", "side"]), st.integers(0, 4), st.integers(1, 20)),
                max_size=3, unique_by=lambda t: t[:2]))
def test_an_inserted_edge_orders_the_two_lines_under_every_schedule(raw: list[tuple[str, int, int]]) -> None:
    r, _ = run(unordered, (EDGE,), tuple(Delay(a, k, u) for a, k, u in raw))
    assert r.reports == ()
    assert torch.equal(r.result, torch.arange(N, dtype=torch.float32))


def test_the_inserted_wait_is_not_counted() -> None:
    plain, _ = run(unordered)
    fixed, dev = run(unordered, (EDGE,))
    assert fixed.op_counts == plain.op_counts
    assert any("inserted edge from side@" in what for _, actor, what in dev.trace if actor == "default")


def test_the_context_manager_inserts_into_runs_made_inside_it() -> None:
    with inserted([EDGE]):
        r, _ = run(unordered, delays=(Delay("side", 0, 1),))
    assert r.reports == ()
    after, _ = run(unordered, delays=(Delay("side", 0, 1),))
    assert after.reports != ()  # only inside


def test_an_edge_from_a_line_that_issued_nothing_yet_is_a_no_op() -> None:
    backwards = Edge(EDGE.before, EDGE.after)  # the offload waits for a reload not issued yet
    r, dev = run(unordered, (backwards,), (Delay("side", 0, 1),))
    plain, plain_dev = run(unordered, delays=(Delay("side", 0, 1),))
    assert r.reports == plain.reports
    assert dev.trace == plain_dev.trace


def host_read(dev: Any) -> float:
    """The host reads the pinned buffer the side stream fills, without waiting."""
    x = torch.full((N,), 3.0, device=dev.device)
    pinned = torch.zeros(N, pin_memory=True)
    side = dev.Stream(name="side")
    side.wait_stream(dev.current_stream())
    with dev.stream(side):
        pinned.copy_(x, non_blocking=True)  # offload
    return float(pinned.sum())  # host read


def test_an_edge_into_a_host_step_makes_the_host_wait() -> None:
    edge = Edge(Site("side", _line(host_read, "# offload")), Site("host", _line(host_read, "# host read")))
    racy, _ = run(host_read, delays=(Delay("side", 0, 1),))
    assert any(isinstance(x, Race) for x in racy.reports)
    fixed, _ = run(host_read, (edge,), (Delay("side", 0, 1),))
    assert fixed.reports == ()
    assert fixed.result == 3.0 * N


def gather_then_read(dev: Any) -> torch.Tensor:
    """An async all-gather into a buffer a side stream then copies, without waiting for the work."""
    shard = torch.full((N,), 2.0, device=dev.device)
    full = torch.zeros(N, device=dev.device)
    work = dev.all_gather_into_tensor(full, shard, async_op=True)  # gather
    side = dev.Stream(name="side")
    out = torch.empty(N, device=dev.device)
    with dev.stream(side):
        out.copy_(full)  # read
    side.synchronize()
    work.wait()
    return out.cpu()


def test_an_edge_out_of_a_collective_waits_for_its_work() -> None:
    edge = Edge(Site("nccl", _line(gather_then_read, "# gather")), Site("side", _line(gather_then_read, "# read")))
    racy, _ = run(gather_then_read, delays=(Delay("nccl", 0, 1),))
    assert any(isinstance(x, Race) for x in racy.reports)
    fixed, _ = run(gather_then_read, (edge,), (Delay("nccl", 0, 1),))
    assert fixed.reports == ()
    assert torch.equal(fixed.result, torch.full((N,), 2.0))
