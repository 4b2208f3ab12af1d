"""Rule (dispatch: ``SimMode``): with torch's fake tensor mode on (DTensor's sharding propagation shapes an op's
output so, as torch.compile's tracing does), an op is the fake mode's: its tensors have no bytes and no kernel runs,
as on a GPU. The fake mode is an infrastructure mode, below the simulator's on the stack; before, the simulator took
a factory of a fake ``cuda`` tensor as a device allocation and queued the op on the fakes, and a run of FSDP2's
optimizer step crashed the process. (A fake tensor made for ``cuda`` in a session is a fake of the ``meta`` device,
as the session makes a tensor for the device: its shape is all that is asked of it.)"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

import simdevice


def shaped() -> list[object]:
    x = torch.ones(4, device="cuda")
    with FakeTensorMode():
        fake = torch.empty(8, 3, device="cuda")
        out = torch._foreach_add([fake], [fake])[0] @ torch.empty(3, 2, device="cuda")
    y = x * 2
    return [type(out) is FakeTensor, tuple(out.shape), y.tolist()]


def test_an_op_under_a_fake_mode_runs_no_device_op() -> None:
    s = simdevice.cuda()
    s.run(shaped)
    assert not s.reports, s.text()
    assert s.result.result == [True, (8, 2), [2.0] * 4]
    counted = sum(s.result.op_counts.values())
    plain = simdevice.cuda()
    plain.run(lambda: (torch.ones(4, device="cuda") * 2).tolist())
    assert counted == sum(plain.result.op_counts.values())  # (the fakes' ops are none of the device's)
