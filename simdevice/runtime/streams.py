"""Virtual streams, events and the operations queued on streams.

A stream runs its queued operations one at a time, in order. An operation
reads its inputs when it starts and writes its outputs when it completes,
so a concurrent reader of its output sees the old bytes until then. Event
waits are markers in the queue: the stream does not pass one until the
recorded work is complete. Operations are counted per stream (markers are
not) exactly as ``reference.device.CudaDevice`` counts them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from simdevice.runtime.clock import VectorClock
from simdevice.runtime.memory import Issued


class StreamOp:
    """One queued operation: a kernel, a copy, or an event-wait marker."""

    __slots__ = (
        "desc",
        "duration",
        "finish",
        "index",
        "issued",
        "position",
        "ready",
        "source",
        "start",
        "stream",
        "sweeps",
    )

    def __init__(
        self,
        stream: SimStream,
        desc: str,
        index: int,
        duration: int,
        start: Callable[[], Any] | None = None,
        finish: Callable[[], None] | None = None,
        ready: Callable[[], bool] | None = None,
        issued: Issued | None = None,
    ) -> None:
        self.stream = stream
        self.desc = desc
        #: schedule index on the stream; -1 for markers
        self.index = index
        self.duration = duration
        self.start = start
        self.finish = finish
        #: for markers: whether the stream may pass it
        self.ready = ready
        #: the memory accesses it makes (checked when it starts, landed when it completes)
        self.issued = issued if issued is not None else Issued()
        self.position = 0
        #: a copy that moves its bytes in order and reads its source at its completion (see ``Memory.start``)
        self.sweeps = False
        #: the program's line that issued it, where known (what an error of the operation names)
        self.source: str | None = None


class SimStream:
    """A named virtual stream of one process."""

    def __init__(self, name: str, process: str, order: int) -> None:
        self.name = name
        self.process = process
        self.order = order
        self.queue: deque[StreamOp] = deque()
        self.busy = False
        #: queue items enqueued / completed so far (markers included)
        self.enqueued = 0
        self.completed = 0
        #: counted operations so far (the schedule's index)
        self.ops = 0
        #: the clock of the last enqueued item
        self.clock = VectorClock()
        self.delays: dict[int, int] = {}
        self.fired: set[int] = set()
        self.running: StreamOp | None = None
        #: queue positions an event with timing was recorded at -> when the stream got past them (ns)
        self.done_at: dict[int, int | None] = {}
        #: the CUDA graph capture this stream records into, while one is underway (``simdevice.runtime.graphs``)
        self.capture: Any = None
        #: collectives its work so far comes after that a peer has not issued yet (``sync.late``): their callers'
        #: clocks are joined once the last rank issues each
        self.late: list[Any] = []

    def idle(self) -> bool:
        return self.completed == self.enqueued

    def complete_one(self, now: int) -> None:
        """One more queue item (an operation or a marker) is done."""
        self.completed += 1
        if self.completed in self.done_at:
            self.done_at[self.completed] = now

    def __repr__(self) -> str:
        return f"<stream {self.name}>"


class EventRecord:
    """Where an event was recorded: the stream, its queue position, and its clock then."""

    __slots__ = ("capture", "clock", "late", "position", "stamped", "stream")

    def __init__(self, stream: SimStream, position: int, clock: VectorClock) -> None:
        self.stream = stream
        self.position = position
        self.clock = clock
        #: recorded on a capturing stream: (the capture, the stream's name, the nodes it had recorded then); else None
        self.capture: Any = None
        #: a timing record made when its stream was already past its position: the time it was made (each event
        #: is stamped when the stream reaches it, so two recorded at one position at different times differ)
        self.stamped: int | None = None
        #: collectives the recorded work comes after that a peer had not issued when it was recorded (``sync.late``)
        self.late: list[Any] | None = None

    def done(self) -> bool:
        return self.stream.completed >= self.position

    def time_ns(self) -> int | None:
        """When the stream got past the recorded work (None: not yet, or the record was made without timing)."""
        if self.stamped is not None:
            return self.stamped
        return self.stream.done_at.get(self.position)
