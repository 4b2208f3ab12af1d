"""Activation offload on a real GPU: the schedules the simulator shrank corrupt before the fix, never after.

Run on a CUDA machine: ``python -m pytest -q -s tests/gpu/test_activation_offload_gpu.py``. Sizes scale by
1024 on the GPU (``size_keys``): ``kib=64`` is a 64 MiB activation, two per group, so 128 MiB per group.
Each case prints ``RATE <variant> <schedule> corrupted K/N``. Every trial gets its own ``seed`` so a pinned
block recycled from the last trial never already holds the right bytes. A ``Chunk mismatch`` raised by
backward counts as corruption (on CUDA it is an exception, on the simulator a host-error report).

CUDA serializes two streams' commands when the host allocates page-locked memory or calls ``cudaMalloc``
between them (implicit synchronization). The first GPU run (docs/confirmations.md) saw the inline-reload
bug corrupt 0/20 while the pinned pool still grew lazily between the copies; the program now reserves its
pool up front, and every counted trial follows ``gc.collect()`` (the manager's own reference cycles hold the last
trial's memory until a collection; none goes through autograd any more, see the leak test) and one uncounted
warm-up run, so the caching allocators serve every allocation as in
steady-state training and no allocation separates the D2H from the inline H2D.
"""

from __future__ import annotations

import contextlib
import gc
import time

import pytest
import torch

from reference.schedule import Schedule
from simdevice.programs.activation_offload import PROGRAM
from simdevice.search import execute

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

pytestmark = pytest.mark.gpu

TRIALS = 20

#: shrunk by ``simdevice check`` (check_variant, 150 examples; ``PROGRAM.pinned``, shared with the simulator's
#: tests); for the inline bug
#: also that schedule at upstream's 256 MiB per group (kib=128), and the upstream regression's stall of
#: d2h_stream before the commit's copy. A variant passes when one of its schedules corrupts at least once: an
#: H200 may run the copies of one direction pair in submission order (docs/confirmations.md, the
#: demonstration's ``racy:work=0``), and then only a stalled D2H lets the inline H2D overtake it.
PINNED = PROGRAM.pinned

#: FIXED under the same schedules, and a few larger configurations (fewer trials: they take longer)
FIXED_CASES = [
    (text.replace(f"/{variant}", "/FIXED"), TRIALS) for variant, texts in PINNED.items() for text in texts
    if "kib=128" not in text
] + [
    ("activation_offload/FIXED:layers=3,mb=2,iters=2,frac=50", 3),
    ("activation_offload/FIXED:layers=2,mb=3,iters=2,frac=100,warmup=0:h2d#0+10", 3),
    ("activation_offload/FIXED:layers=2,mb=2,iters=2,frac=0,evalfirst=1", 3),
]


def _with_seed(text: str, seed: int) -> Schedule:
    s = Schedule.parse(text)
    return Schedule(s.program, s.variant, (*s.config, ("seed", str(seed))), s.delays)


def corrupted(text: str, trials: int) -> int:
    bad = 0
    with contextlib.suppress(AssertionError):  # warm-up: fill the caching allocators, uncounted
        execute(_with_seed(text, 0), backend="cuda")
    start = time.monotonic()
    for trial in range(trials):
        gc.collect()
        try:
            out = execute(_with_seed(text, trial + 1), backend="cuda")
        except AssertionError as e:
            if "Chunk mismatch" not in str(e):
                raise
            bad += 1
            continue
        if out.corrupted:
            bad += 1
        elif out.run.result is not None and out.schedule.variant == "FIXED":
            waits, reloads = out.run.result["waits"], out.run.result["reloads"]
            prefetched = {(r.pass_index, r.chunk, r.group) for r in reloads if r.path == "prefetch"}
            # the wait-count properties are host-side bookkeeping: they must hold on CUDA too
            assert not [w for w in waits if w.event == "offload" and not w.offloaded]
            assert not [w for w in waits if w.stream == "compute" and w.event == "offload"
                        and (w.pass_index, w.chunk, w.group) in prefetched]
    torch.cuda.synchronize()
    print(f"RATE {Schedule.parse(text).variant} {text} corrupted {bad}/{trials} "
          f"({time.monotonic() - start:.1f}s; torch {torch.__version__}, {torch.cuda.get_device_name()})")
    return bad


@pytest.mark.parametrize("variant", sorted(PINNED))
def test_shrunk_bug_schedule_corrupts_on_gpu(variant: str) -> None:
    rates = [corrupted(text, TRIALS) for text in PINNED[variant]]
    assert max(rates) >= 1, rates


@pytest.mark.parametrize(("text", "trials"), FIXED_CASES)
def test_fixed_never_corrupts_on_gpu(text: str, trials: int) -> None:
    assert corrupted(text, trials) == 0


def test_no_pinned_or_device_memory_grows_after_warm_up() -> None:
    """A run frees what it allocated (no reference cycle through autograd keeps the manager, its pinned pool and
    the saved activations; its own cycles are Python's, which ``gc.collect()`` frees): after a few warm-up runs,
    neither ``cudaHostAlloc`` calls nor device memory grow."""
    stats = getattr(torch.cuda, "host_memory_stats", None)
    if stats is None:
        pytest.skip("torch.cuda.host_memory_stats is not in this torch")
    line = "activation_offload/FIXED:layers=2,mb=2,iters=2,frac=100,evalfirst=1"
    for seed in range(5):
        execute(_with_seed(line, seed), backend="cuda")
        gc.collect()
    torch.cuda.synchronize()
    allocs, device = stats().get("num_host_alloc"), torch.cuda.memory_allocated()
    if allocs is None:
        pytest.skip(f"host_memory_stats has no num_host_alloc here: {sorted(stats())[:12]}")
    for seed in range(5, 25):
        execute(_with_seed(line, seed), backend="cuda")
        gc.collect()
    torch.cuda.synchronize()
    after, device_after = stats().get("num_host_alloc"), torch.cuda.memory_allocated()
    print(f"RATE leak {line}: cudaHostAlloc {allocs} -> {after}, device bytes {device} -> {device_after} "
          "over 20 runs")
    assert after == allocs
    assert device_after <= device


def test_operation_counts_equal_the_simulators() -> None:
    """The same schedule counts the same operations per actor on both machines (a delay lands on the same one)."""
    lines = ["activation_offload/FIXED", "activation_offload/FIXED:layers=2,mb=2,iters=2,frac=50",
             "activation_offload/FIXED:layers=3,mb=2,iters=2,frac=100,evalfirst=1",
             "activation_offload/offload-inline-no-wait"]
    for line in lines:
        # actors with no operation aside (the simulator lists a stream it made that never got one)
        sim = {a: n for a, n in execute(Schedule.parse(line)).run.op_counts.items() if n}
        gpu = {a: n for a, n in execute(_with_seed(line, 0), backend="cuda").run.op_counts.items() if n}
        print(f"COUNTS {line}: sim {dict(sorted(sim.items()))} gpu {dict(sorted(gpu.items()))}")
        assert gpu == sim, line
