"""An operation reads its inputs when it starts and lands its writes when it completes, whether it is computed at
its start or at its completion.

An in-place operation is computed at its completion (no copy of its destination is held while it runs), so every
write that lands while it runs first keeps, for it, what its inputs held (``InFlight.before_write``). Rules, each
with a test a mutation of it fails:

- a racing write to an input, landing while the operation runs, is not seen by it (it reads the start's value);
- a racing write to its destination, landing while it runs, is not what it computes from either, and its own
  result lands last (at its completion);
- only the inputs a write overlaps are kept, once.
- an operation is computed at its completion unless an input other than a destination itself shares bytes with a
  destination;
- an operation that makes one new tensor, where its op has an ``out=`` overload, is computed at its completion
  into the new tensor's bytes, from its inputs as they were at its start (where that overload refuses what the op
  takes, the op is computed as it is, once, and its result copied in);
- the bytes a new tensor lands in (a block freed and handed on while another stream still reads it: a race) are
  kept first for the operations in flight that read them, however the new tensor was computed.
"""

from __future__ import annotations

import warnings
from typing import Any

import attrs
import pytest
import torch

from simdevice import SimDevice, peek
from simdevice.runtime.memory import InFlight

#: large enough that the in-place operation on stream a outlasts the short one racing it on stream b
N = 1 << 18


def _race(dev: Any, on_a: Any, on_b: Any, y0: float) -> torch.Tensor:
    x = torch.ones(N, device=dev.device)
    y = torch.full((N,), y0, device=dev.device)
    a, b = dev.Stream(name="a"), dev.Stream(name="b")
    a.wait_stream(dev.current_stream())
    b.wait_stream(dev.current_stream())
    with dev.stream(a):
        on_a(x, y)  # starts first, completes last
    with dev.stream(b):
        on_b(x, y)  # starts a host step later, completes while a's operation runs
    dev.synchronize()
    return y


def test_a_write_landing_on_an_input_while_the_operation_runs_is_not_seen() -> None:
    run = SimDevice().run(lambda dev: _race(dev, lambda x, y: y.add_(x), lambda x, y: x.fill_(5), 0.0))
    assert {r.kind for r in run.reports} == {"race"}
    assert torch.equal(peek(run.result), torch.ones(N))  # 0 + x as it was at the start (1), not 5


def test_a_write_landing_on_the_destination_is_not_computed_from_and_is_overwritten() -> None:
    run = SimDevice().run(lambda dev: _race(dev, lambda x, y: y.mul_(2), lambda x, y: y.fill_(7), 1.0))
    assert {r.kind for r in run.reports} == {"race"}
    assert torch.equal(peek(run.result), torch.full((N,), 2.0))  # 1 * 2 lands at a's completion, after the 7


def test_the_operations_trace_is_the_start_and_completion_order() -> None:
    run = SimDevice().run(lambda dev: _race(dev, lambda x, y: y.add_(x), lambda x, y: x.fill_(5), 0.0))
    events = [what for _, who, what in run.trace if who in ("a", "b") and what.split()[0] in ("start", "done")]
    assert events == ["start add_ #0", "start fill_ #0", "done fill_ #0", "done add_ #0"]


def test_only_the_inputs_a_write_overlaps_are_kept_once() -> None:
    buf = torch.arange(16.0)
    x, y, other = buf[:8], buf[8:].clone(), torch.zeros(4)
    in_flight = InFlight()
    reading = in_flight.open([x, y])
    in_flight.before_write([other])
    assert reading.snaps == {}
    in_flight.before_write([buf])  # x's storage
    assert set(reading.snaps) == {id(x)}
    kept = reading.snaps[id(x)]
    x.fill_(-1)
    in_flight.before_write([buf])
    assert reading.snaps[id(x)] is kept  # the first value is the start's; a later write does not replace it
    assert torch.equal(kept, torch.arange(8.0))
    in_flight.close(reading)
    in_flight.before_write([y])  # nothing in flight any more
    assert id(y) not in reading.snaps


def test_an_input_that_is_its_own_destination_does_not_stop_the_completion_rule() -> None:
    """Which operations are computed at their completion (``_Effect.deferred``): those whose inputs other than
    their destinations themselves share no bytes with a destination (spans are storages': conservative)."""
    from simdevice.dispatch import _overlap

    base, elsewhere = torch.zeros(8), torch.zeros(8)
    a, rest = base[:4], base[4:]
    assert not _overlap([a], [a])  # x.mul_(2): it reads only its destination
    assert not _overlap([a, elsewhere], [a])
    assert _overlap([rest], [a])  # another view of the destination's storage
    assert _overlap([a, rest], [a])
    assert not _overlap([a], [rest, a])
    assert _overlap([base], [a])


def test_an_op_reading_views_of_its_destination_computes_on_a_copy_at_its_start() -> None:
    """``mm(z, z, out=z)`` through other views of ``z``: computed in place, the kernel would read what it has begun
    to write (on the CPU it zeroes its output first, so eager torch gives zeros); computed at its start on a copy of
    its destination, it reads ``z`` as it was, and lands the product at its completion."""

    def program(dev: Any) -> Any:
        z = torch.arange(4.0, device=dev.device).reshape(2, 2)
        torch.mm(z.view(2, 2), z.view(2, 2), out=z)
        return z.cpu()

    assert SimDevice().run(program).result.tolist() == [[2.0, 3.0], [6.0, 11.0]]


def test_a_new_tensor_is_computed_from_its_inputs_as_they_were_at_its_start() -> None:
    """An operation that makes a new tensor (``x * 2``) is computed at its completion, into its output's bytes
    (``_Effect.into``): a racing write that landed on an input meanwhile is not what it computes from."""
    run = SimDevice().run(lambda dev: _race(dev, lambda x, y: y.copy_(x * 2), lambda x, y: x.fill_(5), 0.0))
    assert {r.kind for r in run.reports} == {"race"}
    assert torch.equal(peek(run.result), torch.full((N,), 2.0))  # 1 * 2, not 5 * 2


@pytest.mark.parametrize("make", [lambda x: x * 1, lambda x: torch.normal(x, 0.0)], ids=["into", "computed"])
def test_a_new_tensor_landing_in_memory_a_running_operation_reads_leaves_it_the_old_bytes(make: Any) -> None:
    """A block freed while another stream's operation still reads it is handed to a new tensor of the freeing
    stream (a race); the new tensor's bytes land while that operation runs, and it reads what the block held at
    its start: whether the new tensor is computed at its completion into its bytes (``x * 1``) or at its start
    and copied in (a random op, ``normal``)."""

    def body(dev: Any) -> torch.Tensor:
        x = torch.full((N,), 2.0, device=dev.device)
        p = torch.ones(4 * N, device=dev.device)
        q = torch.zeros(4 * N, device=dev.device)
        b = dev.Stream(name="b")
        b.wait_stream(dev.current_stream())
        with dev.stream(b):
            q.add_(p)  # long; reads p at its completion
        del p  # its block goes back to the default stream's pool at once: b's read is not recorded
        z = make(x)  # made in p's block, lands while b's add_ runs
        dev.synchronize()
        del z
        return q

    run = SimDevice().run(body)
    assert "race" in {r.kind for r in run.reports}
    assert torch.equal(peek(run.result), torch.ones(4 * N))  # 0 + p as it was (1), nowhere z's 2


def test_an_out_kernel_that_refuses_leaves_the_op_computed_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where an op's ``out=`` overload raises on what the op itself takes, the op is computed as it is and its
    result copied into its output: the same values, no error, the op computed once."""
    from simdevice import dispatch

    aten = torch.ops.aten
    calls = []
    real = aten.mul.Tensor._op

    def refusing(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("refused")

    def counted(*args: Any, **kwargs: Any) -> Any:
        if args[0].device.type == "cpu":  # the effect's call on the bytes (its meta outputs are found on meta)
            calls.append(1)
        return real(*args, **kwargs)

    def body(dev: Any) -> torch.Tensor:
        x = torch.arange(8.0, device=dev.device)
        return x * torch.full((8,), 3.0, device=dev.device)

    SimDevice().run(body)  # an op's first call with these arguments is tried on the CPU once (_argument_error)
    op = aten.mul.Tensor
    facts = dispatch.classify(op)
    assert facts.into is not None
    monkeypatch.setitem(dispatch._FACTS, id(op), (op, attrs.evolve(facts, into=(refusing, "out", frozenset()))))
    monkeypatch.setattr(dispatch, "_REFUSED", set())
    monkeypatch.setattr(op, "_op", counted)  # what the effect calls the op by
    run = SimDevice().run(body)
    assert not run.reports
    assert torch.equal(peek(run.result), torch.arange(8.0) * 3)
    assert len(calls) == 1


def test_a_refusing_out_kernel_is_asked_once_and_a_reduction_to_one_value_never(
        monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    """A refusal is remembered: the op is computed as it is from then on, so a kernel that prints a warning as it
    refuses prints it once. A 0-d result is never computed into place (nothing to save there, and a loss's out=
    kernel uses its output as scratch of its input's shape first: it would refuse, and warn, every time).

    Mutations caught: the refusal forgotten (asked again); 0-d results into place (``mse_loss`` warns)."""
    from simdevice import dispatch

    aten = torch.ops.aten
    asked = []

    def refusing(*args: Any, **kwargs: Any) -> Any:
        asked.append(1)
        raise RuntimeError("refused")

    def body(dev: Any) -> torch.Tensor:
        x = torch.arange(8.0, device=dev.device)
        return x * torch.full((8,), 3.0, device=dev.device)

    SimDevice().run(body)  # an op's first call with these arguments is tried on the CPU once (_argument_error)
    op = aten.mul.Tensor
    facts = dispatch.classify(op)
    monkeypatch.setitem(dispatch._FACTS, id(op), (op, attrs.evolve(facts, into=(refusing, "out", frozenset()))))
    monkeypatch.setattr(dispatch, "_REFUSED", set())

    def body(dev: Any) -> list[torch.Tensor]:
        x = torch.arange(8.0, device=dev.device)
        a, b = torch.rand(6, 5, device=dev.device), torch.rand(6, 5, device=dev.device)
        return [x * x, x * x, x * x, torch.nn.functional.mse_loss(a, b), torch.nn.functional.mse_loss(a, b)]

    with warnings.catch_warnings(record=True) as seen:  # (torch passes a kernel's warning on to Python's)
        warnings.simplefilter("always")
        run = SimDevice().run(body)
    assert not [w for w in seen if "resized" in str(w.message)]
    assert not run.reports
    got = [peek(t) for t in run.result]
    assert all(torch.equal(g, torch.arange(8.0) ** 2) for g in got[:3])
    assert got[3].dim() == 0
    assert torch.equal(got[3], got[4])
    assert len(asked) == 1
    assert "resized" not in capfd.readouterr().err
