"""Vector clocks: the happens-before order between host actors and streams.

Every host actor and every stream owns one component. An operation enqueued
on a stream carries the join of the stream's clock and the enqueuing host's
clock; events snapshot a stream's clock; waits, synchronizations, shared
values, queues and collectives ``join``. Access ``a`` happens before access
``b`` when ``b``'s clock has seen ``a``'s own tick (an epoch check).
"""

from __future__ import annotations

ActorId = str


class VectorClock:
    __slots__ = ("_c",)

    def __init__(self, components: dict[ActorId, int] | None = None) -> None:
        self._c: dict[ActorId, int] = dict(components) if components else {}

    def tick(self, actor: ActorId) -> int:
        """Advance ``actor``'s own component; return the new epoch."""
        v = self._c.get(actor, 0) + 1
        self._c[actor] = v
        return v

    def join(self, other: VectorClock) -> None:
        c = self._c
        for k, v in other._c.items():
            if c.get(k, 0) < v:
                c[k] = v

    def get(self, actor: ActorId) -> int:
        return self._c.get(actor, 0)

    def copy(self) -> VectorClock:
        c = VectorClock.__new__(VectorClock)  # (no __init__: a copy comes with every event record and free)
        c._c = self._c.copy()
        return c

    def happens_before(self, actor: ActorId, epoch: int) -> bool:
        """Whether the event ``epoch`` of ``actor`` is ordered before this clock."""
        return epoch <= self._c.get(actor, 0)

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}:{v}" for k, v in sorted(self._c.items()))
        return f"VC({inner})"
