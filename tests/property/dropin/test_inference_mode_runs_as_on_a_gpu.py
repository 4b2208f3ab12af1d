"""Serving code runs its model under ``torch.inference_mode()`` (vLLM's model runner, SGLang's). There torch skips
autograd's keys, so a composite op (``to``, ``reshape``, ``item``, ``cpu``) reaches the dispatch mode whole, and the
simulator's own tensors made there (a block's bytes, their aliases) came out as inference tensors: ``.to("cuda")``
of a host tensor failed the simulator's own assertion (a host error, "found"), a view or ``.cpu()`` of a device
tensor failed, and a parameter used there could not be updated in place afterwards. A race under inference mode is
found as under ``no_grad``."""

from __future__ import annotations

import torch

import simdevice
from simdevice.search.explore import explore

H = 16


def _prefetch_under_inference_mode(wait: bool = True) -> None:
    """The next layer's weights moved from pinned memory on a side stream, the compute stream waiting (``wait``)."""
    w_cpu = torch.full((H, H), 2.0).pin_memory()
    p = torch.nn.Parameter(torch.ones(H, device="cuda"))
    side = torch.cuda.Stream(priority=-1)
    with torch.inference_mode():
        x = torch.ones(2, H, device="cuda")
        with torch.cuda.stream(side):
            w = w_cpu.to("cuda", non_blocking=True)
        if wait:
            torch.cuda.current_stream().wait_stream(side)
        y = (x @ w) * p
        row = y[0].reshape(4, 4).cpu()
        total = y.sum().item()
        ids = y[1, :2].tolist()
    with torch.no_grad():
        p.add_(1.0)  # a parameter the inference pass read, updated after it
    assert row.flatten().tolist() == [32.0] * H, row
    assert total == 32.0 * 2 * H, total
    assert ids == [32.0, 32.0], ids
    assert p.sum().item() == 2.0 * H


def _not_waiting() -> None:
    _prefetch_under_inference_mode(False)


def test_a_waiting_inference_pass_is_clean() -> None:
    run = simdevice.cuda()
    run.run(_prefetch_under_inference_mode)
    run.assert_clean()


def test_an_inference_pass_that_does_not_wait_for_its_weights_is_found() -> None:
    found = explore(_not_waiting, max_examples=20)
    assert found.failure is not None
    kinds = {r.kind for r in found.failure.run.reports}
    assert {"race", "stale-read"} <= kinds, found.failure.text()
    assert "AssertionError at" not in found.failure.text()  # the program's own check, not the simulator's
