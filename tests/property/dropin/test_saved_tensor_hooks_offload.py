"""Activation offloading through ``torch.autograd.graph.saved_tensors_hooks``, as plain ``torch.cuda``: pack copies
each saved activation to pinned memory on an offload stream (``non_blocking``), unpack copies it back on the stream
the engine runs the node on. Each wait the protocol needs, left out, is a race; with all of them it is clean, with
the forward on the default stream or in a side stream's block (then unpack runs on that stream, the node's). These
verdicts were already right before sequence-number stream marking; the cases keep them so."""

from __future__ import annotations

import pytest
import torch

import simdevice
from simdevice import Race

N = 256


def _offload(wait_d2h: bool, wait_h2d: str, record: bool, forward_side: bool) -> list[str]:
    """Two ``Linear`` layers and a gelu; the saved activations (not the parameters) go to pinned memory in pack on
    ``s``, after ``s`` waited for the current stream (``wait_d2h``), with ``record_stream(s)`` so that their blocks
    are not reused under the copy (``record``); unpack makes ``wait_h2d`` (``current``, ``default`` or ``none``)
    wait for the D2H's event, then copies back. Returns the streams unpack ran on."""
    torch.manual_seed(0)
    s = torch.cuda.Stream()
    c = torch.cuda.Stream()
    lin1, lin2 = torch.nn.Linear(N, N).cuda(), torch.nn.Linear(N, N).cuda()
    host_x = torch.randn(8, N)
    x = host_x.cuda()
    c.wait_stream(torch.cuda.current_stream())
    seen: list[str] = []

    def pack(t: torch.Tensor) -> object:
        if isinstance(t, torch.nn.Parameter):
            return t
        p = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        if wait_d2h:
            s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            p.copy_(t.detach(), non_blocking=True)
            ev = torch.cuda.Event()
            ev.record()
        if record:
            t.record_stream(s)
        return p, ev

    def unpack(packed: object) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        p, ev = packed  # type: ignore[misc]
        seen.append(torch.cuda.current_stream().name)  # type: ignore[attr-defined]
        if wait_h2d != "none":
            (torch.cuda.current_stream() if wait_h2d == "current" else torch.cuda.default_stream()).wait_event(ev)
        return p.to("cuda", non_blocking=True)

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack), torch.cuda.stream(c if forward_side else None):
        loss = lin2(torch.nn.functional.gelu(lin1(x.mul(2.0)))).tanh().pow(2).mean()
    torch.cuda.current_stream().wait_stream(c)
    loss.backward()
    got = lin1.weight.grad.cpu()  # type: ignore[union-attr]
    ref1, ref2 = torch.nn.Linear(N, N), torch.nn.Linear(N, N)
    ref1.load_state_dict({k: v.cpu() for k, v in lin1.state_dict().items()})
    ref2.load_state_dict({k: v.cpu() for k, v in lin2.state_dict().items()})
    ref2(torch.nn.functional.gelu(ref1(host_x.mul(2.0)))).tanh().pow(2).mean().backward()
    assert torch.allclose(got, ref1.weight.grad, rtol=1e-3, atol=1e-5), "the gradient differs from the host's"
    return sorted(set(seen))


@pytest.mark.parametrize("forward_side", [False, True])
def test_offloading_saved_activations_with_every_wait_is_clean(forward_side: bool) -> None:
    r = simdevice.cuda()
    r.run(_offload, True, "current", True, forward_side)
    r.assert_clean()
    assert r.result is not None
    assert r.result.result == (["c"] if forward_side else ["default"])


@pytest.mark.parametrize("forward_side", [False, True])
@pytest.mark.parametrize(("wait_d2h", "wait_h2d", "record", "racing"),
                         [(False, "current", True, "copy_ (D2H)"),  # the D2H reads the activation before it is made
                          (True, "none", True, "(H2D)"),  # the H2D reads pinned memory before the D2H filled it
                          (True, "current", False, "before the free"),  # the block is reused under the D2H
                          ])
def test_offloading_saved_activations_without_a_wait_races(forward_side: bool, wait_d2h: bool, wait_h2d: str,
                                                            record: bool, racing: str) -> None:
    r = simdevice.cuda()
    r.run(_offload, wait_d2h, wait_h2d, record, forward_side)
    races = [x for x in r.reports if isinstance(x, Race)]
    assert races, r.text()
    assert racing in r.text(), r.text()


def test_unpack_waiting_on_the_default_stream_races_where_the_node_runs_on_a_side_stream() -> None:
    """The forward in a side stream's block: the engine runs its nodes, and unpack, on that stream, so an unpack
    that makes the default stream wait for the D2H leaves its own H2D unordered (a race, as on a GPU); with the
    forward on the default stream the same unpack is clean."""
    racy = simdevice.cuda()
    racy.run(_offload, True, "default", True, True)
    assert any(isinstance(x, Race) for x in racy.reports), racy.text()
    right = simdevice.cuda()
    right.run(_offload, True, "default", True, False)
    right.assert_clean()
