"""Rule (reports: ``_LIBRARIES``): the line a report gives for an operation is the program's, past the wrapper
``typing_extensions.deprecated`` puts around a function of torch's (``_all_gather_base``, which Megatron's buckets
call to gather their parameters, through the name its module bound): it named the wrapper's own line in
``typing_extensions.py``, in each report and in the edge of the fix suggested."""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist

import simdevice

#: torch's own ``_all_gather_base``, held as Megatron's module holds it (bound at import: kept as it is in a session)
HELD = {"gather": dist.distributed_c10d._all_gather_base}


def gathered() -> float:
    dist.init_process_group("nccl")
    out = torch.empty(2 * 4, device="cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        work = HELD["gather"](out, torch.ones(4, device="cuda"), async_op=True)
    total = float(out.sum())  # read before the wait: a race, its gather named at the call above
    work.wait()
    dist.destroy_process_group()
    return total


def test_a_gather_through_torch_s_deprecated_name_is_named_at_its_call() -> None:
    s = simdevice.cuda()
    s.run(gathered, world_size=2)
    races = [str(r) for r in s.result.reports if r.kind == "race"]
    assert races, s.text()
    assert all("typing_extensions" not in r for r in races), races
    here = __file__.rsplit("/", 1)[-1]
    assert any(f"{here}:24)" in r and "all_gather" in r for r in races), races
