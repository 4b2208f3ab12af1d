"""A lazy module moved to the device before its first forward (CHANGELOG, twenty-sixth sitting) makes each
placeholder as torch's ``materialize`` makes it, beyond ``test_a_lazy_module_moved_to_the_device_is_made_there.py``:
a move that names the dtype it already has (``module.to("cuda", torch.float32)``) is a move, no conversion; a
buffer stays a plain tensor (not a ``Parameter``); a parameter made frozen stays frozen; and an
explicit ``materialize(shape, dtype=...)`` or ``materialize(shape, device="cpu")`` makes it with that dtype, or on
that device."""

from __future__ import annotations

import torch
from torch import nn

import simdevice


def _clean(program: object) -> None:
    run = simdevice.cuda()
    run.run(program)
    run.assert_clean()


def test_a_move_that_names_the_dtype_it_has_is_a_move() -> None:
    def program() -> None:
        for model in (nn.LazyLinear(3).to("cuda", torch.float32), nn.LazyLinear(3).to(device="cuda",
                                                                                       dtype=torch.float32)):
            y = model(torch.ones(2, 5, device="cuda"))
            assert y.is_cuda
            assert model.weight.dtype == torch.float32

    _clean(program)


def test_a_lazy_buffer_is_made_a_plain_tensor() -> None:
    def program() -> None:
        bn = nn.LazyBatchNorm1d().cuda()
        bn(torch.ones(4, 3, device="cuda"))
        assert bn.running_mean.is_cuda
        assert not isinstance(bn.running_mean, nn.Parameter)
        assert isinstance(bn.weight, nn.Parameter)

    _clean(program)


def test_a_parameter_made_frozen_stays_frozen() -> None:
    """A lazy module's own ``UninitializedParameter(requires_grad=False)`` (torch refuses ``requires_grad_`` of one
    before it is made) becomes a frozen parameter."""

    def program() -> None:
        model = nn.Module()
        model.frozen = nn.parameter.UninitializedParameter(requires_grad=False)
        model.trained = nn.parameter.UninitializedParameter()
        model.cuda()
        model.frozen.materialize((3,))
        model.trained.materialize((3,))
        assert model.frozen.is_cuda
        assert model.trained.is_cuda
        assert not model.frozen.requires_grad
        assert model.trained.requires_grad

    _clean(program)


def test_an_explicit_materialize_takes_its_dtype_and_device() -> None:
    def program() -> None:
        a = nn.LazyLinear(3).cuda()
        a.weight.materialize((3, 5), dtype=torch.float64)
        assert a.weight.is_cuda
        assert a.weight.dtype == torch.float64
        b = nn.LazyLinear(3).cuda()
        b.weight.materialize((3, 5), device="cpu")
        assert not b.weight.is_cuda
        assert b.weight.shape == (3, 5)

    _clean(program)
