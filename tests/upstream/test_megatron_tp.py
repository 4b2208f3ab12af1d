"""Megatron-LM's real tensor-parallel layers (megatron-core 0.16.1 from PyPI, unmodified) on the simulator
(``megatron_tp.py``), two ranks: ``parallel_state.initialize_model_parallel(2)`` on each rank (each simulated process
has its own ``parallel_state``: the second rank found the first's groups made, before), a column- then a
row-parallel layer, with and without sequence parallelism: every schedule is clean, and the output equals the one
the whole weights give. Needs the extra ``upstream``; skipped without it."""

from __future__ import annotations

import importlib.util

import pytest

import simdevice
from reference.naming import import_file_as

_spec = importlib.util.find_spec("megatron")
if _spec is None or not _spec.submodule_search_locations:
    pytest.skip("megatron-core is not installed (the extra 'upstream')", allow_module_level=True)

DRIVER = "tests/upstream/megatron_tp.py"


@pytest.mark.parametrize("function", ["layers", "sequence_parallel"])
def test_the_real_layers_are_clean_and_compute_the_whole_layers_output(function: str) -> None:
    found = simdevice.explore(f"{DRIVER}::{function}", max_examples=15, world_size=2)
    assert found.failure is None, found.text()
    module = import_file_as("megatron_tp_driver", DRIVER)
    assert module is not None
    s = simdevice.cuda()
    s.run(getattr(module, function), world_size=2)
    s.assert_clean()
    for got, expected in s.result.result:
        assert got == pytest.approx(expected, rel=1e-5)
