"""Async collectives on the simulated device (``torch.distributed`` with NCCL).

A collective runs on its process's communication stream (``nccl``, or
``rank1.nccl`` for another process), which first waits for the caller's
current stream, as NCCL does. The call returns a work handle; ``wait()``
makes the caller's current stream wait for the collective.

This module holds world size 1 (one rank, the all-gather is a copy); the
several-rank version joins the ranks' clocks as NCCL orders them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from simdevice.streams import EventRecord, SimStream
from simdevice.tensor import _user_source

if TYPE_CHECKING:
    from simdevice.device import SimDevice

aten = torch.ops.aten


class SimWork:
    """The handle of an async collective."""

    def __init__(self, dev: SimDevice, rec: EventRecord) -> None:
        self._dev, self._rec = dev, rec

    def wait(self) -> None:
        a = self._dev._sched.host_step("work.wait")
        self._dev._wait_marker(a.current_stream, self._rec, "collective")

    def is_completed(self) -> bool:
        a = self._dev._sched.host_step("work.is_completed")
        if self._rec.done():
            a.clock.join(self._rec.clock)
            return True
        return False


def _comm_stream(dev: SimDevice) -> SimStream:
    sched = dev._sched
    a = sched.current()
    full = "nccl" if a.name == "host" else f"{a.name}.nccl"
    s = sched.streams.get(full)
    return s if s is not None else sched.new_stream(a, "nccl")


def all_gather_into_tensor(
    dev: SimDevice, output: torch.Tensor, input: torch.Tensor, async_op: bool = True
) -> SimWork | None:
    if dev.world_size != 1:
        raise NotImplementedError("simulated collectives across several ranks are not built yet")
    if output.numel() != input.numel() * dev.world_size:
        raise ValueError(
            f"all_gather_into_tensor: output has {output.numel()} elements, expected {input.numel() * dev.world_size}"
        )
    sched = dev._sched
    a = sched.host_step("all_gather_into_tensor")
    comm = _comm_stream(dev)
    cur = a.current_stream
    # the communication stream waits for the caller's stream, as NCCL does
    dev._wait_marker(comm, EventRecord(cur, cur.enqueued, cur.clock.copy()), f"stream {cur.name}")
    out, inp = output.view(-1), input.reshape(-1)
    dev._ops.issue(a, comm, aten.copy_.default, (out, inp), {}, [out, inp], "all_gather", _user_source())  # type: ignore[arg-type]
    rec = EventRecord(comm, comm.enqueued, comm.clock.copy())
    work = SimWork(dev, rec)
    if not async_op:
        work.wait()
        return None
    return work
