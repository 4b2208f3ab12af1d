"""Parameter readiness on a real GPU: NCCL with a world of one, a prefetch stream, 64 MiB per layer.

The shrunk counterexamples the simulator found (and the same configurations
with NCCL stalled 2 ms before its gather) must read stale weights at least
once over the trials; FIXED must never. Run on a CUDA machine:

    NCCL_NVLS_ENABLE=0 python -m pytest -q -s tests/gpu/test_param_readiness_gpu.py

Each case prints ``RATE <variant> <schedule> corrupted K/N``; record the lines
in docs/confirmations.md. Sizes: ``kib=64`` per layer in the simulator is
64 MiB per layer here (``SimConfig.byte_scale``).
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

from mutants import ready_on_the_prefetch_stream

import reference.param_readiness as pr
from reference.schedule import Schedule
from simdevice.programs.param_readiness import PROGRAM
from simdevice.search import execute

TRIALS = 20

_LAZY = "evaluate=0,iters=1,layers=2,ranks=1"
_EAGER = "eager=1,evaluate=0,iters=1,layers=2,ranks=1"
_EVAL = "bucket=2,eager=1,iters=1,layers=2,ranks=1"

#: per variant: the schedule Hypothesis shrank, then the same with NCCL stalled 2 ms, so the prefetch (or the
#: evaluation) outruns a gather still in flight (shared with the simulator's tests: ``PROGRAM.pinned``). On the
#: H200 the unstalled no-drain schedule read fresh weights (0/20 twice): there the gather of a world of one is done
#: before the evaluation reads; the stalled one is what confirms that variant.
BUGGY = PROGRAM.pinned

CLEAN = [
    f"param_readiness/FIXED:{_LAZY}",
    f"param_readiness/FIXED:{_EAGER}:rank0.nccl#0+2",
    f"param_readiness/FIXED:{_EVAL}:rank0.nccl#1+2",
    f"param_readiness/FIXED:{_LAZY}:rank0.default#2+2",
    "param_readiness/FIXED:bucket=2,eager=1,layers=4,ranks=1:rank0.nccl#2+2",
]


def rate(text: str) -> int:
    s = Schedule.parse(text)
    bad = sum(execute(s, backend="cuda").corrupted for _ in range(TRIALS))
    print(
        f"RATE {s.variant} {text} corrupted {bad}/{TRIALS} "
        f"(torch {torch.__version__}, {torch.cuda.get_device_name()})"
    )
    return bad


@pytest.mark.parametrize("variant", sorted(BUGGY))
def test_bug_variant_reads_stale_weights_on_the_gpu(variant: str) -> None:
    rates = [rate(text) for text in BUGGY[variant]]  # every schedule's rate is printed for the record
    assert max(rates) >= 1


@pytest.mark.parametrize("text", CLEAN)
def test_fixed_never_reads_stale_weights_on_the_gpu(text: str) -> None:
    assert rate(text) == 0


def test_readiness_waited_on_the_consumer_stream_reads_stale_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    # tests/mutants.py: compute's own read of the weight outruns the stalled gather; FIXED on the same schedule does
    # not (a world of one runs in this process, so the patched consumer is the one that runs)
    text = f"param_readiness/FIXED:{_LAZY}:rank0.nccl#0+2"
    assert rate(text) == 0
    monkeypatch.setattr(pr.PrefetchingConsumer, "prefetch", ready_on_the_prefetch_stream)
    print("(the next rate: the mutant tests/mutants.py:ready_on_the_prefetch_stream)")
    assert rate(text) >= 1


def test_cuda_counts_operations_as_the_simulator_does() -> None:
    s = Schedule.parse(f"param_readiness/FIXED:{_EVAL}")
    sim, gpu = execute(s), execute(s, backend="cuda")
    assert gpu.run.unfired == ()
    assert {k: v for k, v in sim.run.op_counts.items() if v} == {k: v for k, v in gpu.run.op_counts.items() if v}


TWO_RANKS = "eager=1,evaluate=0,iters=1,layers=2"


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="two ranks need two GPUs")
def test_two_ranks_one_per_gpu() -> None:
    # fewer trials: each run spawns two processes and builds an NCCL group
    trials = 3
    bug = Schedule.parse(f"param_readiness/param-prefetch-no-ready:{TWO_RANKS}:rank1.nccl#0+2")
    fixed = Schedule.parse(f"param_readiness/FIXED:{TWO_RANKS}:rank1.nccl#0+2")
    bad = sum(execute(bug, backend="cuda").corrupted for _ in range(trials))
    clean_bad = sum(execute(fixed, backend="cuda").corrupted for _ in range(trials))
    print(f"RATE {bug.variant} {bug} corrupted {bad}/{trials}")
    print(f"RATE {fixed.variant} {fixed} corrupted {clean_bad}/{trials}")
    assert bad >= 1
    assert clean_bad == 0
