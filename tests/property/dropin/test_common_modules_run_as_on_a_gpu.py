"""Common modules on the simulated device compute what they compute on the host, forward and backward, with no
report: ``BatchNorm`` in eval mode and its backward where the input needs no gradient, ``EmbeddingBag`` in each mode
(with ``include_last_offset`` too), and recurrent layers over packed sequences. Before, each stopped with a host error
of the stream ("found", for a correct program): a CPU kernel shapes some results otherwise than CUDA's, whose shapes
the simulator's outputs have (``native_batch_norm``'s saved statistics in eval mode are empty on the CPU,
``_embedding_bag``'s ``offset2bag`` empty on its fast path and its ``bag_size`` one shorter with
``include_last_offset``, ``native_batch_norm_backward``'s ``grad_input`` undefined where the mask says so); and a
packed sequence's lengths, a host tensor on a GPU too, were refused as a host tensor among device tensors."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from hazards import MODULE_PROGRAMS, module_on_the_host, same_module_results

import simdevice


@pytest.mark.parametrize("name", sorted(MODULE_PROGRAMS))
def test_a_module_computes_on_the_simulated_device_what_it_computes_on_the_host(name: str) -> None:
    program = MODULE_PROGRAMS[name]
    want = {k: module_on_the_host(v) for k, v in program("cpu").items()}
    got: list[dict[str, Any]] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the RNNs' cuDNN notes)
        with simdevice.cuda() as sim:
            got.append({k: module_on_the_host(v) for k, v in program("cuda").items()})
    sim.assert_clean()
    assert sorted(got[0]) == sorted(want)
    for key in want:
        assert same_module_results(want[key], got[0][key]), key
    if name == "packed_sequences":
        assert want["batch sizes"][0] == "cpu"
