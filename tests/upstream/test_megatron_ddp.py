"""Megatron-LM's real ``DistributedDataParallel`` (megatron-core 0.16.1 from PyPI, unmodified) on the simulator
(``megatron_ddp.py``), two ranks: with its distributed optimizer's buffers and both overlaps, every schedule is
clean (its coalesced parameter gather waited for by each layer's pre-hook); a weight read before its bucket's gather
is waited for races with that gather, named at Megatron's own call, and the fix suggested and checked is the wait;
trained by Megatron's own distributed optimizer, every schedule is clean and the ranks end with the same model.
Needs the extra ``upstream``; skipped without it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from hypothesis import strategies as st

import simdevice
from reference.naming import import_file_as, short_path
from simdevice.explain import suggest
from simdevice.search.targets import resolve

_spec = importlib.util.find_spec("megatron")
if _spec is None or not _spec.submodule_search_locations:
    pytest.skip("megatron-core is not installed (the extra 'upstream')", allow_module_level=True)

DRIVER = "tests/upstream/megatron_ddp.py"
_upstream = Path(next(iter(_spec.submodule_search_locations))) / "core" / "distributed" / "param_and_grad_buffer.py"
UPSTREAM = short_path(str(_upstream))


def test_the_real_ddp_is_clean() -> None:
    found = simdevice.explore(f"{DRIVER}::step", config=st.fixed_dictionaries({"steps": st.integers(1, 2)}),
                              max_examples=30, world_size=2)
    assert found.failure is None, found.text()


def test_a_weight_read_before_its_gather_is_waited_for_races_and_the_wait_is_suggested() -> None:
    target = f"{DRIVER}::read_early"
    found = simdevice.explore(target, max_examples=20, world_size=2)
    assert found.failure is not None
    races = [str(r) for r in found.failure.run.reports if r.kind == "race"]
    assert any("all_gather (receive)" in r and f"({UPSTREAM}:" in r for r in races), races
    fix = suggest(resolve(target, 2), found.failure, schedules=20)
    assert fix.checked, fix.lines()
    assert any("nccl@" in str(e) and f"->rank0.default@{DRIVER}:" in str(e) for e in fix.edges), fix.lines()


def test_training_with_the_real_distributed_optimizer_is_clean() -> None:
    found = simdevice.explore(f"{DRIVER}::trained", max_examples=10, world_size=2)
    assert found.failure is None, found.text()
    module = import_file_as("megatron_ddp_driver", DRIVER)
    assert module is not None
    s = simdevice.cuda()
    s.run(module.trained, world_size=2)
    s.assert_clean()
    first, second = s.result.result
    assert first == second
