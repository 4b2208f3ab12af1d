"""``record_stream`` has a CUDA kernel alone: torch refuses it for a host tensor, pinned or not, with a
``NotImplementedError`` on a GPU as on the CPU build. An offload hook that calls it on its pinned buffer (meaning to
keep the buffer while the D2H fills it) fails on a GPU, so the simulator raises there too, as the program's own error
(a finding, not "what the simulator does not run"). It used to return nothing, and such a program ran clean."""

from __future__ import annotations

import pytest
import torch

import simdevice
from simdevice.explain import not_run
from simdevice.search.explore import explore

N = 64


def _offload_recording_the_pinned_buffer(pinned_record: bool = True) -> None:
    """Saved activations of a ``Linear`` offloaded to pinned memory on a side stream; ``pinned_record`` also calls
    ``record_stream`` on the pinned buffer (beside the right one, on the device activation)."""
    lin = torch.nn.Linear(N, N).cuda()
    d2h = torch.cuda.Stream()

    def pack(t: torch.Tensor) -> object:
        p = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        d2h.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(d2h):
            p.copy_(t, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record()
        t.record_stream(d2h)
        if pinned_record:
            p.record_stream(d2h)
        return p, ev

    def unpack(packed: object) -> torch.Tensor:
        p, ev = packed  # type: ignore[misc]
        torch.cuda.current_stream().wait_event(ev)
        return p.to("cuda", non_blocking=True)

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        loss = torch.tanh(lin(torch.randn(8, N, device="cuda"))).sum()
    loss.backward()


def test_record_stream_of_a_pinned_buffer_is_the_program_s_error() -> None:
    found = explore(_offload_recording_the_pinned_buffer, max_examples=1)
    assert found.failure is not None
    assert not_run(found.failure) is None, found.failure.text()  # a verdict: a GPU raises the same
    assert [r.kind for r in found.failure.run.reports] == ["host-error"]
    assert "Could not run 'aten::record_stream' with arguments from the 'CPU' backend (as torch raises on a GPU" \
        in found.failure.text()


def test_record_stream_of_the_device_activation_alone_is_clean() -> None:
    run = simdevice.cuda()
    run.run(_offload_recording_the_pinned_buffer, False)
    run.assert_clean()


def test_record_stream_of_a_host_tensor_raises_in_the_program() -> None:
    with simdevice.cuda() as sim, pytest.raises(NotImplementedError, match="record_stream takes a device tensor"):
        torch.zeros(4).record_stream(torch.cuda.current_stream())
    sim.assert_clean()
