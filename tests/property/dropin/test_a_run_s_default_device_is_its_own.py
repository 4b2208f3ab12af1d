"""A program's ``torch.set_default_device("cuda")`` (or ``set_default_dtype``) is its run's: the next run, the next
function of a file, and the code after a ``simdevice.cuda()`` block start from torch's defaults as they were.
Before, the default device stayed the session's: the next function's host tensors were made on the simulated
device (its assertion failed: "found"), and after the session ``torch.ones(3)`` asked the CPU build for CUDA."""

from __future__ import annotations

import torch

import simdevice
from simdevice.search.targets import resolve


def test_the_caller_of_a_session_gets_host_tensors_again() -> None:
    with simdevice.cuda() as sim:
        torch.set_default_device("cuda")
        torch.set_default_dtype(torch.float64)
        inside = torch.ones(3)
        where = (inside.is_cuda, inside.dtype)
    sim.assert_clean()
    after = torch.ones(3)
    assert where == (True, torch.float64)
    assert (after.device.type, after.dtype, torch.get_default_dtype()) == ("cpu", torch.float32, torch.float32)


def _sets_default() -> None:
    torch.set_default_device("cuda")
    assert torch.ones(4).is_cuda


def _host_tensor() -> None:
    assert not torch.ones(4).is_cuda, "a host tensor made on the device"


def test_the_next_function_starts_from_torch_s_defaults() -> None:
    """Two functions checked in one process, as ``simdevice check FILE.py`` checks a file's: the second's host tensor
    is a host tensor."""
    from reference.schedule import Schedule

    for fn in (_sets_default, _host_tensor):
        out = resolve(f"{__file__}::{fn.__name__}").run(Schedule.parse(f"{__file__}::{fn.__name__}"))
        assert not out.run.reports, out.text()
    assert not torch.ones(1).is_cuda
