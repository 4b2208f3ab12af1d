"""The output of a plain elementwise op, without torch's meta kernel.

A simulated op's output shape and dtype come from running the op on meta tensors (``Dispatcher._meta_outputs``,
cached per signature). For the out-of-place pointwise ops (``add``, ``mul``, ``tanh``, ``tanh_backward``, ...)
that kernel is a Python reference (``torch._refs``), and its first call imports ``torch._dynamo``: about a second
of a command's start, for the shape of an ``add``. :func:`output` gives the same answer for the cases it is sure
of (inputs of one shape, or 0-dimensional, or Python numbers; contiguous; real dtypes), by TensorIterator's rules:
the shape is the common one, the dtype the promoted one (``torch.result_type``), ints and bools to the default
float for the ops that compute in floating point, the output contiguous. ``arange(end)`` too (its decomposition is
such a reference): ``ceil(end)`` elements, of the dtype asked for, else int64 for an integral end and the default
float for a float one (a float end with an integral dtype is left to the meta kernel). ``ones_like`` and the other
``*_like`` factories of such an input too (every ``backward()`` makes its ``grad_output`` with ``ones_like``).
Anything else is None,
and the meta kernel decides, as before. tests/property/model/test_elementwise_meta.py compares the two on random
calls and on every dtype pair.
"""

from __future__ import annotations

import math
from typing import Any

import torch

#: the meta device, one object: the simulator's own meta tensors are made with it (a session's factories tell them
#: by it from a program's meta tensors: ``facade._program_meta``)
META = torch.device("meta")

aten = torch.ops.aten

#: binary ops whose dtype is the promoted one (``torch.result_type``)
_PROMOTED = {aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.tanh_backward.default,
             aten.sigmoid_backward.default, aten.maximum.default, aten.minimum.default}
#: binary ops that compute in floating point: an integral or bool result type becomes the default float
_TRUE_DIVIDE = {aten.div.Tensor}
#: unary ops that compute in floating point (ints and bools promote to the default float)
_FLOAT_UNARY = {aten.tanh.default, aten.sigmoid.default, aten.exp.default, aten.log.default, aten.sqrt.default,
                aten.rsqrt.default, aten.sin.default, aten.cos.default}
#: unary ops that keep the dtype (bool excepted: not every one takes it)
_SAME_UNARY = {aten.neg.default, aten.abs.default, aten.relu.default}

_REAL = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int16, torch.int32,
         torch.int64, torch.uint8)
_SCALARS = (bool, int, float)
#: a new tensor shaped like its input (``grad_output``'s ``ones_like`` in every ``backward()``)
_LIKE = {aten.empty_like.default, aten.zeros_like.default, aten.ones_like.default, aten.full_like.default}
OPS = frozenset(_PROMOTED | _TRUE_DIVIDE | _FLOAT_UNARY | _SAME_UNARY | _LIKE | {aten.arange.default})
_ARANGE_KWARGS = {"dtype", "layout", "device", "pin_memory"}
_LIKE_KWARGS = {"dtype", "layout", "device", "pin_memory", "memory_format"}


def _row_major(shape: torch.Size) -> tuple[int, ...]:
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= max(n, 1)
    return tuple(reversed(out))


def _plain(t: torch.Tensor, shape: torch.Size | None) -> bool:
    """A real dtype, of ``shape`` (or 0-dimensional), with the row-major strides themselves (``is_contiguous`` also
    takes other strides on dimensions of size 1, and the output follows an input's strides), or of one dimension,
    whatever its stride (an output of one dimension is dense whatever its inputs: a slice with a step, an
    expanded number, as a ``sum``'s backward makes)."""
    if t.dtype not in _REAL or (t.dim() > 1 and t.stride() != _row_major(t.shape)):
        return False
    return t.dim() == 0 or shape is None or t.shape == shape


def output(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    """The meta tensor ``func(*args, **kwargs)`` returns, where these rules are sure of it; else None."""
    if func not in OPS:
        return None
    if func is aten.arange.default:
        return _arange(args, kwargs)
    if func in _LIKE:
        return _like(func, args, kwargs)
    if func in _FLOAT_UNARY or func in _SAME_UNARY:
        if kwargs or len(args) != 1 or not isinstance(args[0], torch.Tensor):
            return None
        (x,) = args
        if not _plain(x, None):
            return None
        dtype = x.dtype
        if func in _FLOAT_UNARY and not dtype.is_floating_point:
            dtype = torch.get_default_dtype()
        return torch.empty(x.shape, dtype=dtype, device=META)
    if len(args) != 2 or any(k != "alpha" for k in kwargs):
        return None
    a, b = args
    tensors = [x for x in (a, b) if isinstance(x, torch.Tensor)]
    if not tensors or any(not isinstance(x, (torch.Tensor, *_SCALARS)) for x in (a, b)):
        return None
    if func in (aten.tanh_backward.default, aten.sigmoid_backward.default, aten.maximum.default,
                aten.minimum.default) and len(tensors) != 2:
        return None
    shaped = [t for t in tensors if t.dim() > 0]
    shape = shaped[0].shape if shaped else torch.Size([])
    if not all(_plain(t, shape) for t in tensors):
        return None
    alpha = kwargs.get("alpha")
    if alpha is not None and (func not in (aten.add.Tensor, aten.sub.Tensor) or not isinstance(alpha, _SCALARS)):
        return None
    dtype = torch.result_type(a, b)
    if alpha is not None and isinstance(alpha, float) and not dtype.is_floating_point:
        return None  # a float alpha with an integral result: the meta kernel refuses
    if func in _TRUE_DIVIDE and not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    return torch.empty(shape, dtype=dtype, device=META)


def _arange(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    if len(args) != 1 or not set(kwargs) <= _ARANGE_KWARGS:
        return None
    (end,) = args
    if isinstance(end, bool) or not isinstance(end, (int, float)) or not end >= 0 or end == float("inf"):
        return None
    if kwargs.get("layout") not in (None, torch.strided) or kwargs.get("pin_memory"):
        return None
    dtype = kwargs.get("dtype")
    if dtype is None:
        dtype = torch.int64 if isinstance(end, int) else torch.get_default_dtype()
    if dtype not in _REAL or (isinstance(end, float) and not dtype.is_floating_point):
        return None  # an integral arange of a float end counts to the end cast first: the meta kernel's
    return torch.empty(math.ceil(end), dtype=dtype, device=META)


def _like(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    """``empty_like``, ``zeros_like``, ``ones_like``, ``full_like`` of a row-major input of a real dtype, in the
    input's or a real dtype, keeping its format or asking for the contiguous one: the input's shape, row-major."""
    if len(args) != (2 if func is aten.full_like.default else 1) or not set(kwargs) <= _LIKE_KWARGS:
        return None
    x = args[0]
    if not isinstance(x, torch.Tensor) or not _plain(x, None):
        return None
    if len(args) == 2 and (isinstance(args[1], bool) or not isinstance(args[1], (int, float))):
        return None
    if kwargs.get("layout") not in (None, torch.strided) or kwargs.get("pin_memory"):
        return None
    if kwargs.get("memory_format") not in (None, torch.preserve_format, torch.contiguous_format):
        return None
    dtype = kwargs.get("dtype")
    if dtype is None:
        dtype = x.dtype
    if dtype not in _REAL:
        return None
    return torch.empty(x.shape, dtype=dtype, device=META)
