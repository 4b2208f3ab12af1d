"""Async collectives on the simulated device, for one rank or several (``torch.distributed`` with NCCL).

Ranks are host actors of one simulation: ``dev.spawn_ranks(fn, world_size)``
starts actors ``rank0``, ``rank1``, ... each running ``fn(dev, *args)`` with
its own streams (``rank1.default``, ``rank1.nccl``, ...) and ``dev.rank`` /
``dev.world_size`` answering for the calling actor. A host actor that was
not spawned as a rank (``host``, a worker) is a world of one.

An all-gather on one rank is three items on that rank's communication stream
(``nccl``, or ``rank1.nccl``), which first waits for the caller's current
stream, as NCCL does:

1. the *send*: a counted operation that reads the rank's input when it starts
   (a schedule's ``rank1.nccl#k`` delays this one);
2. a rendezvous marker the stream passes only once every rank of the world
   has issued the same collective (the k-th collective of each rank matches,
   as NCCL requires) and every rank's send has run: a rank never completes a
   collective that a peer has not reached;
3. the *receive*: an uncounted operation that writes the whole output from
   the sends' data when it completes.

Happens-before: the collective joins the clocks of the callers that issued
it; a rank's receive carries the clocks of the peers that had issued it by
then, and ``work.wait()`` joins all of them once every rank has. The ranks
share no memory, so this only sharpens reports, never creates one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from simdevice.clock import VectorClock
from simdevice.streams import EventRecord, SimStream, StreamOp
from simdevice.tensor import _user_source

if TYPE_CHECKING:
    from simdevice.device import SimDevice
    from simdevice.scheduler import HostActor

aten = torch.ops.aten


class World:
    """The ranks of one process group in one simulation, and the collectives they issued."""

    def __init__(self, size: int) -> None:
        self.size = size
        #: actor name -> rank
        self.ranks: dict[str, int] = {}
        #: collectives issued so far, in NCCL order (the k-th of every rank is one instance)
        self.instances: list[_Collective] = []
        self._issued: dict[int, int] = {}

    def instance_for(self, rank: int) -> _Collective:
        k = self._issued.get(rank, 0)
        self._issued[rank] = k + 1
        while len(self.instances) <= k:
            self.instances.append(_Collective(len(self.instances), self.size))
        return self.instances[k]


class _Collective:
    """One all-gather across the world: who issued it, what each rank sent, the joined clock."""

    def __init__(self, seq: int, size: int) -> None:
        self.seq = seq
        self.size = size
        self.issued = 0
        self.sent: dict[int, torch.Tensor] = {}
        self.clock = VectorClock()

    @property
    def complete(self) -> bool:
        return self.issued == self.size

    def all_sent(self) -> bool:
        return len(self.sent) == self.size


_SOLO = "__solo__"


def _world_of(dev: SimDevice, actor: str) -> tuple[World, int]:
    w = dev._worlds.get(actor)
    if w is not None:
        return w, w.ranks[actor]
    # an actor that is not a rank is a world of one of its own
    solo = dev._worlds.get(_SOLO + actor)
    if solo is None:
        solo = dev._worlds[_SOLO + actor] = World(1)
        solo.ranks[actor] = 0
    return solo, 0


def rank_of(dev: SimDevice) -> int:
    a = dev._sched.current_or_none()
    return 0 if a is None else _world_of(dev, a.name)[1]


def world_size_of(dev: SimDevice) -> int:
    a = dev._sched.current_or_none()
    return 1 if a is None else _world_of(dev, a.name)[0].size


def spawn_ranks(dev: SimDevice, fn: Callable[..., Any], world_size: int, args: tuple[Any, ...] = ()) -> list[Any]:
    """Run ``fn(dev, *args)`` on ranks ``rank0..`` of a new world; wait for all; return their results."""
    if world_size < 1:
        raise ValueError(f"spawn_ranks: world_size must be >= 1, got {world_size}")
    sched = dev._sched
    parent = sched.host_step(f"spawn_ranks({world_size})")
    if "rank0" in sched.actors:
        raise RuntimeError("spawn_ranks: one world per simulated run (actors rank0.. already exist)")
    world = World(world_size)
    actors: list[HostActor] = []
    for r in range(world_size):
        a = sched.new_actor(f"rank{r}", parent)
        world.ranks[a.name] = r
        dev._worlds[a.name] = world
        actors.append(a)
    for a in actors:
        sched.start_actor(a, lambda: fn(dev, *args), dev._enter)
    sched.progress()
    sched.block(parent, f"ranks 0..{world_size - 1} to exit", lambda: all(a.state == "done" for a in actors))
    for a in actors:
        parent.clock.join(a.clock)
    return [a.result for a in actors]


class SimWork:
    """The handle of an async collective."""

    def __init__(self, dev: SimDevice, rec: EventRecord, coll: _Collective | None = None) -> None:
        self._dev, self._rec, self._coll = dev, rec, coll

    def _record(self) -> EventRecord:
        rec = self._rec
        if self._coll is None or not self._coll.complete:
            return rec
        clock = rec.clock.copy()
        clock.join(self._coll.clock)
        return EventRecord(rec.stream, rec.position, clock)

    def wait(self) -> None:
        a = self._dev._sched.host_step("work.wait")
        # wait: the caller's stream must not read the output before the receive landed
        self._dev._wait_marker(a.current_stream, self._record(), "collective")

    def is_completed(self) -> bool:
        a = self._dev._sched.host_step("work.is_completed")
        if self._rec.done():
            a.clock.join(self._record().clock)
            return True
        return False


def _comm_stream(dev: SimDevice, a: HostActor) -> SimStream:
    full = "nccl" if a.name == "host" else f"{a.name}.nccl"
    s = dev._sched.streams.get(full)
    return s if s is not None else dev._sched.new_stream(a, "nccl")


def _enqueue(
    dev: SimDevice,
    s: SimStream,
    desc: str,
    counted: bool,
    duration: int,
    reads: list[torch.Tensor],
    writes: list[torch.Tensor],
    src: str,
) -> StreamOp:
    """Enqueue an operation on ``s`` whose accesses are checked like any kernel's."""
    ops, memory = dev._ops, dev._sched.memory
    epoch = s.clock.tick(s.name)
    index = s.ops if counted else -1
    if counted:
        s.ops += 1
    op = StreamOp(s, f"{desc} #{index}" if counted else desc, index, duration)
    for x in reads:
        st = ops._storage_of(x)
        if st is not None:
            acc = ops._access(s.name, epoch, desc, index, "read", st, x, src, 0)
            op.reads.append((st, acc, memory.issue_read(st, acc, s.clock)))
    for x in writes:
        st = ops._storage_of(x)
        if st is not None:
            acc = ops._access(s.name, epoch, desc, index, "write", st, x, src, 0)
            op.writes.append((st, acc, memory.issue_write(st, acc, s.clock)))
    return op


def all_gather_into_tensor(
    dev: SimDevice, output: torch.Tensor, input: torch.Tensor, async_op: bool = True
) -> SimWork | None:
    sched = dev._sched
    a = sched.host_step("all_gather_into_tensor")
    world, rank = _world_of(dev, a.name)
    if output.numel() != input.numel() * world.size:
        raise ValueError(
            f"all_gather_into_tensor: output has {output.numel()} elements, expected {input.numel() * world.size}"
        )
    src = _user_source()
    comm = _comm_stream(dev, a)
    cur = a.current_stream
    # wait: NCCL's stream must not read the input before the caller's stream produced it
    dev._wait_marker(comm, EventRecord(cur, cur.enqueued, cur.clock.copy()), f"stream {cur.name}")
    coll = world.instance_for(rank)
    coll.issued += 1
    coll.clock.join(a.clock)
    comm.clock.join(a.clock)
    out, inp = output.view(-1), input.reshape(-1)
    data_in, data_out = dev._ops._data(inp), dev._ops._data(out)

    send = _enqueue(dev, comm, "all_gather (send)", True, sched.config.launch_ns, [inp], [], src)

    def sent() -> None:
        coll.sent[rank] = data_in.clone()

    send.start = sent
    sched.enqueue(comm, send)

    rendezvous = StreamOp(
        comm, f"every rank's send of collective {coll.seq} ({world.size} ranks)", -1, 0, ready=coll.all_sent
    )
    sched.enqueue(comm, rendezvous)

    comm.clock.join(coll.clock)
    nbytes = output.numel() * output.element_size()
    recv = _enqueue(dev, comm, "all_gather (receive)", False, sched.config.kernel_ns(2 * nbytes), [], [out], src)

    def received() -> None:
        data_out.copy_(torch.cat([coll.sent[q].reshape(-1) for q in range(world.size)]))

    recv.finish = received
    sched.enqueue(comm, recv)
    rec = EventRecord(comm, comm.enqueued, comm.clock.copy())
    if coll.complete:
        # the last rank in: peers' comm streams may be parked at their rendezvous
        sched.kick_all()
    work = SimWork(dev, rec, coll)
    if not async_op:
        work.wait()
        return None
    return work
