"""``torch.cuda``'s NVML queries (``utilization``, ``memory_usage``, ``temperature``, ``power_draw``,
``clock_rate``, ``device_memory_used``), which training loops log: on the simulated device, which has no sensors,
each answers a number (0; ``device_memory_used`` the memory the simulated allocator holds) and the run notes it
once. Before, the CPU build's ``ModuleNotFoundError`` (no ``nvidia-ml-py``) was a host error: a correct program that
logs its GPU's utilization was reported as found. Outside a session torch's own functions are back."""

from __future__ import annotations

import torch

import simdevice
from simdevice.dropin.facade import SENSORS_NOTE

QUERIES = ("utilization", "memory_usage", "temperature", "power_draw", "clock_rate")


def _logged() -> dict[str, int]:
    x = torch.ones(1 << 20, device="cuda")
    got = {name: getattr(torch.cuda, name)() for name in QUERIES}
    got["device_memory_used"] = torch.cuda.device_memory_used(0)
    got["reserved"] = torch.cuda.memory_reserved()
    x.mul_(2)
    return got


def test_a_loop_that_logs_nvml_numbers_runs_clean_and_is_told_they_are_placeholders() -> None:
    original = torch.cuda.utilization
    s = simdevice.cuda()
    s.run(_logged)
    assert s.result is not None
    assert not s.result.reports, [str(r) for r in s.result.reports]
    got = s.result.result
    assert all(got[name] == 0 for name in QUERIES), got
    assert got["device_memory_used"] == got["reserved"] >= 4 << 20
    assert s.result.notes.count(SENSORS_NOTE) == 1, s.result.notes
    assert torch.cuda.utilization is original
