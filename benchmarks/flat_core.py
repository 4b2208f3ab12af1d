"""A measurement, not a simulator: how cheap can a simulated operation be in Python, with the bookkeeping in one flat
layer instead of the simulator's (dispatch, runtime, execution, memory, sync)? Issue 18 asks for about half the
Python per operation; this prototype does, for one in-place operation on a device tensor, the per-operation work
the simulator does for it, written flat, and counts its instructions as ``bench_instructions.py`` counts the
simulator's:

    PYTHONPATH=. python benchmarks/flat_core.py            # instructions per op, prototype and simulator

What the prototype does per ``x.mul_(0.5)``, as the simulator does:

- the dispatch mode's entry, the op's facts looked up once per op (which arguments it writes), the operands
  unwrapped to their CPU aliases;
- a host step: the host's clock ticks, its time moves one step, a trace line, the step's delay looked up, the
  program's line found (a cached frame walk, as ``user_source`` does);
- the issue: the stream's clock joins the host's and ticks; for the read and the write, the shadow cell looked up
  by (storage, range), the race checks against the last write and the reads (vector-clock epochs), an access
  record, the write's id and the read's expected id;
- the operation queued on its stream, its start and completion as two events through a heap; at the start the
  read's version checked against what landed (a stale read), at the completion the op computed on the CPU bytes
  and the write's id landed; trace lines for both.

What it leaves out (the simulator has it, this operation does not need it): byte ranges split into cells, views
and aliases, the allocator, pinned memory, copies, events, several actors, inserted edges, reports' objects,
deadlock and step limits, the in-flight readers' snapshots. So its count is a floor for this layering of the work,
not a design: what a restructured core could approach on the commonest operation.
"""

from __future__ import annotations

import heapq
import sys
from pathlib import Path
from typing import Any

import torch
from bench_instructions import _COUNTED, OPS, instructions  # the simulator's counting (this folder is on sys.path)
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
STEP_NS = 5_000
KERNEL_NS = 5_000
_START, _COMPLETE = 1, 0


class FlatTensor(torch.Tensor):
    """A device tensor: a meta wrapper over CPU bytes, with its storage's shadow cell key."""

    _data: torch.Tensor
    _key: tuple[int, int, int]

    @staticmethod
    def __new__(cls, data: torch.Tensor, key: tuple[int, int, int]) -> FlatTensor:
        r = torch.Tensor._make_wrapper_subclass(cls, data.shape, strides=data.stride(), dtype=data.dtype,
                                                device="meta", requires_grad=False)
        r._data = data
        r._key = key
        return r  # type: ignore[no-any-return]

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        raise RuntimeError("outside the prototype's mode")


class Cell:
    __slots__ = ("done", "issued", "last_write", "reads")

    def __init__(self) -> None:
        self.last_write: tuple[str, int, str, int] | None = None
        self.reads: list[tuple[str, int, str, int]] = []
        self.issued = 0
        self.done = 0


class Stream:
    __slots__ = ("busy", "clock", "name", "ops", "order", "queue")

    def __init__(self, name: str, order: int) -> None:
        self.name, self.order = name, order
        self.clock: dict[str, int] = {}
        self.queue: list[list[Any]] = []
        self.busy = False
        self.ops = 0


class FlatSim(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0
        self.host_time = 0
        self.host_clock: dict[str, int] = {"host": 0}
        self.host_steps = 0
        self.delays: dict[int, int] = {}
        self.stream = Stream("default", 2)
        self.heap: list[tuple[int, int, int, int, Any]] = []
        self.seq = 0
        self.cells: dict[tuple[int, int, int], Cell] = {}
        self.trace: list[tuple[int, str, str]] = []
        self.races: list[Any] = []
        self.stale: list[Any] = []
        self.sources: dict[tuple[Any, int], str] = {}
        self.facts: dict[Any, tuple[int, ...]] = {}

    def device_tensor(self, data: torch.Tensor) -> FlatTensor:
        key = (data.data_ptr(), 0, data.nbytes)
        self.cells[key] = Cell()
        return FlatTensor(data, key)

    def source(self) -> str:
        f = sys._getframe(3)
        key = (f.f_code, f.f_lasti)
        text = self.sources.get(key)
        if text is None:
            text = self.sources[key] = f"{f.f_code.co_filename}:{f.f_lineno}"
        return text

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        written = self.facts.get(func)
        if written is None:
            written = self.facts[func] = tuple(
                i for i, a in enumerate(func._schema.arguments) if a.alias_info is not None and a.alias_info.is_write)
        # the host step
        t = self.host_time
        k = self.host_steps
        self.host_steps = k + 1
        delay = self.delays.get(k)
        if delay:
            t += delay
        self.run_events_until(t)
        self.now = t
        self.host_time = t + STEP_NS
        clock = self.host_clock
        clock["host"] += 1
        name = func.__name__
        self.trace.append((t, "host", name))
        src = self.source()
        # the issue
        s = self.stream
        sc = s.clock
        for a, v in clock.items():
            if sc.get(a, 0) < v:
                sc[a] = v
        epoch = sc[s.name] = sc.get(s.name, 0) + 1
        index = s.ops
        s.ops = index + 1
        aliases = []
        reads = []
        writes = []
        for i, a in enumerate(args):
            if type(a) is FlatTensor:
                aliases.append(a._data)
                cell = self.cells[a._key]
                access = (s.name, epoch, name, index)
                # the read (an in-place op reads its destination too): what it must see is the last write issued
                lw = cell.last_write
                if lw is not None and lw[0] != s.name and sc.get(lw[0], 0) < lw[1]:
                    self.races.append((access, lw, src))
                cell.reads = [r for r in cell.reads if r[0] != s.name]
                cell.reads.append(access)
                reads.append((cell, cell.issued))
                if i in written:
                    for r in cell.reads:
                        if r[0] != s.name and sc.get(r[0], 0) < r[1]:
                            self.races.append((access, r, src))
                    cell.issued += 1
                    cell.last_write = access
                    cell.reads = []
                    writes.append((cell, cell.issued))
            else:
                aliases.append(a)
        op = [func, aliases, kwargs or {}, reads, writes, f"{name} #{index}"]
        s.queue.append(op)
        if not s.busy:
            s.busy = True
            self.seq += 1
            heapq.heappush(self.heap, (self.now, _START, s.order, self.seq, s))
        return args[written[0]] if written else None

    def run_events_until(self, t: int) -> None:
        heap = self.heap
        while heap and heap[0][0] <= t:
            when, kind, _, _, s = heapq.heappop(heap)
            self.now = when
            op = s.queue[0]
            if kind == _START:
                for cell, expected in op[3]:
                    if cell.done != expected:
                        self.stale.append((op[5], when))
                self.trace.append((when, s.name, "start " + op[5]))
                self.seq += 1
                heapq.heappush(heap, (when + KERNEL_NS, _COMPLETE, s.order, self.seq, s))
            else:
                s.queue.pop(0)
                with torch._C._DisableTorchDispatch():
                    op[0]._op(*op[1], **op[2])
                for cell, wid in op[4]:
                    cell.done = wid
                self.trace.append((when, s.name, "done " + op[5]))
                s.busy = False
                if s.queue:
                    s.busy = True
                    self.seq += 1
                    heapq.heappush(heap, (when, _START, s.order, self.seq, s))

    def synchronize(self) -> None:
        self.run_events_until(1 << 62)


COUNTED = _COUNTED + r"""
import torch
sys.path.insert(0, "benchmarks")
from flat_core import FlatSim

def inplace(k):
    sim = FlatSim()
    x = sim.device_tensor(torch.ones(4096))
    with sim:
        for _ in range(k):
            x.mul_(0.5)
    sim.synchronize()
    assert torch.equal(x._data, torch.full((4096,), 0.5 ** k)), "the prototype computed something else"

for _ in range(3):
    inplace(50)
gc.collect()
gc.freeze()
counted(lambda: inplace(int(sys.argv[1])))
"""


def main() -> None:
    proto = (instructions(ROOT, COUNTED, "300") - instructions(ROOT, COUNTED, "100")) / 200
    sim = (instructions(ROOT, OPS, "inplace", "300") - instructions(ROOT, OPS, "inplace", "100")) / 200
    print(f"instructions per in-place op: flat prototype {proto:,.0f}, simulator {sim:,.0f}, ratio {proto / sim:.2f}")


if __name__ == "__main__":
    main()
