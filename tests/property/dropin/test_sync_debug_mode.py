"""``torch.cuda.set_sync_debug_mode`` applied (``Runtime.synchronizing``).

Rule, with tests a mutation of it fails: under mode 1 ("warn") a call that makes the host wait as c10's
``memcpy_and_sync`` or ``stream_synchronize`` does warns "called a synchronizing CUDA operation" at the program's
line, and goes on; under mode 2 ("error") it raises that as a ``RuntimeError`` before the host waits; a
non-blocking copy, ``torch.cuda.synchronize()``, an event's ``synchronize()`` and a kernel are not flagged. It was
kept and noted as not applied: a training script that sets "error" to prove its step never synchronizes passed here
where a GPU raised, and one that does synchronize got no warning. ``tests/hazards.py``'s ``SYNC_DEBUG_CASES`` run on
a GPU in ``tests/gpu/test_dropin_gpu.py``.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from hazards import SYNC_DEBUG_CASES, sync_debug_outcome

import simdevice


@pytest.mark.parametrize("mode", ["warn", "error"])
def test_each_case_is_flagged_as_on_a_gpu(mode: str) -> None:
    got: dict[str, str] = {}

    def program() -> None:
        for name in SYNC_DEBUG_CASES:
            got[name] = sync_debug_outcome(name, mode)

    run = simdevice.cuda()
    run.run(program)
    run.assert_clean()
    differ = {name: got[name] for name, (_, flagged) in SYNC_DEBUG_CASES.items()
              if got[name] != ("flagged" if flagged else "not flagged")}
    assert not differ


def _offload_step(sync: bool) -> float:
    x = torch.arange(1024, dtype=torch.float32, device="cuda")
    host = torch.empty(1024, pin_memory=True)
    host.copy_(x, non_blocking=True)
    ev = torch.cuda.Event()
    ev.record()
    value = float(x.sum()) if sync else 0.0  # a hidden synchronization
    ev.synchronize()
    return value + float(host[-1])


def test_warn_names_the_program_s_line_and_the_run_goes_on() -> None:
    seen: list[Any] = []

    def program() -> float:
        torch.cuda.set_sync_debug_mode("warn")
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            out = _offload_step(sync=True)
        seen.extend(w)
        return out

    run = simdevice.cuda()
    run.run(program)
    run.assert_clean()
    assert run.result.result == sum(range(1024)) + 1023.0
    flagged = [w for w in seen if str(w.message) == "called a synchronizing CUDA operation"]
    # one: float() of the sum; not the pinned buffer's read, which the event's synchronize made safe
    assert len(flagged) == 1
    assert flagged[0].category is UserWarning
    assert flagged[0].filename == __file__
    assert "float(x.sum())" in Path(__file__).read_text().splitlines()[flagged[0].lineno - 1]


def test_error_raises_before_the_host_waits() -> None:
    def program() -> None:
        torch.cuda.set_sync_debug_mode("error")
        _offload_step(sync=False)  # no hidden synchronization: runs
        with pytest.raises(RuntimeError, match="called a synchronizing CUDA operation"):
            _offload_step(sync=True)
        torch.cuda.set_sync_debug_mode("default")
        assert _offload_step(sync=True) == sum(range(1024)) + 1023.0

    run = simdevice.cuda()
    run.run(program)
    run.assert_clean()


def test_each_run_starts_with_the_mode_off() -> None:
    """A search's runs are each a process's first: the mode one run set does not reach the next."""
    modes: list[int] = []

    def program() -> None:
        modes.append(torch.cuda.get_sync_debug_mode())
        torch.cuda.set_sync_debug_mode("error")
        torch.ones(2, device="cuda").sum().item() if modes[-1] == 2 else None

    for _ in range(2):
        run = simdevice.cuda()
        run.run(program)
        run.assert_clean()
    assert modes == [0, 0]
