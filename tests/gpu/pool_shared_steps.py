"""What CUDA's caching allocator reserves at each step of ``_pool_shared`` (two CUDA graphs sharing a private pool,
``tests/property/dropin/test_cuda_graphs_capture_and_replay.py``), whose last check (12 MiB reserved at the end) the
seventy-second run saw fail on an H100: ``memory_reserved()``, ``memory_allocated()`` and each segment of the
snapshot (its pool, its size and its blocks in KiB) after each step, to set against the simulator's.

Run on a GPU: ``python tests/gpu/pool_shared_steps.py``. Not a test: it prints.
"""

from __future__ import annotations

import torch

MIB = 1 << 20


def show(step: str) -> None:
    segments = [(s.get("segment_pool_id"), s["total_size"] // 1024,
                 [(b["size"] // 1024, b["state"]) for b in s["blocks"]]) for s in torch.cuda.memory_snapshot()]
    print(f"{step}: reserved {torch.cuda.memory_reserved() / MIB:.3f} MiB, allocated "
          f"{torch.cuda.memory_allocated()} B, segments {segments}", flush=True)


def main() -> None:
    big = 3 << 20
    x = torch.ones(big, device="cuda")
    show("x made")
    g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(g1):
        t = x * 2
        out1 = t + 1
        del t
    show("g1 captured")
    with torch.cuda.graph(g2, pool=g1.pool()):
        out2 = x[:1024] * 4
    show("g2 captured in g1's pool")
    g1.reset()
    show("g1 reset")
    torch.cuda.empty_cache()
    show("empty_cache")
    g2.replay()
    torch.cuda.synchronize()
    print("g2's output right:", torch.equal(out2.cpu(), torch.full((1024,), 4.0)), flush=True)
    g2.reset()
    show("g2 reset")
    del out1
    torch.cuda.empty_cache()
    show("out1 dropped, empty_cache")
    del out2
    torch.cuda.empty_cache()
    show("out2 dropped, empty_cache")
    print(f"the simulator's end: {big * 4 / MIB:.0f} MiB reserved (x's segment alone)")


if __name__ == "__main__":
    main()
