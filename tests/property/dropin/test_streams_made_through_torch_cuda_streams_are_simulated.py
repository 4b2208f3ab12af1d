"""``torch.cuda.streams`` is where torch defines ``Stream``, ``Event`` and ``ExternalStream``; ``torch.cuda``
re-exports them. A prefetcher that makes its stream there (``self.stream = torch.cuda.streams.Stream() if
torch.cuda.is_available() else None``, as DataLoader wrappers write it) got torch's own class, which raised
"torch.cuda.Stream requires CUDA support" on the CPU build: a host error, so a correct program was reported as
failing; and ``isinstance(s, torch.cuda.streams.Stream)`` of a simulated stream answered False."""

from __future__ import annotations

import torch

import simdevice
from simdevice import explore


class Prefetcher:
    """Copies the next batch to the device on a stream of its own while the current one is used."""

    def __init__(self, batches: list[torch.Tensor], wait: bool) -> None:
        self.batches = iter(batches)
        self.stream = torch.cuda.streams.Stream() if torch.cuda.is_available() else None
        self.wait = wait
        self.preload()

    def preload(self) -> None:
        host = next(self.batches, None)
        if host is None:
            self.next = None
            return
        with torch.cuda.stream(self.stream):
            self.next = host.cuda(non_blocking=True) * 2

    def __next__(self) -> torch.Tensor | None:
        if self.wait:
            torch.cuda.current_stream().wait_stream(self.stream)
        batch = self.next
        if batch is not None:
            batch.record_stream(torch.cuda.current_stream())
        self.preload()
        return batch


def prefetch(wait: bool = True, n: int = 3) -> None:
    batches = [torch.full((256,), float(i)).pin_memory() for i in range(n)]
    loader = Prefetcher(batches, wait)
    sums = []
    batch = next(loader)
    while batch is not None:
        sums.append(batch.sum())
        batch = next(loader)
    assert [s.item() for s in sums] == [512.0 * i for i in range(n)]


def prefetch_racy() -> None:
    prefetch(wait=False)


def test_a_prefetcher_s_stream_made_there_is_a_simulated_stream() -> None:
    run = simdevice.cuda()
    run.run(prefetch)
    run.assert_clean()
    assert run.result is not None
    assert run.result.op_counts["stream"] == 6, run.result.op_counts  # three H2D, three mul


def test_its_missing_wait_is_found_as_a_race() -> None:
    found = explore(prefetch_racy, max_examples=50).failure
    assert found is not None
    assert any(isinstance(r, simdevice.Race) for r in found.run.reports), found.text()


def test_simulated_streams_and_events_are_instances_of_its_classes() -> None:
    with simdevice.cuda() as sim:
        assert isinstance(torch.cuda.Stream(), torch.cuda.streams.Stream)
        assert isinstance(torch.cuda.current_stream(), torch.cuda.streams.Stream)
        assert isinstance(torch.cuda.streams.Event(), torch.cuda.Event)
    sim.assert_clean()
    assert torch.cuda.streams.Stream is torch.cuda.Stream  # put back as it was


def test_the_hazard_tests_gpu_runs_is_named_and_counted_on_its_stream() -> None:
    """``tests/hazards.py::streams_module_reload`` (what tests/gpu counts on a GPU, where ``reference/cuda_plain.py``
    puts its counting classes under ``torch.cuda.streams`` too): the D2H is ``prefetch``'s one operation, and the
    host's read without the sync is stale under the stall."""
    from reference.schedule import Schedule
    from simdevice.search.targets import resolve

    line = "tests/hazards.py::streams_module_reload"
    target = resolve(line)
    out = target.run(Schedule.parse(f"{line}::prefetch#0+20"))
    assert not out.corrupted, out.text()
    assert out.run.op_counts["prefetch"] == 1, out.run.op_counts
    assert target.run(Schedule.parse(f"{line}:wait=0:prefetch#0+20")).corrupted


def rebuilt_from_its_id() -> None:
    """A stream rebuilt from its ids, as torch's own ``current_stream`` builds one and as code that kept a stream's
    ids does: ``Stream(stream_id=, device_index=, device_type=)`` is that stream, whose work is in its order."""
    side = torch.cuda.Stream()
    same = torch.cuda.Stream(stream_id=side.stream_id, device_index=side.device_index, device_type=side.device_type)
    assert same == side
    x = torch.ones(256, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y = x * 2
    with torch.cuda.stream(same):
        y.add_(1)  # after the mul: one stream
    default = torch.cuda.default_stream()
    again = torch.cuda.streams.Stream(stream_id=default.stream_id, device_index=default.device_index,
                                      device_type=default.device_type)
    again.wait_stream(side)
    assert y.sum().item() == 3 * 256


def test_a_stream_rebuilt_from_its_ids_is_that_stream() -> None:
    """Before, each was a new stream (``s1``): the add raced with the mul it follows, and the default stream's
    wait ordered nothing."""
    run = simdevice.cuda()
    run.run(rebuilt_from_its_id)
    run.assert_clean()
    assert run.result is not None
    assert run.result.op_counts["side"] == 2, run.result.op_counts
