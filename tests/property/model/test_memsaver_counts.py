"""A memory saver's ``pause`` and ``resume`` are each one host step on both backends; ``region`` and ``disable`` none.

On the H200 (docs/confirmations.md, eleventh run) the trainer of ``memsaver_guard/FIXED`` counted 4 host steps
fewer on the GPU than on the simulator, two cycles of one pause and one resume: ``CudaDevice`` handed out the library
uncounted, so a delay at or after a pause landed on different operations on the two machines. Now
``reference.cuda.CountedMemorySaver`` steps the calling actor before each, as ``simdevice.runtime.memsaver`` does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from reference.cuda import CountedMemorySaver, _Counter
from reference.schedule import Delay, Schedule
from simdevice import SimDevice


class FakeSaver:
    """``torch_memory_saver``'s surface, logging what is called."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    @contextlib.contextmanager
    def region(self, tag: str = "default", enable_cpu_backup: bool = False) -> Iterator[None]:
        self.log.append(f"region({tag})")
        yield

    @contextlib.contextmanager
    def disable(self) -> Iterator[None]:
        self.log.append("disable")
        yield

    def pause(self, tag: str | None = None) -> None:
        self.log.append(f"pause({tag})")

    def resume(self, tag: str | None = None) -> None:
        self.log.append(f"resume({tag})")


def lifecycle(dev: Any) -> None:
    """What a sleeping trainer does with the saver: allocate in a region, pause, allocate around it, resume (each
    device operation one host step, as ``CudaDevice`` counts them; ``_on_sim`` is the same on the simulator)."""
    with dev.memory_saver.region("train"):
        w = dev.zeros(4)
    dev.synchronize()
    dev.memory_saver.pause("train")
    with dev.memory_saver.disable():
        side = dev.zeros(4)
    dev.memory_saver.resume("train")
    dev.add_(w, side)


class _Dev:
    """Just what ``lifecycle`` needs of a device, on plain CPU tensors; its memory saver counted as CudaDevice's."""

    def __init__(self, counter: _Counter, log: list[str]) -> None:
        self.counter, self.log = counter, log
        self.memory_saver = CountedMemorySaver(FakeSaver(log), self.step)

    def step(self) -> None:
        self.log.append(f"step {self.counter.counts.get('host', 0)}")
        self.counter.next("host")

    def zeros(self, n: int) -> Any:
        import torch

        self.step()
        return torch.zeros(n)

    def synchronize(self) -> None:
        self.step()

    def add_(self, a: Any, b: Any) -> None:
        self.step()
        a.add_(b)


def test_pause_and_resume_are_each_one_host_step_before_the_call() -> None:
    log: list[str] = []
    counter = _Counter(Schedule("test", "t", ()), cycles_per_ms=1.0)
    dev = _Dev(counter, log)
    dev.memory_saver.pause("train")
    with dev.memory_saver.region("train"), dev.memory_saver.disable():
        pass
    dev.memory_saver.resume(None)
    assert log == ["step 0", "pause(train)", "region(train)", "disable", "step 1", "resume(None)"]
    assert counter.counts == {"host": 2}


def test_the_gpu_counter_gives_pause_and_resume_the_simulators_host_indices() -> None:
    sim = SimDevice(Schedule("test", "t", ()))
    run = sim.run(_on_sim)
    assert not run.reports, run.reports
    host = [what for _, actor, what in run.trace if actor == "host"]
    at = {w: i for i, w in enumerate(host) if w.startswith("memory_saver.")}
    assert sorted(at) == ["memory_saver.pause(train)", "memory_saver.resume(train)"]

    log: list[str] = []
    counter = _Counter(Schedule("test", "t", ()), cycles_per_ms=1.0)
    lifecycle(_Dev(counter, log))
    steps = [entry for entry in log if entry.startswith("step")]
    assert counter.counts["host"] == run.op_counts["host"] == len(host)
    # the step before each call has the simulator's index of that call
    assert log[log.index("pause(train)") - 1] == f"step {at['memory_saver.pause(train)']}"
    assert log[log.index("resume(train)") - 1] == f"step {at['memory_saver.resume(train)']}"
    assert len(steps) == len(host)


def test_a_delay_on_the_pause_stalls_the_gpu_run_right_before_the_pause() -> None:
    sim_host = [w for _, a, w in SimDevice(Schedule("test", "t", ())).run(_on_sim).trace if a == "host"]
    k = sim_host.index("memory_saver.pause(train)")

    class Stalled(_Dev):
        def step(self) -> None:
            if self.counter.next("host"):
                self.log.append("stall")

    dev = Stalled(_Counter(Schedule("test", "t", (), (Delay("host", k, 5),)), cycles_per_ms=1.0), [])
    lifecycle(dev)
    assert dev.log.count("stall") == 1
    assert dev.log[dev.log.index("pause(train)") - 1] == "stall"


def _on_sim(dev: Any) -> None:
    """``lifecycle`` on the simulated device (its tensors made with ``torch.zeros(..., device=dev.device)``)."""
    import torch

    with dev.memory_saver.region("train"):
        w = torch.zeros(4, device=dev.device)
    dev.synchronize()
    dev.memory_saver.pause("train")
    with dev.memory_saver.disable():
        side = torch.zeros(4, device=dev.device)
    dev.memory_saver.resume("train")
    w.add_(side)
