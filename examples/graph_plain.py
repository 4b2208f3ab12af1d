"""A CUDA graph's static input refilled on a copy stream before each replay, in plain torch.cuda:

    simdevice check examples/graph_plain.py::replay_racy      # found: the replay does not wait for the copy
    simdevice check examples/graph_plain.py::replay_correct   # clean
    simdevice check examples/graph_plain.py::input_freed      # found: the graph reads a tensor the program dropped

Each asserts what it must hold (the value oracle).
"""

import torch


def _replay(wait: bool, n: int) -> None:
    """Capture ``out = static_in * 2 + 1`` once; before each replay, copy the next batch into ``static_in`` from
    pinned memory on a copy stream (so that the copy overlaps the previous replay)."""
    static_in = torch.zeros(n, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_out = static_in * 2 + 1
    copy = torch.cuda.Stream()
    batches = [torch.full((n,), float(k)).pin_memory() for k in range(3)]
    outs = []
    for batch in batches:
        copy.wait_stream(torch.cuda.current_stream())  # wait: the copy must not overwrite what a replay still reads
        with torch.cuda.stream(copy):
            static_in.copy_(batch, non_blocking=True)
        if wait:
            torch.cuda.current_stream().wait_stream(copy)  # wait: the replay must not read before the copy lands
        g.replay()
        outs.append(static_out.clone())
    for k, out in enumerate(outs):
        assert torch.equal(out.cpu(), torch.full((n,), 2.0 * k + 1)), f"replay {k} computed on another batch"


def replay_racy(n: int = 4096) -> None:
    """The replay does not wait for the copy that fills its static input."""
    _replay(False, n)


def replay_correct(n: int = 4096) -> None:
    _replay(True, n)


def input_freed(n: int = 4096) -> None:
    """The graph reads ``x``, which the program drops after the capture: a CUDA graph holds no reference, so the
    next tensor of its size takes its block, and the replay reads that."""
    x = torch.ones(n, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = x * 3
    del x
    y = torch.full((n,), 7.0, device="cuda")
    g.replay()
    assert torch.equal(out.cpu(), torch.full((n,), 3.0)), "the replay read another tensor's memory"
    assert torch.equal(y.cpu(), torch.full((n,), 7.0))
