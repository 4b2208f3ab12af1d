"""NumPy views of pinned memory whose reads and writes are the host's accesses, checked.

``t.numpy()`` gives the host a tensor's bytes in C++, without the dispatcher: what the program then does through the
array (fills a staging buffer's slice for the next H2D, sums what a D2H brought back) is no aten op, so the
simulator would not see it. A staging buffer kept as a NumPy view (``self.input_ids_np = self.input_ids_cpu.numpy()``
once, ``self.input_ids_np[:n] = ids`` each step, then ``self.input_ids_cpu[:n].to("cuda", non_blocking=True)``) races
with the last step's copy where nothing waited for it; so does a sum of a D2H's pinned destination read through
NumPy before the copy is done.

:func:`checked` wraps the array ``numpy()`` returns for pinned memory of the run in a :class:`PinnedArray`: a view of
the same bytes whose element reads and writes (indexing, assignment, ufuncs and reductions, NumPy's functions,
``tolist``/``copy``/``astype`` and the other methods that read, ``fill``/``sort``/``put`` that write) are checked as
the host's access of exactly the bytes they touch, where the program makes them, with no host step of their own (a
GPU run counts none there either). Views of it (slices, ``reshape``, ``T``) are PinnedArrays too; making one reads
nothing. What reads the bytes below Python still goes unseen: the buffer protocol (``memoryview``, ``bytes(a)``,
``torch.from_numpy``), and C extensions given the array.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import torch

#: the access check a view carries: (the pinned tensor, tensors over the bytes read, over the bytes written, op)
Access = Callable[[torch.Tensor, list[torch.Tensor], list[torch.Tensor], str], None]

_byte_bounds = getattr(np.lib, "array_utils", np).byte_bounds  # (NumPy 2; NumPy 1 has it at the top)

#: NumPy functions that read no element (shapes, types, memory overlap) or make views: no access
_NO_ACCESS = {
    getattr(np, name) for name in (
        "shape", "ndim", "size", "may_share_memory", "shares_memory", "result_type", "iscomplexobj", "isrealobj",
        "reshape", "ravel", "transpose", "squeeze", "expand_dims", "moveaxis", "swapaxes", "rollaxis",
        "atleast_1d", "atleast_2d", "atleast_3d", "broadcast_to", "broadcast_arrays", "split", "array_split",
        "hsplit", "vsplit", "dsplit", "diagonal", "real", "imag", "flip", "fliplr", "flipud", "rot90",
    ) if hasattr(np, name)
}
#: NumPy functions that write their first argument in place (and read what they are given)
_WRITES_FIRST = {
    getattr(np, name) for name in ("copyto", "put", "place", "putmask", "fill_diagonal", "put_along_axis")
    if hasattr(np, name)
}

#: while set, a PinnedArray's access is already counted by the call that is running (a NumPy function whose own
#: implementation calls ufuncs on the same arrays)
_counted = [False]


def checked(array: np.ndarray, pinned: torch.Tensor, access: Access) -> np.ndarray:
    """``array`` (what ``pinned.numpy()`` gave) as a :class:`PinnedArray` whose accesses ``access`` checks."""
    view = array.view(PinnedArray)
    view._pinned = pinned
    view._access = access
    return view


def _as_tensor(x: np.ndarray, pinned: torch.Tensor) -> torch.Tensor | None:
    """A tensor over the bytes of ``pinned``'s storage that array ``x`` spans (None: none of them, as for a copy
    made from it): exact for a view torch can take, else the bytes from its first to its last."""
    plain = x.view(np.ndarray)
    storage = pinned.untyped_storage()
    base = storage.data_ptr()
    lo, hi = _byte_bounds(plain)
    if hi <= lo or lo < base or hi > base + storage.nbytes():
        return None
    with torch._C._DisableTorchDispatch():  # (made here, not an operation of the program's)
        if plain.flags.writeable and all(s >= 0 for s in plain.strides):
            try:
                return torch.from_numpy(plain)
            except (TypeError, ValueError, RuntimeError):  # a dtype torch has not, strides not of whole elements
                pass
        return torch.empty(0, dtype=torch.uint8).set_(storage, lo - base, (hi - lo,))


def _touch(reads: Iterable[Any], writes: Iterable[Any], op: str) -> None:
    """Check the host's reads and writes of the PinnedArrays among ``reads`` and ``writes`` (one access per pinned
    buffer)."""
    if _counted[0]:
        return
    by: dict[int, tuple[PinnedArray, list[torch.Tensor], list[torch.Tensor]]] = {}
    for arrays, writing in ((reads, False), (writes, True)):
        for x in arrays:
            if isinstance(x, PinnedArray) and x._access is not None:
                t = _as_tensor(x, x._pinned)
                if t is not None:
                    _, r, w = by.setdefault(id(x._pinned), (x, [], []))
                    (w if writing else r).append(t)
    for x, r, w in by.values():
        assert x._access is not None
        x._access(x._pinned, r, w, op)


def _arrays_in(values: Iterable[Any]) -> Iterator[Any]:
    """The arrays among ``values``, also within lists and tuples (``np.concatenate([a, b])``)."""
    for v in values:
        if isinstance(v, np.ndarray):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from _arrays_in(v)


def _plain(v: Any) -> Any:
    return v.view(np.ndarray) if isinstance(v, PinnedArray) else v


def _element(a: np.ndarray, key: Any) -> np.ndarray:
    """The bytes ``a[key]`` reaches, as a view where it can be one (an element: a 0-d view), else ``a`` whole (an
    advanced index: conservatively every byte)."""
    got = np.ndarray.__getitem__(a, key)
    if isinstance(got, np.ndarray) and np.may_share_memory(got, a):
        return got
    try:
        got = np.ndarray.__getitem__(a, (*key, Ellipsis) if isinstance(key, tuple) else (key, Ellipsis))
    except (IndexError, TypeError, ValueError):  # (a key with its own Ellipsis, a mask)
        return a
    return got if isinstance(got, np.ndarray) and np.may_share_memory(got, a) else a


def _reading(name: str) -> Callable[..., Any]:
    method = getattr(np.ndarray, name)

    def read(self: PinnedArray, *args: Any, **kwargs: Any) -> Any:
        _touch([self], [], name)
        return method(self.view(np.ndarray), *args, **kwargs)

    read.__name__ = read.__qualname__ = name
    read.__doc__ = method.__doc__
    return read


def _writing(name: str, reads: bool) -> Callable[..., Any]:
    method = getattr(np.ndarray, name)

    def write(self: PinnedArray, *args: Any, **kwargs: Any) -> Any:
        _touch([self] if reads else [], [self], name)
        return method(self.view(np.ndarray), *args, **kwargs)

    write.__name__ = write.__qualname__ = name
    write.__doc__ = method.__doc__
    return write


class PinnedArray(np.ndarray):
    """A NumPy view of pinned memory of a run (:func:`checked`): its element accesses are the host's, checked."""

    _pinned: torch.Tensor
    _access: Access | None = None

    def __array_finalize__(self, obj: Any) -> None:
        if obj is not None:
            self._pinned = getattr(obj, "_pinned", None)  # type: ignore[assignment]
            self._access = getattr(obj, "_access", None)

    def __getitem__(self, key: Any) -> Any:
        got = np.ndarray.__getitem__(self, key)
        if isinstance(got, np.ndarray) and np.may_share_memory(got, self):
            return got  # a view: no read yet
        _touch([_element(self, key)], [], "__getitem__")
        return got

    def __setitem__(self, key: Any, value: Any) -> None:
        _touch(_arrays_in([value]), [_element(self, key)], "__setitem__")
        np.ndarray.__setitem__(self, key, _plain(value))

    def __iter__(self) -> Iterator[Any]:
        if self.ndim == 1:  # its elements: one read of the whole, not one per element
            _touch([self], [], "__iter__")
            return iter(self.view(np.ndarray))
        return (self[i] for i in range(len(self)))  # its rows: views

    def __repr__(self) -> str:
        _touch([self], [], "__repr__")
        return repr(self.view(np.ndarray))

    def __str__(self) -> str:
        _touch([self], [], "__str__")
        return str(self.view(np.ndarray))

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        out = kwargs.get("out")
        outs = out if isinstance(out, tuple) else () if out is None else (out,)
        writes = [o for o in outs if isinstance(o, PinnedArray)]
        if method == "at":  # (np.add.at(a, idx, v): reads and writes a in place)
            writes.append(inputs[0])
        _touch(inputs, writes, f"{ufunc.__name__}.{method}" if method != "__call__" else ufunc.__name__)
        if outs:
            kwargs["out"] = tuple(_plain(o) for o in outs)
        result = getattr(ufunc, method)(*(_plain(x) for x in inputs), **kwargs)
        if outs and method != "at":  # (``a += 1`` binds ``a`` to what this returns: the view itself)
            return outs if isinstance(result, tuple) else outs[0]
        return result

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        if func not in _NO_ACCESS and not _counted[0]:
            reads = list(_arrays_in(args)) + list(_arrays_in(kwargs.values()))
            writes = list(_arrays_in([kwargs.get("out")]))
            if func in _WRITES_FIRST and args:
                writes.append(args[0])
            _touch(reads, writes, func.__name__)
            _counted[0] = True  # (its implementation's own ufunc calls on the same arrays: counted here)
            try:
                return super().__array_function__(func, types, args, kwargs)
            finally:
                _counted[0] = False
        return super().__array_function__(func, types, args, kwargs)


# the methods that read the elements in C without a ufunc, and those that write them in place
for _name in ("tolist", "tobytes", "tofile", "item", "copy", "astype", "argmax", "argmin", "argsort", "nonzero",
              "dot", "searchsorted", "take", "compress", "repeat", "choose", "flatten", "dump", "dumps", "__reduce__",
              "__reduce_ex__", "__copy__", "__deepcopy__", "__float__", "__int__", "__index__", "__complex__",
              "__bool__", "__contains__", "__format__", "round", "trace", "cumsum", "cumprod", "tostring"):
    if hasattr(np.ndarray, _name):
        setattr(PinnedArray, _name, _reading(_name))
for _name, _reads in (("fill", False), ("put", False), ("setfield", False), ("itemset", False), ("sort", True),
                      ("partition", True)):
    if hasattr(np.ndarray, _name):
        setattr(PinnedArray, _name, _writing(_name, _reads))
