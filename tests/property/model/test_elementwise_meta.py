"""The elementwise rules (``simdevice.elementwise``) give what torch's meta kernel gives: the same shape, dtype and
strides on random calls of every op they cover (tensors of one shape or 0-dimensional, Python numbers, every real
dtype and bool, contiguous or not), and nothing where the meta kernel refuses the call or where they are not sure.
A program's first pointwise op then no longer imports ``torch._dynamo``."""

from __future__ import annotations

import itertools
import subprocess
import sys
from typing import Any

import torch
from hypothesis import given
from hypothesis import strategies as st

from simdevice import elementwise

aten = torch.ops.aten
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int32, torch.int64,
          torch.uint8, torch.bool]
UNARY = sorted((op for op in elementwise.OPS if len(op._schema.arguments) == 1), key=str)
BINARY = sorted((op for op in elementwise.OPS if op not in UNARY and op is not aten.arange.default), key=str)


@st.composite
def tensors(draw: st.DrawFn, shape: tuple[int, ...]) -> torch.Tensor:
    dtype = draw(st.sampled_from(DTYPES))
    if draw(st.booleans()):
        shape = ()
    t = torch.empty(shape, dtype=dtype, device="meta")
    if t.dim() >= 2 and draw(st.booleans()):
        t = t.transpose(0, 1)  # not contiguous: the meta kernel decides
    elif t.dim() == 1 and draw(st.booleans()):
        # one dimension, not contiguous: a number expanded (as a sum's backward makes), or a slice with a step
        n = t.shape[0]
        t = draw(st.sampled_from([torch.empty((), dtype=dtype, device="meta").expand(n),
                                  torch.empty(2 * n, dtype=dtype, device="meta")[::2]]))
    return t


def _operand(draw: st.DrawFn, shape: tuple[int, ...]) -> Any:
    return draw(st.one_of(tensors(shape), st.booleans(), st.integers(-3, 3), st.floats(-2, 2, allow_nan=False)))


def _meta(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
    try:
        out = func(*args, **kwargs)
    except (RuntimeError, TypeError, ValueError, NotImplementedError):
        return None
    return tuple(out.shape), out.dtype, out.stride()


@given(st.data())
def test_the_rules_give_the_meta_kernels_output_or_leave_it_to_it(data: st.DataObject) -> None:
    shape = tuple(data.draw(st.lists(st.integers(1, 4), min_size=0, max_size=3)))
    if data.draw(st.booleans(), label="unary"):
        func = data.draw(st.sampled_from(UNARY))
        args: tuple[Any, ...] = (data.draw(tensors(shape)),)
        kwargs: dict[str, Any] = {}
    else:
        func = data.draw(st.sampled_from(BINARY))
        args = (data.draw(tensors(shape)), _operand(data.draw, shape))
        if data.draw(st.booleans()):
            args = args[::-1]
        kwargs = {"alpha": data.draw(st.sampled_from([2, 0.5, True]))} if data.draw(st.booleans()) else {}
    mine = elementwise.output(func, args, kwargs)
    want = _meta(func, args, kwargs)
    if mine is None:
        return  # the meta kernel decides, as before
    assert want is not None, f"{func}{args} {kwargs}: the meta kernel refuses, the rules gave {mine}"
    assert (tuple(mine.shape), mine.dtype, mine.stride()) == want, (func, args, kwargs)


@given(st.one_of(st.integers(0, 40), st.floats(0, 40, allow_nan=False)),
       st.sampled_from([None, *DTYPES]), st.booleans())
def test_arange_by_the_rules_is_the_meta_kernels(end: float, dtype: torch.dtype | None, pinned: bool) -> None:
    kwargs: dict[str, Any] = {"device": torch.device("meta")}
    if dtype is not None:
        kwargs["dtype"] = dtype
    if pinned:
        kwargs["pin_memory"] = False
    mine = elementwise.output(aten.arange.default, (end,), kwargs)
    want = _meta(aten.arange.default, (end,), kwargs)
    if mine is not None:
        assert want is not None
        assert (tuple(mine.shape), mine.dtype, mine.stride()) == want, (end, kwargs)


LIKE = sorted((op for op in elementwise.OPS if op.__name__.split(".")[0].endswith("_like")), key=str)


@given(st.sampled_from(LIKE), st.lists(st.integers(1, 4), max_size=3), st.sampled_from(DTYPES),
       st.sampled_from([None, *DTYPES]), st.sampled_from([None, torch.preserve_format, torch.contiguous_format,
                                                          torch.channels_last]),
       st.booleans(), st.one_of(st.integers(-3, 3), st.floats(-2, 2, allow_nan=False), st.booleans()))
def test_like_factories_by_the_rules_are_the_meta_kernels(
    func: Any, shape: list[int], dtype: torch.dtype, asked: torch.dtype | None, fmt: Any, transposed: bool,
    fill: Any,
) -> None:
    x = torch.empty(shape, dtype=dtype, device="meta")
    if x.dim() >= 2 and transposed:
        x = x.transpose(0, 1)
    args: tuple[Any, ...] = (x, fill) if func is aten.full_like.default else (x,)
    kwargs: dict[str, Any] = {"device": torch.device("meta")}
    if asked is not None:
        kwargs["dtype"] = asked
    if fmt is not None:
        kwargs["memory_format"] = fmt
    mine = elementwise.output(func, args, kwargs)
    want = _meta(func, args, kwargs)
    if mine is not None:
        assert want is not None, (func, args, kwargs)
        assert (tuple(mine.shape), mine.dtype, mine.stride()) == want, (func, args, kwargs)


def test_the_rules_cover_the_common_calls() -> None:
    x = torch.empty(4, 3, device="meta")
    for func, args in [(aten.add.Tensor, (x, 1.0)), (aten.mul.Tensor, (x, x)), (aten.tanh.default, (x,)),
                       (aten.tanh_backward.default, (x, x)), (aten.div.Tensor, (x.int(), 2)),
                       (aten.arange.default, (4096,)), (aten.arange.default, (10.5,)),
                       (aten.ones_like.default, (x,)), (aten.zeros_like.default, (x,)),
                       (aten.empty_like.default, (x,)), (aten.full_like.default, (x, 2.0))]:
        assert elementwise.output(func, args, {}) is not None, func


def test_a_run_with_a_backward_does_not_import_dynamo() -> None:
    """``backward()`` makes its ``grad_output`` with ``ones_like`` (a Python reference as its meta kernel)."""
    code = ("import sys; from simdevice.search import execute; from reference.schedule import Schedule; "
            "out = execute(Schedule.parse('activation_offload/FIXED')); "
            "print('DYNAMO' if 'torch._dynamo' in sys.modules else 'NO-DYNAMO', out.clean)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.strip().splitlines()[-1] == "NO-DYNAMO True", out.stdout + out.stderr


def test_a_replay_of_the_demonstration_does_not_import_dynamo() -> None:
    code = ("import sys; from simdevice.cli import main; rc = main(['replay', 'offload_reload/racy::d2h#0+1', "
            "'--no-fix']); print('DYNAMO' if 'torch._dynamo' in sys.modules else 'NO-DYNAMO', rc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.strip().splitlines()[-1] == "NO-DYNAMO 1", out.stdout + out.stderr


def test_every_dtype_pair_of_every_binary_op_by_the_rules_is_the_meta_kernels() -> None:
    """The whole grid, not a sample: each binary op, each pair of dtypes and each kind of Python number, over
    shapes with and without dimensions of size 1."""
    checked = 0
    for func, da, shape in itertools.product(BINARY, DTYPES, [(3, 2), (2, 1), (1, 3), (4,)]):
        firsts = [torch.empty(shape, dtype=da, device="meta")]
        if len(shape) == 2:  # the same shape, other strides: a transpose (size-1 dimensions keep is_contiguous)
            firsts.append(torch.empty(shape[::-1], dtype=da, device="meta").transpose(0, 1))
        others: list[Any] = [torch.empty(shape, dtype=db, device="meta") for db in DTYPES]
        others += [torch.empty((), dtype=db, device="meta") for db in DTYPES] + [True, 2, 0.5]
        for a, b, flip in itertools.product(firsts, others, (False, True)):
            args = (b, a) if flip else (a, b)
            mine = elementwise.output(func, args, {})
            if mine is None:
                continue
            checked += 1
            want = _meta(func, args, {})
            assert want is not None, (func, args)
            assert (tuple(mine.shape), mine.dtype, mine.stride()) == want, (func, args)
    assert checked > 500
