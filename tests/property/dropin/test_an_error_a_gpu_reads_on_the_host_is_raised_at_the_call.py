"""An op whose CUDA implementation reads its result's status on the host and raises there (``linalg.cholesky``,
``cholesky`` of a matrix that is not positive-definite: ATen reads the factorization's ``info`` after the kernel)
raises at the call, once the host has waited for the stream, as an H100 raised each (``scripts/api-sweep run``,
docs/confirmations.md, fifty-first run). Before, the error came from the stream, a host error past the program's
``try``: a program that falls back to another factorization stopped here and ran there."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable

import pytest
import torch

import simdevice

FACTORIZATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "linalg.cholesky": torch.linalg.cholesky,
    "cholesky": torch.cholesky,
}


@pytest.mark.parametrize("name", sorted(FACTORIZATIONS))
def test_a_factorization_s_error_is_the_caller_s(name: str) -> None:
    factor = FACTORIZATIONS[name]
    got: list[str] = []

    def program() -> None:
        a = torch.ones(4, 4, device="cuda")  # (rank one: not positive-definite)
        try:
            factor(a)
        except torch.linalg.LinAlgError as e:
            got.append(str(e))
            a = a + 4 * torch.eye(4, device="cuda")  # the fallback: made positive-definite
        got.append(str(factor(a).diagonal().sum().item() > 0))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (torch.cholesky's deprecation)
        with simdevice.cuda() as sim:
            program()
    sim.assert_clean()
    assert "not positive-definite" in got[0]
    assert got[1] == "True"


def test_the_host_raises_it_once_the_stream_has_run_the_op() -> None:
    """The host waited for the factorization (the queue ahead of it too) before it raised: the error is raised
    after the wait, not at the issue."""
    def program() -> None:
        a = torch.ones(64, 64, device="cuda")
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            torch.cuda._sleep(10**6)  # (the queue ahead of the op: the host waits for it)
            with contextlib.suppress(torch.linalg.LinAlgError):
                torch.linalg.cholesky(a)
        assert s.query()

    with simdevice.cuda() as sim:
        program()
    sim.assert_clean()
