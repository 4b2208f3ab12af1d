"""Megatron-LM's real fine-grained activation offload (megatron-core 0.16.1 from PyPI, unmodified) on the simulator.

The module runs byte for byte through the torch.cuda drop-in: the search finds the inline-reload race (the H2D of
``tensor_pop`` reads the pinned buffer the D2H may still fill) and shrinks it; the printed line replays to the same
reports from the command line; with the fixes written in ``megatron_offload.py`` every schedule is clean. Needs the
extra ``upstream`` (``pip install -e '.[upstream]'``); skipped without it.

Not found: the queue-empty shortcut of ``finish_all_groups`` is in 0.16.1, but no driver tried reaches it there
(docs/dropin.md says which and why): in 0.16.1 a group that is not offloaded stays on the offload queue, so the
two queues are never both empty in the middle of a chunk's forward.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed (the extra 'upstream')")

from hypothesis import strategies as st

import simdevice
from reference.schedule import Schedule
from simdevice import StaleRead
from simdevice.search.targets import resolve

ROOT = Path(__file__).resolve().parents[2]
TRAIN = "tests/upstream/megatron_offload.py::train"
CONFIG = st.fixed_dictionaries({"layers": st.integers(1, 3), "mb": st.integers(1, 2), "iters": st.integers(1, 2)})


def test_the_inline_reload_race_is_found_shrunk_and_replays() -> None:
    found = simdevice.explore(TRAIN, config=CONFIG, max_examples=60)
    assert found.failure is not None
    assert found.schedule == TRAIN  # shrunk to the smallest model, no delay: it needs no stall on the simulator
    stale = [r for r in found.failure.run.reports if isinstance(r, StaleRead)]
    assert stale
    assert all(r.read.op == "copy_ (H2D)" and r.read.actor == "default" for r in stale)
    assert all("fine_grained_activation_offload.py" in r.read.source for r in stale)
    again = resolve(TRAIN).run(Schedule.parse(str(found.schedule)))
    assert [str(r) for r in again.run.reports] == [str(r) for r in found.failure.run.reports]
    # the printed line replays in a fresh process (--no-fix: the suggested fix's search is test_explain's business)
    p = subprocess.run([sys.executable, "-m", "simdevice", "replay", found.schedule, "--no-fix"], cwd=ROOT,
                       capture_output=True, text=True, check=False)
    assert p.returncode == 1
    assert "weight 0 differs from the run without offload" in p.stdout


def test_a_stalled_d2h_stream_is_still_a_failure_and_names_the_upstream_lines() -> None:
    out = resolve(TRAIN).run(Schedule.parse(f"{TRAIN}:layers=2:d2h_stream#0+20"))
    assert out.corrupted
    assert out.run.unfired == ()
    assert {"d2h_stream", "h2d_stream"} <= set(out.run.op_counts)


def test_with_the_fixes_every_schedule_is_clean() -> None:
    found = simdevice.explore("tests/upstream/megatron_offload.py::train_fixed", config=CONFIG, max_examples=100)
    assert found.failure is None, found.text()
