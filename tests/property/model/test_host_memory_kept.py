"""Memory a run frees serves the next run without new pages.

Rules, each with a test a mutation of it fails:

- A device segment's CPU bytes, once no alias of them is left (no tensor, view or record of its run's, nor one the
  program kept after its run), serve the next segment of that size (``simdevice.runtime.allocator._kept_bytes``),
  up to ``KEPT_AT_MOST`` bytes kept, the sizes kept longest ago giving way to the last; never while an alias
  lives.
- Once a process has run the simulator, glibc's malloc keeps host memory a run frees (pinned buffers, host copies)
  for the next run's allocations, up to its largest thresholds (``simdevice.runtime.runtime.host_memory_kept``).

Speed rules (docs/benchmarks.md): new pages cost a page fault each at their first write, a tenth of a run of
``param_readiness``, and for a segment past glibc's 32 MiB every page in every run. What a run computes is the same
either way: fresh device memory is poisoned whichever bytes it gets.
"""

from __future__ import annotations

import os
import platform
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import simdevice.runtime.allocator as allocator
from simdevice import SimDevice, peek
from simdevice.runtime.runtime import host_memory_kept

glibc = pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                           reason="the setting is glibc's malloc's")

MIB = 1 << 20
#: 40 MiB of float32: a segment past glibc's largest mmap threshold (32 MiB), which malloc alone never keeps
LARGE = 10 * MIB


def _faults(run: Any) -> int:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    run()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def _write_large(dev: Any) -> None:
    x = torch.empty(LARGE, device=dev.device)
    x.fill_(1.0)


def test_a_large_segment_s_bytes_serve_the_next_run() -> None:
    SimDevice().run(_write_large)  # the first run's pages come from the system
    faults = [_faults(lambda: SimDevice().run(_write_large)) for _ in range(3)]
    # 40 MiB written are 10,240 pages of 4 KiB, each a fault where the segment's bytes are new
    assert max(faults) < 1024, f"page faults in runs that write a 40 MiB segment the process had before: {faults}"


def _keep(dev: Any) -> torch.Tensor:
    x = torch.empty(LARGE, device=dev.device)
    x.fill_(7.0)
    return x


def test_bytes_a_kept_tensor_holds_serve_no_other_run() -> None:
    kept = SimDevice().run(_keep).result  # the program's tensor outlives its run
    for _ in range(2):
        SimDevice().run(_write_large)  # a segment of the same size, written with 1.0
    assert bool((peek(kept) == 7.0).all())
    del kept
    SimDevice().run(_write_large)
    assert any(len(v) for v in allocator._KEPT.values())  # its bytes, back once it is gone


def _write_small(dev: Any) -> None:
    x = torch.empty(MIB, device=dev.device)  # 4 MiB
    x.fill_(1.0)


def test_no_more_than_the_bound_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocator, "_KEPT", {})
    monkeypatch.setattr(allocator, "KEPT_AT_MOST", 8 * MIB)
    SimDevice().run(_write_large)
    assert allocator._KEPT == {}  # 40 MiB: over the bound, given back
    SimDevice().run(_write_small)
    assert 0 < sum(k * len(v) for k, v in allocator._KEPT.items()) <= 8 * MIB


def test_the_size_kept_last_displaces_those_kept_before_at_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run of a new configuration keeps its segments' bytes where older sizes filled the bound (a search, a test
    session, moves on from one configuration to the next): before, the bytes of the sizes kept first stayed, and
    every later configuration's segments were new pages in every run."""
    monkeypatch.setattr(allocator, "_KEPT", {})
    monkeypatch.setattr(allocator, "KEPT_AT_MOST", 42 * MIB)
    SimDevice().run(_write_small)
    assert sum(k * len(v) for k, v in allocator._KEPT.items()) > 2 * MIB  # (4 MiB: 40 + 4 > 42)
    SimDevice().run(_write_large)
    assert list(allocator._KEPT) == [4 * LARGE], {k: len(v) for k, v in allocator._KEPT.items()}
    faults = _faults(lambda: SimDevice().run(_write_large))
    assert faults < 1024, f"page faults in a run that writes a 40 MiB segment kept by the run before: {faults}"


#: a process of its own (where nothing else has moved glibc's thresholds): the page faults of a run of a mechanism,
#: the mean of five after two
_MECHANISM_FAULTS = """
import resource, sys
from reference.schedule import Schedule
from simdevice.programs import resolve
from simdevice.search.execute import device_for
s = Schedule.parse(sys.argv[1])
program, _ = resolve(s)
def run():
    dev, config = device_for(s)
    dev.run(program.body, s.variant, config)
run(); run()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    run()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 5)
"""


@glibc
def test_host_memory_a_run_freed_serves_the_next() -> None:
    """``param_readiness``'s runs free host memory (its copies' and collectives' results on the CPU, about 1 MiB
    each) that glibc's own thresholds gave back at the heap's top: 1,130 page faults a run with the segments' bytes
    kept, 1,680 without; kept, about 6."""
    root = Path(__file__).resolve().parents[3]
    p = subprocess.run([sys.executable, "-c", _MECHANISM_FAULTS, "param_readiness/FIXED"], cwd=root,
                       env=dict(os.environ, PYTHONPATH=str(root)), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    faults = float(p.stdout.strip().splitlines()[-1])
    assert faults < 200, f"{faults} page faults a run of param_readiness/FIXED, after two runs"


@glibc
def test_the_setting_is_taken_once_a_run_ran() -> None:
    SimDevice().run(lambda dev: None)
    assert host_memory_kept() is True
