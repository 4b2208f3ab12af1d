"""A factory asked for a device tensor and ``pin_memory=True`` raises ATen's error, as on a GPU (``empty_cuda``
refuses to pin device memory: "Only dense CPU tensors can be pinned"), whether the device is named (``torch.empty(n,
device="cuda", pin_memory=True)``, ``zeros``, ``full``) or taken from a device tensor (``empty_like(t,
pin_memory=True)``, ``ones_like``). Before, the simulator made a device tensor (or, for ``ones_like``, raised the CPU
build's "no pinned memory allocator"), so a program that a GPU stops went on here. A host factory with
``pin_memory=True`` pins, and ``pin_memory=False`` on the device is a device tensor. The calls and what a GPU gives
are ``tests/hazards.py``'s ``PIN_FACTORIES``; ``tests/gpu/test_dropin_gpu.py`` runs them on a GPU."""

from __future__ import annotations

from typing import Any

import pytest
from hazards import PIN_FACTORIES, pin_factory_outcome

import simdevice


@pytest.mark.parametrize("name", sorted(PIN_FACTORIES))
def test_a_factory_asked_to_pin_gives_what_a_gpu_gives(name: str) -> None:
    got: list[Any] = []
    s = simdevice.cuda()
    s.run(lambda: got.append(pin_factory_outcome(name)))
    assert s.result is not None
    assert not s.result.reports, s.result.reports
    assert got == [PIN_FACTORIES[name][1]]
