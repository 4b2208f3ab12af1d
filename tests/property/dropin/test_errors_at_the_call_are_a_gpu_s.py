"""``tests/hazards.py``'s ``ERRORS_AT_THE_CALL`` on the simulator: each call raises what a GPU raises, and at the
moment it does: an error of the arguments before anything is launched (the stream the call was made on is still
busy), a factorization's error once the host has waited for the stream (ATen reads its ``info`` on the host). The
same function runs on a GPU in ``tests/gpu/test_dropin_gpu.py``."""

from __future__ import annotations

from typing import Any

import pytest
from hazards import ERRORS_AT_THE_CALL, error_at_the_call_outcome

import simdevice


@pytest.mark.parametrize("name", sorted(ERRORS_AT_THE_CALL))
def test_a_call_raises_what_a_gpu_raises_when_it_raises_it(name: str) -> None:
    got: list[Any] = []
    s = simdevice.cuda()
    s.run(lambda: got.append(error_at_the_call_outcome(name)))
    assert s.result is not None
    assert not s.result.reports, s.result.reports
    assert got == [ERRORS_AT_THE_CALL[name][1]]
