"""Every happens-before edge of the simulated device, in one place.

What does a wait order? Read it here. Each function below is one kind of
edge (or one snapshot of a clock that a later edge will join); the rest of
the runtime calls these and never joins or ticks a clock itself:

- program order: a host step ticks its actor (:func:`host_step`); an
  operation issued on a stream is ordered after what its stream and its host
  did before (:func:`issue`);
- events: ``record`` snapshots the stream's clock (:func:`record`); a stream
  that waits for it joins the snapshot at once and passes a marker only once
  the recorded work is done (:func:`stream_waits`); the host joins it once it
  saw the work done (:func:`host_observes`: ``event.synchronize``,
  ``event.query() == True``, ``stream.synchronize``, a blocking copy,
  ``work.is_completed() == True``);
- frees: a block freed by the program is free as of its stream's position,
  joined with the streams recorded with ``record_stream`` (:func:`free_point`);
- processes: a child starts after its parent's step that spawned it
  (:func:`spawned`); ``join`` orders the parent after all of the child
  (:func:`observe`);
- shared values and queues: a write publishes the writer's clock, a read
  joins it (:func:`publish`, :func:`observe`); a queue item carries the clock
  of its ``put`` (:func:`snapshot`);
- collectives: the k-th collective of every rank is one rendezvous whose
  clock joins what every rank's send is ordered after (:func:`collective_issued`); each rank's receive
  carries it (:func:`collective_receive`), and where a rank issued before a
  peer did, what waits for its receive is ordered after every caller once
  the last one issues (:func:`late`, :func:`every_rank_issued`).
- inserted edges (:class:`Edge`): a synchronization the program does not make, added by the simulator to check a
  suggested fix without editing the program: the stream of the later operation waits for an event recorded right
  after the earlier one (:func:`stream_waits`), or the host synchronizes on it (:func:`host_observes`);
- forward edges (``Edge(..., forward=True)``): an operation waits for one its program issues *later*: until that
  one is issued, its stream is held (:func:`forward_marker`); the held stream's operations are checked as if
  issued right after it, their clocks taken at their issue (:func:`held_clock`) and joined with its record when it
  comes (:func:`released`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import attrs

from simdevice.runtime.clock import VectorClock
from simdevice.runtime.streams import EventRecord, SimStream, StreamOp


class Clocked(Protocol):
    """A host actor, a stream, a shared value, a collective: anything with a vector clock."""

    clock: VectorClock


# -- program order -------------------------------------------------------------------------------


def host_step(actor: Clocked, name: str) -> int:
    """A host actor took a step: its own component moves on."""
    return actor.clock.tick(name)


def access_within_step(actor: Clocked, name: str) -> int:
    """A host access with no step of its own (made within the actor's last step): an epoch of its own, newer than
    any the actor has published (a release earlier in that step, a ``Queue.put``, comes before it)."""
    return actor.clock.tick(name)


def issue(actor: Clocked, stream: SimStream) -> int:
    """An operation enqueued on ``stream`` by ``actor``: after the stream's earlier work and the actor's past."""
    stream.clock.join(actor.clock)
    return stream.clock.tick(stream.name)


def device_op(stream: SimStream) -> int:
    """An operation the device enqueues on its own stream (a collective's send and receive)."""
    return stream.clock.tick(stream.name)


# -- events, and waits on streams -------------------------------------------------------------------


def record(stream: SimStream) -> EventRecord:
    """``event.record(stream)``: the stream's position and clock as of now."""
    rec = EventRecord(stream, stream.enqueued, stream.clock.copy())
    if stream.late:
        rec.late = list(stream.late)
    return rec


def stream_waits(stream: SimStream, rec: EventRecord, what: str) -> StreamOp:
    """``stream.wait_event``: later work on ``stream`` is ordered after the recorded work.

    Returns the marker to enqueue: the stream passes it once the recorded work is done.
    """
    stream.clock.join(rec.clock)
    if rec.late:
        for c in rec.late:
            if c.complete:
                stream.clock.join(c.clock)
            elif c not in stream.late:
                stream.late.append(c)
    return StreamOp(stream, f"{what} recorded on stream {rec.stream.name} (item {rec.position})", -1, 0,
                    ready=rec.done)


def host_observes(actor: Clocked, rec: EventRecord) -> None:
    """The host saw the recorded work done (a synchronize, a successful query, a blocking copy)."""
    actor.clock.join(rec.clock)
    if rec.late:  # (seen done: every collective it comes after has had its every caller)
        for c in rec.late:
            if c.complete:
                actor.clock.join(c.clock)


def handed_on(actor: Clocked, after: VectorClock) -> None:
    """A host took a freed block again: CUDA's caching allocator hands blocks on under its lock, so the taker is
    ordered after the block's free, ``after`` (the freeing host's past, and the events of its recorded streams that
    some host's allocation queried done), whichever thread of the process freed it or saw it back."""
    actor.clock.join(after)


def also_after(after: VectorClock | None, clock: VectorClock) -> VectorClock:
    """What a free block's next taker is ordered after (``handed_on``), ``after``, once ordered after ``clock`` too
    (``after`` itself is updated where there is one)."""
    if after is None:
        return clock.copy()
    after.join(clock)
    return after


def free_point(stream: SimStream, uses: list[EventRecord], by: Clocked | None) -> VectorClock:
    """What a block's free is ordered after, as of now (the free): the work of its stream, ``stream``, so far; the
    freeing host's past (``by``: a host that synchronized with a stream before dropping the tensor made its use
    safe); and every stream recorded with it (``uses``: ``record_stream``, their records made now). (The streams
    themselves are not ordered by it.)"""
    clock = stream.clock.copy()
    for rec in uses:
        clock.join(rec.clock)
    if by is not None:
        clock.join(by.clock)
    return clock


# -- processes, shared values, queues -------------------------------------------------------------------


def spawned(parent: Clocked, child: Clocked) -> None:
    """A new actor starts after its parent's step that made it."""
    child.clock.join(parent.clock)


def publish(shared: Clocked, actor: Clocked) -> None:
    """A write of a shared value: a later reader is ordered after the writer's past."""
    shared.clock.join(actor.clock)


def observe(actor: Clocked, other: Clocked | VectorClock) -> None:
    """A read of a shared value, an item taken from a queue, a joined process: ``actor`` is now after it."""
    actor.clock.join(other if isinstance(other, VectorClock) else other.clock)


def snapshot(actor: Clocked) -> VectorClock:
    """The actor's clock as of now (what a queue item carries)."""
    return actor.clock.copy()


# -- collectives ------------------------------------------------------------------------------------------


def collective_issued(collective: Clocked, actor: Clocked, comm: SimStream) -> None:
    """A rank issued its part of a collective: the rank's communication stream is after its caller's past, and the
    rendezvous after what the rank's send is (the caller's past, and the work the communication stream waited for
    first: NCCL's stream waits for the caller's current stream, so what a rank queued before its call lands before
    its send)."""
    comm.clock.join(actor.clock)
    collective.clock.join(comm.clock)


def collective_receive(comm: SimStream, collective: Clocked) -> None:
    """A rank's receive is after every caller that had issued the collective by then."""
    comm.clock.join(collective.clock)


def late(comm: SimStream, collective: Any) -> None:
    """A rank issued its part of ``collective`` before a peer did: its receive lands after every rank's send, each
    after what its rank did before it called, but those peers' pasts are not known yet. The communication stream's
    later records carry the collective (``EventRecord.late``), and so do the streams that wait for one: a host that
    sees such a record done is ordered after every caller (its receive landed, so every rank had called), a stream
    that waits for one after the last rank called is ordered after them then (:func:`every_rank_issued`)."""
    comm.late.append(collective)


def every_rank_issued(collective: Any, streams: Iterable[SimStream]) -> None:
    """The last rank issued ``collective``: the streams that carry it (:func:`late`) are ordered after every caller
    from now on."""
    for s in streams:
        if s.late and collective in s.late:
            s.clock.join(collective.clock)
            s.late.remove(collective)


# -- inserted edges ------------------------------------------------------------------------------------------


def forward_marker(stream: SimStream, what: str, ready: Callable[[], bool]) -> StreamOp:
    """A forward edge's wait on ``stream`` for an operation not issued yet: the stream passes the marker once
    ``ready()`` (that operation issued and done). It joins no clock now: :func:`released` does, when it is issued."""
    return StreamOp(stream, what, -1, 0, ready=ready)


def held_clock(stream: SimStream) -> VectorClock:
    """The clock of an operation issued on a held stream, as of its issue (its accesses wait for the release)."""
    return stream.clock.copy()


def host_record(actor: Clocked, stream: SimStream) -> EventRecord:
    """A host step as an awaited operation: done at once, ordered after the host's past (``stream``: any of the
    host's, the record sits before its first item)."""
    return EventRecord(stream, 0, actor.clock.copy())


def released(clock: VectorClock, recs: list[EventRecord]) -> None:
    """What a forward edge orders: everything held behind it (a held operation's clock, a held stream, an event
    recorded on it meanwhile) is after the awaited operations, once they are issued."""
    for rec in recs:
        clock.join(rec.clock)



@attrs.frozen(order=True)
class Site:
    """Where an operation is issued: its actor (a stream such as ``d2h`` or ``rank0.nccl``, or a host actor) and the
    program's line that issued it (``my_offload.py:19``, as reports name it)."""

    actor: str
    source: str

    def __str__(self) -> str:
        return f"{self.actor}@{self.source}"


_OFFSET = re.compile(r"^(.*)\[([+-]\d+)\]$")
#: a site's source: FILE:LINE, the line a positive number
_SOURCE = re.compile(r".+:[1-9]\d*")
EDGE_SYNTAX = "ACTOR@FILE:LINE->ACTOR@FILE:LINE or ACTOR@FILE:LINE[+D]=>ACTOR@FILE:LINE"


@attrs.frozen(order=True)
class Edge:
    """An inserted happens-before edge from the operations issued at ``after`` to those issued at ``before``.

    A backward edge (``A@L1->B@L2``, the default): every operation issued at ``before`` waits for the latest
    operation issued at ``after`` before it (an event recorded after that operation, waited on by the later one's
    stream, or synchronized on by its host). What a code fix at those two lines would do.

    A forward edge (``forward=True``, ``A@L1=>B@L2``, with ``[+D]`` after the first site when ``offset`` is not
    0): the k-th operation issued at ``before`` waits for the (k + ``offset``)-th operation issued at ``after``
    (counting from 0, per site, in the order the program issues them), which may be issued later, by another actor
    or another process: until it is issued and done, a stream waiter's stream is held (its host goes on), a host
    step's host is blocked; a collective's host is blocked until it is issued, then its stream waits for it. No
    such operation (k + offset < 0) is no wait; one that never comes is a deadlock of the run. What reordering the
    code does: issue the awaited operation first and wait on it, or across processes a handshake."""

    after: Site
    before: Site
    forward: bool = False
    #: forward edges: the k-th operation at ``before`` waits for the (k + offset)-th at ``after``
    offset: int = 0

    def __str__(self) -> str:
        if not self.forward:
            return f"{self.after}->{self.before}"
        shift = f"[{self.offset:+d}]" if self.offset else ""
        return f"{self.after}{shift}=>{self.before}"

    @classmethod
    def parse(cls, text: str) -> Edge:
        """``d2h@my_offload.py:11->default@my_offload.py:19``, or a forward edge
        ``nccl@my_prefetch.py:30=>side@my_prefetch.py:22`` (``nccl@my_prefetch.py:30[+1]=>...``: with an offset)."""
        forward = "=>" in text
        try:
            a, b = text.split("=>" if forward else "->")
            offset = 0
            m = _OFFSET.match(a.strip())
            if m is not None and forward:
                a, offset = m.group(1), int(m.group(2))
            sites = [Site(*part.strip().split("@", 1)) for part in (a, b)]
        except (ValueError, TypeError):
            raise ValueError(f"bad edge {text!r}: expected {EDGE_SYNTAX}") from None
        # each site a FILE:LINE with a line number (an offset on a forward edge alone, in brackets)
        if not all(s.actor and _SOURCE.fullmatch(s.source) for s in sites):
            raise ValueError(f"bad edge {text!r}: expected {EDGE_SYNTAX}")
        return cls(sites[0], sites[1], forward, offset)
