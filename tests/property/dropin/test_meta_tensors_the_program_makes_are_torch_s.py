"""Model code made on the meta device (``with torch.device("meta")``, ``device="meta"``), then given memory on the
device (``to_empty(device="cuda")``) and initialized there, as large-model code builds its models: the meta
tensors are torch's own, with no memory, as on a GPU. The simulated device's tensors are meta shells, and the
session took a factory given the meta device for one of them: the program's meta tensors were simulated CUDA
tensors made in device memory, ``is_meta`` False (an assertion of the program failed: "found"), and a model built
there took its size in device memory before it was ever moved."""

from __future__ import annotations

import torch
from hazard_checks import races_only_unwaited

import simdevice


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4))


def test_a_model_built_on_the_meta_device_is_made_on_the_device_by_to_empty() -> None:
    with simdevice.cuda() as sim:
        with torch.device("meta"):
            model = _model()
            made = torch.ones(3), torch.tensor([1.0, 2.0])
        explicit = torch.empty(8, device="meta"), torch.nn.Linear(4, 4, device="meta").weight
        metas = [p.is_meta and p.device.type == "meta" for p in [*model.parameters(), *made, *explicit]]
        allocated_before = torch.cuda.memory_allocated()
        model.to_empty(device="cuda")
        for m in model.modules():
            if hasattr(m, "reset_parameters"):
                m.reset_parameters()
        out = model(torch.randn(8, 16, device="cuda"))
        out.sum().backward()
        moved = [p.is_cuda and not p.is_meta and p.grad is not None for p in model.parameters()]
        allocated_after = torch.cuda.memory_allocated()
        with torch.device("cuda"):
            inside_cuda = torch.ones(3).is_cuda  # (a CUDA block still gives its device)
    sim.assert_clean()
    assert metas == [True] * 10
    assert allocated_before == 0
    assert all(moved)
    assert allocated_after > 0
    assert inside_cuda


def test_the_hazards_meta_built_model_races_unwaited_and_not_waited() -> None:
    """``tests/hazards.py::meta_model_reload`` (what tests/gpu runs on a GPU)."""
    races_only_unwaited("meta_model_reload", "side#0+20")
