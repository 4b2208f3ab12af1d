"""Loaders remake a parameter through its class, ``type(p)(data, requires_grad=p.requires_grad)`` (Hugging Face's
``set_module_tensor_to_device``, which ``accelerate.cpu_offload`` calls before each forward), as ``Parameter(...)``
on a GPU. A simulated parameter's class is the simulator's tensor class (a ``Parameter`` by torch's mark), whose
constructor took the simulator's own arguments: the call raised ``TypeError: SimTensor.__new__() got an unexpected
keyword argument 'requires_grad'``, a host error of a correct program ("found")."""

from __future__ import annotations

import torch

import simdevice


def test_the_class_of_a_simulated_parameter_makes_a_parameter_as_torch_s_does() -> None:
    with simdevice.cuda() as sim:
        model = torch.nn.Linear(4, 4).cuda()
        cls = type(model.weight)
        on_device = cls(model.weight.detach() * 2, requires_grad=False)
        on_host = cls(torch.ones(2))
        got = (isinstance(on_device, torch.nn.Parameter), on_device.is_cuda, on_device.requires_grad,
               type(on_host) is torch.nn.Parameter, on_host.is_cuda, on_host.requires_grad,
               torch.equal(on_device, model.weight.detach() * 2))
        model.weight = on_device  # (a module takes it as a parameter)
        out = model(torch.ones(1, 4, device="cuda")).sum().item()
    sim.assert_clean()
    assert got == (True, True, False, True, False, True, True)
    assert isinstance(out, float)
