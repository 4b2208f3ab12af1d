"""``replay --gpu --trace``: the GPU's timeline, from CUDA events around each counted operation.

Run: ``python -m pytest -q -s tests/gpu/test_timeline_gpu.py`` on a CUDA machine; it prints both timelines of the
demonstration's shrunk schedule, the simulator's and the GPU's, for docs/fidelity.md.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from collections import defaultdict
from typing import Any

from reference.cuda import timelines
from reference.schedule import Schedule
from simdevice.search import execute
from simdevice.timeline import slices

SCHEDULE = "offload_reload/racy::d2h#0+1"


def _ops(out: Any) -> dict[str, list[tuple[int, int, int]]]:
    """Per stream: (index, start ns, end ns) of each operation (``simdevice.timeline.slices``)."""
    ops: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for sl in slices(out):
        if sl.kind == "op":
            ops[sl.actor].append((sl.index, sl.start, sl.end))
    return dict(ops)


def test_the_gpu_timeline_has_every_counted_operation_in_order() -> None:
    s = Schedule.parse(SCHEDULE)
    execute(s, backend="cuda")  # warm-up
    with timelines():
        gpu = execute(s, backend="cuda")
    sim = execute(s)
    print("simulator:\n" + sim.trace_text() + "GPU:\n" + gpu.trace_text())
    ops = _ops(gpu)
    host = [t for t, actor, what in gpu.run.trace if actor == "host"]
    # every counted operation is there, once: the host's steps and each stream's operations, as counted
    assert len(host) == gpu.run.op_counts["host"]
    for stream, n in gpu.run.op_counts.items():
        if stream != "host":
            assert [k for k, _, _ in sorted(ops.get(stream, []))] == list(range(n)), stream
    assert host == sorted(host)
    for stream, rows in ops.items():
        rows.sort()
        assert all(start <= end for _, start, end in rows), stream
        # one stream runs its operations one after another
        assert all(a_end <= b_start for (_, _, a_end), (_, b_start, _) in itertools.pairwise(rows)), stream
    # the same operations per stream as the simulator's
    assert {a: len(r) for a, r in ops.items()} == {a: len(r) for a, r in _ops(sim).items()}
    # the delay d2h#0+1 (one unit, 1 ms) stalls the first D2H: it starts at least 0.9 ms after the host issued it
    issued = next(t for t, actor, what in gpu.run.trace if actor == "host" and what.startswith("copy_"))
    d2h0 = min(ops["d2h"])
    assert d2h0[1] - issued >= 900_000


def test_replay_gpu_trace_prints_it() -> None:
    out = subprocess.run([sys.executable, "-m", "simdevice", "replay", SCHEDULE, "--gpu", "--trace"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode in (0, 1), out.stderr
    assert "the GPU's timeline" in out.stdout
    assert "start copy_ (D2H) #0" in out.stdout
