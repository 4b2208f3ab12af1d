"""Hugging Face transformers' real offloaded KV cache (``DynamicCache(offloading=True)``, transformers 5.25.0 from
PyPI, unmodified) on the simulator.

The cache runs byte for byte through the torch.cuda drop-in (``transformers_offload.py``, a decode loop). With two
or more offloaded layers every schedule is clean. The mutant (``decode_without_prefetch_wait``: the prefetch
stream's wait for the compute stream made a no-op) is found, and the fix suggested and checked is that wait's
reason as the cache's own comment gives it: the prefetch's H2D must wait for the offload's D2H on the compute
stream, which is still filling the pinned buffer the prefetch reads.

Found in upstream: with a single offloaded layer (a one-layer stack; or one full-attention layer whose neighbours
never call ``update``, as linear-attention and KV-sharing layers do not), ``update`` prefetches the very layer it
is updating: ``prefetch`` circles back to it after the compute stream's wait on the prefetch stream, so the
concatenation on the compute stream reads the keys and values while their H2D on the prefetch stream may still
write them. The fix suggested and checked: the compute stream waits for that H2D before the concatenation.
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
from reference.schedule import Schedule
from simdevice.explain import suggest
from simdevice.search.targets import resolve

_spec = importlib.util.find_spec("transformers")
if _spec is None or not _spec.submodule_search_locations:
    pytest.skip("transformers is not installed (the extra 'upstream')", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
DRIVER = "tests/upstream/transformers_offload.py"
_upstream = Path(next(iter(_spec.submodule_search_locations))) / "cache_utils.py"
UPSTREAM = short_path(str(_upstream))


def _line(text: str, within: str | None = None) -> int:
    """The line of the cache's module that holds ``text`` (the sites the reports name, whatever the version's), the
    first after the line that holds ``within`` where given."""
    lines = _upstream.read_text().splitlines()
    start = 0 if within is None else next(i for i, line in enumerate(lines) if within in line)
    return next(i for i, line in enumerate(lines[start:], start + 1) if text in line)


#: the offload's D2H and the prefetch's H2D of the keys (``CacheLayerMixin``), the update's concatenation of them
#: (``DynamicLayer``) and its in-place write of the new ones (``StaticLayer``)
_OFFLOAD = 'self.keys = self.keys.to("cpu", non_blocking=True)'
D2H = f"{UPSTREAM}:{_line(_OFFLOAD)}"
H2D = f"{UPSTREAM}:{_line('self.keys = self.keys.to(self.device, non_blocking=True)')}"
CAT = f"{UPSTREAM}:{_line('self.keys = torch.cat([self.keys, key_states], dim=-2)', 'class DynamicLayer(')}"
INDEX_COPY = f"{UPSTREAM}:{_line('self.keys.index_copy_(2, cache_position, key_states)', 'class StaticLayer(')}"
CONFIG = st.fixed_dictionaries({"steps": st.integers(2, 4), "full": st.integers(2, 3),
                                "sliding": st.integers(0, 1), "static": st.booleans()})


def test_the_real_cache_is_clean_with_two_or_more_offloaded_layers() -> None:
    found = simdevice.explore(f"{DRIVER}::decode", config=CONFIG, max_examples=40)
    assert found.failure is None, found.text()


@pytest.mark.parametrize("static", [False, True])
def test_a_single_offloaded_layer_is_prefetched_by_its_own_update_and_read_unwaited(static: bool) -> None:
    """The update's write of the keys that reads the prefetched ones: ``DynamicLayer``'s ``cat``, ``StaticLayer``'s
    in-place ``index_copy_`` (which the H2D may overwrite after it)."""
    target = f"{DRIVER}::decode"
    config = {"steps": 3, "full": 1, "sliding": 0, "static": static}
    found = simdevice.explore(target, default_config=config, config=st.just(config), max_examples=20)
    assert found.failure is not None
    op, site = ("index_copy_", INDEX_COPY) if static else ("cat", CAT)
    reports = [str(r) for r in found.failure.run.reports]
    assert any(r.startswith(f"race: {op} on stream default ") and "_to_copy (H2D) on stream prefetch_stream" in r
               and f"({H2D})" in r for r in reports), reports
    fix = suggest(resolve(target), found.failure, schedules=20)
    assert fix.checked, fix.lines()
    assert f"prefetch_stream@{H2D}->default@{site}" in [str(e) for e in fix.edges], fix.lines()


def test_the_mutant_without_the_prefetch_s_wait_races_and_its_reason_is_the_fix() -> None:
    target = f"{DRIVER}::decode_without_prefetch_wait"
    found = simdevice.explore(target, config=CONFIG, max_examples=40)
    assert found.failure is not None
    reports = [str(r) for r in found.failure.run.reports]
    assert any(r.startswith("race: ") and "_to_copy (H2D) on stream prefetch_stream" in r for r in reports), reports
    fix = suggest(resolve(target), found.failure, schedules=20)
    assert fix.checked, fix.lines()
    assert f"default@{D2H}->prefetch_stream@{H2D}" in [str(e) for e in fix.edges], fix.lines()


def test_the_upstream_race_replays_from_the_command_line() -> None:
    p = subprocess.run([sys.executable, "-m", "simdevice", "replay", f"{DRIVER}::decode:full=1,sliding=0",
                        "--no-fix"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "the attention read a layer's cache wrong" in p.stdout


def test_a_one_layer_model_generates_wrong_tokens_with_the_offloaded_cache() -> None:
    """End to end: ``model.generate(..., cache_implementation="offloaded")`` of a tiny Llama, through the model's
    own attention. Two layers: clean; one layer: the same race (the update's ``cat`` before the prefetch's H2D),
    other tokens than the host's, and the same fix, checked."""
    target = f"{DRIVER}::generate"
    clean = simdevice.explore(target, max_examples=5)
    assert clean.failure is None, clean.text()
    one = {"new": 3, "layers": 1}
    found = simdevice.explore(target, default_config=one, config=st.just(one), max_examples=5)
    assert found.failure is not None
    reports = [str(r) for r in found.failure.run.reports]
    assert any(r.startswith("race: cat on stream default ") and f"({H2D})" in r for r in reports), reports
    assert any("the model generated other tokens" in r for r in reports), reports
    fix = suggest(resolve(target), found.failure, schedules=5)
    assert fix.checked, fix.lines()
    assert f"prefetch_stream@{H2D}->default@{CAT}" in [str(e) for e in fix.edges], fix.lines()


def test_a_model_loaded_with_a_device_map_runs_and_its_race_is_found() -> None:
    """``from_pretrained(path, device_map="cuda")`` moves the weights in the workers of a pool transformers makes
    through a name it bound at import (before, no verdict: the workers were Python's threads); the loaded model
    generates as the one built in place does: two layers clean, one layer the same race and wrong tokens."""
    target = f"{DRIVER}::generate_loaded"
    clean = simdevice.explore(target, max_examples=3)
    assert clean.failure is None, clean.text()
    run = resolve(target).run(Schedule.parse(f"{target}:layers=1")).run
    reports = [str(r) for r in run.reports]
    assert any(r.startswith("race: cat on stream default ") and f"({H2D})" in r for r in reports), reports
    assert any("the model generated other tokens" in r for r in reports), reports
    assert any(actor.startswith("pool_") and n > 0 for actor, n in run.op_counts.items()), run.op_counts
