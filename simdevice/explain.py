"""Which synchronization is missing: a fix suggested from a failing run's races, and checked by re-running.

A race is two accesses no happens-before edge orders. The program meant them in the order it issued them, so the
missing edge runs from the earlier-issued access's operation to the later one's: an event recorded after the
first and waited on before the second (``wait_event``), ``work.wait()`` when the first is a collective, a
synchronize when the second is the host's, ``record_stream`` when a free handed the block on between them.

:func:`suggest` derives those edges, as :class:`~simdevice.runtime.sync.Edge` values between two program lines,
then checks them counterfactually: the same schedule is re-run with the edges inserted by the simulator
(:func:`~simdevice.runtime.inserted`), edges are added for whatever race remains (a few rounds), and a bounded
search over the same configuration looks for a schedule that still fails or races with them. The answer says
which edges, in the program's words, and whether they were enough.

When every race is ordered as issued and the values are still wrong, the program issues an operation before one it
depends on (a read before the write it needs; across processes, one process moves on before the other copied). Then
:func:`forward_for` proposes *forward* edges (``Edge(..., forward=True)``): the earlier-issued operation waits for
the later one, matched by occurrence with the offset of the racing pair (counted on a re-run of the schedule,
:func:`~simdevice.runtime.runtime.counted`), in place of the backward edges they reverse; the smallest set of them
that makes the failing schedule clean is checked the same way (the bounded search). Its advice is the reordering:
issue the operation first and wait on it, or across processes a handshake.

A failure without a race (a deadlock, a host error, an illegal access) gets no edge: :attr:`Fix.why_none` says
why.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from typing import Any

import attrs

from reference.schedule import Schedule
from simdevice.runtime import Edge, Site, inserted
from simdevice.runtime.reports import (
    Access,
    Deadlock,
    HostError,
    IllegalAccess,
    Race,
    StepLimit,
    is_collective,
    process_of,
)
from simdevice.runtime.runtime import Occurrences, counted
from simdevice.search.execute import Outcome
from simdevice.search.targets import Target, kept_patched

__all__ = ["Fix", "edge_for", "forward_for", "suggest"]

#: schedules the bounded search runs with the suggested edges (per round)
SCHEDULES = 200
#: rounds of "add an edge for each remaining race" on one schedule
ROUNDS = 4
#: rounds of searching again with the edges found so far, each after new edges (several processes of one kind may
#: each need their own: a race of each is found in turn, and ordered as issued before a forward edge orders it)
SEARCH_ROUNDS = 12


@attrs.frozen
class Fix:
    """A suggested fix for one failing run, and what checking it showed."""

    #: the edges to add, in the order found
    edges: tuple[Edge, ...]
    #: each edge in the program's words (one sentence each)
    advice: tuple[str, ...]
    #: whether, with the edges inserted, the failing schedule and the bounded search were clean
    checked: bool
    #: schedules the bounded search ran with the edges inserted
    schedules: int
    #: what remained when the edges were not enough (a schedule line and its verdict), else None
    remains: str | None = None
    #: why no edge is suggested (a failure without a race), else None
    why_none: str | None = None
    #: False where the runs were race-only (``--no-values``): the check saw races and stale reads, no values
    values: bool = True

    def lines(self) -> list[str]:
        """The fix as report lines."""
        if self.why_none is not None:
            return [f"no edge suggested: {self.why_none}"]
        out = [f"suggested fix{' (in each of ' + ', '.join(procs) + ')' if procs else ''}: {a}"
               for a, procs in self._per_process()]
        if self.checked:
            judged = "no wrong values" if self.values else "no stale read; race-only, so no value was checked"
            out.append(f"checked: with {'it' if len(self.edges) == 1 else 'these'} inserted, the failing schedule "
                       f"and {self.schedules} searched schedules are clean (no race, {judged})")
        else:
            out.append(f"not enough: {self.remains}")
        return out

    def _per_process(self) -> list[tuple[str, list[str]]]:
        """The advice, each said once, with the processes it is for (more than one: said without them): an edge
        within one process (a rank, a worker) whose lines, ops and streams are those of an edge in other processes
        is the same fix in each."""
        said: dict[str, tuple[str, list[str]]] = {}  # the advice without its process -> as said, the processes
        for e, a in zip(self.edges, self.advice, strict=True):
            p = process_of(e.after.actor)
            alike = a.replace(f"`{p}.", "`")
            if p == "host" or p != process_of(e.before.actor) or p in alike:
                alike = a  # the main process's, or across processes: said as it is
            said.setdefault(alike, (a, []))[1].append(p)
        return [(alike if len(set(procs)) > 1 else first,
                 sorted(set(procs), key=_by_number) if len(set(procs)) > 1 else [])
                for alike, (first, procs) in said.items()]

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": "edges" if self.edges else "none",
            "edges": [
                {"kind": "forward" if e.forward else "backward",
                 "after": {"actor": e.after.actor, "source": e.after.source},
                 "before": {"actor": e.before.actor, "source": e.before.source},
                 **({"offset": e.offset} if e.forward else {}), "text": str(e)}
                for e in self.edges
            ],
            "advice": list(self.advice),
            "checked": self.checked,
            "schedules": self.schedules,
            "remains": self.remains,
            "why_none": self.why_none,
        }


def _by_number(name: str) -> list[Any]:
    """A process's name as it sorts for a reader: ``rank2`` before ``rank10``, whichever raced first."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _ordered(race: Race) -> tuple[Access, Access]:
    """The race's two accesses in the order the program issued them."""
    a, b = race.previous, race.current
    return (a, b) if a.seq <= b.seq else (b, a)


def edge_for(race: Race) -> Edge | None:
    """The edge that orders a race's accesses as the program issued them, or None when the earlier one is a host
    step (an event cannot be recorded after it: the later side waits for that host's matching access instead, a
    handshake, :func:`handshake_for`)."""
    first, second = _ordered(race)
    if first.on != "stream" or first.actor == second.actor:
        return None
    return Edge(Site(first.actor, first.source), Site(second.actor, second.source))


def _communication(op: str, actor: str) -> tuple[str, str]:
    """What a communication stream's operation ``op`` on ``actor`` belongs to, and how its work is waited for: a
    ``batch_isend_irecv``'s (a send or receive on the collectives' own stream, ``nccl``, where ProcessGroupNCCL runs
    the batch as one group: its works, there are no blocking forms), a point-to-point call's (``send``,
    ``recv (receive)`` on the pair's stream: ``isend``, ``irecv``) or a collective's."""
    if op.startswith(("send", "recv")):
        if re.fullmatch(r"(pg\d+-)?nccl", actor.rsplit(".", 1)[-1]):  # (a process group's collectives' stream)
            return "`batch_isend_irecv`", "the `wait()` of each work the `batch_isend_irecv` returned,"
        return "point-to-point call", "`work.wait()` of an `isend` or `irecv`"
    return "collective", "`work.wait()` of an `async_op=True` call"


def _where(access: Any) -> str:
    """Where an access is, in a fix's words: ``the host``, ``the host's thread `writer```, or the stream."""
    if access.on == "host":
        return "the host"
    return f"the host's thread `{access.actor}`" if access.on == "thread" else f"`{access.actor}`"


def _host_named(access: Any) -> str:
    """A host access's actor in a fix's words: ``the host``, ``the host's thread `filler```, ``the host of
    `SpawnProcess-1```."""
    if access.on == "host" and access.actor != "host":
        return f"the host of `{access.actor}`"
    return _where(access)


def _advice(race: Race, edge: Edge) -> str:
    """One edge in the program's words."""
    first, second = _ordered(race)
    done = f"`{first.op}` on `{first.actor}` ({first.source})"
    then = f"before `{second.op}` on {_where(second)} ({second.source})"
    if is_collective(first.actor, first.op) and is_collective(second.actor, second.op):
        # two communication streams (two process groups', a pair's and the collectives'): the program cannot make
        # NCCL's stream current; that stream waits for the stream the later call is made on, so that one waits
        work, call = _communication(first.op, first.actor)
        later, _ = _communication(second.op, second.actor)
        blocking = ("" if work.startswith("`batch") else
                    "; after a blocking call, a wait of that stream on the stream it was called on")
        how = (f"wait for the {work}'s work on the stream the {later} is called on ({call} with that stream "
               f"current{blocking}) after {done}")
        then = f"before the call that issues `{second.op}` on `{second.actor}` ({second.source})"
    elif is_collective(first.actor, first.op):  # (it writes device memory: a stream reads it next, never the host)
        # (``wait()`` makes the stream current at the call wait: called with another stream current, as in a program
        # that waits on the default stream and reads on a side one, it orders the wrong stream)
        work, call = _communication(first.op, first.actor)
        blocking = ("" if work.startswith("`batch") else
                    f"; after a blocking call, a wait of `{second.actor}` on the stream it was called on")
        how = (f"wait for the {work}'s work on `{second.actor}` ({call} with `{second.actor}` current{blocking}) "
               f"after {done}")
    elif second.on != "stream":
        how = f"synchronize on an event recorded on `{first.actor}` after {done}"
    elif is_collective(second.actor, second.op):
        # the program cannot wait on NCCL's own stream: it waits for the stream the collective is called on
        work, _ = _communication(second.op, second.actor)
        how = (f"record an event on `{first.actor}` after {done} and make the stream the {work} is called on "
               f"wait on it (NCCL's stream waits for the calling stream when the {work} is issued)")
        then = f"before the call that issues `{second.op}` on `{second.actor}` ({second.source})"
    else:
        how = f"record an event on `{first.actor}` after {done} and make `{second.actor}` wait on it"
    across = ""
    if process_of(first.actor, first.on) != process_of(second.actor, second.on):
        across = " (across processes: an interprocess event, or a handshake the other process waits for)"
    freed = ""
    if race.freed is not None and race.freed.actor != first.actor and (
            process_of(race.freed.actor, race.freed.on) == process_of(first.actor, first.on)):
        # (record_stream on the stream the block was allocated on is a no-op: that stream's own order holds it; and
        # so is one in another process than the block's, on a tensor it received: torch's allocator skips it)
        freed = (f"; or keep the block from reuse until `{first.actor}` is done: `record_stream` on that stream "
                 f"(`{first.actor}`), on the tensor whose free at {race.freed.source} handed its block on, before "
                 "the free")
    return f"{how} {then}{across}{freed}"


def _reorder(races: list[Race]) -> list[str]:
    """For each racing pair (distinct lines): the later-issued operation, which the data may need first."""
    out: list[str] = []
    for r in races:
        first, second = _ordered(r)
        how = ("have the host wait for it (a handshake) before issuing the other"
               if process_of(first.actor, first.on) != process_of(second.actor, second.on)
               else "issue it first and wait on it")
        text = (f"`{second.op}` on `{second.actor}` ({second.source}) is issued after `{first.op}` on "
                f"`{first.actor}` ({first.source}); if it must come first, {how}")
        if text not in out:
            out.append(text)
    return out


def _why_none(out: Outcome) -> str:
    reports = out.run.reports
    if any(isinstance(r, StepLimit) for r in reports):
        return "the run hit its step limit before it ended: raise it (--max-steps) to judge it"
    if any(isinstance(r, Deadlock) for r in reports):
        return ("the run deadlocks: every actor waits for something that cannot happen; an added edge only adds "
                "waits, so the fix removes a wait or makes what it waits for happen (see what each actor waits for)")
    if any(isinstance(r, IllegalAccess) for r in reports):
        return ("an access reached unmapped or released memory: no two accesses race; order the access before the "
                "pause or release, or map the memory again first")
    errors = [r for r in reports if isinstance(r, HostError)]
    unrun = not_run(out)
    if unrun is not None:
        return (f"the run stopped at what the simulator does not run ({unrun.error.split(':', 1)[0]} in "
                f"{unrun.actor}, {unrun.source}): see \"Not intercepted\" in docs/dropin.md")
    raised = next((r for r in errors if not r.error.startswith("AssertionError")), None)
    if raised is not None and not out.problems:
        return (f"the program raised {raised.error.split(':', 1)[0].split(' ', 1)[0]} ({raised.source}) with no two "
                "accesses racing: an error of its own under this interleaving, not a missing wait")
    discarded = next((n for n in out.run.notes if n.startswith("memory_saver.pause(") and " discarded " in n), None)
    if (errors or out.problems) and discarded is not None:
        return (f"the program's own check failed with no two accesses racing, and {discarded.split(' discarded ')[0]} "
                "discarded the contents of a region with no CPU backup, whose tensors lived on: no wait brings "
                "them back; give the region enable_cpu_backup=True, or write its tensors again after the resume")
    if errors or out.problems:
        return ("the program's own check failed with no two accesses racing: its logic under this interleaving (a "
                "bookkeeping or ordering decision), or a host read or write the simulator does not see (the buffer "
                "protocol and np.asarray(t) reach host memory without an op: see \"Not intercepted\" in "
                "docs/dropin.md); no wait to suggest")
    return "the run has no race to order"


#: what a host error says where the program used what the simulator does not run (docs/dropin.md, "Not
#: intercepted"), not where it failed on its own
_NOT_RUN = ("NotImplementedError", "RuntimeError: simdevice: ", "RuntimeError: Cannot access accelerator",
            # an assert of the simulator's own code failed (``describe``): its bug, no verdict on the program
            "AssertionError: simdevice: ",
            "AssertionError: Torch not compiled with CUDA",
            # CUDA's own C API (torch._C._cuda_*: memory history, BLAS handles; torch.cuda.comm's _broadcast,
            # _scatter, ...), absent from the CPU build
            "AttributeError: module 'torch._C' has no attribute '",
            # a class of CUDA's the CPU build has only as a stub
            "RuntimeError: Tried to instantiate dummy base class",
            # torch's own torch.cuda.Stream, held under a name bound before the session (a class attribute, a
            # default argument), which refuses on the CPU build
            "RuntimeError: torch.cuda.Stream requires CUDA support",
            # the device-generic torch.Stream("cuda") / torch.Event("cuda") held under a name bound before the
            # session outside the program's modules, and a CUDA torch.Generator
            "RuntimeError: PyTorch is not linked with support for cuda devices",
            "RuntimeError: Cannot get CUDA generator without ATen_cuda library",
            # a host tensor's .data set to a device tensor: torch's check, as the simulated tensors are no CUDA ones
            "RuntimeError: Attempted to call `variable.set_data(tensor)`, but `variable` and `tensor` have "
            "incompatible tensor type",
            # a CUDA storage made directly (torch.UntypedStorage(n, device="cuda"), storage.cuda(),
            # torch.cuda.FloatStorage(n)), which the CPU build has no allocator for
            "RuntimeError: torch.UntypedStorage(): Storage device not recognized: cuda",
            # DLPack of a simulated device tensor (torch.utils.dlpack.to_dlpack, __dlpack__, from_dlpack of one: CuPy,
            # JAX, Triton's interop), whose bytes are no device memory another library could read
            "BufferError: Cannot pack tensors on meta")


#: what torch raises on a GPU too, though it starts as what the simulator does not run: ``record_stream`` of a host
#: tensor (pinned too) has a CUDA kernel alone, so torch's dispatcher refuses it there as here
_TORCH_RAISES_TOO = ("NotImplementedError: Could not run 'aten::record_stream' with arguments from the 'CPU' backend",)


def _not_run(error: str) -> bool:
    return error.startswith(_NOT_RUN) and not error.startswith(_TORCH_RAISES_TOO)


def not_run(out: Outcome) -> HostError | None:
    """The host error of ``out`` that says the program used what the simulator does not run, if there is one: the
    run says nothing about the program past it."""
    return next((r for r in out.run.reports if isinstance(r, HostError) and _not_run(r.error)), None)


def _races(out: Outcome) -> list[Race]:
    return [r for r in out.run.reports if isinstance(r, Race)]


def forward_for(race: Race, occ: Occurrences) -> Edge | None:
    """The forward edge that orders a race's accesses against the issue order: the earlier-issued operation waits
    for the later-issued one, matched by occurrence (the k-th at the earlier one's site waits for the (k + offset)-th
    at the later one's, the offset this pair's). None when both are one stream's or one host's (an actor cannot wait
    for what it issues later) or ``occ`` does not know them."""
    first, second = _ordered(race)
    a, b = occ.of(first.seq), occ.of(second.seq)
    if a is None or b is None or first.actor == second.actor:
        return None
    (waiter, k), (awaited, j) = a, b
    if (waiter.actor, awaited.actor) != (first.actor, second.actor):
        return None
    return Edge(awaited, waiter, forward=True, offset=j - k)


def handshake_for(race: Race, occ: Occurrences) -> Edge | None:
    """For a race whose earlier access is a host's (a thread's or another process's host reading or writing host
    memory): the edge by which the later access waits for that host's matching access, in issue order (the k-th at
    the later one's site waits for the (k + offset)-th at the host's, the offset this pair's), blocking its host
    until that access is made; a handshake (a queue message, an event, ``join()``) in the program. None otherwise,
    or where ``occ`` does not know them."""
    first, second = _ordered(race)
    if first.on == "stream" or first.actor == second.actor:
        return None
    a, b = occ.of(first.seq), occ.of(second.seq)
    if a is None or b is None:
        return None
    (awaited, j), (waiter, k) = a, b
    if (awaited.actor, waiter.actor) != (first.actor, second.actor):
        return None
    return Edge(awaited, waiter, forward=True, offset=j - k)


def _forward_advice(race: Race, edge: Edge) -> str:
    """A forward edge in the program's words: issue the awaited operation first and wait on it, or across
    processes, or where the awaited access is a host's, a handshake."""
    first, second = _ordered(race)
    if edge.after.actor == first.actor and edge.after.source == first.source:  # (a handshake, in issue order)
        first, second = second, first
    x = f"`{second.op}` on `{second.actor}` ({second.source})"
    y = f"`{first.op}` on {_where(first)} ({first.source})"
    match = ""
    if edge.offset:
        match = f" (the k-th `{first.op}` there waits for the (k{edge.offset:+d})-th `{second.op}`)"
    if second.on != "stream":  # the awaited access is a host's: the waiter's host waits for word from it
        handshake = (f"wait for a handshake from {_host_named(second)} after `{second.op}` ({second.source}) (a "
                     "queue message or an event it sets after it, `future.result()` or `join()` of it)")
        if first.on == "stream":
            return (f"have the host that issues `{first.op}` on `{first.actor}` ({first.source}) {handshake} before "
                    f"it issues it{match}")
        return f"have {_host_named(first)} {handshake} before `{first.op}` ({first.source}){match}"
    proc = process_of(first.actor, first.on)
    if proc != process_of(second.actor, second.on):
        host = "the main process's host" if proc == "host" else f"`{proc}`'s host"
        return f"have {host} wait for {x} before {y}: a handshake{match}"
    return f"issue {x} before {y} and wait on it{match}"


def _reverses(e: Edge, forward: list[Edge]) -> bool:
    """Whether backward edge ``e`` orders a pair the other way round from one of the forward edges."""
    return not e.forward and any((f.after, f.before) == (e.before, e.after) for f in forward)


def _reorder_case(o: Outcome) -> bool:
    """Every race ordered as issued, and still wrong: the program issues an operation before one it depends on."""
    return not _races(o) and _wrong(o)


def _wrong(o: Outcome) -> bool:
    """Whether ``o`` is wrong beyond its races. In a race-only run (``--no-values``) the program's host errors are not
    evidence: its checks of values it read back saw placeholders (the run's note says so); a stale read, a deadlock
    or an illegal access still is."""
    if o.values:
        return o.corrupted
    return any(not isinstance(r, (Race, HostError)) for r in o.run.reports)


#: subsets of the candidate forward edges tried on the failing schedule (smallest first)
FORWARD_TRIALS = 15


def suggest(
    target: Target,
    out: Outcome,
    *,
    schedules: int = SCHEDULES,
    max_delays: int = 3,
    progress: Callable[[int], None] | None = None,
) -> Fix:
    """The edges that order ``out``'s races, checked: ``out.schedule`` and a bounded search over its configuration,
    both with the edges inserted. Backward edges first (each race ordered as issued); when the values are still
    wrong with every race so ordered, forward edges (:func:`forward_for`) in place of the backward ones they
    reverse, checked the same way."""
    # the bounded search is Hypothesis's: imported here, so that a replay that asks for no fix does not import it
    from hypothesis import strategies as st

    from simdevice.search.explore import search_target

    races = _races(out)
    if not races:
        return Fix((), (), False, 0, why_none=_why_none(out))
    edges: list[Edge] = []
    said: dict[Edge, str] = {}
    unordered: list[Race] = []

    #: each backward edge's later access, by issue order (what an edge into the same stream later is implied by)
    waits_at: dict[Edge, int] = {}

    def backward(found: list[Race], into: list[Edge], words: dict[Edge, str], note: bool = True,
                 prune: bool = False) -> bool:
        """Backward edges for ``found``'s races not ordered yet (none that reverses a forward edge of ``into``);
        whether any was new. ``prune``: leave out an edge from a site another edge already waits for on the same
        stream, earlier in issue order (stream order then covers it; where it does not, the run with the edges
        inserted still races there, and the next round adds it)."""
        new = False
        fwd = [e for e in into if e.forward]
        for r in found:
            e = edge_for(r)
            if e is None:
                if note:
                    unordered.append(r)
            elif e not in into and not _reverses(e, fwd):
                later = _ordered(r)[1].seq
                if prune and any(x.after == e.after and x.before.actor == e.before.actor and waits_at[x] < later
                                 for x in into if x in waits_at):
                    continue
                into.append(e)
                waits_at[e] = later
                words[e] = _advice(r, e)
                new = True
        return new

    def failing(o: Outcome) -> bool:
        return (target.failed(o) if o.values else _wrong(o)) or bool(o.races)

    def settle(schedule: Schedule, trial: list[Edge], words: dict[Edge, str], note: bool) -> Outcome | None:
        """``schedule`` with ``trial`` inserted, adding backward edges for the races that remain (a few rounds):
        what still fails, or None."""
        again: Outcome | None = None
        for _ in range(ROUNDS):
            with inserted(trial):
                again = target.run(schedule)
            if not failing(again):
                return None
            if not backward(_races(again), trial, words, note):
                break
        return again

    tried: str | None = None

    def forward(failed: Outcome) -> str | None:
        """Forward edges for the races of ``failed``'s schedule run without edges, in place of the backward edges
        they reverse: the smallest set that makes that schedule (and ``out``'s) clean goes into ``edges``; else
        why none did."""
        with counted() as occ:
            plain = target.run(failed.schedule)
        candidates: dict[Edge, Race] = {}
        for r in _races(plain):
            # (a handshake in issue order first: the later access waits for the host's; then against it)
            for f in (handshake_for(r, occ), forward_for(r, occ)):
                if f is None:
                    continue
                # the pair reported need not be the nearest of its two sites' racing occurrences (one host ran
                # ahead of the other by more than one): the offsets between it and 0 too, nearest to it first
                step = -1 if f.offset > 0 else 1
                for offset in [f.offset, *range(f.offset + step, step, step)] if f.offset else [0]:
                    g = attrs.evolve(f, offset=offset)
                    if g not in candidates and g not in edges:
                        candidates[g] = r
        if not candidates:
            return "no racing pair's earlier operation can wait for the later one (both one actor's)"
        subsets = [list(c) for n in range(1, len(candidates) + 1)
                   for c in itertools.combinations(candidates, n)][:FORWARD_TRIALS]
        last: Outcome | None = None
        for fwd in subsets:
            trial = [e for e in edges if not _reverses(e, fwd)] + fwd
            words = {e: said[e] for e in trial if e in said} | {f: _forward_advice(candidates[f], f) for f in fwd}
            last = settle(failed.schedule, trial, words, False)
            if last is None and failed.schedule != out.schedule:
                last = settle(out.schedule, trial, words, False)
            if last is None:
                # a backward edge between the same two sites as a forward one is often implied by it: drop it
                # where the failing schedule stays clean without it (the search then checks what is left)
                for e in [e for e in trial if not e.forward and any(
                        (f.after, f.before) == (e.after, e.before) for f in fwd)]:
                    fewer = [x for x in trial if x != e]
                    with inserted(fewer):
                        if not failing(target.run(out.schedule)) and not failing(target.run(failed.schedule)):
                            trial = fewer
                edges[:] = trial
                said.update(words)
                return None
        assert last is not None
        how = (f"forward edges make it deadlock ({len(subsets)} tried): an operation waits for one that never "
               "comes, or for one issued after something that waits for it" if any(
                   isinstance(r, Deadlock) for r in last.run.reports)
               else f"forward edges for its racing pairs leave it {last.verdict()} ({len(subsets)} tried)")
        return f'"{last.schedule}" {how}'

    def stuck(o: Outcome) -> bool:
        """Whether no backward edge can help ``o`` further: its values are wrong with every race ordered as issued,
        or every race left begins at a host step (no event can be recorded after it) or has its edge already; a
        forward edge may still order such a pair (the host's read waits for the copy issued after it)."""
        left = _races(o)
        if not left:
            return _reorder_case(o)
        return all(edge_for(r) is None or edge_for(r) in edges for r in left)

    def fewest() -> None:
        """Leave out each backward edge the failing schedule stays clean without (the last added first), so that
        the fix names the synchronization that is missing, not every pair it orders; the search then checks what
        is left, and adds back what another schedule needs."""
        for e in reversed(list(edges)):
            if e.forward or len(edges) == 1:
                continue
            fewer = [x for x in edges if x != e]
            with inserted(fewer):
                if failing(target.run(schedule)):
                    continue
            edges.remove(e)

    schedule = out.schedule
    backward(races, edges, said, prune=True)
    searched = 0
    remains: Outcome | None = None
    with kept_patched(target):
        remains = settle(schedule, edges, said, True)
        if remains is not None and stuck(remains):
            tried = forward(remains)
            if tried is None:
                remains = None
        if remains is None:
            fewest()
        if remains is None:
            config = st.just(dict(schedule.config_dict()))
            for _ in range(SEARCH_ROUNDS):
                with inserted(edges):
                    found = search_target(target, failing, max_examples=schedules, max_delays=max_delays,
                                          config=config, progress=progress)
                searched += found.examples
                remains = found.failure
                if remains is None:
                    break
                if backward(_races(remains), edges, said):
                    continue
                if stuck(remains):
                    # (again where forward edges are in already: each worker of several may need its own)
                    tried = forward(remains)
                    if tried is None:
                        continue
                break
    advice = tuple(said[e] for e in edges)
    if remains is None:
        return Fix(tuple(edges), advice, True, searched, values=out.values)
    what = f'"{remains.schedule}" still {remains.verdict()}'
    if _reorder_case(remains) and not any(e.forward for e in edges):
        what += (" with every racing pair ordered as issued: the program issues an operation before one it "
                 "depends on, and a wait on an operation issued later (a forward edge) did not fix it; "
                 + "; ".join(_reorder(races)))
    if tried is not None:
        what += f"; {tried}"
    if unordered:
        what += f"; {len(unordered)} race(s) begin at a host step, which no event can be recorded after"
    return Fix(tuple(edges), advice, False, searched, remains=what, values=out.values)


def check_edges(target: Target, schedule: Schedule, edges: list[Edge]) -> Outcome:
    """``schedule`` re-run with ``edges`` inserted (``simdevice replay --edge``)."""
    with kept_patched(target), inserted(edges):
        return target.run(schedule)
