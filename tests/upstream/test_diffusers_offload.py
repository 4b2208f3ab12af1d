"""diffusers' real group offloading (``apply_group_offloading``, diffusers 0.42.1 and accelerate 1.16.0 from PyPI,
unmodified) on the simulator.

The hooks run byte for byte through the torch.cuda drop-in (``diffusers_offload.py``): block and leaf level, with
and without a stream, with and without ``record_stream`` and ``low_cpu_mem_usage``, every schedule is clean. Each
mutant (one of its synchronizations made a no-op on diffusers' own objects) is found with wrong outputs, and the
fix suggested and checked is the synchronization taken away: without the side stream's ``synchronize()``, the
compute reads a weight before its H2D landed (fix: the compute stream waits for the H2D); without the compute
stream's ``synchronize()`` before a group's device weights are let go (``param.data = pinned``), the next onload's
H2D on the side stream takes their block while the compute may still read it (fix: the side stream waits for the
compute, or ``record_stream`` on the compute stream, the option diffusers offers for it).
Needs the extra ``upstream`` (``pip install -e '.[upstream]'``); skipped without it.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import strategies as st

import simdevice
from reference.naming import short_path
from simdevice.explain import suggest
from simdevice.search.targets import resolve

_spec = importlib.util.find_spec("diffusers")
if _spec is None or not _spec.submodule_search_locations or importlib.util.find_spec("accelerate") is None:
    pytest.skip("diffusers and accelerate are not installed (the extra 'upstream')", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
DRIVER = "tests/upstream/diffusers_offload.py"
_upstream = Path(next(iter(_spec.submodule_search_locations))) / "hooks" / "group_offloading.py"
UPSTREAM = short_path(str(_upstream))


def _line(text: str) -> int:
    """The line of the group offloading module that holds ``text`` (first), whatever the version's numbers."""
    return next(i for i, line in enumerate(_upstream.read_text().splitlines(), 1) if text in line)


#: the onload's H2D (``_transfer_tensor_to_device``) and the offload's release of the device weight
H2D = f"{UPSTREAM}:{_line('moved = source_tensor.to(self.onload_device, non_blocking=self.non_blocking)')}"
RELEASE = f"{UPSTREAM}:{_line('param.data = self.cpu_param_dict[param]')}"
CONFIG = st.fixed_dictionaries({
    "steps": st.integers(1, 3),
    "stream": st.booleans(),
    "record_stream": st.booleans(),
    "level": st.sampled_from(["block_level", "leaf_level"]),
    "low_cpu_mem_usage": st.booleans(),
})
MUTANT_CONFIG = st.fixed_dictionaries({"steps": st.integers(1, 3),
                                       "level": st.sampled_from(["block_level", "leaf_level"])})


def test_the_real_group_offloading_is_clean() -> None:
    found = simdevice.explore(f"{DRIVER}::offload", config=CONFIG, max_examples=40)
    assert found.failure is None, found.text()
    from reference.schedule import Schedule

    run = resolve(f"{DRIVER}::offload").run(Schedule.parse(f"{DRIVER}::offload")).run
    assert run.op_counts["stream"] > 0  # (the onloads ran on the side stream)


@pytest.mark.parametrize("mutant", ["offload_without_compute_sync", "offload_without_side_sync"])
def test_each_mutant_races_and_the_missing_synchronization_is_named_and_checked(mutant: str) -> None:
    target = f"{DRIVER}::{mutant}"
    found = simdevice.explore(target, config=MUTANT_CONFIG, max_examples=100)
    assert found.failure is not None
    reports = [str(r) for r in found.failure.run.reports]
    assert any(r.startswith("race: ") and f"({H2D})" in r for r in reports), reports
    assert any("differs from the host's" in r for r in reports), reports
    fix = suggest(resolve(target), found.failure, schedules=20)
    assert fix.checked, fix.lines()
    edges = [str(e) for e in fix.edges]
    if mutant == "offload_without_side_sync":
        assert any(e.startswith(f"stream@{H2D}->default@") for e in edges), fix.lines()
    else:  # the side stream waits for the compute before the next onload, or record_stream where the block is let go
        assert any(e.startswith("default@") and e.endswith(f"->stream@{H2D}") for e in edges), fix.lines()
        assert any("record_stream` on that stream (`default`)" in a and RELEASE in a for a in fix.advice), fix.advice


def test_a_mutant_replays_from_the_command_line() -> None:
    p = subprocess.run([sys.executable, "-m", "simdevice", "replay", f"{DRIVER}::offload_without_side_sync",
                        "--no-fix"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "differs from the host's" in p.stdout
