"""Run unmodified torch.cuda code on the simulated device: ``simdevice.cuda()``.

::

    with simdevice.cuda("my.py::fn::side#0+3") as sim:      # or simdevice.cuda() for the default schedule
        my_offload_protocol()                              # plain torch.cuda code, run in virtual time
    print(sim.text())                                      # races, stale reads, deadlocks, ...

While a session is open, ``torch.cuda`` (streams, events, ``stream()``, ``synchronize()``, memory statistics,
``nvtx``), ``"cuda"`` devices and indices in factories, ``Tensor.cuda()`` / ``.to("cuda")``, and the default
``torch.distributed`` process group are the simulated device's; simulated tensors show ``cuda:0`` to Python
code (in autograd hooks and backward too). Leaving the session puts torch back exactly as it was. See
docs/dropin.md for what is intercepted and what is not.
"""

from simdevice.dropin.session import DropIn, cuda

__all__ = ["DropIn", "cuda"]
