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
  clock joins every caller (:func:`collective_issued`); each rank's receive
  carries it (:func:`collective_receive`), and ``work.wait()`` joins it once
  every rank has issued (:func:`work_record`).
- inserted edges (:class:`Edge`): a synchronization the program does not make, added by the simulator to check a
  suggested fix without editing the program: the stream of the later operation waits for an event recorded right
  after the earlier one (:func:`stream_waits`), or the host synchronizes on it (:func:`host_observes`).
"""

from __future__ import annotations

from typing import Protocol

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
    return EventRecord(stream, stream.enqueued, stream.clock.copy())


def stream_waits(stream: SimStream, rec: EventRecord, what: str) -> StreamOp:
    """``stream.wait_event``: later work on ``stream`` is ordered after the recorded work.

    Returns the marker to enqueue: the stream passes it once the recorded work is done.
    """
    stream.clock.join(rec.clock)
    return StreamOp(stream, f"{what} recorded on stream {rec.stream.name} (item {rec.position})", -1, 0,
                    ready=rec.done)


def host_observes(actor: Clocked, rec: EventRecord) -> None:
    """The host saw the recorded work done (a synchronize, a successful query, a blocking copy)."""
    actor.clock.join(rec.clock)


def free_point(where: EventRecord, uses: list[EventRecord], by: VectorClock | None) -> VectorClock:
    """What a block's free is ordered after: its stream's work so far, the freeing host's past (a host that
    synchronized with a stream before dropping the tensor made its use safe), and every stream recorded with
    it (``record_stream``), as of the free. (The streams themselves are not ordered by it.)"""
    clock = where.clock.copy()
    for rec in uses:
        clock.join(rec.clock)
    if by is not None:
        clock.join(by)
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
    """A rank issued its part of a collective: the rendezvous and the rank's communication stream are after it."""
    collective.clock.join(actor.clock)
    comm.clock.join(actor.clock)


def collective_receive(comm: SimStream, collective: Clocked) -> None:
    """A rank's receive is after every caller that had issued the collective by then."""
    comm.clock.join(collective.clock)


def work_record(rec: EventRecord, collective: Clocked | None, complete: bool) -> EventRecord:
    """What ``work.wait()`` orders after: the receive, and once every rank issued, every caller."""
    if collective is None or not complete:
        return rec
    clock = rec.clock.copy()
    clock.join(collective.clock)
    return EventRecord(rec.stream, rec.position, clock)


# -- inserted edges ------------------------------------------------------------------------------------------


@attrs.frozen(order=True)
class Site:
    """Where an operation is issued: its actor (a stream such as ``d2h`` or ``rank0.nccl``, or a host actor) and the
    program's line that issued it (``my_offload.py:19``, as reports name it)."""

    actor: str
    source: str

    def __str__(self) -> str:
        return f"{self.actor}@{self.source}"


@attrs.frozen(order=True)
class Edge:
    """An inserted happens-before edge: every operation issued at ``before`` waits for the latest operation issued
    at ``after`` before it (an event recorded after that operation, waited on by the later one's stream, or
    synchronized on by its host). What a code fix at those two lines would do."""

    after: Site
    before: Site

    def __str__(self) -> str:
        return f"{self.after}->{self.before}"

    @classmethod
    def parse(cls, text: str) -> Edge:
        """``d2h@my_offload.py:11->default@my_offload.py:19``."""
        try:
            a, b = text.split("->")
            sites = [Site(*part.strip().split("@", 1)) for part in (a, b)]
        except (ValueError, TypeError):
            raise ValueError(f"bad edge {text!r}: expected ACTOR@FILE:LINE->ACTOR@FILE:LINE") from None
        return cls(sites[0], sites[1])
