"""A device index alone names the simulated CUDA device wherever torch takes one: ``torch.device(local_rank)``,
``model.to(local_rank)`` (the commonest spelling in a distributed training script), a device map of indices
(accelerate's ``dispatch_model``, Hugging Face's ``device_map="auto"``). The CPU build's C++ asked for an accelerator
there and failed (``Cannot access accelerator device when none is available``): no verdict for such a program."""

from __future__ import annotations

import copy
import importlib.util
import io
import pickle

import pytest
import torch
import torch.distributed as dist
from hazard_checks import races_only_unwaited

import simdevice


def test_an_index_is_the_cuda_device_and_devices_stay_torch_s() -> None:
    with simdevice.cuda() as sim:
        d = torch.device(0)
        model = torch.nn.Linear(4, 4).to(0)
        twice = torch.nn.Linear(4, 4).to(device=0, dtype=torch.float64)
        got = (d, type(d) is type(torch.device("cpu")), isinstance(d, torch.device), next(model.parameters()).device,
               next(twice.parameters()).dtype, torch.device("cuda", 0) == d, torch.device(type="cpu").type)
        kept = pickle.loads(pickle.dumps({"d": d, "host": torch.device("cpu")})), copy.deepcopy(d)
        raw = pickle.dumps(d)
        saved = io.BytesIO()
        torch.save({"device": d}, saved)
        saved.seek(0)
        loaded = torch.load(saved)  # (weights_only, which allows torch.device by its name)
        with pytest.raises(RuntimeError, match="invalid device ordinal"):
            torch.device(1)
    sim.assert_clean()
    cuda0 = torch.device("cuda", 0)
    assert got == (cuda0, True, True, cuda0, torch.float64, True, "cpu")
    assert kept == ({"d": cuda0, "host": torch.device("cpu")}, cuda0)
    assert raw == pickle.dumps(cuda0)  # (torch's own bytes: read outside a session too)
    assert loaded == {"device": cuda0}
    assert type(torch.device) is type  # (torch's own class again)
    with pytest.raises(RuntimeError, match="accelerator"):
        torch.device(0)  # (and the CPU build's answer)


def _ranks_move_their_model_to_their_index() -> None:
    rank = dist.get_rank()
    model = torch.nn.Linear(8, 8).to(rank)
    assert next(model.parameters()).is_cuda  # (every rank's tensors show cuda:0: docs/dropin.md)
    x = torch.ones(2, 8, device=torch.device(rank))
    out = model(x).sum()
    dist.all_reduce(out)
    assert out.is_cuda


def test_each_rank_moves_its_model_to_its_local_rank() -> None:
    run = simdevice.cuda()
    run.run(_ranks_move_their_model_to_their_index, world_size=2)
    run.assert_clean()


@pytest.mark.skipif(importlib.util.find_spec("accelerate") is None, reason="accelerate is not installed")
def test_accelerate_dispatches_a_model_over_a_device_map_of_indices() -> None:
    from accelerate import dispatch_model

    def program() -> None:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
        x = torch.randn(2, 8)
        with torch.no_grad():
            expected = model(x)
        model = dispatch_model(model, device_map={"0": 0, "1": 0, "2": "cpu"}, main_device=0)
        with torch.no_grad():
            out = model(x.to(0))
        assert torch.allclose(out.cpu(), expected, atol=1e-6)

    run = simdevice.cuda()
    run.run(program)
    run.assert_clean()


def test_the_hazards_indexed_device_races_unwaited_and_not_waited() -> None:
    """``tests/hazards.py::device_index_reload`` (what tests/gpu runs on a GPU)."""
    races_only_unwaited("device_index_reload", "side#0+20")
