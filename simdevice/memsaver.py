"""A pausable memory pool on the simulated device (``torch_memory_saver``).

``region(tag)`` makes allocations of the current actor pausable;
``disable()`` routes allocations inside it to ordinary memory;
``pause(tag)`` unmaps every allocation of the tag (addresses kept, contents
lost unless the region was made with ``enable_cpu_backup=True``);
``resume(tag)`` maps them again. An access to unmapped memory is an
:class:`~simdevice.report.IllegalAccess`; an allocation made in a pausable
region while its tag is paused is served from a paused segment, as the
caching allocator does, and is unmapped from birth.

Minimal so far: a storage is one allocation; segments, blocks and reuse
come with the memory-saver mechanism.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

from simdevice.memory import Storage

if TYPE_CHECKING:
    from simdevice.device import SimDevice


class SimMemorySaver:
    def __init__(self, dev: SimDevice) -> None:
        self._dev = dev
        #: per actor: stack of active tags (None inside disable())
        self._tags: dict[str, list[str | None]] = {}
        self._paused: set[str] = set()
        self._backup: dict[str, bool] = {}
        self._storages: dict[str, list[Storage]] = {}
        self._saved: dict[int, object] = {}
        dev._ops.on_alloc = self._on_alloc

    def _stack(self) -> list[str | None]:
        return self._tags.setdefault(self._dev._sched.current().name, [])

    def _on_alloc(self, st: Storage) -> None:
        actor = self._dev._sched.current_or_none()
        stack = self._tags.get(actor.name, []) if actor else []
        tag = stack[-1] if stack else None
        if tag is None:
            return
        self._storages.setdefault(tag, []).append(st)
        if tag in self._paused:
            st.unmapped = f"allocated while memory_saver region {tag!r} was paused (a paused segment's block)"

    @contextlib.contextmanager
    def region(self, tag: str = "default", enable_cpu_backup: bool = False) -> Iterator[None]:
        self._backup[tag] = enable_cpu_backup
        self._stack().append(tag)
        try:
            yield
        finally:
            self._stack().pop()

    @contextlib.contextmanager
    def disable(self) -> Iterator[None]:
        self._stack().append(None)
        try:
            yield
        finally:
            self._stack().pop()

    def pause(self, tag: str | None = None) -> None:
        sched = self._dev._sched
        sched.host_step(f"memory_saver.pause({tag})")
        for t in [tag] if tag else list(self._storages):
            self._paused.add(t)
            for st in self._storages.get(t, []):
                if st.unmapped is None:
                    if self._backup.get(t):
                        self._saved[st.id] = st.data.clone()
                    st.unmapped = f"unmapped by memory_saver.pause({t!r}) at t={sched.now / 1e6:.3f}"
                    if st.data.dtype.is_floating_point:
                        st.data.fill_(math.nan)
        sched.progress()

    def resume(self, tag: str | None = None) -> None:
        sched = self._dev._sched
        sched.host_step(f"memory_saver.resume({tag})")
        for t in [tag] if tag else list(self._storages):
            self._paused.discard(t)
            for st in self._storages.get(t, []):
                st.unmapped = None
                saved = self._saved.pop(st.id, None)
                if saved is not None:
                    st.data.copy_(saved)  # type: ignore[arg-type]
        sched.progress()
