"""Megatron-LM's real ``HybridDeviceOptimizer`` (megatron-core 0.16.1 from PyPI, unmodified) on the simulator
(``megatron_hybrid_optimizer.py``): every schedule is clean, with all or half the parameters offloaded and with or
without the overlapping streams; each mutant (one of its synchronizations made a no-op on the optimizer's own
objects) is found with wrong weights, and the fix suggested and checked is the synchronization taken away: the host
waits for the gradient's D2H before its AdamW step reads the pinned gradient; the D2H stream waits for the
backward before it copies the gradient. Needs the extra ``upstream``; skipped without it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from hypothesis import strategies as st

import simdevice
from reference.naming import short_path
from simdevice.explain import suggest
from simdevice.search.targets import resolve

_spec = importlib.util.find_spec("megatron")
if _spec is None or not _spec.submodule_search_locations:
    pytest.skip("megatron-core is not installed (the extra 'upstream')", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
DRIVER = "tests/upstream/megatron_hybrid_optimizer.py"
_upstream = (Path(next(iter(_spec.submodule_search_locations))) / "core" / "optimizer" / "cpu_offloading"
             / "hybrid_optimizer.py")
UPSTREAM = short_path(str(_upstream))
#: the gradient's D2H into pinned memory
D2H = f"{UPSTREAM}:" + str(next(i for i, line in enumerate(_upstream.read_text().splitlines(), 1)
                                if "self.cpu_copy_map_grad[param].data.copy_(grad, non_blocking=True)" in line))
CONFIG = st.fixed_dictionaries({"steps": st.integers(1, 3), "fraction": st.sampled_from([0.5, 1.0]),
                                "overlap": st.booleans()})


def test_the_real_optimizer_is_clean() -> None:
    found = simdevice.explore(f"{DRIVER}::train", config=CONFIG, max_examples=40)
    assert found.failure is None, found.text()


@pytest.mark.parametrize(("mutant", "edge"), [
    ("train_without_d2h_event_sync", f"d2h_stream@{D2H}->host@{UPSTREAM}:"),
    ("train_without_d2h_stream_wait", f"default@{DRIVER}:"),
])
def test_each_mutant_races_and_the_missing_synchronization_is_named_and_checked(mutant: str, edge: str) -> None:
    target = f"{DRIVER}::{mutant}"
    found = simdevice.explore(target, config=st.fixed_dictionaries({"steps": st.integers(1, 3)}), max_examples=100)
    assert found.failure is not None
    reports = [str(r) for r in found.failure.run.reports]
    assert any(r.startswith("race: ") and f"({D2H})" in r for r in reports), reports
    fix = suggest(resolve(target), found.failure, schedules=20)
    assert fix.checked, fix.lines()
    edges = [str(e) for e in fix.edges]
    assert any(e.startswith(edge) for e in edges), fix.lines()
    if mutant == "train_without_d2h_stream_wait":
        assert any(e.endswith(f"->d2h_stream@{D2H}") for e in edges), fix.lines()
