"""Mutants of the reference mechanisms' fixed paths, shared by tests/property and tests/gpu.

Each is a plausible misplacement of a synchronization that no named variant covers; a test shows the
mechanism's property catches it on the simulator, and the GPU test that the same schedule reads wrong numbers
there.

``ready_on_the_prefetch_stream``: ``PrefetchingConsumer.prefetch`` calls ``ensure_params_ready`` inside the
prefetch stream's block instead of before it. The readiness callback's wait then lands on the prefetch stream and
marks the bucket group PUBLISHED, so the layer's own pre-hook returns at once: the consumer's copy is ordered after
the all-gather, compute's read of the weight is not.
"""

from __future__ import annotations

import reference.param_readiness as pr


def ready_on_the_prefetch_stream(self: pr.PrefetchingConsumer, i: int) -> None:
    """``PrefetchingConsumer.prefetch`` with ``ensure_params_ready`` moved into the prefetch stream's block."""
    w = self.layers[i]
    self.stream.wait_stream(self.dev.current_stream())
    with self.dev.stream(self.stream):
        pr.ensure_params_ready([w])
        self.buffers[i].copy_(w.data)
        self.ready[i].record()
