"""Explaining a counterexample: the suggested edge for each built-in bug variant, checked by re-running with it
inserted; why none is suggested where no edge can help; the Perfetto trace and the picture; the command line.

The shrunk schedules below are inputs (what ``simdevice check`` prints for each variant); what the tests assert
is computed. A suggestion's lines are checked against the code they name (the line must hold the operation).
"""

from __future__ import annotations

import json
import linecache
import os
import re
import shlex
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from reference.naming import short_path
from reference.schedule import Schedule
from simdevice.explain import check_edges, suggest
from simdevice.programs import REGISTRY, load_all
from simdevice.runtime import Edge
from simdevice.search.targets import FunctionTarget, ProgramTarget
from simdevice.timeline import perfetto, slices, write_png

ROOT = Path(__file__).resolve().parents[3]
EXPLAIN_DOC = (ROOT / "docs" / "explain.md").read_text()
HERE = short_path(__file__)
load_all()

#: variant -> its shrunk schedule, and per suggested edge: (after actor, code on its line, before actor, code, forward).
#: A backward edge (``->``) orders a race as issued; a forward edge (``=>``) makes the earlier-issued operation wait
#: for the later one: the program issues a read before the write it needs (or one process moves on before the other
#: copied), which no wait on an operation issued before can fix.
FIXES = {
    "offload_reload/racy": ("offload_reload/racy::d2h#0+1",
                            [("d2h", "copy_(", "default", "copy_(", False)]),
    "activation_offload/offload-inline-no-wait": ("activation_offload/offload-inline-no-wait",
                                                  [("d2h", "copy_(", "default", "copy_(", False)]),
    "param_readiness/param-no-drain-on-disable": (
        "param_readiness/param-no-drain-on-disable:bucket=2,eager=1,iters=1,layers=2,ranks=1",
        [("rank0.nccl", "all_gather_into_tensor", "rank0.default", "copy_(", False)]),
    # the prefetch's copy waits for the gather its pre-hook issues later: ensure_params_ready's dispatch-then-wait
    "param_readiness/param-prefetch-no-ready": (
        "param_readiness/param-prefetch-no-ready:evaluate=0,iters=1,layers=2,ranks=1",
        [("rank0.nccl", "all_gather_into_tensor", "rank0.prefetch", "copy_(", True)]),
    "param_readiness/param-ready-skips-undispatched": (
        "param_readiness/param-ready-skips-undispatched:evaluate=0,iters=1,layers=2,ranks=1",
        [("rank0.nccl", "all_gather_into_tensor", "rank0.prefetch", "copy_(", True)]),
    # the trainer's on_step_begin rescale waits for the worker's copy: the step-begin barrier (a handshake)
    "zcc/zcc-frozen-step": ("zcc/zcc-frozen-step",
                            [("worker0.d2h", "copy_(", "default", "mul_(", True)]),
    "zcc/zcc-late-barrier": ("zcc/zcc-late-barrier",
                             [("worker0.d2h", "copy_(", "default", "mul_(", True)]),
}
#: variants without a race: why no edge is suggested
NO_RACE = {
    "zcc/zcc-no-step-begin-guard": ("zcc/zcc-no-step-begin-guard:chunks=2,mutate=0", "deadlocks"),
    "activation_offload/offload-queue-empty-cursor": (
        "activation_offload/offload-queue-empty-cursor:layers=2,warmup=0", "the program's own check failed"),
    "memsaver_guard/memsaver-free-while-paused-twice": ("memsaver_guard/memsaver-free-while-paused-twice",
                                                        "the program raised RuntimeError"),
    "memsaver_guard/memsaver-connect-unguarded": ("memsaver_guard/memsaver-connect-unguarded", "unmapped"),
}


def _target(line: str) -> tuple[ProgramTarget, Schedule]:
    s = Schedule.parse(line)
    return ProgramTarget(REGISTRY[s.program], s.variant), s


def _code(source: str) -> str:
    path, _, line = source.rpartition(":")
    return linecache.getline(str(ROOT / path), int(line))


def test_every_bug_variant_is_covered() -> None:
    bugs = {f"{p.name}/{v}" for p in REGISTRY.values() for v in p.buggy}
    assert bugs == set(FIXES) | set(NO_RACE)


def _reversed(e: Edge) -> Edge:
    return Edge(e.before, e.after, e.forward, -e.offset)


@pytest.mark.parametrize("variant", sorted(FIXES))
def test_the_suggested_fix_makes_the_schedule_and_a_search_clean(variant: str) -> None:
    line, expected = FIXES[variant]
    target, schedule = _target(line)
    out = target.run(schedule)
    assert out.races
    assert target.failed(out)
    fix = suggest(target, out)
    assert fix.checked, fix.lines()
    assert fix.schedules >= 200
    assert len(fix.edges) == len(expected), fix.edges
    for edge, (after, after_code, before, before_code, forward) in zip(fix.edges, expected, strict=True):
        assert (edge.after.actor, edge.before.actor, edge.forward) == (after, before, forward)
        assert after_code in _code(edge.after.source), edge
        assert before_code in _code(edge.before.source), edge
    kinds = [e["kind"] for e in fix.as_dict()["edges"]]
    assert kinds == ["forward" if f else "backward" for *_, f in expected]
    # checked means it: with the edges inserted the schedule is clean, without them it is not
    edges = list(fix.edges)
    assert check_edges(target, schedule, edges).clean
    assert not check_edges(target, schedule, []).clean
    # the reversed edges do not pass
    assert not check_edges(target, schedule, [_reversed(e) for e in edges]).clean
    # a forward edge is needed: ordered as issued instead (backward), the values stay wrong
    if any(e.forward for e in edges):
        as_issued = [Edge(e.before, e.after) if e.forward else e for e in edges]
        assert not check_edges(target, schedule, as_issued).clean
    assert any(line.startswith("suggested fix: ") for line in fix.lines())
    assert fix.lines()[-1].startswith("checked: ")
    for e in edges:  # what --edge takes back
        assert Edge.parse(str(e)) == e
    # what docs/explain.md says of the variant (its table's row, a replay line of its schedule) is what it gets:
    # the edges it writes out and the program lines it names
    said = [x for x in EXPLAIN_DOC.splitlines() if x.startswith(f"| `{variant}` |") or f'replay "{line}"' in x]
    assert said or variant not in EXPLAIN_DOC, variant
    for text in said:
        cited = set(re.findall(r"[\w.]+@[\w/.]+\.py:\d+(?:\[[+-]\d+\])?(?:->|=>)[\w.]+@[\w/.]+\.py:\d+", text))
        assert cited <= {str(e) for e in edges}, text
        named = {f"{f}:{n}" for f, n in re.findall(r"((?:reference|simdevice)/[\w/]+\.py):(\d+)", text)}
        assert named <= {e.after.source for e in edges} | {e.before.source for e in edges}, text


def impossible_check(dev: Any) -> None:
    """A read issued before the write it needs, and a check no order of the two can pass."""
    x = torch.zeros(1024, device=dev.device)
    out = torch.empty(1024, device=dev.device)
    side = dev.Stream(name="side")
    side.wait_stream(dev.current_stream())
    with dev.stream(side):
        out.copy_(x)
    x.fill_(2.0)
    dev.current_stream().wait_stream(side)
    assert float(out.sum().cpu()) == 3.0 * 1024, "the check no order passes"


def test_when_forward_edges_do_not_fix_it_either_the_answer_says_not_enough_and_why() -> None:
    target = FunctionTarget(f"{HERE}::impossible_check", impossible_check, "contract")
    out = target.run(target.schedule())
    assert out.races
    fix = suggest(target, out, schedules=20)
    assert not fix.checked
    assert fix.remains is not None
    assert "issues an operation before one it depends on" in fix.remains
    assert "forward edges for its racing pairs leave it" in fix.remains
    assert fix.lines()[-1].startswith("not enough: ")


@pytest.mark.parametrize("variant", sorted(NO_RACE))
def test_a_failure_without_a_race_says_why_no_edge_is_suggested(variant: str) -> None:
    line, why = NO_RACE[variant]
    target, schedule = _target(line)
    out = target.run(schedule)
    assert not out.races
    assert target.failed(out)
    fix = suggest(target, out)
    assert fix.edges == ()
    assert fix.why_none is not None
    assert why in fix.why_none
    assert fix.as_dict()["kind"] == "none"


def _graphs() -> None:
    torch.cuda.ExternalStream(1234)  # not run by the simulator


def test_a_failure_at_what_the_simulator_does_not_run_says_so() -> None:
    """A program that stops at something the simulator does not run (a CUDA stream made outside torch) is not told
    its logic failed."""
    from simdevice.search.targets import from_function

    target = from_function(_graphs, "tests/property/tool/test_explain.py::_graphs")
    out = target.run(target.schedule())
    assert target.failed(out)
    fix = suggest(target, out)
    assert fix.why_none is not None
    assert fix.why_none.startswith("the run stopped at what the simulator does not run (NotImplementedError in host")
    assert 'see "Not intercepted" in docs/dropin.md' in fix.why_none


def _reduce_on_a_side_stream() -> None:
    import torch.distributed as dist

    g = torch.ones(64, device="cuda")
    g.mul_(2.0)  # the gradient, on the default stream
    comm = torch.cuda.Stream()
    with torch.cuda.stream(comm):  # no comm.wait_stream(default): the all-reduce may read g before mul_
        dist.all_reduce(g)
    torch.cuda.current_stream().wait_stream(comm)
    assert g.cpu().tolist() == [2.0] * 64


def test_a_wait_before_a_collective_is_advised_on_the_stream_it_is_called_on() -> None:
    """The program cannot make NCCL's own stream wait: the advice names the stream the collective is called on,
    which NCCL's stream waits for when the collective is issued; the edge itself is checked."""
    from simdevice.search.targets import from_function

    target = from_function(_reduce_on_a_side_stream, "tests/property/tool/test_explain.py::_reduce_on_a_side_stream")
    out = target.run(Schedule.parse(f"{target.name}::default#0+1"))
    assert out.races
    fix = suggest(target, out)
    assert fix.checked
    (advice,) = fix.advice
    assert "make the stream the collective is called on wait on it" in advice
    assert "before the call that issues `all_reduce (send)` on `nccl`" in advice
    assert "make `nccl` wait" not in advice


def _ring_checked_on_the_host(n: int = 256) -> None:
    side = torch.cuda.Stream()
    stage = torch.empty(n, pin_memory=True)
    acc = torch.zeros(n, device="cuda")
    for i in range(3):
        stage.fill_(float(i + 1))  # no wait for the copy that read the stage before
        with torch.cuda.stream(side):
            d = torch.empty(n, device="cuda")
            d.copy_(stage, non_blocking=True)
            acc.add_(d)
    torch.cuda.current_stream().wait_stream(side)
    assert acc.cpu().tolist() == [6.0] * n  # a value check: a placeholder in a race-only run


def test_a_race_only_fix_is_judged_by_races_and_stale_reads_not_by_the_program_s_value_checks() -> None:
    """In a race-only run (``--no-values``) the program's checks of values it reads back see placeholders: its host
    error is no evidence that a fix is not enough. The edge that orders the race is checked by races and stale reads,
    and the line says no value was checked (it said "not enough", and that forward edges deadlock)."""
    from simdevice.search.targets import from_function

    target = from_function(_ring_checked_on_the_host, "tests/property/tool/test_explain.py::_ring_checked_on_the_host",
                           values=False)
    out = target.run(Schedule.parse(f"{target.name}::side#0+5"))
    assert out.races
    fix = suggest(target, out)
    assert fix.checked
    assert fix.lines()[-1].endswith("are clean (no race, no stale read; race-only, so no value was checked)")
    valued = from_function(_ring_checked_on_the_host, "tests/property/tool/test_explain.py::_ring_checked_on_the_host")
    again = suggest(valued, valued.run(Schedule.parse(f"{target.name}::side#0+5")))
    assert again.checked
    assert again.lines()[-1].endswith("are clean (no race, no wrong values)")


def _acked_saver(buf: torch.Tensor, mirror: torch.Tensor, req: Any, ack: Any) -> None:
    s = torch.cuda.Stream()
    while True:
        step = req.get()
        with torch.cuda.stream(s):
            mirror.copy_(buf, non_blocking=True)
        s.synchronize()
        ack.put(step)


def _last_save_not_awaited(n: int = 256) -> None:
    """A daemon saver thread snapshots ``buf`` into a pinned mirror per request; the trainer waits for every ack but
    the last, then reads the mirror: the read races with the last copy, issued after it in the failing schedule. (A
    thread, not a process: a pinned mirror sent to another process is moved into shared memory, pageable, where a
    non-blocking copy is done as it returns.)"""
    import queue
    import threading

    buf = torch.zeros(n, device="cuda")
    mirror = torch.zeros(n, pin_memory=True)
    req: queue.Queue[int] = queue.Queue()
    ack: queue.Queue[int] = queue.Queue()
    t = threading.Thread(target=_acked_saver, args=(buf, mirror, req, ack), daemon=True, name="saver")
    t.start()
    for step in range(1, 4):
        buf.fill_(float(step))
        torch.cuda.synchronize()
        req.put(step)
        if step < 3:
            assert ack.get() == step
    assert mirror[0].item() == 3.0, mirror[0].item()  # (the message reads it again, after the last copy is issued)


def test_a_race_that_begins_at_a_host_step_is_fixed_by_a_handshake() -> None:
    """The host's read is issued before the copy it must wait for, so no event recorded after the copy orders it (a
    backward edge); a forward edge does: the host's read waits for the copy issued after it. It was tried only where
    no race was left, and the answer said "not enough"."""
    from simdevice.search.targets import from_function

    target = from_function(_last_save_not_awaited, "tests/property/tool/test_explain.py::_last_save_not_awaited")
    out = target.run(target.schedule())
    assert any("host" in (r.current.actor, r.previous.actor) for r in out.races), out.run.reports
    fix = suggest(target, out)
    assert fix.checked, fix.lines()
    assert any(e.forward and e.after.actor == "s" and e.before.actor == "host" for e in fix.edges), fix.edges


def _snapshotter(buf: torch.Tensor, tasks: Any, done: Any) -> None:
    side = torch.cuda.Stream()
    mirror = torch.empty(buf.numel(), pin_memory=True)
    while (step := tasks.get()) is not None:
        with torch.cuda.stream(side):
            mirror.copy_(buf, non_blocking=True)
        side.synchronize()
        done.put((step, mirror.clone()))


def _trainer_waits_for_one_of_three(n: int = 64) -> None:
    """Three snapshot workers copy the trainer's buffer at each step; the trainer waits for one of them before it
    writes the buffer again: each other worker's copy races with the next write."""
    import torch.multiprocessing as mp

    buf = torch.zeros(n, device="cuda")
    tasks, done = [mp.Queue() for _ in range(3)], mp.Queue()
    workers = [mp.Process(target=_snapshotter, args=(buf, q, done)) for q in tasks]
    for p in workers:
        p.start()
    for step in (1, 2):
        buf.fill_(float(step))
        torch.cuda.synchronize()
        for q in tasks:
            q.put(step)
        s, snap = done.get()  # one worker's snapshot only
        assert torch.equal(snap, torch.full((n,), float(s)))
    for _ in range(4):
        s, snap = done.get()
        assert torch.equal(snap, torch.full((n,), float(s))), f"step {s}'s snapshot is torn"
    for q in tasks:
        q.put(None)
    for p in workers:
        p.join()


def test_each_worker_of_several_gets_its_own_handshake() -> None:
    """A worker's race is found in turn, ordered as issued first (a backward edge, which does not fix it) and then
    by a forward edge: forward edges were tried once, for the first worker, so the answer said "not enough", and
    the search gave up after four rounds where three workers need more. The fix is a handshake per worker."""
    from simdevice.search.targets import from_function

    target = from_function(_trainer_waits_for_one_of_three,
                           "tests/property/tool/test_explain.py::_trainer_waits_for_one_of_three")
    out = target.run(Schedule.parse("tests/property/tool/test_explain.py::_trainer_waits_for_one_of_three"
                                    "::Process-1#0+1"))
    assert out.races
    fix = suggest(target, out)
    assert fix.checked, fix.lines()
    assert sorted((e.after.actor, e.before.actor, e.offset) for e in fix.edges if e.forward) == [
        (f"Process-{k}.side", "default", -1) for k in (1, 2, 3)], [str(e) for e in fix.edges]


def _offloaded_step() -> None:
    """ZeRO-offload's step: gradients D2H on a side stream, an optimizer step on the host's pinned copies, the
    parameters H2D on another stream; the host does not wait for the D2H (``grads_ready.synchronize()`` is missing)."""
    model = torch.nn.Linear(16, 16).cuda()
    params = list(model.parameters())
    cpu_params = [p.detach().cpu().pin_memory() for p in params]
    cpu_grads = [torch.empty_like(c).pin_memory() for c in cpu_params]
    opt = torch.optim.SGD(cpu_params, lr=0.1)
    d2h, h2d = torch.cuda.Stream(), torch.cuda.Stream()
    for it in range(2):
        x = torch.full((4, 16), float(it + 1), device="cuda")
        model(x).square().sum().backward()
        d2h.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(d2h):
            for g, p in zip(cpu_grads, params, strict=True):
                g.copy_(p.grad, non_blocking=True)
        for c, g in zip(cpu_params, cpu_grads, strict=True):
            c.grad = g
        opt.step()
        for p in params:
            p.grad = None
        with torch.cuda.stream(h2d):
            for p, c in zip(params, cpu_params, strict=True):
                p.data.copy_(c, non_blocking=True)
        torch.cuda.current_stream().wait_stream(h2d)
    torch.cuda.synchronize()


def test_the_fix_names_the_missing_synchronization_not_every_pair_it_orders() -> None:
    """Three racing pairs, one missing wait: the fix leaves out each edge the failing schedule stays clean without
    (it gave an edge per pair), and the search still checks what is left."""
    from simdevice.search.explore import explore
    from simdevice.search.targets import from_function

    found = explore(_offloaded_step, max_examples=30)
    assert found.failure is not None
    out = found.failure
    assert len({(r.current.source, r.previous.source) for r in out.races}) >= 2, out.run.reports
    target = from_function(_offloaded_step, "tests/property/tool/test_explain.py::_offloaded_step")
    fix = suggest(target, out)
    assert fix.checked, fix.lines()
    assert len(fix.edges) == 1, fix.edges
    (edge,) = fix.edges
    assert (edge.after.actor, edge.before.actor, edge.forward) == ("d2h", "host", False), edge


def _two_reads_of_one_write(loop: int = 1) -> None:
    side = torch.cuda.Stream()
    b = torch.empty(64, device="cuda")
    for k in range(loop):
        with torch.cuda.stream(side):
            b.fill_(float(k + 2))  # no wait for it below
        x = b * 2.0
        y = b + 1.0
        assert x.cpu().tolist() == [2.0 * (k + 2)] * 64
        assert y.cpu().tolist() == [k + 3.0] * 64


@pytest.mark.parametrize("loop", [1, 3])
def test_an_edge_implied_by_an_earlier_one_on_the_same_stream_is_left_out(loop: int) -> None:
    """Two reads on one stream of a side stream's write race it; the wait before the first orders the second too,
    so the fix is that one edge (checked: were it not enough, the run with it would race again and get the other)."""
    from simdevice.search.targets import from_function

    name = "tests/property/tool/test_explain.py::_two_reads_of_one_write"
    target = from_function(_two_reads_of_one_write, name)
    out = target.run(Schedule.parse(f"{name}:loop={loop}:side#0+1"))
    assert len({(r.current.source, r.previous.source) for r in out.races}) == 2
    fix = suggest(target, out)
    assert fix.checked
    (edge,) = fix.edges
    first_read = next(i for i, text in enumerate(Path(__file__).read_text().splitlines(), 1) if "x = b * 2.0" in text)
    assert str(edge).endswith(f"->default@{short_path(__file__)}:{first_read}")


def _freed_while_read(reader_is_side: bool = True) -> None:
    side = torch.cuda.Stream()
    third = torch.cuda.Stream()
    x = torch.full((1024,), 1.0, device="cuda")
    out = torch.empty(1024, device="cuda")
    if reader_is_side:
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            out.copy_(x)  # side reads x's block ...
    del x  # ... which is free on the default stream at once
    y = torch.empty(1024, device="cuda")  # takes x's block
    with torch.cuda.stream(third):
        y.fill_(7.0)  # no wait for the default stream, nor for side
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.current_stream().wait_stream(third)


@pytest.mark.parametrize("reader_is_side", [True, False])
def test_record_stream_is_advised_only_for_another_stream_than_the_blocks_own(reader_is_side: bool) -> None:
    """Where a free handed a block on while another stream still used it, ``record_stream`` on that stream is an
    alternative; on the block's own stream it does nothing (its order holds the block already), so it is not
    advised there."""
    from simdevice.search.targets import from_function

    name = "tests/property/tool/test_explain.py::_freed_while_read"
    target = from_function(_freed_while_read, name)
    out = target.run(Schedule.parse(f"{name}:reader_is_side={int(reader_is_side)}"))
    freed = [r for r in out.races if r.freed is not None]
    assert freed
    fix = suggest(target, out)
    advised = [a for a in fix.advice if "record_stream" in a]
    if reader_is_side:
        assert any("`record_stream` on that stream (`side`)" in a for a in advised), fix.advice
    assert not any("(`default`)" in a for a in advised), fix.advice
    # third's fill races on a block another storage had: it touched what others touched, whatever the storages
    assert not any(n.startswith("stream third") for n in out.run.notes), out.run.notes


def test_a_fix_each_process_needs_on_the_same_lines_is_said_once() -> None:
    """An edge per rank between the same lines (each rank runs the program) is one fix, said once with the ranks it
    is for; an edge on other lines, or the main process's, or across processes, is said as it is."""
    from simdevice.explain import Fix
    from simdevice.runtime import Site

    def within(p: str, a: str = "p.py:9", b: str = "p.py:10") -> tuple[Edge, str]:
        return (Edge(Site(f"{p}.nccl", a), Site(f"{p}.default", b)),
                f"wait for the collective's work after `all_gather` on `{p}.nccl` ({a}) before `sum` on "
                f"`{p}.default` ({b})")

    across = (Edge(Site("rank0.d2h", "p.py:20"), Site("rank1.default", "p.py:21")),
              "record an event on `rank0.d2h` after `copy_` on `rank0.d2h` (p.py:20) and make `rank1.default` wait "
              "on it before `add_` on `rank1.default` (p.py:21) (across processes: ...)")
    main = (Edge(Site("side", "p.py:30"), Site("default", "p.py:31")),
            "record an event on `side` after `mul_` on `side` (p.py:30) and make `default` wait on it before `add_` "
            "on `default` (p.py:31)")
    pairs = [within("rank0"), within("rank1"), within("rank2"), within("rank0", "p.py:12"), across, main]
    fix = Fix(tuple(e for e, _ in pairs), tuple(a for _, a in pairs), True, 10)
    lines = fix.lines()
    assert lines == [
        "suggested fix (in each of rank0, rank1, rank2): wait for the collective's work after `all_gather` on "
        "`nccl` (p.py:9) before `sum` on `default` (p.py:10)",
        f"suggested fix: {pairs[3][1]}", f"suggested fix: {across[1]}", f"suggested fix: {main[1]}",
        "checked: with these inserted, the failing schedule and 10 searched schedules are clean (no race, no wrong "
        "values)"]
    assert fix.as_dict()["advice"] == [a for _, a in pairs]  # each edge's own, as before


def test_edges_parse_and_print_as_the_command_line_takes_them() -> None:
    for text in ("d2h@my_offload.py:11->default@my_offload.py:19", "nccl@my_gather.py:30=>side@my_gather.py:22",
                 "d2h@zcc.py:205[-1]=>default@zcc.py:151"):
        assert str(Edge.parse(text)) == text
    for bad in ("d2h->default", "d2h@a.py:1=>", "@a.py:1->b@a.py:2"):
        with pytest.raises(ValueError, match="expected ACTOR@FILE:LINE->ACTOR@FILE:LINE"):
            Edge.parse(bad)


# -- the timeline ---------------------------------------------------------------------------------


def _racy() -> tuple[ProgramTarget, object]:
    target, schedule = _target(FIXES["offload_reload/racy"][0])
    return target, target.run(schedule)


def test_the_perfetto_trace_has_a_track_per_actor_a_slice_per_operation_and_the_race() -> None:
    target, out = _racy()
    fix = suggest(target, out, schedules=20)  # type: ignore[arg-type]
    doc = perfetto(out, fix)
    events = doc["traceEvents"]
    threads = {e["args"]["name"].split(" ")[0]: e["tid"] for e in events if e["name"] == "thread_name"}
    assert set(out.run.op_counts) <= set(threads)  # type: ignore[attr-defined]
    for actor, n in out.run.op_counts.items():  # type: ignore[attr-defined]
        if actor == "host":
            continue
        ops = [e for e in events if e["ph"] == "X" and e.get("cat") in ("op", "pending") and e["tid"] == threads[actor]]
        assert len(ops) == n, actor
    races = [e for e in events if e["ph"] == "i" and e["name"] == "race"]
    assert len(races) == 2 * len(out.races)  # type: ignore[attr-defined]
    assert all("race:" in e["args"]["report"] for e in races)
    starts = {e["id"] for e in events if e["ph"] == "s"}
    assert starts == {e["id"] for e in events if e["ph"] == "f"}
    assert any(e["name"] == "suggested edge" for e in events if e["ph"] == "s")
    assert any(e["name"] == "stall" for e in events if e["ph"] == "X")
    assert all(e["ts"] >= 0 for e in events if "ts" in e)
    json.dumps(doc)


def _bound(doc: dict[str, Any]) -> dict[tuple[str, int], tuple[dict[str, Any], dict[str, Any]]]:
    """The trace's structure, checked as Perfetto reads it, and each flow's two slices: per track, the complete
    events nest or are disjoint (Perfetto requires it of a thread's slices); a flow event (``s``, or ``f`` with
    ``bp: e``) binds to the slice on top of its track's stack when it is read, the one begun last before it (a
    slice closes only when a later one begins; a thread's instant is a slice of no length), so it must come strictly
    inside that slice with nothing begun on the track since, nothing beginning at its very time (the order of equal
    times is the reader's), and that slice must be a complete event, not an instant."""
    def ns(us: float) -> int:
        return round(us * 1000)

    tracks: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for e in doc["traceEvents"]:
        if e["ph"] == "X" or (e["ph"] == "i" and e.get("s") == "t"):
            tracks.setdefault((e["pid"], e["tid"]), []).append(e)
    for key, evs in tracks.items():
        evs.sort(key=lambda e: (ns(e["ts"]), -ns(e.get("dur", 0))))
        stack: list[tuple[int, dict[str, Any]]] = []
        for e in evs:
            if e["ph"] != "X":
                continue
            start, end = ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])
            while stack and stack[-1][0] <= start:
                stack.pop()
            assert not stack or end <= stack[-1][0], (key, e, stack[-1][1])  # inside the enclosing one, or after it
            stack.append((end, e))
    flows: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
    for e in doc["traceEvents"]:
        if e["ph"] not in ("s", "f"):
            continue
        if e["ph"] == "f":
            assert e.get("bp") == "e", e
        t = ns(e["ts"])
        evs = tracks.get((e["pid"], e["tid"]), [])
        assert all(ns(x["ts"]) != t for x in evs), (e, [x for x in evs if ns(x["ts"]) == t])
        before = [x for x in evs if ns(x["ts"]) < t]
        assert before, e
        top = before[-1]
        assert top["ph"] == "X", (e, top)
        assert t < ns(top["ts"]) + ns(top["dur"]), (e, top)
        flows.setdefault((e["cat"], e["id"]), {})[e["ph"]] = top
    assert all(set(ends) == {"s", "f"} for ends in flows.values())
    return {k: (ends["s"], ends["f"]) for k, ends in flows.items()}


def test_perfetto_slices_nest_and_each_flow_binds_to_its_own_slice() -> None:
    """The default stream stalled: each wait on it passes and the add after it starts at the same time. Each wait's
    arrow runs from the copy its event was recorded after into the wait's sliver, and the race arrows join the
    racing copy and add, not a wait's sliver."""
    target, out = _stalled_ping_pong()
    fix = suggest(target, out, schedules=10)
    bound = _bound(perfetto(out, fix))
    waits = [(s["name"], f["name"]) for (cat, _), (s, f) in bound.items() if cat == "wait"]
    assert all(f.startswith("wait: event recorded on stream copy") for _, f in waits), waits
    assert sorted({s for s, _ in waits}) == [f"copy_ (H2D) #{k}" for k in range(4)]
    races = sorted(tuple(sorted((s["name"], f["name"]))) for (cat, _), (s, f) in bound.items() if cat == "race")
    assert races == [("add_ #1", "copy_ (H2D) #2"), ("add_ #2", "copy_ (H2D) #3")]
    edges = [(s["name"], f["name"]) for (cat, _), (s, f) in bound.items() if cat == "suggested edge"]
    assert edges
    assert all({s.split(" #")[0], f.split(" #")[0]} == {"add_", "copy_ (H2D)"} for s, f in edges), edges


def test_every_perfetto_flow_starts_no_later_than_it_ends() -> None:
    """Perfetto and chrome://tracing read the events in time order: a flow's ``f`` before its ``s`` finds no start
    and the arrow is dropped. The suggested edge runs from the D2H (stalled, so it ran last) to the H2D that ran
    before it: its arrow must still be there, between those two operations."""
    target, out = _racy()
    fix = suggest(target, out, schedules=20)  # type: ignore[arg-type]
    events = perfetto(out, fix)["traceEvents"]
    ends = {(e["cat"], e["id"]): e for e in events if e["ph"] == "f"}
    starts = {(e["cat"], e["id"]): e for e in events if e["ph"] == "s"}
    assert starts.keys() == ends.keys()
    for key, s in starts.items():
        assert s["ts"] <= ends[key]["ts"], (key, s, ends[key])
    threads = {e["args"]["name"].split(" ")[0]: e["tid"] for e in events if e["name"] == "thread_name"}
    edge = [(s, ends[k]) for k, s in starts.items() if k[0] == "suggested edge"]
    assert edge
    for s, f in edge:
        assert {s["tid"], f["tid"]} == {threads["d2h"], threads["default"]}
        assert "d2h@" in s["args"]["edge"]


def test_the_perfetto_trace_loads_in_the_trace_processor(tmp_path: Path) -> None:
    tp_module = pytest.importorskip("perfetto.trace_processor", reason="the perfetto package is not installed")
    _, out = _racy()
    path = tmp_path / "run.json"
    path.write_text(json.dumps(perfetto(out)))
    # the package downloads its trace_processor_shell binary on first use (no timeout, into ~/.local/share): the
    # test never does; it runs where one is installed (on PATH, or named by PERFETTO_TRACE_PROCESSOR)
    binary = os.environ.get("PERFETTO_TRACE_PROCESSOR") or shutil.which("trace_processor_shell")
    if not binary:
        pytest.skip("no trace_processor_shell here (put it on PATH or name it in PERFETTO_TRACE_PROCESSOR)")
    tp = tp_module.TraceProcessor(trace=str(path), config=tp_module.TraceProcessorConfig(bin_path=binary))
    try:
        tracks = {r.name for r in tp.query("select name from thread")}
        assert {"d2h (stream)", "default (stream)", "host (host)"} <= tracks
        racing = list(tp.query("select s.name from slice s join instant i on 1 = 1 limit 1"))
        assert racing is not None
        names = {r.name for r in tp.query("select name from slice")}
        assert any(n.startswith("copy_ (D2H)") for n in names)
        assert "race" in names
    finally:
        tp.close()


def _read_back_unsynchronized() -> None:
    x = torch.arange(256, dtype=torch.float32, device="cuda")
    pinned = torch.empty(256, pin_memory=True)
    pinned.copy_(x, non_blocking=True)
    assert pinned.sum().item() == 255 * 128  # no synchronize before the host reads what the copy writes


def test_a_race_with_a_host_step_is_drawn_at_that_step(tmp_path: Path) -> None:
    """A host read of pinned memory a D2H still writes: both racing accesses are marked (an instant on the host's
    track too, the flow between the two), and the suggested synchronize is an arrow into the host step."""
    from simdevice.search.targets import from_function

    name = "tests/property/tool/test_explain.py::_read_back_unsynchronized"
    target = from_function(_read_back_unsynchronized, name)
    out = target.run(Schedule.parse(name))
    (race,) = out.races
    assert {race.current.on, race.previous.on} == {"host", "stream"}
    fix = suggest(target, out, schedules=10)
    assert fix.checked, fix.lines()
    (edge,) = fix.edges
    assert edge.before.actor == "host", edge
    events = perfetto(out, fix)["traceEvents"]
    threads = {e["args"]["name"].split(" ")[0]: e["tid"] for e in events if e["name"] == "thread_name"}
    instants = [e for e in events if e["ph"] == "i" and e["name"] == "race"]
    assert sorted(e["tid"] for e in instants) == sorted([threads["host"], threads["default"]])
    for name_ in ("race", "suggested edge"):
        ends = [e for e in events if e.get("name") == name_ and e["ph"] in ("s", "f")]
        assert {e["tid"] for e in ends} == {threads["host"], threads["default"]}, name_
    # the host's end is the step that read: at its time (just inside it, where no flow binds to the instant), on
    # its line
    (step,) = [e for e in instants if e["tid"] == threads["host"]]
    host_steps = [e for e in events if e["ph"] == "X" and e["tid"] == threads["host"]
                  and e["ts"] < step["ts"] < e["ts"] + e["dur"]]
    assert [e["name"] for e in host_steps] == [race.current.op if race.current.on == "host" else race.previous.op]
    path = write_png(out, tmp_path / "run.png", fix)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_pause_racing_with_a_kernel_is_drawn_at_the_pause(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A memory-saver pause while a kernel on its region may still run: the pause is a host step (an unmap, recorded
    where it happened as any host access is), so the race's instant and flow in the Perfetto trace sit in the
    pause's slice, the suggested synchronize is an arrow into it, and the picture outlines it, joined to the race
    arrow and the fix's arc."""
    pytest.importorskip("matplotlib", reason="matplotlib is not installed")
    import matplotlib.pyplot as plt

    from simdevice.search.targets import resolve
    from simdevice.timeline import UNIT_NS, figure

    monkeypatch.chdir(ROOT)  # (the schedule line names the program relative to the repository)
    name = "tests/property/dropin/test_a_pause_waits_for_the_streams.py::sleep_while_a_step_runs"
    target = resolve(name)
    out = target.run(Schedule.parse(name))
    (race,) = out.races
    host, device = (race.current, race.previous) if race.current.on == "host" else (race.previous, race.current)
    assert (host.on, device.on) == ("host", "stream")
    assert host.op.startswith("memory_saver.pause('train')"), host.op
    fix = suggest(target, out, schedules=10)
    assert fix.checked, fix.lines()
    (edge,) = fix.edges
    assert edge.before.actor == "host", edge
    # the pause's slice: a host step
    (pause,) = [s for s in slices(out) if s.kind == "host" and s.name.startswith("memory_saver.pause")]
    events = perfetto(out, fix)["traceEvents"]
    threads = {e["args"]["name"].split(" ")[0]: e["tid"] for e in events if e["name"] == "thread_name"}
    instants = [e for e in events if e["ph"] == "i" and e["name"] == "race"]
    assert sorted(e["tid"] for e in instants) == sorted([threads["host"], threads[device.actor]])
    for name_ in ("race", "suggested edge"):
        ends = [e for e in events if e.get("name") == name_ and e["ph"] in ("s", "f")]
        assert {e["tid"] for e in ends} == {threads["host"], threads[device.actor]}, name_
        (at_host,) = [e for e in ends if e["tid"] == threads["host"]]
        steps = [e["name"] for e in events if e["ph"] == "X" and e["tid"] == threads["host"]
                 and e["ts"] <= at_host["ts"] <= e["ts"] + e["dur"]]
        assert steps == [pause.name], (name_, steps)
    (step,) = [e for e in instants if e["tid"] == threads["host"]]
    assert [e["name"] for e in events if e["ph"] == "X" and e["tid"] == threads["host"]
            and e["ts"] < step["ts"] < e["ts"] + e["dur"]] == [pause.name]
    # the picture: the pause outlined in red, the race arrow and the fix's arc ending at it
    fig = figure(out, fix)
    try:
        (ax,) = fig.axes
        lanes = {t.get_text(): i for i, t in enumerate(ax.get_yticklabels())}
        x = pause.start / UNIT_NS
        outlined = [c for c in ax.collections if hasattr(c, "get_paths") and len(c.get_edgecolor())
                    and tuple(c.get_edgecolor()[0][:3]) == (1.0, 0.0, 0.0)
                    and any(abs(p.get_extents().y0 - (lanes["host"] - 0.2)) < 1e-6
                            and p.get_extents().x0 == pytest.approx(x) for p in c.get_paths())]
        assert outlined, "the pause is not outlined"
        arrows = [(a.xy, a.xyann, a.arrow_patch.get_edgecolor()[:3]) for a in ax.texts
                  if getattr(a, "arrow_patch", None) is not None]
        red = [(xy, xyann) for xy, xyann, c in arrows if c == pytest.approx((1.0, 0.0, 0.0))]
        green = [(xy, xyann) for xy, xyann, c in arrows if c == pytest.approx((0x2c / 255, 0xa0 / 255, 0x2c / 255))]
        assert any((x, lanes["host"]) in (tuple(a), tuple(b)) for a, b in red), red
        assert any(tuple(to) == (x, lanes["host"]) for to, _ in green), green  # xy: the arrow's head
    finally:
        plt.close(fig)
    assert write_png(out, tmp_path / "run.png", fix).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _ping_pong(n: int = 256, iters: int = 4) -> None:
    copy = torch.cuda.Stream()
    bufs = [torch.empty(n, device="cuda"), torch.empty(n, device="cuda")]
    filled = [torch.cuda.Event(), torch.cuda.Event()]
    host = [torch.full((n,), float(i), pin_memory=True) for i in range(iters)]
    out = torch.zeros(n, device="cuda")
    for i in range(iters):
        b = i % 2
        with torch.cuda.stream(copy):
            if i >= 2:
                copy.wait_event(filled[b])  # one iteration short: the add that read bufs[b] last is not waited for
            bufs[b].copy_(host[i], non_blocking=True)
            filled[b].record()
        torch.cuda.current_stream().wait_event(filled[b])
        out.add_(bufs[b])
    assert torch.equal(out.cpu(), torch.full((n,), float(sum(range(iters)))))


def _stalled_ping_pong() -> tuple[FunctionTarget, Any]:
    """The default stream stalled before its first operation: every wait on it passes long after the copy it waits
    for finished, when the copy stream has run all its copies."""
    from simdevice.search.targets import from_function

    name = "tests/property/tool/test_explain.py::_ping_pong"
    target = from_function(_ping_pong, name)
    return target, target.run(Schedule.parse(f"{name}::default#0+1"))


def test_a_wait_s_arrow_starts_at_the_operation_its_event_was_recorded_after() -> None:
    """The event is recorded after an item of its stream (the trace names its place in the stream's queue): the
    arrow starts there, not at whatever that stream ran last before the wait passed."""
    _, out = _stalled_ping_pong()
    events = perfetto(out)["traceEvents"]
    threads = {e["args"]["name"].split(" ")[0]: e["tid"] for e in events if e["name"] == "thread_name"}
    starts = {e["id"]: e for e in events if e["ph"] == "s" and e["name"] == "wait"}
    ends = {e["id"]: e for e in events if e["ph"] == "f" and e["name"] == "wait"}
    assert starts.keys() == ends.keys()

    def ns(us: float) -> int:
        return round(us * 1000)

    def at(e: dict[str, Any], cat: str) -> str:
        """The slice of ``cat`` on the flow end's track whose time holds it."""
        (x,) = [o["name"] for o in events if o["ph"] == "X" and o["cat"] == cat and o["tid"] == e["tid"]
                and ns(o["ts"]) <= ns(e["ts"]) <= ns(o["ts"] + o["dur"])]
        return x

    waits = sorted((ends[k]["ts"], at(starts[k], "op"), at(ends[k], "wait")) for k in starts
                   if ends[k]["tid"] == threads["default"])
    assert all(wait.startswith("wait: event recorded on stream copy") for _, _, wait in waits)
    assert [src for _, src, _ in waits] == [f"copy_ (H2D) #{k}" for k in range(4)]


def test_slices_pair_every_start_with_its_end_and_keep_unrun_operations() -> None:
    _, out = _racy()
    ss = slices(out)
    assert all(s.end >= s.start for s in ss)
    ops = [s for s in ss if s.kind in ("op", "pending")]
    assert len(ops) == sum(n for a, n in out.run.op_counts.items() if a != "host")  # type: ignore[attr-defined]
    assert all(s.source for s in ops)


def _h2d_overwrite(n: int = 1024) -> None:
    pinned = torch.full((n,), 1.0, pin_memory=True)
    dev = torch.empty(n, device="cuda")
    dev.copy_(pinned, non_blocking=True)
    pinned.fill_(2.0)  # the copy may still read it: no synchronize before
    torch.cuda.synchronize()
    assert torch.equal(dev.cpu(), torch.full((n,), 1.0))


def _arcs_stay_in_the_axes(out: Any, fix: Any) -> list[Any]:
    """The suggested edges' arrows of the picture, each checked to lie inside the axes."""
    import matplotlib.pyplot as plt

    from simdevice.timeline import figure

    fig = figure(out, fix)
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
        (ax,) = fig.axes
        box = ax.get_window_extent(renderer)
        arcs = [a for a in ax.texts if getattr(a, "arrow_patch", None) is not None
                and a.arrow_patch.get_edgecolor()[:3] == pytest.approx((0x2c / 255, 0xa0 / 255, 0x2c / 255))]
        assert arcs
        title = ax.title.get_window_extent(renderer)
        for a in arcs:
            drawn = a.arrow_patch.get_window_extent(renderer)
            assert box.x0 - 1 <= drawn.x0, (drawn, box)
            assert drawn.x1 <= box.x1 + 1, (drawn, box)
            assert box.y0 - 1 <= drawn.y0, (drawn, box)
            assert drawn.y1 <= box.y1 + 1, (drawn, box)
            assert drawn.y1 < title.y0
            # still an arc, not the straight line the race's arrow may lie on
            assert a.arrow_patch.get_connectionstyle().rad != 0
        return arcs
    finally:
        plt.close(fig)


def test_the_suggested_edge_s_arc_bends_inside_the_axes() -> None:
    """A host step waits for a copy that ran long after it (the stream stalled): the arc goes from the lower lane
    far up-left; bent the same way whatever its direction, it left the axes and crossed the title."""
    pytest.importorskip("matplotlib", reason="matplotlib is not installed")
    from simdevice.search.targets import from_function

    name = "tests/property/tool/test_explain.py::_h2d_overwrite"
    target = from_function(_h2d_overwrite, name)
    out = target.run(Schedule.parse(f"{name}::default#0+1"))
    fix = suggest(target, out, schedules=10)
    assert [e.before.actor for e in fix.edges] == ["host"]
    _arcs_stay_in_the_axes(out, fix)
    target, out = _stalled_ping_pong()
    _arcs_stay_in_the_axes(out, suggest(target, out, schedules=10))
    _, out = _racy()
    _arcs_stay_in_the_axes(out, suggest(_racy()[0], out, schedules=10))  # type: ignore[arg-type]


SHRUNK = [line for line, _ in FIXES.values()] + [line for line, _ in NO_RACE.values()]


@pytest.mark.parametrize("line", SHRUNK)
def test_a_picture_and_a_well_formed_trace_are_written_for_every_variants_shrunk_schedule(
        line: str, tmp_path: Path) -> None:
    target, schedule = _target(line)
    out = target.run(schedule)
    fix = suggest(target, out, schedules=10)
    kinds = {"race": {"op", "pending", "host"}, "wait": {"op", "wait"}, "suggested edge": {"op", "pending", "host"}}
    for (cat, _), (s, f) in _bound(perfetto(out, fix)).items():
        assert s["cat"] in kinds[cat], (cat, s)
        assert f["cat"] in ({"wait"} if cat == "wait" else kinds[cat]), (cat, f)
    pytest.importorskip("matplotlib", reason="matplotlib is not installed")
    path = write_png(out, tmp_path / "run.png", fix)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- the command line --------------------------------------------------------------------------------




def test_replay_suggests_the_fix_checks_it_and_replays_with_it(tmp_path: Path, run_cli: Any) -> None:
    line = FIXES["offload_reload/racy"][0]
    p = run_cli(["replay", line, "--perfetto", str(tmp_path / "t.json"), "--png", str(tmp_path / "t.png")], ROOT)
    assert p.returncode == 1
    assert "  suggested fix: record an event on `d2h` after `copy_ (D2H)`" in p.stdout
    assert "  checked: with it inserted, the failing schedule and 200 searched schedules are clean" in p.stdout
    replay = next(x for x in p.stdout.splitlines() if x.startswith("  replay with it: "))
    edge = replay.split('--edge "')[1].rstrip('"')
    fixed = run_cli(["replay", line, "--edge", edge], ROOT)
    assert fixed.returncode == 0
    assert "on sim: clean" in fixed.stdout
    # the run was made with the edge: the line that replays it says so
    assert f'replay with them: simdevice replay "{line}" --edge "{edge}")' in fixed.stdout
    assert json.loads((tmp_path / "t.json").read_text())["metadata"]["schedule"] == line
    assert (tmp_path / "t.png").stat().st_size > 1000


@pytest.mark.parametrize("option", ["--perfetto", "--png"])
def test_a_file_that_cannot_be_written_after_the_run_leaves_the_report_and_nothing_half_written(
        option: str, tmp_path: Path, run_cli: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The folder passed the check made before the run, and writing fails after it (a full disk, say): the report
    is printed, then the one-line error, exit 2; neither the half-written file nor a leftover remains, and a file
    already at that path is kept as it was."""
    pytest.importorskip("matplotlib", reason="matplotlib is not installed")
    import matplotlib.figure

    def full(path: Any) -> None:
        Path(path).write_bytes(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", lambda self, *_, **__: full(self))
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda self, path, *_, **__: full(path))
    path = tmp_path / ("t.json" if option == "--perfetto" else "t.png")
    path.write_bytes(b"before")
    line = FIXES["offload_reload/racy"][0]
    p = run_cli(["replay", line, option, str(path)], ROOT)
    assert p.returncode == 2
    assert "  suggested fix: record an event on `d2h` after `copy_ (D2H)`" in p.stdout
    assert "  replay with it: " in p.stdout
    assert p.stderr.splitlines()[-1] == (f"simdevice: error: {option} {str(path)!r}: cannot write it (No space left on "
                                         "device)")
    assert sorted(x.name for x in tmp_path.iterdir()) == [path.name]
    assert path.read_bytes() == b"before"


def test_a_folder_no_file_can_be_made_in_is_refused_before_the_run(run_cli: Any) -> None:
    p = run_cli(["replay", FIXES["offload_reload/racy"][0], "--png", "/proc/x.png"], ROOT)
    assert p.returncode == 2
    assert p.stdout == ""
    assert p.stderr.startswith("simdevice: error: --png '/proc/x.png': cannot write it (")
    assert p.stderr.count("\n") == 1


def test_check_json_carries_the_fix(run_cli: Any) -> None:
    p = run_cli(["check", "examples/offload_plain.py::reload_racy", "--json", "--examples", "30"], ROOT)
    assert p.returncode == 1
    fix = json.loads(p.stdout)["fix"]
    assert fix["kind"] == "edges"
    assert fix["checked"] is True
    assert fix["edges"][0]["after"]["actor"] == "d2h_stream"
    # the text's 'replay with it' line: the failing schedule with the edge, a command that runs clean
    assert fix["replay"] == f'simdevice replay "{json.loads(p.stdout)["schedule"]}" --edge "{fix["edges"][0]["text"]}"'
    fixed = run_cli([*shlex.split(fix["replay"])[1:], "--json"], ROOT)
    assert fixed.returncode == 0, fixed.stdout
    assert run_cli(["check", "examples/offload_plain.py::reload_racy", "--json", "--examples", "30", "--no-fix"],
                   ROOT).stdout.count('"fix": null') == 1


def test_replay_prints_a_forward_fix_checked_and_a_working_edge_line(run_cli: Any) -> None:
    line = FIXES["param_readiness/param-ready-skips-undispatched"][0]
    p = run_cli(["replay", line], ROOT)
    assert p.returncode == 1
    assert "  suggested fix: issue `all_gather (receive)` on `rank0.nccl` (reference/param_readiness.py:" in p.stdout
    assert "  checked: with it inserted, the failing schedule and 200 searched schedules are clean" in p.stdout
    replay = next(x for x in p.stdout.splitlines() if x.startswith("  replay with it: "))
    edge = replay.split('--edge "')[1].rstrip('"')
    assert "=>" in edge
    fixed = run_cli(["replay", line, "--edge", edge, "--json"], ROOT)
    assert fixed.returncode == 0
    assert json.loads(fixed.stdout)["edges"] == [edge]
    assert "clean" in fixed.stdout


def test_a_forward_edge_is_drawn_between_the_occurrences_it_matches() -> None:
    """The picture's and the trace's arrow for ``A=>B`` with offset D joins the k-th operation at B with the
    (k+D)-th at A (issue order), not the latest one at A started before it (a backward edge's ends)."""
    from simdevice.runtime import Edge
    from simdevice.timeline import Slice, _edge_ends

    ops = [Slice("s", "op", "mul_", 10 * k, 10 * k + 5, k, "x.py:1") for k in range(3)]
    ops += [Slice("t", "op", "copy_", 10 * k + 7, 10 * k + 9, k, "x.py:2") for k in range(3)]
    forward = Edge.parse("t@x.py:2[-1]=>s@x.py:1")
    assert [(a.index, b.index) for a, b in _edge_ends(ops, forward)] == [(0, 1), (1, 2)]
    backward = Edge.parse("t@x.py:2->s@x.py:1")
    # s#0 comes before any t: the edge makes it wait for nothing, and it gets no arrow
    assert [(a.index, b.index) for a, b in _edge_ends(ops, backward)] == [(0, 1), (1, 2)]


def _ping_pong(iters: int = 4) -> None:
    copy = torch.cuda.Stream()
    bufs = [torch.empty(64, device="cuda"), torch.empty(64, device="cuda")]
    filled = [torch.cuda.Event(), torch.cuda.Event()]
    host = [torch.full((64,), float(i), pin_memory=True) for i in range(iters)]
    out = torch.zeros(64, device="cuda")
    for i in range(iters):
        with torch.cuda.stream(copy):
            bufs[i % 2].copy_(host[i], non_blocking=True)  # no wait for the add_ that read this buffer last
            filled[i % 2].record()
        torch.cuda.current_stream().wait_event(filled[i % 2])
        out.add_(bufs[i % 2])


def test_a_suggested_edge_is_drawn_to_the_operations_it_makes_wait_in_issue_order(tmp_path: Path) -> None:
    """Double buffering without the wait for the buffer's last reader, the compute stream stalled: every copy
    starts before any add_ does, but the edge ``default@add_->copy@copy_`` makes a copy wait for the latest add_
    *issued* before it. The first copy waits for nothing (no arrow); each later one for the add_ of the iteration
    before (not the first add_, which ran after them all)."""
    from simdevice.search.targets import from_function
    from simdevice.timeline import _edge_ends

    name = "tests/property/tool/test_explain.py::_ping_pong"
    target = from_function(_ping_pong, name)
    out = target.run(Schedule.parse(f"{name}::default#0+1"))
    assert out.races
    fix = suggest(target, out, schedules=10)
    assert fix.checked, fix.lines()
    (edge,) = fix.edges
    assert (edge.after.actor, edge.before.actor) == ("default", "copy"), edge
    pairs = _edge_ends(slices(out), edge)
    # copy_ #k (iteration k) waits for the add_ of iteration k - 1, default's operation #k (#0 is zeros)
    assert [(a.index, b.index) for a, b in pairs] == [(1, 1), (2, 2), (3, 3)]
    assert all(a.start > b.start for a, b in pairs)  # (what start times alone would have got wrong)
    events = perfetto(out, fix)["traceEvents"]
    assert len([e for e in events if e["ph"] == "s" and e["name"] == "suggested edge"]) == len(pairs)


def test_a_long_schedule_line_is_the_picture_s_title_whole() -> None:
    """The picture's title is the schedule line, broken across lines where a field or a delay ends, with nothing
    cut off. Before, a line of more than 110 characters was cut at 107 with '...': a file in a folder or two, a
    configuration and a few delays lost the delays, the part that says what was stalled."""
    import matplotlib.pyplot as plt

    from simdevice.timeline import figure

    line = ("offload_reload/racy:kib=16,scratch=64,work=2:d2h#0+1,d2h#1+5,default#1+5,default#2+20,host#2+20,host#3+5,"
            "host#4+1")
    assert len(line) > 110
    target, schedule = _target(line)
    out = target.run(schedule)
    fig = figure(out)
    try:
        (ax,) = fig.axes
        *lines, verdict = ax.get_title().split("\n")
        assert verdict == out.verdict()
        assert "".join(lines) == str(out.schedule), lines
        assert all(len(x) <= 110 for x in lines), lines
        fig.canvas.draw()
        title = ax.title.get_window_extent(fig.canvas.get_renderer())  # type: ignore[attr-defined]
        assert title.x0 >= 0, title  # (inside the picture)
        assert title.x1 <= fig.bbox.x1, (title, fig.bbox)
        assert title.y1 <= fig.bbox.y1, (title, fig.bbox)
    finally:
        plt.close(fig)


@pytest.mark.parametrize(("line", "racing"), [("offload_reload/correct::d2h#0+1", False),
                                              ("offload_reload/racy::d2h#0+1", True)])
def test_the_picture_s_legend_names_racing_operations_only_where_it_draws_some(line: str, racing: bool) -> None:
    """A clean run's picture has no racing operation, and its legend names none. Before, every picture's legend had
    "racing operation", a red outline, a clean run's too: a reader looked for a race that was not there."""
    import matplotlib.pyplot as plt

    from simdevice.timeline import figure

    target, schedule = _target(line)
    out = target.run(schedule)
    assert bool(out.run.reports) == racing, out.run.reports
    fig = figure(out)
    try:
        (legend,) = fig.legends
        labels = [t.get_text() for t in legend.get_texts()]
        assert ("racing operation" in labels) == racing, labels
        assert "stall" in labels, labels
    finally:
        plt.close(fig)


def _no_waits() -> None:
    x = torch.ones(1024, device="cuda")
    x.mul_(2.0)
    torch.cuda.synchronize()


def test_the_picture_s_legend_names_the_wait_marker_where_it_draws_one() -> None:
    """The red tick of a passed wait (a stream's ``wait_event``, a host's synchronize) was drawn with no word in the
    legend; it is named where the picture has one, and the race label sits on a white ground on its arrow."""
    import matplotlib.pyplot as plt

    from simdevice.timeline import figure

    target, schedule = _target("offload_reload/racy::d2h#0+1")
    clean = FunctionTarget("tests/property/tool/test_explain.py::_no_waits", _no_waits, "plain")
    for out, waits in ((target.run(schedule), True), (clean.run(clean.schedule()), False)):
        fig = figure(out)
        try:
            (legend,) = fig.legends
            labels = [t.get_text() for t in legend.get_texts()]
            assert ("wait passed" in labels) == waits, labels
            texts = [t for t in fig.axes[0].texts if t.get_text() == "race"]
            assert bool(texts) == waits
            assert all(t.get_bbox_patch() is not None for t in texts)
        finally:
            plt.close(fig)
