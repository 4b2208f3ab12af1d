"""An error torch's checks of an op's arguments raise (dtypes, shapes) is raised at the call, on the host, as CUDA
raises it before anything is launched: a program's ``try`` around the call takes it there. Before, an op whose meta
kernel made no such check (``mm`` of float32 and bfloat16) or refused for it (shapes that do not multiply) was
queued, and the error came from the stream, past the ``try``."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import simdevice


def _fallback(b: Any) -> None:
    a = torch.randn(8, 32, device="cuda")
    try:
        y = a @ b
    except RuntimeError:
        y = a @ b[:32].float()
    assert y.dtype == torch.float32
    assert y.shape == (8, 32)


@pytest.mark.parametrize("wrong", ["dtype", "shape"])
def test_a_try_around_a_call_with_wrong_arguments_takes_the_error(wrong: str) -> None:
    def program() -> None:
        if wrong == "dtype":
            _fallback(torch.randn(32, 32, device="cuda", dtype=torch.bfloat16))
        else:
            _fallback(torch.randn(33, 32, device="cuda"))

    with simdevice.cuda() as sim:
        program()
    sim.assert_clean()


def test_an_uncaught_argument_error_stops_the_host_at_its_line() -> None:
    after: list[str] = []

    def program() -> None:
        a = torch.randn(8, 32, device="cuda")
        a @ torch.randn(32, 32, device="cuda", dtype=torch.bfloat16)
        after.append("went on")

    s = simdevice.cuda()
    s.run(program)
    assert s.result is not None
    assert after == []
    (error,) = s.result.reports
    assert error.kind == "host-error"
    assert "host raised RuntimeError" in str(error)
    assert "same dtype" in str(error)



@pytest.mark.parametrize("make", [
    lambda: torch.ones(-5, device="cuda"),
    lambda: torch.full((-2,), 1.0, device="cuda"),
    lambda: torch.arange(0, 10, 0, device="cuda"),
    lambda: torch.linspace(0, 1, -1, device="cuda"),
    lambda: torch.randn(-2, device="cuda"),
], ids=["ones", "full", "arange", "linspace", "randn"])
def test_a_factory_s_refusal_raises_at_the_call(make: Any) -> None:
    """A factory on the device (``ones``, ``full``, ``arange``, ...) with a size or step torch refuses raises at the
    call, as on CUDA: a ``try`` around it takes the error. Before, its meta kernel's refusal was taken for a result
    the values decide, and the host trial skips an op that names a device: the error came from the stream, past the
    ``try`` (a host error "stream default raised RuntimeError: Trying to create tensor with negative dimension")."""
    caught: list[str] = []

    def program() -> None:
        try:
            make()
        except RuntimeError as e:
            caught.append(str(e))
        torch.ones(4, device="cuda").add_(1)

    with simdevice.cuda() as sim:
        program()
    sim.assert_clean()
    assert len(caught) == 1


@pytest.mark.parametrize("rows", [16, 1 << 12])
def test_only_arguments_up_to_the_trial_bytes_are_tried_on_the_host(
    rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host trial of an op's arguments makes zeros of their sizes, so it is made only up to
    ``dispatch._TRIAL_BYTES`` of them (4 MiB): a program's large tensors cost no host copy (a race-only run of a
    simulated 64 GiB would make them). Mutation caught: the bound left out (a 32 MiB sum tried)."""
    from simdevice import dispatch

    tried: list[Any] = []
    monkeypatch.setattr(dispatch, "_on_a_stack_of_its_own", lambda call: tried.append(call))
    a, b = (torch.empty(rows, 1024, device="meta") for _ in range(2))  # 128 KiB, or 32 MiB
    assert dispatch._argument_error(torch.ops.aten.add.Tensor, (a, b), {}) is None
    assert bool(tried) == (rows * 1024 * 4 * 2 <= dispatch._TRIAL_BYTES), (rows, len(tried))


def test_an_error_of_the_trial_s_zeros_alone_is_not_raised_at_the_call() -> None:
    """The trial on zeros that finds argument errors raises only what ones raise as well, word for word: an error
    of the zeros' values (``cholesky_inverse`` of a zero diagonal, singular) is not the program's. Before, every
    ``cholesky_inverse`` of a device tensor raised here; an H100 computes it (docs/confirmations.md, fifty-first
    run's sweep)."""
    got: list[torch.Tensor] = []

    def program() -> None:
        factor = torch.eye(3, device="cuda") * 2
        got.append(torch.cholesky_inverse(factor).cpu())

    with simdevice.cuda() as sim:
        program()
    sim.assert_clean()
    assert torch.allclose(got[0], torch.eye(3) * 0.25)


def test_an_in_place_op_s_argument_error_is_raised_at_its_first_call_on_a_destination() -> None:
    """An in-place op given arguments its kernels refuse (``bitwise_and_`` of floats, ``uniform_`` from 1 to 0) raises
    at the call, as CUDA does before the launch; asked once per destination tensor and op: the same op on that tensor
    later is not asked again (its error, if any, comes from the stream, as before), another tensor is."""
    got: list[str] = []

    def program() -> None:
        a, b = torch.ones(4, device="cuda"), torch.ones(4, device="cuda")
        for call in (lambda: a.bitwise_and_(a), lambda: a.uniform_(1, 0), lambda: a.uniform_(0, 1),
                     lambda: b.uniform_(1, 0)):
            try:
                call()
            except (RuntimeError, NotImplementedError) as e:
                got.append(type(e).__name__)
            else:
                got.append("ok")
        a.uniform_(1, 0)  # (uniform_ was asked of ``a`` once, and passed: this one the stream raises)

    s = simdevice.cuda()
    s.run(program)
    assert got == ["NotImplementedError", "RuntimeError", "ok", "RuntimeError"]
    assert s.result is not None
    assert [str(r).split(" raised ")[1][:40] for r in s.result.reports] == ["RuntimeError: uniform_ expects to return"]
