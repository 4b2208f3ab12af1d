"""A factory that takes a ``layout`` dispatches on the layout asked for, not on a dense CUDA tensor:
native_functions.yaml gives ``_sparse_coo_tensor_with_dims_and_tensors`` no ``CUDA`` key (``SparseCUDA`` instead),
yet a GPU makes a sparse COO tensor on the device. So it is not among the ops refused at the call as a GPU's that
have no CUDA kernel (``dispatch._lacks_cuda_kernel``); whatever the simulator then says of it (sparse tensors are not
simulated), it does not claim a GPU lacks it. Mutation caught (a sweep of the twenty-ninth sitting's rules): the
``layout`` exception left out, ``torch.sparse_coo_tensor`` of device tensors refused with "the operator has no CUDA
kernel"."""

from __future__ import annotations

import torch

import simdevice


def test_a_sparse_coo_tensor_of_device_tensors_is_not_refused_as_a_gpu_would_refuse_it() -> None:
    got: list[str] = []

    def program() -> None:
        indices = torch.tensor([[0, 1], [1, 2]], device="cuda")
        values = torch.tensor([1.0, 2.0], device="cuda")
        try:
            torch.sparse_coo_tensor(indices, values, (3, 3))
        except NotImplementedError as e:  # (not simulated: no verdict)
            got.append(str(e))

    s = simdevice.cuda()
    s.run(program)
    assert not any("no CUDA kernel" in e for e in got), got
