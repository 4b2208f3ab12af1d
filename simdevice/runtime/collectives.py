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

A collective whose ranks exchange different amounts (an all-to-all with split sizes, ``all_to_all`` of a list,
``reduce_scatter`` of a list, ``scatter``: its source sends, the other ranks only receive) is given each rank's
:class:`Splits`: what it sends to and receives from each peer, as NCCL runs it (one ``ncclSend`` and one
``ncclRecv`` per peer, in one group). Each rank's receive is handed what each peer sent to it, and the ranks must
agree pairwise (a send of 6 elements met by a receive of 4 is the program's error, as on a GPU: the wrong bytes, or
a hang).

Happens-before (:mod:`simdevice.runtime.sync`): the collective joins what
each rank's send is ordered after (its caller's past, and the work of the
caller's current stream, which NCCL's stream waited for); a rank's receive
carries that of the peers that had issued it by then, and what waits for the receive (the
work's ``wait()``, a sync) is ordered after every caller: at once where the
rank called last, else once the last peer calls (``sync.late``). Ranks that
share memory (CUDA IPC, shared host memory) are ordered by it as on a GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import torch

from simdevice.runtime import sync
from simdevice.runtime.clock import VectorClock
from simdevice.runtime.execution import Execution, HostActor
from simdevice.runtime.memory import Accessor, Memory, Ref, Storage, nbytes, ranges_without
from simdevice.runtime.streams import EventRecord, SimStream, StreamOp


class World:
    """The ranks of one process group in one simulation, and the collectives they issued."""

    def __init__(self, size: int) -> None:
        self.size = size
        #: actor name -> rank
        self.ranks: dict[str, int] = {}
        #: whether its ranks were started as a launcher starts them, each with the environment torchrun gives
        #: (``spawn_ranks``); False for processes of the program's that met in ``init_process_group``
        self.launched = True
        #: collectives issued so far, in NCCL order (the k-th of every rank is one instance)
        self.instances: list[Collective] = []
        self._issued: dict[int, int] = {}
        #: point-to-point messages by (sender, receiver), each a collective of two (sender 0, receiver 1), and how
        #: many each side posted: the k-th send from i to j is the k-th receive on j from i
        self.messages: dict[tuple[int, int], list[Collective]] = {}
        self._posted: dict[tuple[int, int, int], int] = {}
        #: host-side exchanges of Python objects, and how many each rank took part in
        self.object_rounds: list[ObjectRound] = []
        self.objects_issued: dict[int, int] = {}
        #: the other process groups of these ranks (``new_group``), by their id (1, 2, ...)
        self._groups: dict[int, World] = {}
        #: each group's members as ``new_group`` named them (global ranks in group-rank order), and the rank that
        #: named them first: every rank must name the same ones for the group of one id
        self._members: dict[int, tuple[tuple[int, ...], str]] = {}

    def group(self, gid: int) -> World:
        """Process group ``gid`` of these ranks: the world itself for 0, else a group that ``new_group`` made (the
        ``gid``-th one each rank made: torch requires every rank to make its groups in one order), of every rank, or
        of some (:meth:`new_group`: a world of its members). Each is a communicator of its own, as each
        ProcessGroupNCCL has its own: its collectives and point-to-point messages match only its own, in its own
        order."""
        if gid == 0:
            return self
        g = self._groups.get(gid)
        if g is None:
            g = self._groups[gid] = World(self.size)
            g.ranks = self.ranks
        return g

    def new_group(self, gid: int, members: tuple[int, ...], actor: str) -> None:
        """``actor`` made process group ``gid`` of ``members`` (global ranks, in the order of their ranks in the
        group), as every rank must, member or not (torch requires every rank to call ``new_group`` for every group,
        with the same ranks, in one order: a rank that names other ranks for it is the program's error, as on a GPU,
        where the ranks' groups would not match). A group of every rank in order is the world's ranks again
        (:meth:`group`); another is a world of its members alone, rank ``i`` of it the ``i``-th member, its
        collectives and point-to-point messages in group ranks, matched among its members only."""
        known = self._members.get(gid)
        if known is None:
            self._members[gid] = (members, actor)
        elif known[0] != members:
            raise RuntimeError(
                f"new_group #{gid}: {actor} made it of ranks {list(members)} where {known[1]} made it of ranks "
                f"{list(known[0])} (every rank must call new_group with the same ranks, in the same order)"
            )
        if gid in self._groups or members == tuple(range(self.size)):
            return
        by_rank = {r: a for a, r in self.ranks.items()}
        g = self._groups[gid] = World(len(members))
        g.ranks = {by_rank[m]: i for i, m in enumerate(members)}

    def instance_for(self, rank: int, actor: str, kind: str) -> Collective:
        """``rank``'s next collective (``kind``): the k-th of every rank is one instance; ranks that disagree on its
        kind are the program's error, as NCCL's would be (a hang, or one collective's bytes taken for another's)."""
        k = self._issued.get(rank, 0)
        self._issued[rank] = k + 1
        while len(self.instances) <= k:
            self.instances.append(Collective(len(self.instances), self.size))
        coll = self.instances[k]
        if coll.kind is None:
            coll.kind = kind
        elif coll.kind != kind:
            raise RuntimeError(
                f"collective #{coll.seq}: {actor} issued {kind} where another rank issued {coll.kind} "
                "(every rank must issue the same collectives in the same order)"
            )
        return coll

    def message_for(self, sender: int, receiver: int, side: int) -> Collective:
        """The next message from ``sender`` to ``receiver`` that ``side`` (0: the sender, 1: the receiver) posts."""
        k = self._posted.get((sender, receiver, side), 0)
        self._posted[(sender, receiver, side)] = k + 1
        channel = self.messages.setdefault((sender, receiver), [])
        while len(channel) <= k:
            channel.append(Collective(len(channel), 2, message=True))
        return channel[k]


@attrs.frozen
class Splits:
    """What one rank's call exchanges with each peer, in elements, by peer rank: ``sends[r]`` from its input (the
    input's elements in memory order, each peer's part after the one before), ``receives[r]`` into its output (the
    same, in the output). NCCL's send to ``r`` and receive from ``r`` of that many elements (none where 0)."""

    sends: tuple[int, ...]
    receives: tuple[int, ...]


class Collective:
    """One collective across the world (or one point-to-point message, a collective of two: ``message``): who
    issued it, what each part sent, the joined clock."""

    def __init__(self, seq: int, size: int, message: bool = False) -> None:
        self.seq = seq
        self.size = size
        #: a point-to-point message: its parts are the sender (0) and the receiver (1), not ranks
        self.message = message
        self.issued = 0
        self.sent: dict[int, torch.Tensor] = {}
        self.clock = VectorClock()
        #: what the first rank to issue it asked for (all_gather, all_reduce, ...)
        self.kind: str | None = None
        #: by rank, the elements and dtype of the tensor its call moves (what it sends, or receives if it sends
        #: nothing: a broadcast's receivers): NCCL takes one count and one type for every rank
        self.moved: dict[int, tuple[int, torch.dtype]] = {}
        #: by rank, what its call sends to and receives from each peer, where the ranks exchange different amounts
        #: (an all-to-all): then the sizes that must agree are those of each send and its receive
        self.splits: dict[int, Splits] = {}
        #: whether a rank issued it before a peer did (``sync.late``)
        self.late = False

    def check_agreed(self) -> None:
        """Raise where the ranks passed tensors of different sizes or dtypes (on a GPU: a hang, or bytes of one
        type read as another); for a collective with :class:`Splits`, where a rank's send to a peer is not the size
        of that peer's receive from it (on a GPU: a receive of fewer elements takes the wrong bytes, one of more
        waits for bytes that never come)."""
        by_rank = [self.moved[q] for q in sorted(self.moved)]
        who, order, each = (("a send and its receive", "the sender's, then the receiver's", "both")
                            if self.message else ("the ranks", "by rank", "every rank"))
        if self.splits:
            self._check_splits()
        elif len({n for n, _ in by_rank}) > 1:
            raise RuntimeError(f"{who} passed tensors of different sizes ({', '.join(str(n) for n, _ in by_rank)}"
                               f" elements, {order}): {each} must pass tensors of the same size")
        if len({d for _, d in by_rank}) > 1:
            names = ", ".join(str(d).removeprefix("torch.") for _, d in by_rank)
            raise RuntimeError(f"{who} passed tensors of different dtypes ({names}, {order}): {each} must pass "
                               "tensors of the same dtype")

    def _check_splits(self) -> None:
        for j in range(self.size):
            for r in range(self.size):
                sent, received = self.splits[j].sends[r], self.splits[r].receives[j]
                if sent != received:
                    raise RuntimeError(
                        f"the ranks disagree on what they exchange: rank {j} sends {sent} elements to rank {r}, "
                        f"which receives {received} from rank {j} (each rank must receive from a peer what that "
                        "peer sends it)"
                    )

    def addressed_to(self, slot: int) -> list[torch.Tensor]:
        """What each part sent that ``slot`` receives, by part: its whole send, or with :class:`Splits` the piece
        of it for ``slot``."""
        sent = [self.sent[q] for q in range(self.size)]
        if not self.splits:
            return sent
        pieces = []
        for q, t in enumerate(sent):
            start = sum(self.splits[q].sends[:slot])
            pieces.append(t[start:start + self.splits[q].sends[slot]])
        return pieces

    @property
    def complete(self) -> bool:
        return self.issued == self.size

    def all_sent(self) -> bool:
        return len(self.sent) == self.size


class Gather:
    """An async collective in flight: where its receive sits on the communication stream, and its rendezvous."""

    def __init__(self, rec: EventRecord, collective: Collective) -> None:
        self.rec, self.collective = rec, collective

    def record(self) -> EventRecord:
        """What waiting for it orders after: its receive, and with it every caller (``sync.late``)."""
        return self.rec


class Collectives:
    """The process groups of one run and the collectives issued on them."""

    def __init__(self, execution: Execution, memory: Memory) -> None:
        self._exec = execution
        self._memory = memory
        #: rank actors -> their world; an actor that is not a rank is a world of one of its own
        self._worlds: dict[str, World] = {}
        self._solo: dict[str, World] = {}
        #: the streams collectives were called under (each NCCL's stream waited for)
        self.called_under: set[str] = set()

    def world_of(self, actor: str, group: int = 0) -> tuple[World, int]:
        """``actor``'s process group ``group`` (0: its world; :meth:`World.group`) and its rank there."""
        w = self._worlds.get(actor)
        if w is not None:
            g = w.group(group)
            return g, g.ranks[actor]
        solo = self._solo.get(actor)
        if solo is None:
            solo = self._solo[actor] = World(1)
            solo.ranks[actor] = 0
        return solo.group(group), 0

    def new_group(self, a: HostActor, gid: int, members: tuple[int, ...]) -> None:
        """``a`` made process group ``gid`` of ``members`` (global ranks: :meth:`World.new_group`)."""
        self.world_of(a.process)[0].new_group(gid, members, a.process)

    def rank_of(self, actor: str) -> tuple[World, int] | None:
        """``actor``'s world and rank where it is a rank of a world :meth:`new_world` made (None: it is no rank)."""
        w = self._worlds.get(actor)
        return None if w is None else (w, w.ranks[actor])

    def new_world(self, ranks: list[HostActor]) -> World:
        if any(a.name in self._worlds for a in ranks):
            raise RuntimeError("spawn_ranks: one world per simulated run (actors rank0.. already exist)")
        world = World(len(ranks))
        for r, a in enumerate(ranks):
            world.ranks[a.name] = r
            self._worlds[a.name] = world
        return world

    def comm_stream(self, a: HostActor, group: int = 0) -> SimStream:
        """``a``'s communication stream of process group ``group`` (``nccl``, ``rank1.nccl`` for the world;
        ``rank1.pg1-nccl`` for the first group ``new_group`` made), made at its first collective: as each
        ProcessGroupNCCL takes a stream of its own, unordered with another group's."""
        return self._own_stream(a, "nccl" if group == 0 else f"pg{group}-nccl")

    def _own_stream(self, a: HostActor, name: str) -> SimStream:
        full = name if a.process == "host" else f"{a.process}.{name}"
        s = self._exec.streams.get(full)
        return s if s is not None else self._exec.new_stream(a, name)

    def _enqueue(
        self, s: SimStream, desc: str, counted: bool, duration: int, reads: list[Ref], writes: list[Ref], src: str
    ) -> StreamOp:
        """An operation on ``s`` whose accesses are checked like any kernel's."""
        epoch = sync.device_op(s)
        index = s.ops if counted else -1
        if counted:
            s.ops += 1
        op = StreamOp(s, f"{desc} #{index}" if counted else desc, index, duration)
        op.issued = self._memory.issue(Accessor(s.name, epoch, s.clock, desc, index, src), reads, writes)
        op.source = src  # (what an error of the operation names: the program's call)
        return op

    def collective(
        self,
        a: HostActor,
        kind: str,
        outs: list[Ref],
        ins: list[Ref],
        combine: Callable[[int, list[torch.Tensor]], list[torch.Tensor]],
        src: str,
        splits: Splits | None = None,
        group: int = 0,
    ) -> Gather:
        """Issue ``a``'s part of a collective: a send reading ``ins`` (nothing for a barrier; several tensors are
        sent as one run, one after the other), the rendezvous, and a receive writing ``outs`` with
        ``combine(rank, what every rank sent it)``: every rank's whole send, or with ``splits`` (this rank's
        :class:`Splits`) the piece of each rank's send addressed to this one. The k-th collective of every rank
        of a process group (``group``: :meth:`World.group`) is one instance, on the group's stream; ranks that
        disagree on its kind are the program's error, as NCCL's would be."""
        world, rank = self.world_of(a.process, group)
        if splits is not None and not len(splits.sends) == len(splits.receives) == world.size:
            raise ValueError(f"{kind}: split sizes for {len(splits.sends)} and {len(splits.receives)} ranks in a "
                             f"world of {world.size}")
        comm = self.comm_stream(a, group)
        self._after_caller(a, comm)
        coll = world.instance_for(rank, a.process, kind)
        if splits is not None:
            coll.splits[rank] = splits
        self._post(a, comm, coll, rank, f"{kind} (send)", ins, outs, src)
        self._rendezvous(comm, coll, f"every rank's send of collective {coll.seq} ({world.size} ranks)")
        self._land(comm, coll, rank, f"{kind} (receive)", ins, outs, combine, src)
        return Gather(sync.record(comm), coll)

    def p2p_stream(self, a: HostActor, peer: int, group: int = 0) -> SimStream:
        """``a``'s stream for point-to-point calls with ``peer`` in process group ``group`` (``rank0.p2p1-nccl``;
        ``rank0.pg1-p2p1-nccl`` in the first group ``new_group`` made), made at its first one: as ProcessGroupNCCL
        gives each pair of ranks a communicator and a stream of its own, apart from the collectives' (a
        ``batch_isend_irecv`` runs on the collectives' stream, :meth:`comm_stream`)."""
        return self._own_stream(a, f"p2p{peer}-nccl" if group == 0 else f"pg{group}-p2p{peer}-nccl")

    def point_to_point(self, a: HostActor, comm: SimStream, ops: list[tuple[int, Ref, bool]], src: str,
                       batch: bool = False, group: int = 0) -> Gather:
        """Issue ``a``'s sends and receives (``(peer, tensor, is_send)``) on ``comm``, as one NCCL group: every one
        is posted before any waits for its peer, so that a send and a receive of one group never hold each other up
        (a single call is a group of one). The k-th send from rank i to rank j is the k-th receive on j from i, as
        NCCL matches them; each completes once both sides are posted and the sender's bytes are read, and the
        receive lands them then. A send and a receive of the same pair each posted first on both ranks, in calls of
        their own, wait for each other forever, as on a GPU (NCCL's send blocks its stream until the receive).
        A ``batch`` (``batch_isend_irecv``) may send to the rank itself: NCCL matches it with the group's receive
        from itself (an all-to-all written as sends and receives has one such pair). Messages of process group
        ``group`` match only each other (:meth:`World.group`)."""
        world, rank = self.world_of(a.process, group)
        self._after_caller(a, comm)
        posted = []
        for peer, ref, is_send in ops:
            if not 0 <= peer < world.size or (peer == rank and not batch):
                raise ValueError(f"Invalid {'destination' if is_send else 'source'} rank {peer}: a rank of the world "
                                 f"({world.size} ranks) other than this one ({rank})")
            sender, receiver = (rank, peer) if is_send else (peer, rank)
            msg = world.message_for(sender, receiver, 0 if is_send else 1)
            ins, outs = ([ref], []) if is_send else ([], [ref])
            self._post(a, comm, msg, 0 if is_send else 1, "send" if is_send else "recv (posted)", ins, outs, src)
            posted.append((msg, is_send, ins, outs, f"message {msg.seq} from rank {sender} to rank {receiver}"))
        for msg, _, _, _, what in posted:
            self._rendezvous(comm, msg, f"both sides of {what}")
        for msg, is_send, ins, outs, _ in posted:
            self._land(comm, msg, 0 if is_send else 1, "send (done)" if is_send else "recv (receive)", ins, outs,
                       lambda slot, sent: [sent[0]] if slot == 1 else [], src)
        return Gather(sync.record(comm), posted[-1][0])

    def _after_caller(self, a: HostActor, comm: SimStream) -> None:
        cur = a.current_stream
        self.called_under.add(cur.name)
        # wait: NCCL's stream must not read the input before the caller's stream produced it
        self._exec.enqueue(comm, sync.stream_waits(comm, sync.record(cur), f"stream {cur.name}"))

    def _post(self, a: HostActor, comm: SimStream, coll: Collective, slot: int, desc: str, ins: list[Ref],
              outs: list[Ref], src: str) -> None:
        """``a``'s part of ``coll`` (its ``slot``: its rank, or sender 0 and receiver 1 of a message) issued: the
        counted operation that reads ``ins`` as it starts (a schedule's ``rank1.nccl#k`` delays this one)."""
        coll.issued += 1
        moved = ins if ins else outs[:1]
        if moved:
            coll.moved[slot] = (sum(d.numel() for _, d in moved), moved[0][1].dtype)
        sync.collective_issued(coll, a, comm)
        if not coll.complete:  # a peer has yet to call: what waits for this receive is ordered after it once it does
            coll.late = True
            sync.late(comm, coll)
        elif coll.late:  # the last call of one a peer issued first
            coll.late = False
            sync.every_rank_issued(coll, self._exec.streams.values())
        # A world of one is NCCL's one-rank path (``ncclLaunchOneRank``): no kernel, one ``cudaMemcpyAsync`` of the
        # input into the output, so the receive starts with the send and moves its bytes in order as any copy
        # (a copy that trails it reads its bytes, ``Memory.start``). Between ranks the receive lands in ring order.
        ex = self._exec
        send = self._enqueue(comm, desc, True, 0 if coll.size == 1 else ex.config.launch_ns, ins, [], src)
        data_in = [d for _, d in ins]
        values = ex.config.values  # race-only: no bytes move

        def sent() -> None:
            if not values or not data_in:
                coll.sent[slot] = torch.empty(0, device="cpu")
            elif len(data_in) == 1:
                coll.sent[slot] = in_memory_order(data_in[0]).clone()
            else:  # (several tensors: one run, each after the one before)
                coll.sent[slot] = torch.cat([in_memory_order(d) for d in data_in])

        send.start = sent
        ex.enqueue(comm, send)

    def _rendezvous(self, comm: SimStream, coll: Collective, what: str) -> None:
        """The marker ``comm`` passes once every part of ``coll`` is posted and has started."""
        self._exec.enqueue(comm, StreamOp(comm, what, -1, 0, ready=coll.all_sent))

    def _land(self, comm: SimStream, coll: Collective, slot: int, desc: str, ins: list[Ref], outs: list[Ref],
              combine: Callable[[int, list[torch.Tensor]], list[torch.Tensor]], src: str) -> None:
        """The receive of ``slot``'s part of ``coll``: it writes ``outs`` with ``combine(slot, every part's send)``
        as it completes."""
        ex = self._exec
        values = ex.config.values
        sync.collective_receive(comm, coll)
        recv = self._enqueue(comm, desc, False, ex.config.kernel_ns(2 * nbytes(outs)), [], outs, src)

        def parts(st: Storage, d: torch.Tensor, ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
            """Storage byte ranges within ``d`` (``st``'s, contiguous) as element ranges of ``d``."""
            first, size = st.byte_range(d)[0], d.element_size()
            return [((a - first) // size, (b - first) // size) for a, b in ranges]

        issued = recv.issued  # (the effect holds the accesses, not the operation that holds the effect: no cycle)

        def received() -> None:
            coll.check_agreed()  # (every rank has issued it: the receive comes after the rendezvous)
            if not values:
                return
            values_in = combine(slot, coll.addressed_to(slot))
            early = issued.landed_early
            for (st, d), v in zip(outs, values_in, strict=True):
                lo, hi = st.byte_range(d)
                flat, src = in_memory_order(d), v.reshape(-1)
                # what landed early holds what was written since (a later write's bytes stay)
                for a, b in parts(st, d, ranges_without(lo, hi, [(x, y) for s, x, y in early if s is st])):
                    self._memory.in_flight.before_write([flat[a:b]])
                    flat[a:b].copy_(src[a:b])

        def land_early(st: Storage, lo: int, hi: int) -> None:
            """Bytes ``[lo, hi)`` of ``st`` land now: a copy that trails this one over them completes first."""
            if not values:
                return
            coll.check_agreed()  # (a world of one: its one rank has issued it)
            values_in = combine(slot, coll.addressed_to(slot))
            for (s, d), v in zip(outs, values_in, strict=True):
                if s is st:
                    [(a, b)] = parts(st, d, [(lo, hi)])
                    flat = in_memory_order(d)
                    self._memory.in_flight.before_write([flat[a:b]])
                    flat[a:b].copy_(v.reshape(-1)[a:b])

        recv.finish = received
        recv.sweeps = coll.size == 1 and len(ins) == 1
        if recv.sweeps:  # NCCL's one-rank copy: its bytes are known from its start, so a part can land early
            recv.issued.early = land_early
        ex.enqueue(comm, recv)
        if coll.complete:
            # the last rank in: peers' comm streams may be parked at their rendezvous
            ex.kick_all()

    def all_gather(self, a: HostActor, out: Ref, inp: Ref, src: str, group: int = 0) -> Gather:
        """Issue ``a``'s part of an all-gather of ``inp`` (this rank's shard) into ``out`` (every rank's), in process
        group ``group``."""
        world, _ = self.world_of(a.process, group)
        (_, data_out), (_, data_in) = out, inp
        if data_out.numel() != data_in.numel() * world.size:
            raise ValueError(
                f"all_gather_into_tensor: output has {data_out.numel()} elements, "
                f"expected {data_in.numel() * world.size}"
            )
        return self.collective(a, "all_gather", [out], [inp], _concatenated, src, group=group)

    def exchange_objects(self, a: HostActor, obj: Any, kind: str = "all_gather_object", group: int = 0,
                         rec: EventRecord | None = None) -> list[Any]:
        """A host-side collective of Python objects (``all_gather_object``): ``a`` blocks until every rank of
        its world has contributed, and is then ordered after all of them. It takes its place among the world's
        collectives (torch runs it as NCCL collectives, in order with the others), so ranks that issue it where a
        peer issued another collective are told so (in process group ``group``). ``rec``: the caller's current
        stream as it called (an NCCL object collective: the host also waits until every rank's is done, and is
        ordered after it; a gloo collective of host tensors gives none)."""
        world, rank = self.world_of(a.process, group)
        world.instance_for(rank, a.process, kind)
        ex = self._exec
        k = world.objects_issued.get(rank, 0)
        world.objects_issued[rank] = k + 1
        while len(world.object_rounds) <= k:
            world.object_rounds.append(ObjectRound(world.size))
        r = world.object_rounds[k]
        r.objects[rank] = obj
        if rec is not None:
            r.records.append(rec)
        sync.publish(r, a)
        ex.changed()
        ex.block(a, f"every rank's object of exchange {k} ({world.size} ranks)",
                 lambda: len(r.objects) == world.size and all(x.done() for x in r.records))
        sync.observe(a, r)
        for x in r.records:
            sync.host_observes(a, x)
        return [r.objects[q] for q in range(world.size)]


def in_memory_order(t: torch.Tensor) -> torch.Tensor:
    """A dense tensor's elements as one run, in the order they lie in memory: what NCCL reads and writes, the bytes
    from the tensor's first on, whatever its layout (ProcessGroupNCCL takes a tensor dense in its own memory format,
    a channels-last image as a contiguous one). A view, a write to it a write to ``t``, where ``t`` is dense; a copy
    to read from where it is not."""
    if t.is_contiguous():
        return t.view(-1)
    laid = t.permute(sorted(range(t.dim()), key=t.stride, reverse=True))
    return laid.view(-1) if laid.is_contiguous() else laid.reshape(-1)


def _concatenated(rank: int, sent: list[torch.Tensor]) -> list[torch.Tensor]:
    return [torch.cat([t.reshape(-1) for t in sent])]


class ObjectRound:
    """One exchange of Python objects across a world: what each rank gave, and the clock of every giver."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.objects: dict[int, Any] = {}
        self.clock = VectorClock()
        #: each giver's current stream as it gave (an NCCL object collective's): the exchange waits for them
        self.records: list[EventRecord] = []
