"""A run's timeline, to look at rather than read: a Perfetto (Chrome trace-event) JSON file and a PNG picture.

Both are made from one simulated :class:`~simdevice.search.execute.Outcome`: its trace (every host step, every
stream operation's start and end, markers passed, stalls), the line and bytes of each stream operation, and its
reports. Virtual time: 1 unit = 1 ms of GPU time; the JSON is in microseconds, as the format wants.

- :func:`perfetto` / :func:`write_perfetto`: a process per simulated process (the main host, each rank or
  worker), a thread track per host actor and per stream; each operation a slice (op name, bytes, source line),
  host steps as short slices, each passed wait marker a slice with a flow arrow from the operation its event was
  recorded after, stalls as slices named ``stall``, the racing accesses and stale reads as instant events carrying
  their report text (with a flow arrow between the two racing operations), and a suggested fix's edges as flow
  arrows named ``suggested edge``. Opens in ui.perfetto.dev and chrome://tracing. A track's slices nest or are
  disjoint, and each flow binds to its own slice (:func:`perfetto` says how).
- :func:`write_png`: one lane per actor, operations as bars coloured by kind, stalls hatched, the two racing
  operations outlined in red with an arrow between them (an illegal access in violet), the suggested edge a dashed
  arc that stays inside the axes; the schedule line as title; zoomed on the flagged operations when they sit in a
  small part of a long run.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from simdevice.runtime.config import UNIT_NS, SimConfig
from simdevice.runtime.reports import IllegalAccess, Race, StaleRead, is_collective, process_of

__all__ = ["Slice", "figure", "perfetto", "slices", "write_perfetto", "write_png"]

_INDEX = re.compile(r"^(?P<name>.*) #(?P<index>\d+)$")
_PASS = re.compile(r"on stream (?P<stream>\S+) \(item (?P<item>\d+)\)")
_STALL = re.compile(r"^stall (?P<units>\d+) units before #(?P<index>\d+)$")


@attrs.frozen
class Slice:
    """One interval on one actor's track."""

    actor: str
    #: "op" (a stream operation), "host" (a host step), "marker" (a wait passed), "stall", "pending" (an operation
    #: issued but not done when the run stopped)
    kind: str
    name: str
    start: int
    end: int
    #: the operation's index on its actor (-1: none)
    index: int = -1
    source: str = ""
    nbytes: int = 0
    #: a marker's: the stream whose work it waited for
    waited: str = ""
    #: a marker's: the item of ``waited`` it waited for (the event was recorded after it; 0: none)
    after: int = 0
    #: a stream's operation or marker: its place in the stream's queue, from 1 (a stream runs its items in order,
    #: markers among them; 0: none, a host step or what did not run)
    item: int = 0
    #: an operation's place in the order the run issued every operation, and a host step's that accessed memory
    #: the device reaches (-1: not known): a stall moves when an operation starts, not when it was issued
    issued: int = -1


def slices(out: Any) -> list[Slice]:
    """The run's intervals, from its trace: operations (start to done), host steps, markers, stalls."""
    run = out.run
    host_ns = SimConfig().host_step_ns
    started: dict[str, tuple[int, str]] = {}
    items: dict[str, int] = {}  # per stream: the items done or passed so far
    result: list[Slice] = []
    # the run notes each operation's site as it issues it: the k-th is 2k in issue order, a host access made after
    # k operations 2k - 1 (it comes between the (k-1)-th and the k-th)
    issued = {key: 2 * k for k, key in enumerate(run.sites)}
    host_access = {(actor, t): (source, 2 * k - 1)
                   for actor, t, source, k in getattr(run, "host_accesses", {}).values()}
    for t, actor, what in run.trace:
        if what.startswith("start "):
            started[actor] = (t, what[6:])
        elif what.startswith("done ") and actor in started:
            t0, desc = started.pop(actor)
            m = _INDEX.match(desc)
            index = int(m.group("index")) if m else -1
            source, nbytes = run.sites.get(f"{actor}#{index}", ("", 0))
            items[actor] = items.get(actor, 0) + 1
            result.append(Slice(actor, "op", desc, t0, t, index, source, nbytes,
                                issued=issued.get(f"{actor}#{index}", -1), item=items[actor]))
        elif what.startswith("pass "):
            m = _PASS.search(what)
            items[actor] = items.get(actor, 0) + 1
            result.append(Slice(actor, "marker", what[5:], t, t, waited=m.group("stream") if m else "",
                                after=int(m.group("item")) if m else 0, item=items[actor]))
        elif what.startswith("stall "):
            m = _STALL.match(what)
            units = int(m.group("units")) if m else 0
            result.append(Slice(actor, "stall", what, t, t + units * UNIT_NS, int(m.group("index")) if m else -1))
        else:
            source, order = host_access.pop((actor, t), ("", -1))
            result.append(Slice(actor, "host", what, t, t + host_ns, source=source, issued=order))
    # a host access made later than its step began (an access of shared or pinned memory checked within the actor's
    # last step, after that step waited: a queue's get): the step it was made in, the actor's last one begun by then
    for (actor, t), (source, order) in host_access.items():
        i = _step_at(result, actor, t)
        if i is not None and not result[i].source:
            result[i] = attrs.evolve(result[i], source=source, issued=order)
    for actor, (t0, desc) in started.items():  # running when the run stopped (a deadlock, an error)
        m = _INDEX.match(desc)
        index = int(m.group("index")) if m else -1
        source, nbytes = run.sites.get(f"{actor}#{index}", ("", 0))
        result.append(Slice(actor, "pending", desc + " (running when the run stopped)", t0, t0, index, source,
                            nbytes, issued=issued.get(f"{actor}#{index}", -1)))
    # issued but never started (the run stopped first): after whatever that stream did last
    have = {(s.actor, s.index) for s in result if s.kind in ("op", "pending")}
    ends: dict[str, int] = {}
    for s in result:
        ends[s.actor] = max(ends.get(s.actor, 0), s.end)
    for key, (source, nbytes) in run.sites.items():
        actor, _, index = key.rpartition("#")
        if (actor, int(index)) not in have:
            last = ends.get(actor, 0)
            result.append(Slice(actor, "pending", f"#{index} (issued, not run when the run stopped)", last, last,
                                int(index), source, nbytes, issued=issued[key]))
    return result


def _step_at(ss: list[Slice], actor: str, t: int) -> int | None:
    """The index in ``ss`` of ``actor``'s host step that was under way at ``t``: the last one begun by then."""
    best = None
    for i, s in enumerate(ss):
        if s.kind == "host" and s.actor == actor and s.start <= t and (best is None or s.start >= ss[best].start):
            best = i
    return best


def _racing(out: Any) -> list[Race]:
    return [r for r in out.run.reports if isinstance(r, Race)]


def _find(ss: list[Slice], actor: str, index: int) -> Slice | None:
    return next((s for s in ss if s.kind in ("op", "pending") and s.actor == actor and s.index == index), None)


def _accessor(ss: list[Slice], out: Any, access: Any) -> Slice | None:
    """The slice of a report's access: a stream operation's, or the host step that made a host access."""
    if access.on == "stream":
        return _find(ss, access.actor, access.index)
    at = getattr(out.run, "host_accesses", {}).get(access.seq)
    if at is None:
        return None
    i = _step_at(ss, access.actor, at[1])
    return None if i is None else ss[i]


def _edge_ends(ss: list[Slice], edge: Any) -> list[tuple[Slice, Slice]]:
    """For a suggested edge: each operation at its ``before`` site, with the latest one at its ``after`` site
    issued before it (none: it waits for nothing, and gets no arrow), as the inserted edge waits; for a forward
    edge, the k-th at ``before`` with the (k + offset)-th at ``after`` (issue order), the operation it waits for
    though the run issued that one later. Issue order, not start time: in the failing run a stalled stream starts
    what it was issued long before (where a slice's issue order is not known, its start stands for it)."""
    ends = []
    ops = [s for s in ss if s.kind in ("op", "pending")]
    # a host step waits too (a synchronize before it), where it accessed memory the device reaches; and one is waited
    # for, by a handshake, where its host's access came first
    ops += [s for s in ss if s.kind == "host" and s.source]
    afters = [s for s in ops if s.actor == edge.after.actor and s.source == edge.after.source]
    if getattr(edge, "forward", False):
        befores = sorted((s for s in ops if s.actor == edge.before.actor and s.source == edge.before.source),
                         key=lambda s: (s.index, s.issued, s.start))
        afters.sort(key=lambda s: (s.index, s.issued, s.start))
        return [(afters[k + edge.offset], b) for k, b in enumerate(befores) if 0 <= k + edge.offset < len(afters)]
    def earlier(a: Slice, b: Slice) -> bool:
        return a.issued < b.issued if a.issued >= 0 and b.issued >= 0 else a.start <= b.start

    afters.sort(key=lambda s: (s.issued, s.start))
    for b in ops:
        if b.actor == edge.before.actor and b.source == edge.before.source:
            prior = [a for a in afters if earlier(a, b)]
            if prior:
                ends.append((prior[-1], b))
    return ends


#: a sliver in the Perfetto trace (a passed wait, an operation of no length), in ns: long enough to hold a flow's end
#: strictly inside it
_SLIVER = 2


def _short(s: Slice) -> bool:
    """Whether the Perfetto trace draws ``s`` as a sliver: a passed wait, an operation too short to hold a flow."""
    return s.kind == "marker" or (s.kind in ("op", "pending") and s.end - s.start < _SLIVER + 1)


def _place_slivers(ss: list[Slice], at: dict[int, tuple[int, int]]) -> None:
    """Give each sliver its place on its track, ``at[id(s)]``: a wait ending where it passed, an operation starting
    where it started, when that fits; in a gap, or inside a slice after that one's first ns (where a flow or an
    instant of it goes), never across the edge of another slice nor on another sliver. Several at one time go one
    after another in the stream's order (the waits before it, back from it; the operations after it)."""
    taken: dict[str, list[tuple[int, int]]] = {}
    for s in ss:
        if id(s) in at:
            taken.setdefault(s.actor, []).append(at[id(s)])
    for spans in taken.values():
        spans.sort()
    slivers: dict[str, set[int]] = {}
    for m in sorted((s for s in ss if _short(s)),
                    key=lambda s: (s.actor, s.start, s.kind != "marker", -s.item if s.kind == "marker" else s.index)):
        spans, mine = taken.get(m.actor, []), slivers.setdefault(m.actor, set())

        def fits(a: int, spans: list[tuple[int, int]] = spans, mine: set[int] = mine) -> bool:
            if a < 0 or any(b in mine for b in range(a - _SLIVER + 1, a + _SLIVER)):
                return False
            i = bisect.bisect_right(spans, (a, float("inf"))) - 1
            if i >= 0 and spans[i][1] > a:  # inside that slice: wholly, after its first ns
                return spans[i][0] + 3 <= a and a + _SLIVER <= spans[i][1]
            return i + 1 >= len(spans) or spans[i + 1][0] >= a + _SLIVER
        t = m.start
        back, ahead = range(t - _SLIVER, t - _SLIVER - 64, -1), range(t, t + 64)
        a = next((a for a in ([*back, *ahead] if m.kind == "marker" else [*ahead, *back]) if fits(a)),
                 max(t - _SLIVER, 0) if m.kind == "marker" else t)
        mine.add(a)
        at[id(m)] = (a, a + _SLIVER)


def _processes(ss: list[Slice]) -> Callable[[str], str]:
    """Each track's process: a host actor's (one with host steps) is itself, a stream's its name less the stream's
    (``saver.side`` -> ``saver``, ``d2h`` -> ``host``), as ``process_of`` says of an access."""
    hosts = {s.actor for s in ss if s.kind == "host"} | {"host"}
    return lambda a: process_of(a, "host" if a in hosts else "stream")


def perfetto(out: Any, fix: Any = None) -> dict[str, Any]:
    """The run as a Chrome/Perfetto trace-event document (``{"traceEvents": [...]}``)."""
    ss = slices(out)
    proc_of = _processes(ss)
    actors = sorted({s.actor for s in ss} | set(out.run.op_counts))
    procs = sorted({proc_of(a) for a in actors}, key=lambda p: (p != "host", p))
    pid = {p: i + 1 for i, p in enumerate(procs)}
    tid = {a: i + 1 for i, a in enumerate(actors)}
    events: list[dict[str, Any]] = []

    def us(ns: int) -> float:
        return ns / 1000

    for p in procs:
        events.append({"ph": "M", "name": "process_name", "pid": pid[p], "tid": 0, "args": {"name": p}})
    for a in actors:
        kind = "host" if a == proc_of(a) else "stream"
        events.append({"ph": "M", "name": "thread_name", "pid": pid[proc_of(a)], "tid": tid[a],
                       "args": {"name": f"{a} ({kind})"}})
    # Each slice's place on its track, in ns. A thread's slices must nest or be disjoint, and a flow event binds to
    # the slice begun last on its track before it (a slice closes only when a later one begins; a thread's instant
    # is a slice of no length): every flow comes strictly inside its own slice, before anything else begins in it,
    # at a time at which nothing begins on that track.
    at = {id(s): (s.start, s.end) for s in ss if not _short(s)}
    _place_slivers(ss, at)
    flagged = [x for r in _racing(out) for x in (_accessor(ss, out, r.previous), _accessor(ss, out, r.current))
               if x is not None]
    read = {id(r): _accessor(ss, out, r.read) for r in out.run.reports if isinstance(r, StaleRead)}
    instants: dict[str, list[int]] = {}  # per track: where instants are (just inside the slice they mark)
    for marked in flagged + [y for y in read.values() if y is not None]:
        instants.setdefault(marked.actor, []).append(at[id(marked)][0] + 2)
    begins: dict[str, list[int]] = {}
    for s in ss:
        begins.setdefault(s.actor, []).append(at[id(s)][0])
    for a, ts in instants.items():
        begins.setdefault(a, []).extend(ts)
    for ts in begins.values():
        ts.sort()

    def early(x: Slice) -> int:
        """Just after the slice begins (an instant that marks it comes after)."""
        return at[id(x)][0] + 1

    def late(x: Slice) -> int:
        """Just before the slice ends or anything begins inside it, whichever comes first."""
        start, stop = at[id(x)]
        ts = begins[x.actor]
        i = bisect.bisect_right(ts, start)
        return max(min(ts[i] if i < len(ts) else stop, stop) - 1, start + 1)

    flows = 0
    # the item of a stream an event was recorded after, by its place in the stream's queue
    done = {(o.actor, o.item): o for o in ss if o.item > 0}

    def flow(name: str, a: Slice, b: Slice, at_a: int, at_b: int, args: dict[str, Any] | None = None) -> None:
        """A flow arrow between ``a`` (at ``at_a``, or as near as keeps it before ``b``'s end) and ``b`` (at
        ``at_b``, or as near). Perfetto and chrome://tracing read a trace in time order and drop an ``f`` that
        comes before its ``s`` (or at its time, in whichever order they read the two), drawing the arrow from the
        earlier slice to the later one whichever end names which: a suggested edge, whose ``b`` ran before ``a`` in
        the failing run, starts at the earlier end (its ``args`` say which way it goes)."""
        nonlocal flows
        if at_a >= at_b and early(a) < late(b):  # both ends moved within their slices to keep a's first
            at_a = max(early(a), min(at_a, late(b) - 1))
            at_b = min(late(b), max(at_b, at_a + 1))
        if at_b < at_a:
            a, b, at_a, at_b = b, a, at_b, at_a
        flows += 1
        common = {"name": name, "cat": name, "id": flows}
        arrows.append({**common, "ph": "s", "ts": us(at_a), "pid": pid[proc_of(a.actor)], "tid": tid[a.actor],
                       **({"args": args} if args else {})})
        arrows.append({**common, "ph": "f", "bp": "e", "ts": us(at_b), "pid": pid[proc_of(b.actor)],
                       "tid": tid[b.actor]})

    timed: list[tuple[int, int, dict[str, Any]]] = []  # (start, -length, event): a slice before what it holds
    arrows: list[dict[str, Any]] = []
    for s in ss:
        start, stop = at[id(s)]
        base = {"pid": pid[proc_of(s.actor)], "tid": tid[s.actor], "ts": us(start)}
        if s.kind in ("op", "pending"):
            args: dict[str, Any] = {"index": s.index, "bytes": s.nbytes}
            if s.source:
                args["source"] = s.source
            event = {**base, "ph": "X", "name": s.name, "cat": s.kind, "dur": us(stop - start), "args": args}
        elif s.kind == "host":
            event = {**base, "ph": "X", "name": s.name, "cat": "host", "dur": us(stop - start)}
        elif s.kind == "stall":
            event = {**base, "ph": "X", "name": "stall", "cat": "stall", "dur": us(stop - start),
                     "args": {"what": s.name}}
        else:  # a marker: a sliver, with the arrow from the work that let it pass
            event = {**base, "ph": "X", "name": f"wait: {s.name}", "cat": "wait", "dur": us(stop - start),
                     "args": {"passed": us(s.start)}}
            source = done.get((s.waited, s.after))
            if source is not None:
                flow("wait", source, s, late(source), early(s))
        timed.append((start, start - stop, event))
    for r in _racing(out):
        a, b = _accessor(ss, out, r.previous), _accessor(ss, out, r.current)
        for x in (a, b):
            if x is not None:
                timed.append((early(x) + 1, 0, {"ph": "i", "s": "t", "name": "race", "cat": "race",
                                                "ts": us(early(x) + 1), "pid": pid[proc_of(x.actor)],
                                                "tid": tid[x.actor], "args": {"report": str(r)}}))
        if a is not None and b is not None:
            first, second = (a, b) if a.start <= b.start else (b, a)
            flow("race", first, second, early(first), early(second), {"report": str(r)})
    for r in out.run.reports:
        if isinstance(r, StaleRead) and r.read.actor in tid:
            reader = read[id(r)]
            t = early(reader) + 1 if reader is not None else r.time_ns
            timed.append((t, 0, {"ph": "i", "s": "t", "name": "stale read", "cat": "stale-read", "ts": us(t),
                                 "pid": pid[proc_of(r.read.actor)], "tid": tid[r.read.actor],
                                 "args": {"report": str(r), "time": us(r.time_ns)}}))
    if fix is not None:
        for e in fix.edges:
            for a, b in _edge_ends(ss, e):
                flow("suggested edge", a, b, late(a), early(b), {"edge": str(e)})
    timed.sort(key=lambda x: (x[0], x[1]))
    events += [e for _, _, e in timed] + arrows
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "metadata": {"schedule": str(out.schedule), "verdict": out.verdict(), "time unit": "1 unit = 1 ms"}}


def _replace(path: str | os.PathLike[str], write: Any) -> Path:
    """``write(tmp)`` into a new file beside ``path``, then that file renamed to ``path``: where writing fails,
    nothing is left (no half-written file, and an earlier one at ``path`` kept); the path."""
    p = Path(path)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=p.suffix)
    os.close(fd)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # as a file written in place would be (mkstemp's is the owner's only)
        write(tmp)
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return p


def write_perfetto(out: Any, path: str | os.PathLike[str], fix: Any = None) -> Path:
    """Write :func:`perfetto`'s document to ``path`` (whole, or not at all); the path."""
    text = json.dumps(perfetto(out, fix), indent=1)
    return _replace(path, lambda tmp: Path(tmp).write_text(text))


_COLOURS = {"compute": "#4c78a8", "D2H": "#f58518", "H2D": "#54a24b", "collective": "#b279a2", "host": "#9d9d9d",
            "stall": "#ffffff", "wait": "#e45756"}


def _kind(s: Slice) -> str:
    if "(D2H)" in s.name:
        return "D2H"
    if "(H2D)" in s.name:
        return "H2D"
    if is_collective(s.actor, s.name):
        return "collective"
    return "compute"


def write_png(out: Any, path: str | os.PathLike[str], fix: Any = None) -> Path:
    """Draw the run's timeline into ``path`` (PNG; whole, or not at all); the path."""
    import matplotlib.pyplot as plt

    fig = figure(out, fix)
    try:
        return _replace(path, lambda tmp: fig.savefig(tmp, format="png"))
    finally:
        plt.close(fig)


_TITLE_WIDTH = 110  # characters of a title line that fit the picture's width at its font size
_TITLE_LINES = 6


def _title_lines(text: str) -> list[str]:
    """A schedule line as the picture's title: whole, broken where a field or a delay ends (after a ``:``, ``,`` or
    ``/``) into lines that fit the width, at most ``_TITLE_LINES`` of them (a longer one ends with ``...``: the text
    output has it whole)."""
    pieces = re.findall(r"[^:,/]*(?:[:,/]+|$)", text)
    lines = [""]
    for piece in filter(None, pieces):
        while len(piece) > _TITLE_WIDTH:  # (one field longer than a line: cut where the line ends)
            room = _TITLE_WIDTH - len(lines[-1])
            lines[-1] += piece[:room]
            piece = piece[room:]
            lines.append("")
        if lines[-1] and len(lines[-1]) + len(piece) > _TITLE_WIDTH:
            lines.append("")
        lines[-1] += piece
    if len(lines) > _TITLE_LINES:
        lines = [*lines[:_TITLE_LINES - 1], lines[_TITLE_LINES - 1][:_TITLE_WIDTH - 3] + "..."]
    return lines


def _bend(ax: Any, start: tuple[float, float], end: tuple[float, float], most: float = 0.25) -> float:
    """The ``rad`` of an ``arc3`` arrow from ``start`` to ``end`` (data coordinates) that bends to the side of the
    straight line with more room in the axes (toward the plot's middle), no further than stays inside them: matplotlib
    puts the control point at the middle plus ``rad`` times the line turned a quarter, and the curve's apex halfway
    there."""
    box = ax.get_window_extent()
    (x0, y0), (x1, y1) = ax.transData.transform([start, end])
    dx, dy = x1 - x0, y1 - y0
    length = (dx * dx + dy * dy) ** 0.5
    if length < 1:
        return most
    mx, my = (x0 + x1) / 2, (y0 + y1) / 2
    nx, ny = dy / length, -dx / length  # where a positive rad bends it
    margin = 6.0  # pixels: the line's width and the arrow's head

    def room(ux: float, uy: float) -> float:
        """From the middle of the line to the edge of the axes, along (ux, uy)."""
        ways = [(box.x1 - mx) / ux if ux > 0 else (box.x0 - mx) / ux if ux < 0 else float("inf"),
                (box.y1 - my) / uy if uy > 0 else (box.y0 - my) / uy if uy < 0 else float("inf")]
        return max(min(ways) - margin, 0.0)

    up, down = room(nx, ny), room(-nx, -ny)
    if up == down:  # the middle of the axes decides
        centre = ((box.x0 + box.x1) / 2 - mx) * nx + ((box.y0 + box.y1) / 2 - my) * ny
        sign = 1.0 if centre >= 0 else -1.0
    else:
        sign = 1.0 if up > down else -1.0
    return float(sign * min(most, 2 * max(up, down) / length))


def figure(out: Any, fix: Any = None) -> Any:
    """The run's timeline as a matplotlib figure (what :func:`write_png` writes); the caller closes it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ss = slices(out)
    proc_of = _processes(ss)

    def order(a: str) -> tuple[bool, str, bool, str]:
        """The main host's lanes first, each process's host actor above its streams."""
        p = proc_of(a)
        return p != "host", p, a != p, a

    actors = sorted({s.actor for s in ss}, key=order)
    lane = {a: i for i, a in enumerate(actors)}
    end = max((s.end for s in ss), default=1) / UNIT_NS
    racing = {(x.actor, x.index) for r in _racing(out) for x in (r.previous, r.current) if x.on == "stream"}
    # a racing host step (a read of pinned memory before the copy into it is done, or a write while one reads it)
    racing_steps = {h for r in _racing(out) for x in (r.previous, r.current) if x.on != "stream"
                    for h in [_accessor(ss, out, x)] if h is not None}
    illegal = {(r.access.actor, r.access.index) for r in out.run.reports if isinstance(r, IllegalAccess)}
    # zoom on the flagged operations when they sit in a small part of a long run
    flagged = [x for x in ss if x.kind in ("op", "pending") and ((x.actor, x.index) in racing | illegal)]
    flagged += racing_steps
    lo, hi, zoomed = 0.0, end, False
    if flagged:
        f0, f1 = min(x.start for x in flagged) / UNIT_NS, max(x.end for x in flagged) / UNIT_NS
        pad = max(f1 - f0, end * 0.02) * 1.5
        if (f1 - f0 + 2 * pad) < 0.5 * end:
            lo, hi, zoomed = max(0.0, f0 - pad), min(end, f1 + pad), True
    span = hi - lo
    title = _title_lines(str(out.schedule))
    fig_h = 1.9 + 0.5 * len(actors) + 0.17 * (len(title) - 1)
    fig, ax = plt.subplots(figsize=(12, fig_h), dpi=110)
    # the bars of a lane that look alike are drawn together: one collection each, not one per slice (a long run's
    # hundred thousand slices took minutes one by one)
    bars: dict[tuple[Any, ...], list[tuple[float, float]]] = {}
    markers: dict[int, list[float]] = {}
    for s in ss:
        y = lane[s.actor]
        x0, w = s.start / UNIT_NS, max((s.end - s.start) / UNIT_NS, span / 1500)
        if s.kind == "op":
            red = (s.actor, s.index) in racing
            bad = (s.actor, s.index) in illegal
            if red or bad:
                w = max(w, span / 300)  # a short flagged operation stays visible
            edge = "red" if red else ("#7f00ff" if bad else "none")
            bars.setdefault((y, "op", _COLOURS[_kind(s)], edge), []).append((x0, w))
        elif s in racing_steps:
            bars.setdefault((y, "racing host"), []).append((x0, max(w, span / 300)))
        elif s.kind in ("host", "stall"):
            bars.setdefault((y, s.kind), []).append((x0, w))
        elif s.kind == "pending":
            red = (s.actor, s.index) in racing
            ax.broken_barh([(x0, span / 60)], (y - 0.35, 0.7), facecolors="none", linestyle="--",
                           edgecolors="red" if red else "#555555", linewidth=1.5, zorder=3)
            ax.text(x0 - span / 200, y + 0.5, "not run: the run stopped", fontsize=7, va="center", ha="right",
                    color="#555555", zorder=5)
        else:
            markers.setdefault(y, []).append(x0)
    for (y, kind, *style), ranges in bars.items():
        if kind == "op":
            face, edge = style
            ax.broken_barh(ranges, (y - 0.35, 0.7), facecolors=face, edgecolors=edge,
                           linewidth=2.5 if edge != "none" else 0, zorder=3 if edge != "none" else 2)
        elif kind == "host":
            ax.broken_barh(ranges, (y - 0.2, 0.4), facecolors=_COLOURS["host"], zorder=1)
        elif kind == "racing host":
            ax.broken_barh(ranges, (y - 0.2, 0.4), facecolors=_COLOURS["host"], edgecolors="red", linewidth=2.5,
                           zorder=3)
        else:
            ax.broken_barh(ranges, (y - 0.35, 0.7), facecolors="none", edgecolors="#555555", hatch="///",
                           linewidth=0.8, zorder=1)
    for y, xs in markers.items():
        ax.vlines(xs, y - 0.4, y + 0.4, colors=_COLOURS["wait"], linewidth=1, zorder=2)
    labelled: list[tuple[float, float]] = []
    for r in _racing(out):
        a, b = _accessor(ss, out, r.previous), _accessor(ss, out, r.current)
        if a is None or b is None:
            continue
        first, second = (a, b) if a.start <= b.start else (b, a)
        ax.annotate("", xy=(second.start / UNIT_NS, lane[second.actor]),
                    xytext=(first.start / UNIT_NS, lane[first.actor]),
                    arrowprops={"arrowstyle": "->", "color": "red", "lw": 1.6}, zorder=4)
        mid = ((first.start + second.start) / 2 / UNIT_NS, (lane[first.actor] + lane[second.actor]) / 2)
        if all(abs(mid[0] - x) > span / 25 or abs(mid[1] - y) > 0.3 for x, y in labelled):  # no pile of labels
            # (on the arrow's middle, where it crosses the gap between two lanes; on a white ground where a bar lies)
            ax.text(mid[0], mid[1], "race", color="red", fontsize=9, ha="center", va="center", zorder=5,
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 1.0, "alpha": 0.85})
            labelled.append(mid)
    arcs: list[tuple[tuple[float, float], tuple[float, float]]] = []
    if fix is not None:
        for e in fix.edges:
            pairs = _edge_ends(ss, e)  # one arrow: where the waiter is a racing operation, if it is one
            for a, b in [next((p for p in pairs if (p[1].actor, p[1].index) in racing or p[1] in racing_steps),
                                pairs[0])] if pairs else []:
                arcs.append(((a.end / UNIT_NS, lane[a.actor]), (b.start / UNIT_NS, lane[b.actor])))
    ax.set_yticks(range(len(actors)), actors)
    ax.set_ylim(len(actors) - 0.4, -0.6)
    ax.set_xlim(lo, lo + span * 1.02)
    ax.set_xlabel("virtual time (ms of GPU time)" + (f"; zoomed on the flagged operations (the run: 0 to {end:.2f})"
                                                     if zoomed else ""))
    ax.grid(axis="x", color="#eeeeee", zorder=0)
    ax.set_title("\n".join([*title, out.verdict()]), fontsize=10)
    legend = [Patch(facecolor=_COLOURS[k], label=k) for k in ("compute", "D2H", "H2D", "collective", "host")]
    legend.append(Patch(facecolor="none", edgecolor="#555555", hatch="///", label="stall"))
    if markers:  # (a run whose streams waited for nothing has none)
        from matplotlib.lines import Line2D

        legend.append(Line2D([0], [0], color=_COLOURS["wait"], marker="|", linestyle="none",  # type: ignore[arg-type]
                             markersize=11, markeredgewidth=1.2, label="wait passed"))
    if racing or racing_steps:  # (a clean run's picture has none to show)
        legend.append(Patch(facecolor="white", edgecolor="red", linewidth=2, label="racing operation"))
    if illegal:
        legend.append(Patch(facecolor="white", edgecolor="#7f00ff", linewidth=2, label="illegal access"))
    if fix is not None and fix.edges:
        from matplotlib.lines import Line2D

        legend.append(Line2D([0], [0], color="#2ca02c", linestyle="--", label="suggested edge"))  # type: ignore[arg-type]
    fig.legend(handles=legend, loc="lower center", ncol=len(legend), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.35 / fig_h, 1, 1))
    for a_at, b_at in arcs:  # once the axes have their place: each arc bends inside them
        ax.annotate("", xy=b_at, xytext=a_at,
                    arrowprops={"arrowstyle": "->", "color": "#2ca02c", "lw": 1.6, "linestyle": "--",
                                "connectionstyle": f"arc3,rad={_bend(ax, a_at, b_at):.3f}"},
                    zorder=4)
    return fig
