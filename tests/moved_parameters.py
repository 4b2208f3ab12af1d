"""A parameter moved between the host and the device with ``p.data =`` and back, run unchanged on the simulator
(``tests/property/dropin/test_a_parameter_moved_and_back_keeps_its_graph_and_gradient.py``) and on a GPU
(``tests/gpu/test_dropin_gpu.py``), where torch's ``set_data`` keeps one tensor throughout:

- ``round_trip``: a graph made on the device, the parameter moved to the host and back, then the graph's backward
  and a new forward's: both accumulate into the parameter, and the new forward's graph has a new ``AccumulateGrad``
  node (``set_data`` across devices resets the tensor's accumulator);
- ``grad_left_behind``: the parameter moved to the host with its gradient on the device, which it keeps showing
  there (FSDP's ``CPUOffload`` reads it so, after its reshard), until ``grad = None``; a host gradient then given
  stays on the host when the parameter moves back;
- ``freed_on_the_host``: the device bytes of a parameter moved to the host with its gradient are freed;
- ``backward_on_the_host``: a graph's backward run while its parameter is on the host gives it the device gradient;
- ``version_of_its_own``: a parameter given another tensor's bytes keeps its own version counter;
- ``copied_and_saved``: a moved parameter deep-copied and saved holds nothing but its own.
"""

from __future__ import annotations

from typing import Any

import torch


def round_trip() -> tuple[bool, list[float], str, str]:
    p = torch.nn.Parameter(torch.ones(4, device="cuda"))
    y = (p * 2).sum()
    before = torch.autograd.graph.get_gradient_edge(p).node
    kept = p.data
    p.data = kept.cpu()
    p.data = kept
    y.backward()
    z = (p * 3).sum()
    after = z.grad_fn.next_functions[0][0].next_functions[0][0]  # (sum <- mul <- AccumulateGrad)
    z.backward()
    assert p.grad is not None
    return after is before, p.grad.tolist(), p.device.type, p.grad.device.type


def grad_left_behind() -> list[Any]:
    p = torch.nn.Parameter(torch.ones(4, device="cuda"))
    (p * 3).sum().backward()
    p.data = p.data.cpu()
    assert p.grad is not None
    shown = [p.device.type, p.grad.device.type, p.grad.tolist()]
    p.grad = None
    cleared = p.grad is None
    p.grad = torch.full((4,), 7.0)
    p.data = p.data.cuda()
    return [shown, cleared, p.device.type, p.grad.device.type, p.grad.tolist()]


def freed_on_the_host() -> int:
    """A 4 MiB parameter with a gradient moved to the host: the device bytes it had are freed (its gradient's are
    not). Returns the bytes the device's allocated memory fell by."""
    p = torch.nn.Parameter(torch.ones(1 << 20, device="cuda"))
    (p * 2).sum().backward()
    before = torch.cuda.memory_allocated()
    p.data = p.data.cpu()
    return before - torch.cuda.memory_allocated()


def backward_on_the_host() -> list[Any]:
    """A graph made on the device, its backward run while the parameter is on the host: the device gradient goes to
    the parameter, which shows it there."""
    p = torch.nn.Parameter(torch.ones(4, device="cuda"))
    y = (p * 2).sum()
    p.data = p.data.cpu()
    y.backward()
    assert p.grad is not None
    return [p.device.type, p.grad.device.type, p.grad.tolist()]


def version_of_its_own() -> list[Any]:
    """A host parameter given a device tensor's bytes, a graph made of a view of it, then the device tensor changed
    in place: the parameter's version counter is its own (``set_data`` keeps it), so the graph's saved view is not
    stale and the backward reads the changed bytes. (FSDP's low-precision shard is so changed before a backward.)"""
    p = torch.nn.Parameter(torch.ones(4))
    shard = torch.ones(4, device="cuda")
    p.data = shard
    w, _ = p.split([2, 2])
    y = (w * w).sum()
    shard.add_(1)
    y.backward()
    assert p.grad is not None
    return [p._version, shard._version, p.grad.tolist()]


def copied_and_saved() -> list[Any]:
    """A parameter on the host whose gradient is on the device, deep-copied and saved with ``torch.save``: the copies
    hold its values and attributes, nothing of the simulator's."""
    import copy
    import io

    p = torch.nn.Parameter(torch.ones(4, device="cuda"))
    (p * 2).sum().backward()
    p.data = p.data.cpu()
    p.tag = "w"  # type: ignore[attr-defined]
    q = copy.deepcopy(p)
    buf = io.BytesIO()
    torch.save({"p": p}, buf)
    buf.seek(0)
    back = torch.load(buf, weights_only=False)["p"]
    return [sorted(vars(q)), q.tolist(), sorted(vars(back)), back.tolist()]
