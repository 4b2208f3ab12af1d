"""A pipeline's point-to-point hand-off, in plain torch.cuda and torch.distributed, on two ranks:

    simdevice check examples/pipeline_plain.py::handoff_racy --world-size 2     # found: the buffer refilled mid-send
    simdevice check examples/pipeline_plain.py::handoff_correct --world-size 2  # clean
    simdevice replay "examples/pipeline_plain.py::handoff_racy::rank0.p2p1-nccl#0+20" --world-size 2 --gpu

Rank 0 sends each microbatch's activations from one buffer, which it refills for the next; rank 1 receives each and
checks it. ``isend`` runs on the stream of the pair of ranks (``rank0.p2p1-nccl``), and the send reads the buffer
when it runs there, not when it is called: the buffer is the sender's again once the work's ``wait()`` returned.
"""

import torch
import torch.distributed as dist


def _handoff(wait: bool, n: int, microbatches: int) -> None:
    buf = torch.empty(n, device="cuda")
    sends = []
    got = []
    for mb in range(microbatches):
        if dist.get_rank() == 0:
            if wait and sends:
                sends[-1].wait()  # wait: the last send must have read the buffer before it is refilled
            buf.fill_(float(mb + 1))
            sends.append(dist.isend(buf, 1))
        else:
            dist.irecv(buf, 0).wait()  # wait: the activations must have landed before they are read
            got.append(buf.sum().item() / n)
    for work in sends:
        work.wait()
    if dist.get_rank() == 1:  # (checked after the last receive: a rank that stopped early would hang its peer's send)
        assert got == [float(mb + 1) for mb in range(microbatches)], f"received {got}: the sender refilled the buffer"


def handoff_racy(n: int = 4096, microbatches: int = 2) -> None:
    """The buffer is refilled while the send of the last microbatch may still be reading it."""
    _handoff(False, n, microbatches)


def handoff_correct(n: int = 4096, microbatches: int = 2) -> None:
    _handoff(True, n, microbatches)
