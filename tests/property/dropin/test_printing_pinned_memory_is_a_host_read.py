"""Printing a host tensor in the program is the host's read of its bytes.

torch formats a tensor's values with the dispatch modes turned off (``torch._tensor_str``), so ``print(t)`` of
pinned memory a non-blocking D2H may still be filling read it unseen: a log line of stale values (the classic
``print(loss.to("cpu", non_blocking=True))`` without a synchronize) ran clean here. ``repr``, ``str``, ``print``,
``%s``, a logger's message and ``f"{t}"`` of a host tensor in the program are now checked as the host's read of
it, at the line that printed it (``simdevice/dropin/facade.py``'s ``_tensor_repr``); a 0-d tensor's
``f"{t:.3f}"`` is its ``item()``, an op, checked as before. Mutations caught: the check left out; the line taken
where torch or ``logging`` asks for the text.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hazard_checks import races_only_unwaited

import simdevice
from simdevice import Race

PRINTS: dict[str, Callable[[torch.Tensor], Any]] = {  # (each on a line of its own: the read's line, _LINES)
    "print": lambda t: print(t),
    "repr": lambda t: repr(t),
    "str": lambda t: str(t),
    "f-string": lambda t: f"{t}",
    "%-format": lambda t: "%s" % (t,),  # noqa: UP031 (the form logging uses)
    "logging": lambda t: logging.getLogger("simdevice-test").warning("loss %s", t),
    "a view": lambda t: print(t[:2]),
    "0-d, formatted": lambda t: f"{t[0]:.3f}",
}


#: the line of each print, where its read is reported (a logging call's is logging's own line: the text is made there)
_LINES = {name: __import__("inspect").getsourcelines(f)[1] for name, f in PRINTS.items()}


def _offload_then(show: Callable[[torch.Tensor], Any], sync: bool) -> Any:
    def program() -> None:
        x = torch.arange(4, dtype=torch.float32, device="cuda")
        host = torch.empty(4, pin_memory=True)
        host.copy_(x, non_blocking=True)
        if sync:
            torch.cuda.current_stream().synchronize()
        show(host)

    run = simdevice.cuda()
    run.run(program)
    return run.result


@pytest.mark.parametrize("name", sorted(PRINTS))
def test_printing_a_copy_in_flight_races(name: str) -> None:
    result = _offload_then(PRINTS[name], sync=False)
    races = [r for r in result.reports if isinstance(r, Race)]
    assert len(races) == 1, result.reports
    assert races[0].previous.op == "copy_ (D2H)"
    assert races[0].current.source.endswith("test_printing_pinned_memory_is_a_host_read.py:" + str(_LINES[name]))


@pytest.mark.parametrize("name", sorted(PRINTS))
def test_printing_after_the_wait_is_clean(name: str) -> None:
    assert not _offload_then(PRINTS[name], sync=True).reports


def test_printing_pageable_memory_or_a_device_tensor_checks_nothing_more() -> None:
    def program() -> None:
        x = torch.arange(4, dtype=torch.float32, device="cuda")
        print(x * 2, torch.ones(3))

    run = simdevice.cuda()
    run.run(program)
    run.assert_clean()


def test_a_printed_copy_in_flight_is_found_as_it_shows_on_a_gpu() -> None:
    """``tests/hazards.py::printed_pinned_reload`` (run on a GPU in ``tests/gpu/test_dropin_gpu.py``): under a stall of
    the D2H, the unwaited print shows zeros and races; waited, clean."""
    races_only_unwaited("printed_pinned_reload", "side#0+20")
