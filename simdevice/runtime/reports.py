"""Structured reports of what went wrong in one simulated run, and the run's sink that collects them.

Each report is an attrs value first and text second: ``str(report)`` is
pinned by tests. Kinds:

- :class:`Race`: two conflicting accesses with no happens-before edge
  between them (schedule-independent: found whatever the timing).
- :class:`StaleRead`: a read that, under this schedule, saw another version
  of memory than the program issued before it (what corrupts on a GPU).
- :class:`Deadlock`: no actor can make progress; names what each waits for.
- :class:`IllegalAccess`: an access to unmapped (paused) memory.
- :class:`HostError`: an exception raised by a host actor's code.
- :class:`StepLimit`: the run made more host steps than its bound (``SimConfig.max_host_steps``) without ending.
"""

from __future__ import annotations

import linecache
import os
import re
import sys
from typing import Any, Literal

import attrs

from reference.naming import short_path
from simdevice.runtime.config import UNIT_NS

#: a free is the program dropping an allocation: as of that point its stream no longer owns the bytes; an unmap is a
#: memory-saver pause taking a segment's memory away (a write, for ordering: nothing may access the bytes across it)
AccessKind = Literal["read", "write", "free", "unmap"]


def fmt_time(ns: int) -> str:
    return f"t={ns / UNIT_NS:.3f}"


@attrs.define(unsafe_hash=True)
class Access:
    """One read or write of a byte range, by a stream operation or a host step. Never changed once made, but not
    frozen: one is made for every access of every operation, and a frozen class's ``__init__`` (a call of
    ``object.__setattr__`` per field) costs four times a plain one's. Equal and hashed by value, as a frozen one."""

    actor: str
    #: epoch of ``actor`` at this access (its own vector-clock component)
    epoch: int
    op: str
    #: index of the operation on its actor, as schedules count them (-1 for uncounted)
    index: int
    kind: AccessKind
    storage: str
    lo: int
    hi: int
    source: str
    #: write id issued for a write; for a read, the write id the program expected to see
    version: int
    #: "stream" for a stream operation, "host" for a host step ("thread": one of a thread the program started)
    on: str = "stream"
    #: the order the program issued it in (one count per operation or host step over the whole run): which of two
    #: racing accesses the program meant first (not part of a report's identity or text)
    seq: int = attrs.field(default=0, eq=False, repr=False)
    #: for a strided view with gaps between its bytes, the contiguous ranges it covers within ``lo:hi`` (what is
    #: checked); None: all of ``lo:hi`` (not part of a report's identity or text, which name ``lo:hi``)
    pieces: tuple[tuple[int, int], ...] | None = attrs.field(default=None, eq=False, repr=False)

    def where(self) -> str:
        idx = f" #{self.index}" if self.index >= 0 else ""
        return f"{self.op} on {self.on} {self.actor}{idx} ({self.source})"

    def range(self) -> str:
        return f"{self.storage}[{self.lo}:{self.hi}]"


@attrs.frozen
class Race:
    """Conflicting accesses unordered by happens-before."""

    current: Access
    previous: Access
    #: when the two accesses belong to different allocations of the same bytes: the free that handed the block on
    freed: Access | None = None

    kind = "race"

    def __str__(self) -> str:
        c, p = self.current, self.previous
        verb = {"read": "reads", "write": "writes", "free": "frees", "unmap": "unmaps"}
        past = {"read": "read", "write": "wrote", "free": "freed", "unmap": "unmapped"}
        if c.kind == "unmap":
            # a pause is a host step: the stream's access, issued before it and not waited for, may still be in
            # flight when its memory goes
            return (
                f"race: {c.where()} unmaps {c.storage}, whose {p.range()} {p.where()} {past[p.kind]}; no "
                "happens-before edge orders them: that access may still be in flight when the pause unmaps its "
                "memory (a pause is a host step and does not wait for the streams: make the host wait for that "
                "stream first, e.g. torch.cuda.synchronize() before the pause)"
            )
        reused = ""
        if self.freed is not None:
            reused = f" as {p.storage}, before the {self.freed.where()} handed its block on"
        return (
            f"race: {c.where()} {verb[c.kind]} {c.range()}, which {p.where()} "
            f"{past[p.kind]}{reused}; no happens-before edge orders them"
        )


@attrs.frozen
class UnorderedFree:
    """A block freed while another stream's access of it was not ordered before the free (no ``record_stream``).
    Not a race by itself: one only if a reuse of the block is not ordered after that access (then reported)."""

    free: Access
    other: Access

    def __str__(self) -> str:
        past = {"read": "read", "write": "wrote", "free": "freed"}
        o = self.other
        return (
            f"{self.free.where()} freed {self.free.storage}, which {o.where()} {past[o.kind]} unordered before the "
            "free (no record_stream on that stream): any reuse of the block must be ordered after it"
        )


@attrs.frozen
class StaleRead:
    """A read that saw a different version than the one issued before it."""

    read: Access
    #: the write the program issued last before the read (None: uninitialized memory)
    expected: Access | None
    #: the write whose data the read actually saw (None: uninitialized memory)
    seen: Access | None
    #: writes issued before the read that had not landed (negative: later writes that had)
    stale_by: int
    time_ns: int
    #: what the bytes held before any write (a None ``expected`` or ``seen``): uninitialized memory, or a pinned
    #: buffer's values as the host made it
    before: str = "uninitialized memory"

    kind = "stale-read"

    def __str__(self) -> str:
        r = self.read
        seen = self.seen.where() if self.seen else self.before
        expected = self.expected.where() if self.expected else self.before
        if self.stale_by >= 0:
            n = self.stale_by
            how = f"stale by {n} write{'s' if n != 1 else ''}: expected the data of {expected}"
        else:
            how = f"saw a write issued after it: expected the data of {expected}"
        return f"stale read: {r.where()} read {r.range()} at {fmt_time(self.time_ns)}; it saw {seen}; {how}"


@attrs.frozen
class Deadlock:
    """Every live actor waits for something that can no longer happen."""

    #: (actor, what it waits for), in actor order
    waits: tuple[tuple[str, str], ...]
    time_ns: int
    #: why the run was judged stuck, when it is not plain (e.g. a step bound)
    reason: str = ""

    kind = "deadlock"

    def __str__(self) -> str:
        inner = "; ".join(f"{a} waits for {w}" for a, w in self.waits)
        reason = f"{self.reason}; " if self.reason else ""
        return f"deadlock at {fmt_time(self.time_ns)}: {reason}{inner}"


@attrs.frozen
class StepLimit:
    """The run took more host steps than its bound without ending: not a deadlock (it was still moving), and not a
    verdict either (what came after the bound was not run)."""

    bound: int
    time_ns: int

    kind = "step-limit"

    def __str__(self) -> str:
        return (f"step limit at {fmt_time(self.time_ns)}: the run made {self.bound} host steps without ending "
                "(raise it: SimConfig(max_host_steps=N), or --max-steps N on the command line)")


@attrs.frozen
class IllegalAccess:
    """An access to memory that is not mapped (paused by the memory saver, or freed)."""

    access: Access
    allocation: str
    reason: str

    kind = "illegal-access"

    def __str__(self) -> str:
        a = self.access
        return f"illegal access: {a.where()} {a.kind}s {a.range()} of {self.allocation}, {self.reason}"


@attrs.frozen
class HostError:
    """Host code of an actor raised; the run stopped there."""

    actor: str
    error: str
    source: str

    kind = "host-error"

    def __str__(self) -> str:
        return f"host error: {self.actor} raised {self.error} ({self.source})"


Report = Race | StaleRead | Deadlock | IllegalAccess | HostError | StepLimit


class ReportSink:
    """What one run reported, in the order it was found. Every part of the runtime reports here."""

    def __init__(self) -> None:
        self.items: list[Report] = []

    def add(self, report: Report) -> None:
        self.items.append(report)

    def __len__(self) -> int:
        return len(self.items)


#: the ops of collectives, as their stream operations are named (``all_gather (receive)``)
_COLLECTIVE_OPS = ("all_gather", "all_reduce", "reduce_scatter", "broadcast", "all_to_all")


def process_of(actor: str, on: str | None = None) -> str:
    """The simulated process an actor belongs to, from its name: ``rank1.nccl`` and ``rank1`` -> ``rank1``,
    ``worker0.d2h`` -> ``worker0``; the main host and its streams (``host``, ``d2h``) -> ``host``. Where the name is
    an access's (``on``, "host", "thread" or "stream"), any process: a host step's actor is its process (``saver``,
    ``rank1.saver``), a stream's process is its name but the stream's own (``saver.side`` -> ``saver``,
    ``rank1.saver.side`` -> ``rank1.saver``); without it, a process the program named (``saver``) is not told from
    a stream of the main host's."""
    if on == "host":
        return actor
    if on in ("stream", "thread"):  # (a thread the program started is named as its process's streams are)
        return actor.rsplit(".", 1)[0] if "." in actor else "host"
    if "." in actor:
        return actor.split(".", 1)[0]
    return actor if re.fullmatch(r"(rank|worker)\d+", actor) else "host"


def is_collective(actor: str, op: str) -> bool:
    """Whether an operation is a collective's (on a communication stream, or named as one)."""
    return actor.endswith("nccl") or op.startswith(_COLLECTIVE_OPS)


def summarize(reports: tuple[Report, ...] | list[Report]) -> str:
    """One line per report kind with its count, e.g. ``2 stale-read, 1 race``."""
    counts: dict[str, int] = {}
    for r in reports:
        counts[r.kind] = counts.get(r.kind, 0) + 1
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "clean"


# ---------------------------------------------------------------------------
# Source lines: where the program made a call, skipping the simulator, torch and the standard library.

_SIMDEVICE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
#: code of the project that issues operations on the program's behalf, never the program's own line; the
#: harness under simdevice/programs/ is program code
_OWN = (_SIMDEVICE,)
_PROGRAM_CODE = (os.path.join(_SIMDEVICE, "programs") + os.sep,)
_REFERENCE = os.path.join(os.path.dirname(_SIMDEVICE.rstrip(os.sep)), "reference") + os.sep
_CONTRACT = tuple(os.path.join(_REFERENCE, m) for m in ("contract.py", "cuda.py", "device.py"))
#: libraries whose frames are never the program's line (``typing_extensions``: its ``deprecated`` wrapper, around
#: torch's ``_all_gather_base`` that Megatron calls)
_LIBRARIES = ("/torch/", "/numpy/", "<frozen", "/contextlib.py", "/threading.py", "/weakref.py",
              "/typing_extensions.py")


_INTERNAL: dict[str, bool] = {}


def internal_file(filename: str) -> bool:
    """Whether a frame of ``filename`` is the simulator's own, the device contract's or a library's (torch's
    among them), not the program's."""
    known = _INTERNAL.get(filename)
    if known is None:
        path = filename if filename.startswith("<") else os.path.abspath(filename)
        known = own_file(filename) or any(s in path.replace("\\", "/") for s in _LIBRARIES)
        _INTERNAL[filename] = known
    return known


#: (code, instruction offset) -> its ``dir/file.py:LINE`` (a program has few lines that call the device, each called
#: often: keyed by the offset, ``f_lasti``, so that a line's number, which Python finds by walking the code's whole
#: line table, is looked up once); relative to the working directory as the run started (``_SOURCES_CWD``), and
#: kept from run to run while runs start there
_SOURCES: dict[tuple[Any, int], str] = {}
_SOURCES_CWD: list[str | None] = [None]


def forget_sources() -> str:
    """A run starts: the names kept stand while the working directory is the one they were made in (returned)."""
    cwd = os.getcwd()
    if cwd != _SOURCES_CWD[0]:
        _SOURCES.clear()
        _SOURCES_CWD[0] = cwd
    return cwd


def user_source(skip: int = 0) -> str:
    """The first frame outside the simulator and torch: where the program made this call (``dir/file.py:LINE``).
    ``skip``: how many frames above the caller's are the simulator's own for certain (passed over unseen: Python
    makes a frame's object only for the frames a walk looks at). Where no frame is the program's (a thread a library
    started to do the program's work: Distributed Checkpoint's staging), the innermost frame that is not the
    simulator's own: the library's line that made the call."""
    f = sys._getframe(1 + skip)
    start = f
    internal = _INTERNAL
    while f is not None:
        code = f.f_code
        known = internal.get(code.co_filename)
        if not (internal_file(code.co_filename) if known is None else known):
            key = (code, f.f_lasti)
            text = _SOURCES.get(key)
            if text is None:
                if len(_SOURCES) >= 4096:
                    _SOURCES.clear()
                text = _SOURCES[key] = f"{short_path(code.co_filename, _SOURCES_CWD[0])}:{f.f_lineno}"
            return text
        f = f.f_back  # type: ignore[assignment]
    return _library_source(start)


def _library_source(f: Any) -> str:
    """:func:`user_source` where no frame is the program's: the innermost frame outside the simulator, else ``?``."""
    while f is not None:
        filename = f.f_code.co_filename
        if not own_file(filename):
            return f"{short_path(filename, _SOURCES_CWD[0])}:{f.f_lineno}"
        f = f.f_back
    return "?"


_OWN_FILES: dict[str, bool] = {}


def own_file(filename: str) -> bool:
    """Whether a frame of ``filename`` is the simulator's own or the device contract's (not the program's, nor a
    library's)."""
    known = _OWN_FILES.get(filename)
    if known is None:
        path = filename if filename.startswith("<") else os.path.abspath(filename)
        known = _OWN_FILES[filename] = (path.startswith(_OWN) and not path.startswith(_PROGRAM_CODE)) or (
            path in _CONTRACT)
    return known


def user_depth() -> int:
    """How many frames above its caller the program's frame is (:func:`user_source`'s), counted as
    ``warnings.warn``'s ``stacklevel`` counts them from the caller: a warning the simulator gives names the program's
    line, as torch's C++ warnings name the Python line that called into it."""
    f = sys._getframe(1)
    depth = 1
    while f is not None and internal_file(f.f_code.co_filename):
        f = f.f_back  # type: ignore[assignment]
        depth += 1
    return depth if f is not None else 1


#: what torch's CPU build says where a ``torch.cuda`` function calls CUDA's own C API, which it lacks (the start
#: :mod:`simdevice.explain` reads as what the simulator does not run)
_NO_CUDA_C_API = "module 'torch._C' has no attribute '"
#: what torch says where a simulated tensor (a meta wrapper) is exported through DLPack
_NO_DLPACK = "Cannot pack tensors on meta"
#: what torch's CPU build says where a CUDA storage is made directly (no allocator for it)
_NO_CUDA_STORAGE = "torch.UntypedStorage(): Storage device not recognized: cuda"


def exit_succeeded(e: SystemExit) -> bool:
    """Whether ``SystemExit`` ``e`` ends a process with status 0, as Python's own exit takes its code: ``None``,
    ``0`` and ``False``; any other number, or a message (printed, status 1), is a failure."""
    return e.code is None or (isinstance(e.code, int) and e.code == 0)


def describe(e: BaseException) -> str:
    """``Type: message``; for a bare ``assert`` (no message), the line that failed: ``AssertionError at `...```; for
    a ``torch.cuda`` function that calls CUDA's own C API, which torch's CPU build lacks (``host_memory_stats``,
    ``memory_stats_as_nested_dict``, ``torch.cuda.comm``'s: ``torch._C._cuda_*``, ``_broadcast``), the function the
    program called, by name; for an exception whose ``str()`` raises (a class of the program's), its type and what
    that raised, as Python's traceback names it where it cannot make the text."""
    try:
        text = str(e)
    except Exception as failed:  # (the program's own __str__, whatever it raises)
        return f"{type(e).__name__} (its text could not be made: str() raised {type(failed).__name__}: {failed})"
    if isinstance(e, AssertionError):
        at = _simulator_assert(e)
        if at is not None:
            return (f"AssertionError: simdevice: the simulator's own check failed at {at}: a bug of the simulator's, "
                    "not the program's")
    if isinstance(e, AttributeError) and text.startswith(_NO_CUDA_C_API):
        called = _torch_entry(e)
        if called is not None:
            text += f" ({called} reaches CUDA's own C API, which the simulator does not run)"
    if isinstance(e, BufferError) and text.startswith(_NO_DLPACK):
        text += (" (DLPack of a simulated device tensor, to_dlpack, __dlpack__ or from_dlpack of one, is not "
                 "simulated: its bytes are no device memory another library could read)")
    if isinstance(e, RuntimeError) and text.startswith(_NO_CUDA_STORAGE):
        text += (" (a CUDA storage made directly, torch.UntypedStorage(n, device=\"cuda\"), storage.cuda() or a "
                 "torch.cuda.*Storage, is not simulated: make a device tensor instead)")
    if text:
        return f"{type(e).__name__}: {text}"
    frame = _innermost_own(e)
    line = linecache.getline(frame.tb_frame.f_code.co_filename, frame.tb_lineno).strip() if frame else ""
    return f"{type(e).__name__} at `{line}`" if line else type(e).__name__


def _simulator_assert(e: AssertionError) -> str | None:
    """Where an ``assert`` statement of the simulator's own code raised ``e`` (its innermost frame is the simulator's,
    not the program's nor the harness's under simdevice/programs/), as ``file:line (`the assert`)``; else None. The
    program's call led there, but what failed is the simulator's invariant: no verdict on the program. (Where the
    simulator raises a library's own ``AssertionError`` for the program, it raises it, with no ``assert``.)"""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return None
    path = os.path.abspath(tb.tb_frame.f_code.co_filename)
    if not path.startswith(_OWN) or path.startswith(_PROGRAM_CODE):
        return None
    line = linecache.getline(path, tb.tb_lineno).strip()
    if not line.startswith("assert "):
        return None
    return f"{short_path(path, _SOURCES_CWD[0])}:{tb.tb_lineno} (`{line}`)"


def _torch_entry(e: BaseException) -> str | None:
    """The torch function the program's innermost frame called, on the way to ``e`` (``torch.cuda.memory.
    host_memory_stats``); None where there is none."""
    own = _innermost_own(e)
    entry = own.tb_next if own is not None else None
    if entry is None:
        return None
    frame = entry.tb_frame
    module = frame.f_globals.get("__name__", "")
    return f"{module}.{frame.f_code.co_name}" if module.startswith("torch.") else None


def _innermost_own(e: BaseException) -> Any:
    tb, mine, last = e.__traceback__, None, None
    while tb is not None:
        last = tb
        if not internal_file(tb.tb_frame.f_code.co_filename):
            mine = tb
        tb = tb.tb_next
    return mine or last


def error_source(e: BaseException, instead: str | None = None) -> str:
    """Where an exception was raised: the innermost frame of its traceback outside the simulator and torch (the
    program's line that made the failing call); where there is none, ``instead`` if given (a stream operation's
    error: the line that issued it), else the innermost frame."""
    at = _innermost_own(e)
    if instead is not None and (at is None or internal_file(at.tb_frame.f_code.co_filename)):
        return instead
    if at is None:
        return "?"
    return f"{short_path(at.tb_frame.f_code.co_filename, _SOURCES_CWD[0])}:{at.tb_lineno}"


