"""The simulated device's capacity (``SimConfig.device_memory``, ``--device-memory``).

Rules, each with a test a mutation of it fails:

- the caching allocator's segments may take ``device_memory`` bytes together; past it an allocation raises
  ``torch.OutOfMemoryError``, as CUDA does: the program may catch it, and a run that does not is a host error;
- before it gives up, the allocator releases its cached (entirely free) segments and tries again;
- a released segment's bytes count no more.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from simdevice import SimDevice
from simdevice.runtime import SimConfig
from simdevice.runtime.reports import HostError

MIB = 1 << 20
#: room for one 4 MiB tensor (its segment is 4 MiB) and a little more
SMALL = SimConfig(device_memory=6 * MIB)


def test_an_allocation_past_the_capacity_raises_torchs_out_of_memory_error() -> None:
    def big(dev: Any) -> None:
        torch.empty(8 * MIB, dtype=torch.uint8, device=dev.device)

    [report] = SimDevice(config=SMALL).run(big).reports
    assert isinstance(report, HostError)
    assert report.error.startswith("OutOfMemoryError: simulated device out of memory: tried to allocate 8 MiB")
    assert SimDevice(config=SimConfig(device_memory=16 * MIB)).run(big).reports == ()


def test_the_program_may_catch_it_and_go_on() -> None:
    def careful(dev: Any) -> str:
        try:
            torch.empty(8 * MIB, dtype=torch.uint8, device=dev.device)
        except torch.OutOfMemoryError:
            x = torch.ones(MIB, dtype=torch.uint8, device=dev.device)  # a smaller one fits
            return f"fell back to {x.numel()} bytes"
        return "no error"

    run = SimDevice(config=SMALL).run(careful)
    assert run.reports == ()
    assert run.result == f"fell back to {MIB} bytes"


def test_cached_segments_are_released_before_it_gives_up() -> None:
    def two_sizes(dev: Any) -> None:
        a = torch.empty(4 * MIB, dtype=torch.uint8, device=dev.device)
        del a  # its segment stays cached: 4 MiB reserved
        dev.synchronize()
        torch.empty(5 * MIB, dtype=torch.uint8, device=dev.device)  # too big for it: a new segment, once it is freed

    assert SimDevice(config=SMALL).run(two_sizes).reports == ()


def test_a_released_segment_counts_no_more() -> None:
    def released(dev: Any) -> None:
        for _ in range(3):  # each time a new 4 MiB segment: the one before was released
            x = torch.empty(4 * MIB, dtype=torch.uint8, device=dev.device)
            del x
            dev.empty_cache()

    assert SimDevice(config=SMALL).run(released).reports == ()


@pytest.mark.parametrize("bad", [0, -1])
def test_a_capacity_must_be_positive(bad: int) -> None:
    with pytest.raises(ValueError, match="device_memory must be > 0"):
        SimConfig(device_memory=bad)


def test_sizes_read_as_a_person_reads_them_however_large() -> None:
    from simdevice.runtime.allocator import _size

    assert [_size(n) for n in (512, 1536, 3 << 20, 5 << 30, 3 << 40, 2_000_000 << 40)] == [
        "512 bytes", "1.5 KiB", "3 MiB", "5 GiB", "3 TiB", "2,000,000 TiB"]
