"""What an aten op does on the simulated device: which bytes it reads and writes (from its schema), and whether
the host waits for it.

Ops that return nothing still write their mutable arguments and stay asynchronous (``_foreach_add_``,
``_fused_adam_``, ``_amp_foreach_non_finite_check_and_unscale_``); only genuine host reads make the host wait
(``.item()``, ``equal``, a copy to pageable memory, a data-dependent output shape such as ``nonzero``). An
error inside a stream operation ends the run as a host error naming the stream, never a hang.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from reference.schedule import Schedule
from simdevice import HostError, Race, SimDevice, StaleRead, peek
from simdevice.dispatch import classify

aten = torch.ops.aten


def run(body: Any, schedule: str = "t/t") -> Any:
    return SimDevice(Schedule.parse(schedule)).run(body)


@pytest.mark.parametrize(
    ("op", "written"),
    [
        (aten._foreach_add_.List, ("self",)),
        (aten._foreach_copy_.default, ("self",)),
        (aten._fused_adam_.default, ("self", "grads", "exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs")),
        (aten._amp_foreach_non_finite_check_and_unscale_.default, ("self", "found_inf")),
        (aten.add_.Tensor, ("self",)),
        (aten.mul.out, ("out",)),
    ],
)
def test_the_schema_says_what_an_op_writes(op: Any, written: tuple[str, ...]) -> None:
    assert tuple(name for _, name, _ in classify(op).written) == written


@pytest.mark.parametrize(
    ("op", "into"),
    [
        (aten.mul.Tensor, (aten.mul.out, "out")),
        (aten.mul.Scalar, (aten.mul.Scalar_out, "out")),
        (aten.sum.default, (aten.sum.out, "out")),
        (aten.sum.dim_IntList, (aten.sum.IntList_out, "out")),
        (aten.addmm.default, (aten.addmm.out, "out")),
        (aten.clone.default, (aten.clone.out, "out")),
        (aten.tanh_backward.default, (aten.tanh_backward.grad_input, "grad_input")),
        # factories: the out= overload takes no tensor options, which the output given carries
        (aten.arange.default, (aten.arange.out, "out", {"dtype", "layout", "device", "pin_memory"})),
        (aten.arange.start_step, (aten.arange.start_out, "out", {"dtype", "layout", "device", "pin_memory"})),
        (aten.zeros.default, (aten.zeros.out, "out", {"dtype", "layout", "device", "pin_memory"})),
        (aten.full.default, (aten.full.out, "out", {"dtype", "layout", "device", "pin_memory"})),
        (aten.zeros_like.default, (aten.zeros_like.out, "out", {"dtype", "layout", "device", "pin_memory"})),
        (aten.arange.start, None),  # no out= overload without a step
        (aten.max.dim, None),  # two results
        (aten.rand.default, None),  # random (and its out= overload takes fewer arguments)
        (aten.bernoulli.default, None),  # random: computed as it is
        (aten.add_.Tensor, None),  # writes an argument
        (aten.t.default, None),  # a view
    ],
)
def test_an_op_that_makes_one_new_tensor_computes_it_with_its_out_overload(op: Any, into: Any) -> None:
    """``OpFacts.into``: the overload with the same arguments and one more, the tensor it writes, found from the
    schemas."""
    got = classify(op).into
    if into is None:
        assert got is None
    else:
        assert got is not None
        assert got[0] is into[0]._op
        assert got[1] == into[1]
        assert got[2] == frozenset(into[2] if len(into) > 2 else ())


@pytest.mark.parametrize(
    "make",
    [
        lambda d: torch.arange(4096, device=d),
        lambda d: torch.arange(3, 4096, 2, dtype=torch.float64, device=d),
        lambda d: torch.arange(0.5, 100.0, 0.25, device=d),
        lambda d: torch.zeros(64, 32, device=d),
        lambda d: torch.full((64,), 7, device=d),  # an int fill: int64, as on the CPU
        lambda d: torch.full((64,), 2.5, dtype=torch.bfloat16, device=d),
        lambda d: torch.linspace(-1.0, 1.0, 1000, device=d),
        lambda d: torch.eye(17, device=d),
        lambda d: torch.zeros_like(torch.ones(8, 4, device=d).t()),  # strided as its input
        lambda d: torch.ones_like(torch.ones(8, 4, device=d).t(), memory_format=torch.contiguous_format),
    ],
)
def test_a_factory_computed_into_its_output_makes_what_the_cpu_makes(make: Any) -> None:
    """A factory runs its ``out=`` overload into the device tensor, without the tensor options it was given: the
    values, dtype, shape and strides the CPU's factory makes."""
    got = run(lambda dev: make(dev.device)).result
    want = make("cpu")
    assert (got.dtype, got.shape, got.stride()) == (want.dtype, want.shape, want.stride())
    assert torch.equal(peek(got), want)


def test_an_op_that_returns_nothing_writes_its_arguments_and_does_not_make_the_host_wait() -> None:
    def program(dev: Any) -> tuple[float, float, list[float]]:
        xs = [torch.zeros(256, device=dev.device) for _ in range(3)]
        dev.synchronize()
        t0 = dev.now_units
        torch._foreach_add_(xs, 1.0)  # queued: the host goes on at once
        t1 = dev.now_units
        side = dev.Stream(name="side")
        with dev.stream(side):
            torch._foreach_mul_(xs, 2.0)  # unordered with the add: a race on each tensor
        dev.synchronize()
        return t0, t1, [float(x.sum()) for x in xs]

    r = run(program)
    t0, t1, sums = r.result
    assert (t1 - t0) * 1e6 == pytest.approx(SimDevice().config.host_step_ns)  # one host step, no wait
    assert sums == [512.0] * 3
    assert [type(x) for x in r.reports] == [Race] * 3


def test_each_destination_of_a_list_op_is_written_at_its_own_bytes() -> None:
    """A list op's destinations differ in size and place (here a whole tensor and a view into a buffer); each write
    covers its own tensor's bytes, whatever the destination before it covered."""

    def program(dev: Any) -> list[float]:
        big = torch.zeros(256, device=dev.device)
        buf = torch.zeros(16, device=dev.device)
        side = dev.Stream(name="side")
        side.wait_stream(dev.current_stream())  # after the zeros, not after the add
        torch._foreach_add_([big, buf[4:8]], 1.0)
        with dev.stream(side):
            buf[8:].fill_(3.0)  # after the view: no race
            buf[:5].fill_(2.0)  # its first element: a race on bytes 16:20
        dev.synchronize()
        return buf.cpu().tolist()

    r = run(program)
    assert [type(x) for x in r.reports] == [Race]
    race = r.reports[0]
    assert (race.previous.op, race.previous.lo, race.previous.hi) == ("_foreach_add_", 16, 32)
    assert (race.current.lo, race.current.hi) == (0, 20)
    assert r.result == [2.0] * 5 + [1.0] * 3 + [3.0] * 8


def test_a_fused_optimizer_step_is_checked_like_any_kernel() -> None:
    def program(dev: Any) -> float:
        p, g, m, v = (torch.full((256,), x, device=dev.device) for x in (1.0, 0.5, 0.0, 0.0))
        steps = torch.ones(1, device=dev.device)
        dev.synchronize()
        side = dev.Stream(name="side")
        side.wait_stream(dev.current_stream())
        with dev.stream(side):
            g.mul_(2)  # the gradient is still being produced on the side stream...
        torch._fused_adam_([p], [g], [m], [v], [], [steps], lr=0.1, beta1=0.9, beta2=0.999, weight_decay=0.0,
                           eps=1e-8, amsgrad=False, maximize=False)  # ...when the step reads it
        dev.synchronize()
        return float(p[0].item())

    r = run(program)
    assert any(isinstance(x, Race) and x.current.op == "_fused_adam_" for x in r.reports)
    assert r.result < 1.0


def test_host_values_make_the_host_wait() -> None:
    def program(dev: Any) -> tuple[float, bool]:
        x = torch.arange(4096, dtype=torch.float32, device=dev.device)
        return (x * 2).sum().item(), bool(torch.equal(x, x))

    r = run(program)
    assert (r.result, r.reports) == ((float(sum(range(4096)) * 2), True), ())


@pytest.mark.parametrize(
    "make",
    [
        lambda x: torch.nonzero(x > 0),
        lambda x: torch.masked_select(x, x > 0),
        lambda x: x[x > 0],
        lambda x: torch.unique(x.abs()),
        lambda x: torch.repeat_interleave(torch.ones(3, dtype=torch.long, device=x.device) * 2),
    ],
    ids=["nonzero", "masked_select", "bool-index", "unique", "repeat_interleave"],
)
def test_a_data_dependent_shape_runs_on_the_data_and_makes_the_host_wait(make: Any) -> None:
    def on(dev: Any) -> torch.Tensor:
        x = torch.arange(12, dtype=torch.float32, device=dev.device) - 5
        return make(x).cpu()

    r = run(on)
    assert r.reports == ()
    assert torch.equal(r.result, make(torch.arange(12, dtype=torch.float32) - 5))


@pytest.mark.parametrize(
    "make",
    [
        lambda x: x[torch.arange(1, 4, 2, device=x.device)],
        lambda x: torch.repeat_interleave(x, output_size=66),  # (x its repeats: 0 + 1 + ... + 11)
    ],
    ids=["integer-index", "repeat_interleave-output_size"],
)
def test_an_op_whose_shape_its_arguments_decide_does_not_make_the_host_wait(make: Any) -> None:
    """torch tags ``index`` and ``repeat_interleave`` as of a dynamic output shape (for a mask, for no
    ``output_size``), but with integer indices, or given ``output_size``, the host knows the shape and CUDA launches
    them as any kernel. Before, the host waited for them as for ``nonzero``: a side stream's write of their input
    issued after them was ordered after their read, and its race missed."""

    def program(dev: Any) -> torch.Tensor:
        x = torch.arange(12, device=dev.device)
        side = dev.Stream(name="side")
        side.wait_stream(dev.current_stream())
        y = make(x)
        with dev.stream(side):
            x.zero_()  # nothing orders it after the read of x
        dev.synchronize()
        return y.cpu()

    r = run(program)
    assert [(x.current.op, x.previous.actor) for x in r.reports if isinstance(x, Race)] == [("zero_", "default")]


def test_a_data_dependent_op_waits_for_the_writes_it_reads_and_its_output_is_written_on_its_stream() -> None:
    def program(dev: Any) -> int:
        x = torch.zeros(1024, device=dev.device)
        dev.synchronize()
        x.fill_(1.0)
        idx = torch.nonzero(x)  # the host waits: the count needs the fill landed
        side = dev.Stream(name="side")
        with dev.stream(side):
            idx.add_(1)  # not ordered after the compute stream's writing of idx: a race
        dev.synchronize()
        return int(idx.shape[0])

    r = run(program, "t/t::default#1+5")
    assert r.result == 1024
    assert not any(isinstance(x, StaleRead) for x in r.reports)
    assert [x.previous.op for x in r.reports if isinstance(x, Race)] == ["nonzero"]


def test_an_error_inside_a_stream_operation_is_a_host_error_of_the_run() -> None:
    lib = torch.library.Library("simdevice_test_failing", "DEF")
    lib.define("boom(Tensor(a!) x) -> ()")

    def boom(x: torch.Tensor) -> None:
        raise RuntimeError("the kernel failed")

    lib.impl("boom", boom, "CPU")
    lib.impl("boom", lambda x: None, "Meta")

    def program(dev: Any) -> None:
        x = torch.zeros(8, device=dev.device)
        torch.ops.simdevice_test_failing.boom.default(x)
        dev.synchronize()

    r = run(program)
    [err] = r.reports
    assert isinstance(err, HostError)
    assert (err.actor, err.error) == ("stream default", "RuntimeError: the kernel failed in boom #1")
    assert err.source.endswith(f"test_ops.py:{boom.__code__.co_firstlineno + 1}")  # the kernel's own raise


def test_a_stream_operations_error_names_the_line_that_issued_it() -> None:
    """An op that fails in torch's own code on the stream (no frame of the program's there) names the program's line
    that issued it, not the simulator's frame that ran it."""

    def program(dev: Any) -> None:
        x, i = torch.ones(4, device=dev.device), torch.full((2,), 7, device=dev.device)
        x.index_select(0, i)  # the failing line: an index out of range, which only the kernel sees
        dev.synchronize()

    r = run(program)
    [err] = r.reports
    assert isinstance(err, HostError)
    assert err.actor == "stream default"
    assert err.source.endswith(f"test_ops.py:{program.__code__.co_firstlineno + 2}"), err.source


def test_empty_tensors_are_tensors_like_any_other() -> None:
    """An empty device tensor (``torch.empty(0)``, a slice of no elements) covers no bytes at its place: ops on it
    run, copy and race-check as on any tensor. (An empty tensor's ``data_ptr()`` is 0: a range taken from it put
    the tensor before its storage, and the first op on it raised ``invalid storage offset``.)"""
    from simdevice.dispatch import storage_of

    def body(dev: Any) -> tuple[Any, ...]:
        x = torch.empty(0, device=dev.device)
        y = torch.arange(4.0, device=dev.device)
        gap = y[2:2]
        host = torch.empty(0, pin_memory=True)
        host.copy_(x, non_blocking=True)
        z = torch.cat([gap * 2, x + 1, y])
        dev.synchronize()
        return (storage_of(gap).byte_range(gap._data), tuple((x + 1).shape), tuple(gap.mul(3).shape),
                z.cpu().tolist())

    r = run(body)
    assert r.reports == ()
    assert r.result == ((8, 8), (0,), (0,), [0.0, 1.0, 2.0, 3.0])  # y[2:2] lies at byte 8 of y's, covering none


def test_a_views_shape_strides_and_storage_offset_are_those_of_the_same_view_on_the_cpu() -> None:
    views = [lambda t: t[1:], lambda t: t[:, 2:], lambda t: t.t(), lambda t: t[2], lambda t: t.view(-1)[5:],
             lambda t: t.narrow(1, 1, 3), lambda t: t[1:, 1:].t()]

    def body(dev: Any) -> list[tuple[Any, ...]]:
        x = torch.arange(24.0, device=dev.device).reshape(4, 6)
        return [(tuple(v.shape), v.stride(), v.storage_offset()) for v in (view(x) for view in views)]

    cpu = torch.arange(24.0).reshape(4, 6)
    want = [(tuple(v.shape), v.stride(), v.storage_offset()) for v in (view(cpu) for view in views)]
    assert run(body).result == want
