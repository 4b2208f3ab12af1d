"""Inserted edges (``Options.edges``, ``simdevice.runtime.inserted``): a synchronization the simulator adds to a
program, as a suggested fix would, without editing it.

Rules, each with a test a mutation of it fails:

- an edge A@L1->B@L2 makes every operation of B issued at line L2 wait for the latest operation of A issued at
  line L1 before it (a marker, as ``wait_event`` on an event recorded after it): the race is gone and the values
  are right under every schedule;
- the marker is not counted: operation counts, so schedule indices, stay what they were;
- an edge whose first site has issued nothing yet is a no-op, as a wait on a never-recorded event is;
- an edge into a host step makes the host wait (as ``event.synchronize``), and the trace says when the wait ended;
- an edge into a collective orders its communication stream, one out of it waits for the collective's work;
- forward edges (``A@L1=>B@L2``, the k-th operation at B waits for the k-th at A, issued later): see the section
  below.
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
from simdevice.runtime.reports import Deadlock, Race

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


def test_an_edge_that_matches_no_operation_says_so_in_the_runs_notes() -> None:
    """An edge whose actor or line issues nothing (a misspelt stream, a line with no operation, a rank's stream in
    a one-rank run) does nothing: the run says so, where it would otherwise look like a fix that failed."""
    r, _ = run(unordered, (EDGE,))
    assert not any("inserted edge" in n for n in r.notes)
    stray = Edge(Site("sidee", EDGE.after.source), EDGE.before)
    nowhere = Edge(EDGE.after, Site("default", f"{HERE}:1"))
    for edge, unseen in ((stray, f"sidee@{EDGE.after.source}"), (nowhere, f"default@{HERE}:1")):
        r, _ = run(unordered, (edge,))
        (note,) = [n for n in r.notes if "inserted edge" in n]
        assert note.startswith(f"inserted edge {edge} matched no operation at {unseen}:")


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
    fixed, dev = run(host_read, (edge,), (Delay("side", 0, 1),))
    assert fixed.reports == ()
    assert fixed.result == 3.0 * N
    # the trace says when the wait ended, the host's read then: after the offload was done (its step's own line is
    # at its start)
    assert _at(dev, "host", "waited for inserted edge from side@") >= _at(dev, "side", "done copy_")


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


# -- forward edges: a wait for an operation the program issues later --------------------------------------------
#
# Rules, each with a test a mutation of it fails:
#
# - a forward edge A@L1=>B@L2 makes the k-th operation at B wait for the k-th at A, issued later: its stream is held
#   (the host goes on) until that one is issued and done; the race is gone and the values are right under every
#   schedule (held accesses checked as issued right after it: mutate `sync.released` to join nothing and the race
#   comes back; let the marker pass once it is issued, not done, and the values are wrong);
# - matching is by occurrence with an offset (`[+D]`): the k-th at B waits for the (k+D)-th at A; a wrong offset is
#   a race (none to wait for) or a deadlock (the last one never comes), never a clean run;
# - an event recorded on a held stream is released with it: who waits on it is ordered after what the edge waited
#   for (mutate the release of held records to join nothing and a stream waiting on it races);
# - an awaited operation that never comes is a deadlock of the run (reported, never a hang);
# - a host step waiter blocks its host until the operation (another process's) is issued and done;
# - the reversed edge does not make the run clean.


def early_read(dev: Any) -> torch.Tensor:
    """The side stream copies ``x`` before the default stream's fill it needs is issued."""
    x = torch.zeros(N, device=dev.device)
    out = torch.empty(N, device=dev.device)
    side = dev.Stream(name="side")
    side.wait_stream(dev.current_stream())
    with dev.stream(side):
        out.copy_(x)  # early read
    x.fill_(2.0)  # late write
    dev.current_stream().wait_stream(side)
    return out.cpu()


FORWARD = Edge(Site("default", _line(early_read, "# late write")), Site("side", _line(early_read, "# early read")),
               forward=True)


def test_without_a_forward_edge_the_early_read_races_and_reads_the_old_values() -> None:
    r, _ = run(early_read)
    assert any(isinstance(x, Race) for x in r.reports)
    assert torch.equal(r.result, torch.zeros(N))
    # ordered as issued (a backward edge: the fill waits for the read), the race goes and the values stay wrong
    backward, _ = run(early_read, (Edge(FORWARD.before, FORWARD.after),))
    assert backward.reports == ()
    assert torch.equal(backward.result, torch.zeros(N))


@given(st.lists(st.tuples(st.sampled_from(["host", "default", "side"]), st.integers(0, 4), st.integers(1, 20)),
                max_size=3, unique_by=lambda t: t[:2]))
def test_a_forward_edge_orders_the_later_write_first_under_every_schedule(raw: list[tuple[str, int, int]]) -> None:
    r, _ = run(early_read, (FORWARD,), tuple(Delay(a, k, u) for a, k, u in raw))
    assert r.reports == ()
    assert torch.equal(r.result, torch.full((N,), 2.0))


def _at(dev: Any, actor: str, what: str) -> int:
    return next(t for t, a, w in dev.trace if a == actor and w.startswith(what))


def test_the_waiter_stream_waits_for_the_write_to_be_done_and_the_host_goes_on() -> None:
    r, dev = run(early_read, (FORWARD,), (Delay("default", 1, 5),))
    assert r.reports == ()
    assert _at(dev, "side", "start copy_") >= _at(dev, "default", "done fill_")
    assert any(w.startswith("pass inserted forward edge from default@") for _, a, w in dev.trace if a == "side")
    # the host issued the fill while the side stream was held: its step comes before the copy started
    assert _at(dev, "host", "fill_") < _at(dev, "side", "start copy_")
    plain, _ = run(early_read)
    assert r.op_counts == plain.op_counts  # the marker is not counted


def test_a_mutant_that_orders_nothing_at_the_release_races(monkeypatch: Any) -> None:
    from simdevice.runtime import sync

    monkeypatch.setattr(sync, "released", lambda clock, recs: None)
    r, _ = run(early_read, (FORWARD,))
    assert any(isinstance(x, Race) for x in r.reports)


def early_read_then_an_event(dev: Any) -> torch.Tensor:
    """As ``early_read``, and an event recorded on the side stream after its early read (while a forward edge holds
    that stream), which a third stream waits on before it reads what the late write wrote."""
    x = torch.zeros(N, device=dev.device)
    out = torch.empty(N, device=dev.device)
    side, third = dev.Stream(name="side"), dev.Stream(name="third")
    side.wait_stream(dev.current_stream())
    with dev.stream(side):
        out.copy_(x)  # early read
        done = dev.Event()
        done.record()
    x.fill_(2.0)  # late write
    third.wait_event(done)
    with dev.stream(third):
        y = x * 1.0
    dev.current_stream().wait_stream(side)
    dev.current_stream().wait_stream(third)
    return y.cpu()


def test_an_event_recorded_on_a_held_stream_carries_the_forward_edge() -> None:
    """An event recorded on a stream while a forward edge holds it is released with the held operations: who waits
    on it is ordered after what the edge waited for (a mutant that released the held operations but not the
    records left the third stream's read racing with the late write)."""
    edge = Edge(Site("default", _line(early_read_then_an_event, "# late write")),
                Site("side", _line(early_read_then_an_event, "# early read")), forward=True)
    plain, _ = run(early_read_then_an_event)
    assert any(isinstance(x, Race) for x in plain.reports)
    r, _ = run(early_read_then_an_event, (edge,))
    assert r.reports == ()
    assert torch.equal(r.result, torch.full((N,), 2.0))


def test_a_mutant_whose_wait_ends_when_the_write_is_issued_reads_old_values(monkeypatch: Any) -> None:
    from simdevice.runtime import sync

    real = sync.forward_marker

    def issued_only(stream: Any, what: str, ready: Any) -> Any:
        marker = real(stream, what, ready)
        marker.ready = lambda: True  # passes at once: the write it waits for is issued, not done
        return marker

    monkeypatch.setattr(sync, "forward_marker", issued_only)
    r, _ = run(early_read, (FORWARD,), (Delay("default", 1, 5),))
    assert not torch.equal(r.result, torch.full((N,), 2.0))
    assert r.reports != ()


def test_the_reversed_forward_edge_does_not_make_the_run_clean() -> None:
    reversed_edge = Edge(FORWARD.before, FORWARD.after, forward=True)  # the fill waits for a read issued before it
    r, _ = run(early_read, (reversed_edge,))
    assert r.reports != () or not torch.equal(r.result, torch.full((N,), 2.0))


def test_an_awaited_operation_that_never_comes_is_a_deadlock_not_a_hang() -> None:
    never = Edge(Site("default", _line(early_read, "return out.cpu()")), FORWARD.before, forward=True)
    r, _ = run(early_read, (never,))
    [deadlock] = [x for x in r.reports if isinstance(x, Deadlock)]
    assert "inserted forward edge from default@" in str(deadlock)


ROUNDS = 3


def rounds(dev: Any) -> torch.Tensor:
    """Each round the side stream copies ``x`` before the increment it needs is issued."""
    x = torch.zeros(N, device=dev.device)
    outs = torch.empty(ROUNDS, N, device=dev.device)
    side = dev.Stream(name="side")
    side.wait_stream(dev.current_stream())
    for i in range(ROUNDS):
        with dev.stream(side):
            outs[i].copy_(x)  # round read
        x.add_(1.0)  # round write
        dev.current_stream().wait_stream(side)
    return outs.cpu()


def _rounds_edge(offset: int) -> Edge:
    return Edge(Site("default", _line(rounds, "# round write")), Site("side", _line(rounds, "# round read")),
                forward=True, offset=offset)


def test_forward_edges_match_by_occurrence() -> None:
    want = torch.arange(1, ROUNDS + 1, dtype=torch.float32)[:, None].expand(ROUNDS, N)
    r, _ = run(rounds, (_rounds_edge(0),), (Delay("default", 2, 7),))
    assert r.reports == ()
    assert torch.equal(r.result, want)
    # one behind: the first read waits for nothing and races with the first increment
    behind, _ = run(rounds, (_rounds_edge(-1),))
    assert any(isinstance(x, Race) for x in behind.reports)
    # one ahead: the last read waits for an increment that never comes
    ahead, _ = run(rounds, (_rounds_edge(+1),))
    assert any(isinstance(x, Deadlock) for x in ahead.reports)


def test_forward_edges_parse_and_print_with_their_offset() -> None:
    for text in ("nccl@a.py:3=>side@a.py:1", "default@a.py:9[+1]=>side@a.py:2", "d2h@z.py:5[-1]=>default@z.py:2"):
        e = Edge.parse(text)
        assert e.forward
        assert str(e) == text
    assert Edge.parse("default@a.py:9[+1]=>side@a.py:2").offset == 1
    assert not Edge.parse("d2h@a.py:1->default@a.py:2").forward


def early_host_read(dev: Any) -> float:
    """The host reads a pinned buffer its worker process fills, before the worker issued the copy."""
    pinned = torch.zeros(N, pin_memory=True)

    def worker(dev: Any, buf: torch.Tensor) -> None:
        x = torch.full((N,), 3.0, device=dev.device)
        d2h = dev.Stream(name="d2h")
        d2h.wait_stream(dev.current_stream())
        with dev.stream(d2h):
            buf.copy_(x, non_blocking=True)  # worker copy
        d2h.synchronize()

    p = dev.Process(target=worker, args=(pinned,), name="worker0")
    p.start()
    total = float(pinned.sum())  # host read
    p.join()
    return total


def test_a_forward_edge_into_a_host_step_blocks_the_host_until_the_other_process_copied() -> None:
    racy, _ = run(early_host_read)
    assert any(isinstance(x, Race) for x in racy.reports)
    edge = Edge(Site("worker0.d2h", _line(early_host_read, "# worker copy")),
                Site("host", _line(early_host_read, "# host read")), forward=True)
    fixed, dev = run(early_host_read, (edge,))
    assert fixed.reports == ()
    assert fixed.result == 3.0 * N
    # the host's read blocked until the worker's copy was done: its next step comes after it
    assert _at(dev, "host", "Process.join") >= _at(dev, "worker0.d2h", "done copy_")
    assert _at(dev, "host", "waited for inserted forward edge from worker0.d2h@") >= _at(dev, "worker0.d2h",
                                                                                           "done copy_")
    _, plain_dev = run(early_host_read)
    assert _at(plain_dev, "host", "Process.join") < _at(plain_dev, "worker0.d2h", "done copy_")
