"""The simulated device's capacity (``SimConfig.device_memory``, ``--device-memory``).

Rules, each with a test a mutation of it fails:

- the caching allocator's segments may take ``device_memory`` bytes together; past it an allocation raises
  ``torch.OutOfMemoryError``, as CUDA does: the program may catch it, and a run that does not is a host error;
- before it gives up, the allocator releases its cached (entirely free) segments and tries again;
- a released segment's bytes count no more;
- ``empty_cache``, and the release before giving up, first wait for the streams recorded with freed blocks
  (``record_stream``) and give those blocks back, as CUDA's ``synchronize_and_free_events`` does: their segments
  are released too, and the host is ordered after those streams' use (its own process's: another rank's blocks are
  its own allocator's);
- ``empty_cache`` releases its own process's cached segments, not another rank's.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import simdevice
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


def _recorded_then_freed(n: int) -> tuple[torch.Tensor, torch.cuda.Stream]:
    """A tensor of ``n`` bytes the side stream reads into pinned memory, recorded with it and dropped: its block is
    held back for the side stream. Returns the pinned buffer and the stream."""
    side = torch.cuda.Stream()
    x = torch.ones(n, dtype=torch.uint8, device="cuda")
    pinned = torch.empty(8, dtype=torch.uint8, pin_memory=True)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(10_000_000)  # still reading when the host goes on
        pinned.copy_(x[:8], non_blocking=True)
    x.record_stream(side)
    del x
    return pinned, side


def test_empty_cache_gives_back_the_blocks_held_for_recorded_streams() -> None:
    with simdevice.cuda() as sim:
        pinned, _ = _recorded_then_freed(4 * MIB)
        torch.cuda.empty_cache()
        reserved = torch.cuda.memory_reserved()
        active = torch.cuda.memory_stats()["active_bytes.all.current"]
        assert pinned.tolist() == [1] * 8  # the host waited for the side stream: its copy has landed
    sim.assert_clean()
    assert (reserved, active) == (0, 0)


def test_the_release_before_giving_up_gives_back_the_blocks_held_for_recorded_streams() -> None:
    with simdevice.cuda(config=SimConfig(device_memory=48 * MIB)) as sim:  # (a drop-in run has CUDA's segments)
        pinned, _ = _recorded_then_freed(12 * MIB)
        torch.empty(40 * MIB, dtype=torch.uint8, device="cuda")  # fits once the held block's segment is released
        assert pinned.tolist() == [1] * 8
    sim.assert_clean()


@pytest.mark.parametrize("bad", [0, -1])
def test_a_capacity_must_be_positive(bad: int) -> None:
    with pytest.raises(ValueError, match="device_memory must be > 0"):
        SimConfig(device_memory=bad)


def test_sizes_read_as_a_person_reads_them_however_large() -> None:
    from simdevice.runtime.allocator import _size

    assert [_size(n) for n in (512, 1536, 3 << 20, 5 << 30, 3 << 40, 2_000_000 << 40)] == [
        "512 bytes", "1.5 KiB", "3 MiB", "5 GiB", "3 TiB", "2,000,000 TiB"]


def _rank_frees_while_another_empties(out: dict[int, int]) -> None:
    import torch.distributed as dist

    rank = dist.get_rank()
    if rank == 1:
        side = torch.cuda.Stream()
        x = torch.ones(1024, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(10_000_000)
            x.sum()
        x.record_stream(side)
        del x  # held for rank 1's side stream
    dist.barrier()
    if rank == 0:
        torch.cuda.empty_cache()  # waits for its own process's streams only, as each process has its allocator
    dist.barrier()
    if rank == 1:
        out[1] = torch.cuda.memory_stats()["active_bytes.all.current"]


def test_empty_cache_waits_for_its_own_process_s_streams_only() -> None:
    out: dict[int, int] = {}
    s = simdevice.cuda()
    s.run(_rank_frees_while_another_empties, out, world_size=2)
    s.assert_clean()
    assert out[1] >= 4096  # rank 1's block is still held (and rank 0 did not wait for rank 1's stream)


def _rank_caches_while_another_empties(out: dict[int, int]) -> None:
    import torch.distributed as dist

    rank = dist.get_rank()
    if rank == 1:
        x = torch.ones(1024, device="cuda")
        del x  # its segment is cached, entirely free
    dist.barrier()
    if rank == 0:
        before = torch.cuda.mem_get_info()[0]  # the device's free memory: every process's segments taken
        torch.cuda.empty_cache()
        out[0] = torch.cuda.mem_get_info()[0] - before
    dist.barrier()
    if rank == 1:
        out[1] = torch.cuda.memory_reserved()


def test_empty_cache_releases_its_own_process_s_segments_only() -> None:
    out: dict[int, int] = {}
    s = simdevice.cuda()
    s.run(_rank_caches_while_another_empties, out, world_size=2)
    s.assert_clean()
    assert out == {0: 0, 1: 2 << 20}  # rank 1's cached segment stays cached


def test_the_whole_device_s_statistics_count_every_process_s_blocks_and_peaks() -> None:
    """``Runtime.memory_stats()`` without a process (every process's together, the model's own view): the blocks
    and segments live now, the bytes allocated and reserved, and the peaks since the run began, which stay after the
    blocks are freed and their segments released. Mutations: the reserved peak kept as a minimum, the active peak not
    kept; the blocks counted with the freed ones."""
    got: list[dict[str, int]] = []

    def program(dev: Any) -> None:
        a = torch.empty(MIB, dtype=torch.uint8, device=dev.device)
        b = torch.empty(3 * MIB, dtype=torch.uint8, device=dev.device)
        got.append(dev.runtime.memory_stats())
        del a  # (its block free, its segment cached)
        got.append(dev.runtime.memory_stats())
        del b
        dev.empty_cache()
        got.append(dev.runtime.memory_stats())

    dev = SimDevice(config=SimConfig(device_memory=64 * MIB))
    assert dev.run(program).reports == ()
    live, one, emptied = got
    assert (live["allocated"], live["blocks"], live["reserved"] >= 4 * MIB) == (4 * MIB, 2, True)
    assert live["reserved_peak"] == live["reserved"]
    assert (one["allocated"], one["blocks"], one["reserved"], one["peak"]) == (3 * MIB, 1, live["reserved"], 4 * MIB)
    assert (emptied["allocated"], emptied["blocks"], emptied["segments"], emptied["reserved"]) == (0, 0, 0, 0)
    assert (emptied["peak"], emptied["active_peak"], emptied["reserved_peak"]) == (4 * MIB, 4 * MIB, live["reserved"])
