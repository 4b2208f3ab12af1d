"""CUDA graphs: stream work captured once and replayed (``torch.cuda.CUDAGraph``, ``torch.cuda.graph``).

Between a graph's ``capture_begin`` and ``capture_end``, what the program issues on the capturing stream is recorded,
not run: one :class:`Node` per operation, with the bytes it reads and writes, where it was issued and what it
computes. A stream that waits for an event recorded in the capture joins it (CUDA's fork), and what it issues is
recorded too, until the capture ends; the capturing stream must have waited for each joined stream's last node by
then (CUDA's join). A replay issues the nodes again in the order they were captured, each an operation as any other:
checked against every other stream's and host's accesses as it is issued, and computed on the bytes as they are when
it runs. The capture stream's nodes go on the stream current then; another captured stream's (a branch of the graph)
on a stream of the graph's own (``graph1-side``), with the waits between the branches the capture made, so that two
branches run side by side where the capture let them (a race between them is found, at the replay's line).

Memory allocated on a capturing stream comes from the graph's private pool (``pool=``: another graph's or a
``MemPool``'s, shared), which no ordinary allocation takes and ``empty_cache`` leaves while a graph (or the
``MemPool`` object) holds it, as CUDA's caching allocator keeps it. What CUDA refuses during a capture raises CUDA's
error there: a host wait for captured work (``.item()``, a blocking copy, an op whose output size needs its values),
``synchronize()`` (from any thread of the process, in any capture mode), a stream's ``synchronize()`` or ``query()``
of a capturing stream, an event's ``query()``, ``synchronize()`` or ``elapsed_time`` of an event recorded in the
capture, a capturing stream's wait for work outside the capture. Such an error invalidates the capture: its
``capture_end`` then raises, as CUDA's does. torch refuses a copy between the capturing stream and pageable host
memory (``.cpu()`` too) itself, before CUDA is called: the capture goes on. A collective in a capture is not
simulated (``NotImplementedError``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from simdevice.runtime.memory import Ref
from simdevice.runtime.streams import EventRecord, SimStream

#: CUDA's errors (``cudaGetErrorString``), as torch raises them (``CUDA error: ...``)
UNSUPPORTED = "CUDA error: operation not permitted when stream is capturing"
INVALIDATED = "CUDA error: operation failed due to a previous error during capture"
UNJOINED = "CUDA error: capturing stream has unjoined work"
#: torch's own check of a copy between the host and the device in a capture (before CUDA is called: the capture goes on)
PAGEABLE = ("Cannot copy between CPU and CUDA tensors during CUDA graph capture unless the CPU tensor is pinned. "
            "Please use tensor.pin_memory() or allocate the tensor with pin_memory=True.")
ISOLATION = "CUDA error: dependency created on uncaptured work in another stream"
CAPTURED_EVENT = "CUDA error: operation not permitted on an event last recorded in a capturing stream"

#: the capture modes ``capture_begin`` takes (``cudaStreamCaptureMode``)
MODES = ("global", "thread_local", "relaxed")


def cuda_error(message: str) -> RuntimeError:
    """The exception torch raises for a failed CUDA call (``torch.AcceleratorError``, a ``RuntimeError``)."""
    return getattr(torch, "AcceleratorError", RuntimeError)(message)


class Node:
    """One operation of a captured graph: what :meth:`Runtime.enqueue` was given for it (device memory as aliases of
    its bytes, which keep no block allocated), and ``again``, which gives a fresh computation of it (its start and
    finish) for each replay (None: an operation that computes nothing)."""

    __slots__ = ("again", "desc", "duration", "held", "nbytes", "reads", "source", "stream", "sweeps", "writes")

    def __init__(self, desc: str, duration: int, reads: list[Ref], writes: list[Ref], source: str, sweeps: bool,
                 nbytes: int, again: Callable[[], tuple[Any, Any]] | None) -> None:
        self.desc, self.duration, self.reads, self.writes, self.source = desc, duration, reads, writes, source
        self.sweeps, self.nbytes, self.again = sweeps, nbytes, again
        #: the device storages it touches that held a block outside the graphs' pools as it was captured
        self.held: list[Any] = []
        #: the name of the stream that captured it
        self.stream = ""


class Sleep:
    """``torch.cuda._sleep`` on a captured stream: a kernel of the graph's, which each replay runs."""

    __slots__ = ("ns", "stream")

    def __init__(self, stream: str, ns: int) -> None:
        self.stream, self.ns = stream, ns


class Wait:
    """A wait of one captured stream for another in a capture (``stream`` waited for ``on``'s work so far): a
    dependency between two branches of the graph, made again between their replay streams."""

    __slots__ = ("on", "stream")

    def __init__(self, stream: str, on: str) -> None:
        self.stream, self.on = stream, on


class SimGraph:
    """A ``torch.cuda.CUDAGraph``: its private pool, its nodes once captured (None before), its capture while one
    is underway."""

    def __init__(self, gid: int) -> None:
        self.id = gid
        self.label = f"graph{gid}"
        #: the private pool's handle (torch's ``(id, 0)`` for a graph's own, ``(0, id)`` from ``graph_pool_handle``)
        #: and the allocator's tag for it; set at capture_begin
        self.handle: tuple[int, int] | None = None
        self.pool: str | None = None
        self.nodes: list[Node | Wait | Sleep] | None = None
        self.capture: Capture | None = None
        #: the stream the capture began on (its nodes replay on the replay's stream), and the streams the other
        #: captured streams' nodes replay on (made at the first replay that needs each: a graph's branches)
        self.origin = ""
        self.branches: dict[str, SimStream] = {}


class Capture:
    """A capture underway: the graph, the stream it began on (``origin``), the streams that joined it, the process
    capturing (a device synchronization by any of its threads conflicts with it, whatever the capture's mode), and what
    each of its streams recorded and waited for (the origin must have waited for every joined stream's last node by the
    end: CUDA's join)."""

    def __init__(self, graph: SimGraph, origin: SimStream, process: str) -> None:
        self.graph, self.origin, self.process = graph, origin, process
        self.streams: list[SimStream] = [origin]
        self.nodes: list[Node | Wait | Sleep] = []
        #: per stream, the nodes it recorded so far; per stream, what it waited for in the capture (directly or
        #: through another's wait): per stream waited for, how many of its nodes
        self.counts: dict[str, int] = {origin.name: 0}
        self.covers: dict[str, dict[str, int]] = {}
        #: what invalidated it (an error CUDA raised during it), else None
        self.invalid: str | None = None

    def fail(self, message: str) -> RuntimeError:
        """CUDA's error ``message``, the capture invalidated by it."""
        if self.invalid is None:
            self.invalid = message
        return cuda_error(message)

    def add(self, s: SimStream, node: Node) -> int:
        node.stream = s.name
        self.nodes.append(node)
        self.counts[s.name] = self.counts.get(s.name, 0) + 1
        return len(self.nodes) - 1

    def mark(self, rec: EventRecord, s: SimStream) -> None:
        """``rec``, recorded on capturing stream ``s``: a point in this capture (the nodes ``s`` recorded so far,
        and what ``s`` had waited for then)."""
        rec.capture = (self, s.name, self.counts.get(s.name, 0), dict(self.covers.get(s.name, {})))


class Graphs:
    """The run's graphs and captures."""

    def __init__(self) -> None:
        self._graphs = 0
        self._pools = 0
        #: the captures underway
        self.active: list[Capture] = []
        #: how many hold each private pool (graphs captured into it and not reset since, its ``MemPool`` object)
        self.holders: dict[str | None, int] = {}
        #: per process, the stream ``torch.cuda.graph`` captures on where it is given none (torch makes it once)
        self.default_streams: dict[str, SimStream] = {}
        #: the streams that recorded a node in some capture; the allocator's tags of the private pools (the graphs'
        #: and the ``MemPool``s'), and their ids
        self.captured_on: set[str] = set()
        self.pools: set[str | None] = set()
        self.ids: dict[str | None, tuple[int, int]] = {}

    def new(self) -> SimGraph:
        self._graphs += 1
        return SimGraph(self._graphs)

    def pool_handle(self) -> tuple[int, int]:
        """``torch.cuda.graph_pool_handle()``: a new pool's handle."""
        self._pools += 1
        return (0, self._pools)

    def capturing(self, process: str) -> Capture | None:
        """A capture of ``process`` underway: a device synchronization from any of its threads conflicts with it,
        whatever its mode (on an H100: refused, and the capture invalidated, in all three modes)."""
        for cap in self.active:
            if cap.process == process:
                return cap
        return None

    def pool_for(self, handle: tuple[int, int] | None) -> tuple[tuple[int, int], str]:
        """The handle and allocator tag of the pool a graph captures into: ``handle``'s where given (shared with the
        graphs that used it), else a pool of its own."""
        if handle is None:
            self._pools += 1
            handle = (self._pools, 0)
        key = (int(handle[0]), int(handle[1]))
        tag = f"private pool {key[0]}.{key[1]}"
        self.pools.add(tag)
        self.ids[tag] = key
        return key, tag

    def hold(self, pool: str) -> None:
        self.holders[pool] = self.holders.get(pool, 0) + 1

    def let_go(self, pool: str) -> bool:
        """A holder of ``pool`` (a graph, reset; a ``MemPool``, dropped) let go; whether none holds it now."""
        left = self.holders.get(pool, 0) - 1
        if left > 0:
            self.holders[pool] = left
            return False
        self.holders.pop(pool, None)
        return True
