"""Older code spells device tensors with torch's legacy types: ``torch.cuda.LongTensor([...])``,
``torch.cuda.FloatTensor(n)``, ``t.type(torch.cuda.HalfTensor)``, ``isinstance(t, torch.cuda.FloatTensor)``,
``torch.set_default_tensor_type(torch.cuda.FloatTensor)``. In a session they are the simulated device's. Before, the
CPU build's types stood: making one raised ``TypeError: type torch.cuda.FloatTensor not available`` (a host error
blamed on the program: "found"), ``.type()`` to one raised that CUDA cannot initialize, and ``isinstance`` of a
device tensor answered False, so a program took its host branch."""

from __future__ import annotations

import pytest
import torch
from hazard_checks import races_only_unwaited

import simdevice


def test_the_constructors_make_device_tensors_as_torch_s_legacy_constructor() -> None:
    with simdevice.cuda() as sim:
        sized = torch.cuda.FloatTensor(2, 3)
        shaped = torch.cuda.LongTensor(torch.Size([4]))
        data = torch.cuda.LongTensor([1, 2, 3])
        empty = torch.cuda.HalfTensor()
        alias = torch.cuda.FloatTensor(sized.fill_(1.0))
        alias.add_(1.0)
        got = (sized.shape, sized.dtype, sized.is_cuda, shaped.shape, shaped.dtype, data.tolist(), data.is_cuda,
               empty.shape, empty.dtype, sized.sum().item())
        with pytest.raises(TypeError, match=r"expected torch\.cuda\.HalfTensor"):
            torch.cuda.HalfTensor(sized)  # (another type's tensor: torch's type check)
        with pytest.raises(RuntimeError, match="expects device type: cuda"):
            torch.cuda.FloatTensor(3, device="cpu")
    sim.assert_clean()
    assert got == ((2, 3), torch.float32, True, (4,), torch.int64, [1, 2, 3], True, (0,), torch.float16, 12.0)
    assert type(torch.cuda.FloatTensor) is type(torch.FloatTensor)  # (torch's own again)


def test_isinstance_and_type_name_the_device_s_types() -> None:
    with simdevice.cuda() as sim:
        x = torch.ones(3, device="cuda")
        checks = (isinstance(x, torch.cuda.FloatTensor), isinstance(x, torch.cuda.HalfTensor),
                  isinstance(torch.ones(3), torch.cuda.FloatTensor), isinstance(torch.nn.Parameter(x),
                                                                               torch.cuda.FloatTensor),
                  isinstance(x, (torch.FloatTensor, torch.cuda.FloatTensor)))
        half = x.type(torch.cuda.HalfTensor)
        double = torch.ones(3).type("torch.cuda.DoubleTensor")
        same = x.type(torch.cuda.FloatTensor)
        host = x.type(torch.FloatTensor)
        names = (repr(torch.cuda.FloatTensor), torch.cuda.FloatTensor.__name__, x.type(), half.type())
        with pytest.raises(ValueError, match="invalid type"):
            x.type("torch.cuda.NoSuchTensor")
        moved = (half.dtype, half.is_cuda, double.dtype, double.is_cuda, same is x, host.is_cuda, host.tolist())
    sim.assert_clean()
    assert checks == (True, False, False, True, True)
    assert names == ("<class 'torch.cuda.FloatTensor'>", "FloatTensor", "torch.cuda.FloatTensor",
                     "torch.cuda.HalfTensor")
    assert moved == (torch.float16, True, torch.float64, True, True, False, [1.0, 1.0, 1.0])


def test_a_default_tensor_type_of_the_device_makes_factories_put_their_tensors_there() -> None:
    with simdevice.cuda() as sim:
        torch.set_default_tensor_type(torch.cuda.FloatTensor)
        on_device = torch.ones(3).is_cuda
        torch.set_default_tensor_type(torch.FloatTensor)
        back = torch.ones(3).is_cuda
    sim.assert_clean()
    assert (on_device, back) == (True, False)


def test_a_move_by_legacy_type_races_without_its_wait_and_not_with_it() -> None:
    """``tests/hazards.py::legacy_type_reload`` (what tests/gpu runs on a GPU): the pinned buffer refilled while the
    H2D that ``.type(torch.cuda.FloatTensor, True)`` made may still read it."""
    races_only_unwaited("legacy_type_reload", "default#0+20")
