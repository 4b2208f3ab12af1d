"""Simulated device tensors: aten ops become operations on simulated streams.

``SimTensor`` is a wrapper subclass reporting device ``meta`` (on the CPU
build a wrapper that claims ``cuda`` trips device-guard checks outside the
dispatcher; ``meta`` supports slicing, views and arithmetic). Its bytes live
in a CPU tensor that is a view of a :class:`~simdevice.runtime.memory.Storage`.

A :class:`SimMode` dispatch mode is active in every simulated host actor and
sees every aten op there. :func:`classify` reads each op's schema once (what
it writes, what it returns); :class:`Dispatcher` then turns the call into
runtime calls:

- views run at once on the backing data (they alias, as on a GPU);
- allocations (``empty``) take a block from the caching allocator, filled
  with poison (NaN, or the integer maximum), so a read of memory nobody wrote
  is visible;
- every other op on device data is a host step that enqueues a stream
  operation on the actor's current stream; its output is allocated at once
  (shape from running the op on meta tensors, cached per signature) and the
  op's effect is applied to the backing data when the runtime runs it:
  inputs are read when it starts, outputs written when it completes;
- copies: to or from pinned host memory with ``non_blocking=True`` they are
  asynchronous; without it, or to pageable host memory (``.cpu()``,
  ``.item()``, a plain CPU destination), the host waits for the copy, as
  CUDA does; from pageable memory the source is read at issue, as CUDA's
  staging does; one between pinned memory and the device that is no single
  memcpy (another dtype, a layout that is not one contiguous run) goes
  through host temporaries as ATen's makes it: a strided pinned source is
  read by the host at issue, a non-blocking copy into a strided pinned view
  is synchronous (``_through_host_temporaries``);
- plain CPU ops that touch pinned memory the simulator owns are host steps
  too, checked as host accesses.

Random ops draw from a generator of their own, seeded in the order the host
issues them (``Runtime.next_seed``): a run depends on its schedule and its
seed alone, never on the global random state or on timing.
"""

from __future__ import annotations

import copy
import functools
import re
import sys
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import torch
from torch.utils._mode_utils import no_dispatch
from torch.utils._python_dispatch import TorchDispatchMode

from reference.contract import OpKind, dispatches_itself, op_kind, poison
from reference.naming import op_name
from reference.origin import Origin
from simdevice import elementwise
from simdevice.runtime import Runtime
from simdevice.runtime.execution import HostActor, outside_actor, start_own_thread
from simdevice.runtime.graphs import PAGEABLE
from simdevice.runtime.memory import Ref, Storage, footprint, overlap, span
from simdevice.runtime.reports import internal_file, user_source
from simdevice.runtime.streams import SimStream

aten = torch.ops.aten
#: the device type simulated streams report to torch (``torch.Stream`` numbers device types)
_META_TYPE = torch.Stream(device="meta").device_type
META = elementwise.META
CPU = torch.device("cpu")
#: torch's device class, as imported (a session's ``torch.device`` makes its objects, at the cost of a Python call)
_DEVICE = torch.device

#: ops whose tensor inputs only give a shape or are fully overwritten, never read
_INPUT_NOT_READ = frozenset(
    {
        aten.zeros_like.default,
        aten.ones_like.default,
        aten.full_like.default,
        aten.new_zeros.default,
        aten.new_ones.default,
        aten.new_full.default,
    }
)
#: in-place ops that overwrite their destination without reading it
_WRITE_ONLY_SELF = frozenset({aten.copy_.default, aten._foreach_copy_.default, aten.fill_.Scalar, aten.fill_.Tensor,
                              aten.zero_.default})


def _shaped_like(*names: str) -> frozenset[Any]:
    """Every overload of the ops ``names`` whose one tensor argument gives only its shape and options."""
    out = set()
    for name in names:
        packet = getattr(aten, name, None)
        for overload in packet.overloads() if packet is not None else ():
            op = getattr(packet, overload)
            if sum("Tensor" in str(a.type) for a in op._schema.arguments) == 1:
                out.add(op)
    return frozenset(out)


#: ops that make a tensor on their argument's shape and options without reading its bytes: given a host
#: ``device=`` (``torch.empty_like(t, device="cpu", pin_memory=True)``, ``t.new_zeros(n, device="cpu")``), they make
#: it in host memory, as on CUDA, whatever device their argument is on
_HOST_WHEN_ASKED = _shaped_like("empty_like", "new_empty", "new_empty_strided", "zeros_like", "ones_like",
                                "full_like", "new_zeros", "new_ones", "new_full", "rand_like", "randn_like",
                                "randint_like")
#: CUDA's fused optimizer steps, by name, which store their ``grads`` back only where they unscale them: given
#: ``grad_scale`` (a ``GradScaler``'s step); their schemas mark ``grads`` written whatever the call (:func:`_written`)
_GRADS_WRITTEN_IF_SCALED = frozenset({"_fused_adam", "_fused_adam_", "_fused_adamw", "_fused_adamw_", "_fused_sgd",
                                      "_fused_sgd_"})
_COPIES = frozenset({aten.copy_.default, aten._to_copy.default,
                     # (given a host tensor, CUDA's kernel takes its slow route: ``copy_`` of each pair in turn)
                     aten._foreach_copy_.default})


@attrs.frozen
class OpFacts:
    """What an aten op's schema says about its tensors, read once per overload."""

    kind: OpKind
    name: str
    #: (position, name, keyword-only) of every argument the schema marks as written
    written: tuple[tuple[int, str, bool], ...]
    has_returns: bool
    #: whether a return is a tensor (else it is a host value: ``.item()``, ``equal``)
    returns_tensor: bool
    #: an out= overload (``add.out``, ``max.dim_max``, ``*_backward.grad_input``): it writes keyword-only arguments
    #: alone, which are its outputs, not inputs
    out_variant: bool
    #: which tensor arguments are not read: "all", "self" or "" (see the sets above)
    not_read: str
    #: a fused optimizer step: it writes its ``grads`` argument only where ``grad_scale`` is given
    #: (:data:`_GRADS_WRITTEN_IF_SCALED`)
    grads_if_scaled: bool
    copy: bool
    seeded: bool
    #: torch tags its output's shape as one its input's values may decide (``nonzero``, ``masked_select``; ``index``
    #: with a mask): its meta kernel refuses where they do
    dynamic: bool
    #: the position of an advanced-indexing op's ``Tensor?[] indices`` (``index``, ``index_put_``): ATen moves an
    #: index on the host to the device first (:meth:`Dispatcher._move_indices`); else None
    indices: int | None
    #: the op has a CompositeImplicitAutograd kernel: autograd decomposes it before it reaches a dispatch mode,
    #: except where autograd is skipped (inference mode)
    composite: bool
    #: the op itself, without OpOverload.__call__'s Python frame around it
    call: Any = attrs.field(eq=False, repr=False)
    #: for an op that returns one new tensor, its overload that writes it into a given tensor instead, that
    #: argument's name and the keywords the overload does not take (``mul.Tensor`` -> ``mul.out``, "out";
    #: ``tanh_backward`` -> ``tanh_backward.grad_input``, "grad_input"; ``arange`` -> ``arange.out``, "out", its
    #: tensor options), else None
    into: tuple[Any, str, frozenset[str]] | None = attrs.field(default=None, eq=False, repr=False)
    #: where every return aliases a written argument: those arguments' positions among ``written``, in the returns'
    #: order (``_amp_update_scale_`` writes two and returns its first), else None
    returned: tuple[int, ...] | None = None
    #: for an in-place op that writes its destination only where an index or a mask says (``index_copy_``,
    #: ``scatter_``, ``index_put_``, ``masked_fill_``, ...): marks those elements True in a boolean tensor shaped as
    #: the destination, from the op's arguments as host tensors (:data:`_INDEXED`); else None
    indexed: Callable[[torch.Tensor, list[Any]], Any] | None = attrs.field(default=None, eq=False, repr=False)
    #: whether the op writes one tensor argument (not a list) and draws no random numbers: TensorIterator checks
    #: such a destination for overlap on the host (:func:`_overlap_error`); a ``_foreach_`` or fused optimizer op,
    #: which writes lists, takes CUDA's multi-tensor fast route without that check
    overlap_checked: bool = False
    #: CUDA's kernel of the op reads a value on the host as it runs (:data:`_READ_ON_THE_HOST`, where its
    #: arguments say so: :func:`_reads_on_the_host`): the host waits for the stream
    reads_on_host: bool = False
    #: the op copies a host tensor argument to the device itself, blocking, as CUDA's implementation does
    #: (:data:`_HOST_INPUT_COPIED`): a host tensor of any shape is taken, and the host waits
    copies_host_inputs: bool = False
    #: a GPU has no kernel of the op for a dense tensor (``histogram``, ``int_repr``, ``q_scale``): it raises at the
    #: call (:func:`_lacks_cuda_kernel`)
    no_cuda_kernel: bool = False
    #: an op of aten's (``torch.ops.aten``), not a library's
    aten: bool = True
    #: the names of the arguments whose host tensors the op's implementation reads on the host (a packed sequence's
    #: lengths: :data:`_HOST_ARGUMENTS`), and the places of its results that are host tensors; else None
    host_arguments: tuple[frozenset[str], tuple[int, ...]] | None = None
    #: the function that runs a library's op in place of the dispatch (a namespace's, :func:`handle_namespace`), else
    #: None
    handler: Callable[[Any, tuple[Any, ...], dict[str, Any]], Any] | None = attrs.field(default=None, eq=False,
                                                                                        repr=False)


#: each op's facts by the op's id, with the op (the id stays its own while the op lives, and torch keeps every
#: OpOverload for good): a dict keyed by the op would call OpOverload.__hash__, a Python method, for every call
_FACTS: dict[int, tuple[Any, OpFacts]] = {}


def classify(func: torch._ops.OpOverload) -> OpFacts:
    """The op's :class:`OpFacts`, read from its schema once."""
    got = _FACTS.get(id(func))
    if got is not None and got[0] is func:
        return got[1]
    facts = _classify(func)
    _FACTS[id(func)] = (func, facts)
    return facts


def _classify(func: torch._ops.OpOverload) -> OpFacts:
    schema = func._schema
    written = tuple(
        (i, a.name, bool(a.kwarg_only))
        for i, a in enumerate(schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write
    )
    return OpFacts(
        kind=op_kind(func),
        name=op_name(func),
        written=written,
        has_returns=bool(schema.returns),
        returns_tensor=any("Tensor" in str(r.type) for r in schema.returns),
        # (ATen's out= tensors are the keyword-only arguments it writes, whatever their names: ``out``, ``max``)
        out_variant=bool(written) and all(kwarg_only for _, _, kwarg_only in written),
        not_read="all" if func in _INPUT_NOT_READ else "self" if func in _WRITE_ONLY_SELF else "",
        grads_if_scaled=func.__name__.split(".")[0] in _GRADS_WRITTEN_IF_SCALED,
        copy=func in _COPIES,
        seeded=torch.Tag.nondeterministic_seeded in func.tags,
        dynamic=torch.Tag.dynamic_output_shape in func.tags,
        reads_on_host=func in _READ_ON_THE_HOST,
        copies_host_inputs=func in _HOST_INPUT_COPIED,
        no_cuda_kernel=_lacks_cuda_kernel(func),
        host_arguments=_host_arguments(func),
        aten=func._schema.name.startswith("aten::"),
        composite=torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"),
        indices=next((i for i, a in enumerate(schema.arguments) if a.name == "indices" and str(a.type) ==
                      "List[Optional[Tensor]]"), None),
        call=getattr(func, "_op", func),
        # (not a random op: its out= kernel need not draw from the generator as the op does)
        into=_into(func) if not written and torch.Tag.nondeterministic_seeded not in func.tags else None,
        returned=_returned(schema, written),
        indexed=_INDEXED.get(func.__name__.split(".")[0]) if written and written[0][0] == 0 else None,
        overlap_checked=len(written) == 1 and str(schema.arguments[written[0][0]].type) == "Tensor"
        and torch.Tag.nondeterministic_seeded not in func.tags,
        handler=_HANDLERS.get(func.namespace),
    )


#: the functions that run the ops of a namespace in a run, by the namespace (:func:`handle_namespace`)
_HANDLERS: dict[str, Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]] = {}


def handle_namespace(namespace: str, handler: Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]) -> None:
    """From now on, an op of ``torch.ops.<namespace>`` on a simulated tensor is ``handler(op, args, kwargs)``, called
    with the simulator's mode on (the ops it makes are simulated), in place of the op's kernel (torch's functional
    collectives, whose kernels look their process group up in C++: ``simdevice.dropin.distributed``)."""
    _HANDLERS[namespace] = handler
    for key, (func, _) in list(_FACTS.items()):
        if func.namespace == namespace:
            del _FACTS[key]


def _rows(mask: torch.Tensor, args: list[Any]) -> Any:
    return mask.index_fill_(args[1], args[2], True)  # (self, dim, index, ...)


def _scattered(mask: torch.Tensor, args: list[Any]) -> Any:
    return mask.scatter_(args[1], args[2], True)  # (self, dim, index, ...)


def _put(mask: torch.Tensor, args: list[Any]) -> Any:
    return mask.index_put_(tuple(args[1]), torch.tensor(True, device="cpu"))  # (self, indices, values, ...)


def _masked(mask: torch.Tensor, args: list[Any]) -> Any:
    return mask.copy_(args[1].expand_as(mask))  # (self, mask, ...)


#: where each of the functions below finds its index or mask among the op's arguments: the one argument it reads
#: the values of (a source or a value to write, later in the arguments, it does not)
_INDEX_AT: dict[Callable[[torch.Tensor, list[Any]], Any], int] = {_rows: 2, _scattered: 2, _put: 1, _masked: 1}

#: the in-place ops that write their destination only where an index or a mask says, by name: what they write
#: (:attr:`OpFacts.indexed`)
_INDEXED: dict[str, Callable[[torch.Tensor, list[Any]], Any]] = {
    **dict.fromkeys(("index_copy_", "index_add_", "index_fill_", "index_reduce_"), _rows),
    **dict.fromkeys(("scatter_", "scatter_add_", "scatter_reduce_"), _scattered),
    **dict.fromkeys(("index_put_", "_index_put_impl_"), _put),
    **dict.fromkeys(("masked_fill_", "masked_scatter_"), _masked),
}


def _returned(schema: Any, written: tuple[tuple[int, str, bool], ...]) -> tuple[int, ...] | None:
    """The positions among ``written`` of the arguments the returns alias, where each return aliases one."""
    if not written or not schema.returns:
        return None
    sets = [frozenset(schema.arguments[i].alias_info.before_set) for i, _, _ in written]
    out = []
    for r in schema.returns:
        if r.alias_info is None or not r.alias_info.is_write or frozenset(r.alias_info.before_set) not in sets:
            return None
        out.append(sets.index(frozenset(r.alias_info.before_set)))
    return tuple(out)


#: a factory's tensor options, which its ``out=`` overload does not take: the output tensor given carries them
_OPTIONS = frozenset({"dtype", "layout", "device", "pin_memory"})


def _into(func: torch._ops.OpOverload) -> tuple[Any, str, frozenset[str]] | None:
    """The overload of ``func``'s op that takes the same arguments and writes its one tensor result into one more,
    keyword-only (``mul.Tensor`` -> ``mul.out``, ``mul.Scalar`` -> ``mul.Scalar_out``), as its C function, with that
    argument's name, and the keywords of ``func``'s it does not take: a factory's tensor options (``arange`` ->
    ``arange.out`` without ``dtype``, ``layout``, ``device``, ``pin_memory``; ``zeros_like`` -> ``zeros_like.out``
    with ``memory_format``); None where there is none, or ``func`` does not return one new tensor."""
    schema = func._schema
    if len(schema.returns) != 1 or str(schema.returns[0].type) != "Tensor" or schema.returns[0].alias_info:
        return None
    mine = [(a.name, str(a.type), a.kwarg_only) for a in schema.arguments]
    options = frozenset(a.name for a in schema.arguments if a.kwarg_only and a.name in _OPTIONS)
    kept = [m for m in mine if m[0] not in options] if options else mine
    packet = func.overloadpacket
    for name in packet.overloads():
        other = getattr(packet, name)._schema
        args = other.arguments
        if (len(other.returns) == 1 and args and args[-1].kwarg_only and args[-1].alias_info is not None
                and args[-1].alias_info.is_write and str(args[-1].type) == "Tensor"):
            theirs = [(a.name, str(a.type), a.kwarg_only) for a in args[:-1]]
            for wanted, dropped in ((mine, frozenset()), (kept, options)):
                if theirs == wanted:
                    op = getattr(packet, name)
                    return getattr(op, "_op", op), args[-1].name, dropped
    return None


def _leaves_of(tree: Any) -> tuple[list[Any], None]:
    """The leaves of an aten op's arguments or results (tuples, lists and dicts of tensors and scalars), in
    order; as ``torch.utils._pytree.tree_flatten`` gives them, at a fraction of its cost (a third of a simulated
    op's time went to pytree)."""
    out: list[Any] = []
    _collect(tree, out)
    return out, None


def _flat(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The tensors among an op's arguments (``_leaves_of((args, kwargs))``, the tensors alone), in order; in one
    call for the usual flat arguments."""
    out: list[Any] = []
    for x in args:
        if isinstance(x, torch.Tensor):
            out.append(x)
        elif isinstance(x, _NODES):
            _collect_tensors(x, out)
    if kwargs:
        for x in kwargs.values():
            if isinstance(x, torch.Tensor):
                out.append(x)
            elif isinstance(x, _NODES):
                _collect_tensors(x, out)
    return out


def _collect_tensors(x: Any, out: list[Any]) -> None:
    for y in x.values() if isinstance(x, dict) else x:
        if isinstance(y, torch.Tensor):
            out.append(y)
        elif isinstance(y, _NODES):
            _collect_tensors(y, out)


def _unwrapped(args: tuple[Any, ...]) -> list[Any]:
    """An op's positional arguments with each simulated tensor as its CPU bytes (``_tree_map(data_of, args)``)."""
    out: list[Any] = []
    for x in args:
        if isinstance(x, SimTensor):
            out.append(x._data)
        elif isinstance(x, _NODES):
            out.append(_tree_map(data_of, x))
        else:
            out.append(x)
    return out


def _collect(x: Any, out: list[Any]) -> None:
    if isinstance(x, dict):
        x = x.values()
    elif not isinstance(x, (tuple, list)):
        out.append(x)
        return
    for y in x:
        if isinstance(y, _NODES):
            _collect(y, out)
        else:
            out.append(y)


#: what holds aten's values (anything else is a leaf)
_NODES = (tuple, list, dict)


def _tree_map(fn: Callable[[Any], Any], x: Any) -> Any:
    """``fn`` on every leaf of ``x``, the structure kept (``torch.utils._pytree.tree_map`` for aten's values)."""
    t = type(x)
    # a leaf inside a plain container is mapped where it is (no call per leaf: an op's values are mostly leaves)
    if t is tuple:
        return tuple([_tree_map(fn, y) if isinstance(y, _NODES) else fn(y) for y in x])
    if t is list:
        return [_tree_map(fn, y) if isinstance(y, _NODES) else fn(y) for y in x]
    if t is dict:
        return {k: _tree_map(fn, v) if isinstance(v, _NODES) else fn(v) for k, v in x.items()}
    if isinstance(x, tuple):  # a named tuple or a torch.return_types structseq
        items = [_tree_map(fn, y) for y in x]
        return t(*items) if hasattr(t, "_fields") else t(items)
    if isinstance(x, (list, dict)):
        raise TypeError(f"unexpected container {t.__name__} in an aten op's values")
    return fn(x)


def _index_tensor(seq: Any, ops: Dispatcher) -> torch.Tensor:
    """A list (of integers or booleans, nested) or a NumPy array used as an index, as the tensor torch makes of it
    (``sequenceToVariable``): bool or uint8 as it is (a mask), any other type as int64, on the indexed tensor's
    device. A list torch copies there below the dispatch modes (:meth:`Dispatcher.from_host`: no operation a GPU
    run counts); a NumPy array it moves with ``.to()``, an ``_to_copy`` a GPU run's mode sees and counts (both seen
    on an H100). Either copy is blocking. Outside a run's actors: the host tensor."""
    t = torch.as_tensor(seq, device="cpu")
    t = t if t.dtype in (torch.bool, torch.uint8) else t.long()
    a = ops.rt.current_or_none()
    if a is None:
        return t
    if isinstance(seq, np.ndarray):
        return t.to(META)
    return ops.from_host(t, a)


def _sequence(x: Any) -> bool:
    return isinstance(x, (list, np.ndarray))


def _sequences_made_tensors(index: Any, ops: Dispatcher) -> Any:
    """``index`` with each list or NumPy array in it made the tensor torch makes of it, before torch's C++ indexing
    does: torch makes it on the indexed tensor's device, which for a simulated tensor is its ``meta`` shell, so its
    values were lost; made here as torch makes it (:func:`_index_tensor`), it is a device index, which autograd
    saves for backward as a GPU's does (a host index would be moved to the device again there, and the host would
    wait for the stream where a GPU's does not). A list at the top that torch takes as a tuple
    (``treatSequenceAsTuple``: shorter than 32, with a sequence, slice, ``None``, ``...`` or tensor in it) stays a
    list, its items made so."""
    if isinstance(index, tuple):
        if not any(_sequence(x) for x in index):
            return index
        return tuple(_index_tensor(x, ops) if _sequence(x) else x for x in index)
    if isinstance(index, np.ndarray):
        return _index_tensor(index, ops)
    if isinstance(index, list):
        if len(index) < 32 and any(_sequence(x) or isinstance(x, (tuple, slice, torch.Tensor)) or x is None
                                   or x is Ellipsis for x in index):
            return [_index_tensor(x, ops) if _sequence(x) else x for x in index]
        return _index_tensor(index, ops)
    return index


#: torch's own ``Tensor.data`` (a descriptor of the C tensor type), which :class:`SimTensor` extends
_TENSOR_DATA: Any = torch._C.TensorBase.__dict__["data"]


_WRAPPER = torch.Tensor._make_wrapper_subclass


class SimTensor(torch.Tensor):
    """A tensor on the simulated device: a ``meta`` wrapper around CPU bytes.

    To Python code it shows the device its dispatcher shows (``meta`` under the device contract, ``cuda:0``
    under the torch.cuda drop-in), with ``is_cuda``, ``get_device()``, a real ``data_ptr()`` and a storage
    (``untyped_storage()``) whose ``resize_(0)`` frees it; the C++ side keeps seeing ``meta``. Python attribute
    lookup finds these before torch's, inside autograd hooks and backward too.
    """

    _data: torch.Tensor
    _st: Storage
    _ops: Dispatcher
    #: the alias of its bytes that queued operations hold (:func:`_alias_of`), made once
    _alias: torch.Tensor | None
    #: its signature in the meta outputs' cache key (:func:`_sig`), made once
    _sig: Any
    #: for a tensor another process received (``simdevice.dropin.processes``), and every view of it: the token of
    #: its memory's mapping in the receiver, which lives while one of them does (torch keeps the mapping while a
    #: tensor of the storage lives: a view, ``detach()``, a ``Parameter`` of it)
    _ipc: Any = None
    #: the in-place op last checked for its argument errors with this tensor its destination (:func:`_check_in_place`)
    _ok: Any = None

    @staticmethod
    def __new__(cls, data: Any, st: Storage | None = None, ops: Dispatcher | None = None,
                **kwargs: Any) -> SimTensor:
        if st is None:
            # the program calls a parameter's class, as it would torch's ``Parameter`` on a GPU (``type(p)(data,
            # requires_grad=...)``: Hugging Face's loaders remake a parameter so): a simulated parameter is of this
            # class, a ``Parameter`` by torch's ``_is_param`` mark
            return torch.nn.Parameter(data, **kwargs)  # type: ignore[no-any-return]
        # (requires_grad is False, and the storage offset 0, unless given: each argument given costs the call more)
        offset = data.storage_offset()
        if offset:
            r = _WRAPPER(cls, data.shape, strides=data.stride(), storage_offset=offset, dtype=data.dtype, device=META)
        else:
            r = _WRAPPER(cls, data.shape, strides=data.stride(), dtype=data.dtype, device=META)
        r._data = data
        r._st = st
        r._ops = ops
        r._alias = None
        r._sig = None
        return r  # type: ignore[no-any-return]

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if any(t is not SimTensor and dispatches_itself(t) for t in types):
            # another subclass's tensor among the arguments (the simulator's mode declined the op for it): that
            # subclass's __torch_dispatch__ takes it, as torch tries each in turn
            return NotImplemented
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError(outside_actor())  # (a thread the program started: no actor's mode takes it)
        raise RuntimeError(
            f"{func} on a simulated device tensor outside SimDevice.run: "
            "use simdevice.peek(t) to read one after the run"
        )

    def __getitem__(self, index: Any) -> Any:
        return super().__getitem__(_sequences_made_tensors(index, self._ops))

    def __setitem__(self, index: Any, value: Any) -> None:
        if isinstance(value, (bool, int, float, complex)):
            # as torch's ``THPVariable_setitem`` makes a number into a tensor for a CUDA tensor: on the host, of
            # the destination's dtype (``valueToTensor`` on kCPU), which the assignment then copies (``copy_``, a
            # blocking copy from pageable memory: the host waits), fills with (``fill_``) or puts (``index_put_``);
            # a simulated tensor's C++ device is its ``meta`` shell, for which torch made it on the device
            value = torch.scalar_tensor(value, dtype=self.dtype)
        super().__setitem__(_sequences_made_tensors(index, self._ops), value)

    def tolist(self) -> Any:  # torch refuses tolist() on subclasses; on CUDA it is a synchronizing D2H
        return self.cpu().tolist()

    def __deepcopy__(self, memo: dict[int, Any]) -> torch.Tensor:
        """``copy.deepcopy`` of a device tensor (an EMA or target model made by ``deepcopy(model)``): a clone on the
        current stream, as CUDA copies the bytes with a device op, with its ``requires_grad``, its ``grad`` and the
        attributes the program gave it (a parameter's mark among them; the simulator's own, made for every tensor,
        are the copy's) (torch's own copies through a typed storage the simulated one is not)."""
        if id(self) in memo:
            return memo[id(self)]  # type: ignore[no-any-return]
        if not self.is_leaf:
            raise RuntimeError("Only Tensors created explicitly by the user (graph leaves) support the deepcopy "
                               "protocol at the moment.")
        with torch.no_grad():
            new = self.clone()
        memo[id(self)] = new
        new.requires_grad_(self.requires_grad)
        if self.grad is not None:
            new.grad = copy.deepcopy(self.grad, memo)
        for name, value in self.__dict__.items():  # what the program put on it (a parameter's mark among them)
            if name not in new.__dict__:
                setattr(new, name, copy.deepcopy(value, memo))
        return new

    @property  # type: ignore[override]
    def data(self) -> torch.Tensor:
        return _TENSOR_DATA.__get__(self, type(self))  # type: ignore[no-any-return]

    @data.setter
    def data(self, value: torch.Tensor) -> None:
        """``p.data = t`` (how sharded optimizers point a parameter into a flat buffer): ``p`` shows ``t``'s shape and
        reads and writes ``t``'s bytes from now on, as torch's ``set_data`` does, not the bytes it had."""
        if not isinstance(value, SimTensor):
            set_data_across(self, value)  # (a host tensor's: this one becomes a host tensor, as on a GPU)
            return
        _TENSOR_DATA.__set__(self, value)  # the shape, strides and dtype
        self._point_at(value._data, value._st)

    def _point_at(self, data: torch.Tensor, st: Storage) -> None:
        """From now on this tensor is ``data`` (CPU bytes) of storage ``st`` (its shell changed to match)."""
        self._data = data
        self._st = st
        self._alias = None
        self._sig = None

    def type(self, dtype: Any = None, non_blocking: bool = False, **kwargs: Any) -> Any:  # type: ignore[override]
        """``t.type()`` names the device the tensor shows (``torch.cuda.FloatTensor``), not the meta shell's."""
        if dtype is None and not kwargs:
            name = super().type()
            return name.replace("torch.meta.", f"torch.{self.device.type}.", 1)
        return super().type(dtype, non_blocking, **kwargs)

    def numpy(self, *, force: bool = False) -> Any:
        """A device tensor has no NumPy view: torch's own error (torch's says "not supported for tensor
        subclasses", which reads as the simulator's); ``np.asarray(t)`` comes here too. ``force=True`` copies it
        to the host first, as torch's does."""
        if force:
            return self.detach().cpu().resolve_conj().resolve_neg().numpy()
        raise TypeError(f"can't convert {self.device} device type tensor to numpy. Use Tensor.cpu() to copy the "
                        "tensor to host memory first.")

    def pin_memory(self, device: Any = None) -> torch.Tensor:
        """Pinning a device tensor fails with torch's own error, the program's (torch's CPU build asked for an
        accelerator before it checked the device, an error read as what the simulator does not run: no verdict)."""
        kind = self.type().rsplit(".", 1)[1].removesuffix("Tensor")  # (``torch.cuda.FloatTensor``: ``Float``)
        raise RuntimeError(f"cannot pin '{self._ops.shown.type.upper()}{kind}Type' only dense CPU tensors can be "
                           "pinned")

    @property  # type: ignore[override]
    def device(self) -> torch.device:
        return self._ops.shown_now()

    @property  # type: ignore[override]
    def is_cuda(self) -> bool:
        return bool(self._ops.shown.type == "cuda")

    @property  # type: ignore[override]
    def is_meta(self) -> bool:
        return bool(self._ops.shown.type == "meta")

    def get_device(self) -> int:
        return -1 if self._ops.shown.type == "meta" else int(self._ops.shown_now().index or 0)

    def record_stream(self, stream: Any) -> None:
        """``t.record_stream(s)``: the simulator's, also where the caller turned Python dispatch off around it (FSDP1
        records its flat parameter's streams inside ``no_dispatch()``: torch's op on the ``meta`` shell raised). Where
        the program put a function of its own in place of torch's ``Tensor.record_stream``, that function."""
        own = torch.Tensor.record_stream
        if own is not _TORCH_RECORD_STREAM:
            return own(self, stream)  # type: ignore[no-any-return]
        self._ops._record_stream(self, stream)
        return None

    def data_ptr(self) -> int:
        return int(self._data.data_ptr())

    def untyped_storage(self) -> SimStorage:  # type: ignore[override]
        return SimStorage(self)

    def _typed_storage(self) -> SimTypedStorage:
        """``t.storage()`` (torch's deprecated ``TypedStorage``; its warning is torch's own): :class:`SimTypedStorage`,
        where torch's own class refuses a storage not of its kind."""
        return SimTypedStorage(SimStorage(self), self.dtype)

    def is_shared(self) -> bool:
        """Always True for a CUDA tensor, as torch says (another process maps it through CUDA IPC)."""
        return True

    def share_memory_(self) -> SimTensor:
        """A no-op for a CUDA tensor, as in torch."""
        return self

    def set_(  # type: ignore[override]
        self,
        source: SimStorage | SimTensor | None = None,
        storage_offset: int | None = None,
        size: Any = None,
        stride: Any = None,
    ) -> SimTensor:
        """Point this tensor at another simulated storage (as ``Tensor.set_``): metadata only, no stream op."""
        if source is None:
            empty = self._ops.new_device(torch.empty(0, dtype=self.dtype, device="cpu"), self._ops.rt.current())
            st, storage, storage_offset, size = empty._st, empty._data.untyped_storage(), 0, (0,)
        elif isinstance(source, SimStorage):
            st, storage = source._t._st, source._t._data.untyped_storage()
        elif isinstance(source, SimTensor):
            if source.dtype != self.dtype:
                raise RuntimeError(f"set_: expected a source of dtype {self.dtype}, got {source.dtype}")
            st, storage = source._st, source._data.untyped_storage()
            if storage_offset is None and size is None:
                storage_offset, size, stride = source.storage_offset(), source.shape, source.stride()
        else:
            raise TypeError(f"set_: {type(source).__name__} is not a storage or tensor of the simulated device")
        if size is None:
            storage_offset, size = 0, (storage.nbytes() // self.element_size(),)
        offset = 0 if storage_offset is None else int(storage_offset)
        shape = tuple(size)
        with no_dispatch():  # bare CPU bytes and a meta shell of the storage's size: no simulated op
            data = torch.empty(0, dtype=self.dtype, device="cpu").set_(storage, offset, shape, stride)
            shell = torch.empty(storage.nbytes(), dtype=torch.uint8, device=META).untyped_storage()
            torch.Tensor.set_(self, shell, offset, shape, stride)
        self._point_at(data, st)
        return self

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Pickled (``torch.save`` of a checkpoint, ``pickle``) as torch pickles a CUDA tensor: its values copied to
        the host, a synchronizing read (torch's serialization copies a CUDA storage to the CPU), made on the device
        again where it is loaded, by torch's own rebuild, which ``torch.load``'s ``weights_only`` takes and
        ``map_location`` moves. (Its storage is no ``UntypedStorage``: torch's own pickling raised a TypeError.)"""
        host = self.detach().cpu()
        return torch._utils._rebuild_device_tensor_from_cpu_tensor, (host, self.dtype, str(self.device),
                                                                      self.requires_grad)

    def __repr__(self) -> str:
        """Printed by the program in its run, the tensor's values, read as printing a CUDA tensor reads them (the host
        waits for the stream: a synchronizing copy), in torch's text; printed by anything else (the simulator, torch,
        a debugger, a test after the run), its shape and allocation, reading nothing, so that the schedule is the
        same however the run is looked at."""
        return self._text(sys._getframe(1))

    def __format__(self, spec: str) -> str:
        """``f"{loss:.4f}"`` of a 0-d tensor in the program: its value (``.item()``, a host read), as torch formats
        a CUDA tensor's; any other spec is refused as torch refuses it; an empty one is the tensor's text."""
        caller = sys._getframe(1)
        if self.dim() == 0 and self._printed_by_program(caller):
            return format(self.item(), spec)
        if spec:
            return object.__format__(self, spec)
        return self._text(caller)

    def _printed_by_program(self, caller: Any) -> bool:
        """Whether the program's own code (not the simulator's, torch's or a library's) asks for this tensor's text
        in a run, on its actor (not the device's work, nor a thread the program started)."""
        rt = self._ops.rt
        return rt.current_or_none() is not None and not rt.in_engine and not internal_file(caller.f_code.co_filename)

    def _text(self, caller: Any) -> str:
        if not self._printed_by_program(caller):
            return f"SimTensor({tuple(self.shape)}, {self.dtype}, {self._st.label})"
        from torch._tensor_str import _str, _tensor_str

        host = self.detach().cpu()  # the values, as printing reads them: the host waits for the stream
        text = str(_str(self, tensor_contents=_tensor_str(host, len("tensor("))))
        if isinstance(self, torch.nn.Parameter) and text.startswith("Parameter("):
            # torch's text of a subclass's parameter, ``Parameter(SimTensor(...))``: a CUDA one's is nn.Parameter's
            return "Parameter containing:\ntensor(" + text[len("Parameter("):-1].partition("(")[2]
        return "tensor(" + text.partition("(")[2]  # torch's text, which names a subclass by its class


def _view(data: torch.Tensor, st: Storage, ops: Dispatcher) -> SimTensor:
    """A view of a simulated tensor, ``data`` its CPU bytes: with the lazy conjugation and negation of ``data``
    (``conj()`` of a complex tensor, the imaginary part of one) shown by the tensor too, as torch shows them."""
    t = SimTensor(data, st, ops)
    if data.is_conj():
        torch._C._set_conj(t, True)
    if data.is_neg():
        torch._C._set_neg(t, True)
    return t


class SimStorage:
    """The storage of a simulated tensor, as ``t.untyped_storage()`` shows it: its address and size, and
    ``resize_(0)``, which frees the allocation while tensors still refer to it (a forced release)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and isinstance(args[0], SimTensor):
            return super().__new__(cls)
        # torch's storage constructor reached through a simulated storage's class (``type(storage)(n,
        # device="cpu")``: torch.distributed.checkpoint's staging of a state dict): torch's storage on the host, a
        # simulated one on the device
        return _new_storage(torch.UntypedStorage, *args, **kwargs)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if len(args) == 1 and not kwargs and isinstance(args[0], SimTensor):
            self._t = args[0]

    @classmethod
    def _new_shared(cls, size: int, device: Any = None) -> Any:
        return _new_storage(torch.UntypedStorage._new_shared, size, device=device)

    def data_ptr(self) -> int:
        return int(self._t._st.base)

    def nbytes(self) -> int:
        return 0 if self._t._st.released is not None else self._t._st.size

    def size(self) -> int:
        return self.nbytes()

    def __len__(self) -> int:
        return self.nbytes()

    @property
    def device(self) -> torch.device:
        return self._t._ops.shown_now()

    @property
    def is_cuda(self) -> bool:
        return bool(self.device.type == "cuda")

    def get_device(self) -> int:
        """The device's index, as a CUDA storage's (what ``torch.cuda.device_of(storage)`` reads)."""
        index = self.device.index
        return -1 if index is None else int(index)

    def is_pinned(self) -> bool:
        return False  # (device memory)

    def element_size(self) -> int:
        return 1  # (an untyped storage counts bytes)

    @property
    def _cdata(self) -> int:
        """The address of the storage of the tensor's CPU bytes, which every view of the tensor shares and no other
        allocation does: what torch's C functions take (``torch._C._storage_Use_Count(s._cdata)``, which offload
        code compares before and after a backward node to tell whether a view of an unpacked tensor outlives it).
        Its count is of the program's tensors of the allocation, as torch counts a CUDA storage's (the simulator's
        own views of the bytes, which queued operations hold, are of another storage)."""
        return int(self._t._data.untyped_storage()._cdata)

    def _weak_ref(self) -> int:
        """A weak reference to the CPU bytes' storage (``torch.utils.weak.StorageWeakRef``), dead with the last
        tensor of the allocation."""
        return int(self._t._data.untyped_storage()._weak_ref())

    def __getattr__(self, name: str) -> Any:
        """A method of torch's storages this one does not have (``fill_``, ``cpu``, ``tolist``, ...) is
        what the simulator does not run (``NotImplementedError``: no verdict), not an error of the program's."""
        raise _lacking(self, name, torch.UntypedStorage, "untyped_storage()", "storage has data_ptr, nbytes, size, "
                       "element_size, device, is_cuda, get_device, copy_ and resize_(0)")

    def copy_(self, src: Any, non_blocking: bool = False) -> SimStorage:
        """``storage.copy_(src, non_blocking)`` (offload code's onload: ``p.untyped_storage().copy_(
        pinned.untyped_storage(), non_blocking=True)``): :func:`storage_copy`."""
        storage_copy(self, src, non_blocking)
        return self

    def resize_(self, nbytes: int) -> SimStorage:
        st = self._t._st
        if nbytes == 0:
            self._t._ops.release(self._t)
        elif st.released is not None and nbytes == st.size and self._t._ipc is None:
            self._t._ops.regrow(self._t)
        elif nbytes != self.nbytes():
            raise NotImplementedError(
                "untyped_storage().resize_() of a simulated storage to another nonzero size is not supported "
                "(resize_(0), a release, and back to its size after one, are)"
            )
        return self

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SimStorage) and other._t._st is self._t._st

    def __hash__(self) -> int:
        return id(self._t._st)

    def __repr__(self) -> str:
        return f"SimStorage({self._t._st.label}, {self.nbytes()} bytes)"


def _new_storage(make: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``torch.UntypedStorage(size, device=...)`` (``make``: the constructor or ``_new_shared``): on a CUDA device,
    a simulated storage of ``size`` bytes (nobody wrote them: poisoned where values are computed)."""
    device = kwargs.get("device")
    if device is not None and torch.device(device).type == "cuda":
        if len(args) != 1 or not isinstance(args[0], int) or set(kwargs) != {"device"}:
            raise NotImplementedError("a simulated device storage is made of a size alone (UntypedStorage(n, "
                                      "device='cuda'))")
        return torch.empty(args[0], dtype=torch.uint8, device=device).untyped_storage()
    return make(*args, **kwargs)


class SimTypedStorage:
    """``t.storage()`` of a simulated tensor, as torch's deprecated ``TypedStorage`` shows it: the tensor's
    :class:`SimStorage` counted in elements of its dtype. Older offload code frees and brings back memory through it
    (``t.storage().resize_(0)``, ``resize_(t.numel())``, ``copy_``); its queries answer as a CUDA storage's, and a
    method of torch's class it lacks raises ``NotImplementedError`` (no verdict), as :class:`SimStorage`'s do."""

    def __init__(self, untyped: SimStorage, dtype: torch.dtype) -> None:
        #: (torch's attribute name: ``TypedStorage.copy_`` of a host storage reads it from its source)
        self._untyped_storage = untyped
        self.dtype = dtype

    def untyped(self) -> SimStorage:
        return self._untyped_storage

    def element_size(self) -> int:
        return int(self.dtype.itemsize)

    _element_size = element_size

    def size(self) -> int:
        return self._untyped_storage.nbytes() // self.element_size()

    _size = size

    def __len__(self) -> int:
        return self.size()

    def nbytes(self) -> int:
        return self._untyped_storage.nbytes()

    _nbytes = nbytes

    def resize_(self, size: int) -> SimTypedStorage:
        """To ``size`` elements: 0 releases the allocation; its size again, after that, allocates anew
        (:meth:`SimStorage.resize_`)."""
        self._untyped_storage.resize_(size * self.element_size())
        return self

    def _resize_(self, size: int) -> None:
        self.resize_(size)

    def copy_(self, source: Any, non_blocking: bool | None = None) -> SimTypedStorage:
        storage_copy(self._untyped_storage, source, bool(non_blocking))
        return self

    def data_ptr(self) -> int:
        return self._untyped_storage.data_ptr()

    _data_ptr = data_ptr

    @property
    def device(self) -> torch.device:
        return self._untyped_storage.device

    @property
    def is_cuda(self) -> bool:
        return self._untyped_storage.is_cuda

    def get_device(self) -> int:
        return self._untyped_storage.get_device()

    def is_pinned(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        raise _lacking(self, name, torch.TypedStorage, "storage()", "TypedStorage has size, nbytes, element_size, "
                       "data_ptr, device, is_cuda, get_device, untyped, copy_ and resize_(0)")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SimTypedStorage) and other._untyped_storage == self._untyped_storage

    def __hash__(self) -> int:
        return hash(self._untyped_storage)

    def __repr__(self) -> str:
        return f"SimTypedStorage({self._untyped_storage._t._st.label}, {self.dtype}, {self.size()} elements)"


def _lacking(storage: Any, name: str, torch_class: type, shown: str, has: str) -> Exception:
    """What asking a simulated storage for ``name`` raises: ``NotImplementedError`` (no verdict) for a method of
    torch's class (``torch_class``) the simulated one lacks, ``AttributeError`` for any other name."""
    if not name.startswith("_") and hasattr(torch_class, name):
        return NotImplementedError(f"{shown}.{name} of a simulated tensor is not simulated (its {has}): operate on "
                                   "the tensor instead")
    return AttributeError(f"{type(storage).__name__!r} object has no attribute {name!r}")


def storage_copy(dst: Any, src: Any, non_blocking: bool = False) -> None:
    """One storage's bytes copied into another's, where either is a simulated device's, as torch's ``storage_copy``
    makes it: a byte tensor over each whole storage (``empty(0).set_(storage)``: no operation) and one ``copy_``
    between them, the program's operation (on the device, an H2D or a D2H, blocking unless ``non_blocking``)."""
    if dst.nbytes() != src.nbytes():
        raise RuntimeError(f"size does not match, self was {dst.nbytes()} bytes but src was {src.nbytes()} bytes")
    _bytes_over(dst).copy_(_bytes_over(src), non_blocking=bool(non_blocking))


def _bytes_over(storage: Any) -> torch.Tensor:
    """A byte tensor over the whole of ``storage``: a simulated one's, or torch's own (host memory)."""
    if isinstance(storage, (torch.TypedStorage, SimTypedStorage)):
        storage = storage.untyped()
    if isinstance(storage, (SimStorage, torch.UntypedStorage)):
        return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
    raise TypeError(f"copy_(): argument 'src' (position 1) must be torch.Storage, not {type(storage).__name__}")


def peek(t: torch.Tensor) -> torch.Tensor:
    """The current bytes of a simulated tensor as a CPU tensor (for tests, after a run)."""
    return t._data.clone() if isinstance(t, SimTensor) else t.clone()


#: what makes a tensor object simulated or not, kept with its kind when :func:`move_in_place` moves it: the attributes
#: :class:`SimTensor` gives every device tensor, and torch's mark of a parameter of a tensor subclass
#: (``Parameter(t)`` of a simulated ``t``; a host parameter is of class ``Parameter`` itself)
_OWN = frozenset({"_data", "_st", "_ops", "_alias", "_sig", "_ipc", "_is_param"})
#: (the same, for the drop-in: what of a simulated tensor's instance attributes is the simulator's, not the program's)
SIMULATOR_ATTRIBUTES = _OWN


def crosses_devices(old: torch.Tensor, new: torch.Tensor) -> bool:
    """Whether ``new`` is ``old`` moved between the host and the simulated device (either way), each of the kind
    a GPU's ``set_data`` takes in place: a dense host tensor (pinned or not) of torch's own class (or a
    ``Parameter``) and a simulated one (CPU and CUDA dense tensors are of compatible shallow-copy types there;
    a host tensor and a simulated one are not here)."""
    if type(old) is SimTensor:
        old, new = new, old
    elif type(new) is not SimTensor:
        return False
    return (type(old) in (torch.Tensor, torch.nn.Parameter) and old.device.type == "cpu"
            and old.layout is torch.strided and not old.is_quantized and not old.is_mkldnn)


def _held(t: torch.Tensor) -> bool:
    """Whether an ``AccumulateGrad`` node holds ``t``'s tensor (a graph's, or one a library keeps to hook it)."""
    n = t._use_count()
    if n == 1 or not (t.is_leaf and t.requires_grad):
        return False
    node = torch.autograd.graph.get_gradient_edge(t).node  # (held here: a node the lookup made holds t too)
    held = bool(t._use_count() == n)
    del node
    return held


#: what :func:`move_in_place` keeps of a tensor moved between the host and the device, by its object's id: (a weak
#: reference to the object, the tensor it was on the other side by side, True for the device's). Kept here, not on
#: the object, whose ``__dict__`` a deep copy and a pickle take.
_HELD: dict[int, tuple[Any, dict[bool, torch.Tensor]]] = {}
_NONE_HELD: dict[bool, torch.Tensor] = {}
_BASE_GRAD = torch._C.TensorBase.grad


def _held_for(t: torch.Tensor) -> dict[bool, torch.Tensor]:
    entry = _HELD.get(id(t))
    return entry[1] if entry is not None and entry[0]() is t else _NONE_HELD


def _let_go(key: int) -> Callable[[Any], None]:
    """The weak reference's callback: the object is gone, and what was kept for it goes."""
    def gone(ref: Any) -> None:
        entry = _HELD.get(key)
        if entry is not None and entry[0] is ref:
            del _HELD[key]

    return gone


def _grad_get(self: torch.Tensor) -> Any:
    grad = _BASE_GRAD.__get__(self, type(self))
    if grad is None:
        for t in _held_for(self).values():
            grad = _BASE_GRAD.__get__(t, type(t))
            if grad is not None:
                return grad
    return grad


def _grad_set(self: torch.Tensor, value: Any) -> None:
    _BASE_GRAD.__set__(self, value)
    for t in _held_for(self).values():  # (one gradient: the one it had on the other side goes)
        _BASE_GRAD.__set__(t, None)


def _grad_del(self: torch.Tensor) -> None:
    _grad_set(self, None)


#: ``Tensor.grad`` of the drop-in's session: a parameter moved between the host and the device in place
#: (:func:`move_in_place`) shows the gradient it has on the other side, as torch keeps it there
CROSS_SIDE_GRAD = property(_grad_get, _grad_set, _grad_del, doc=_BASE_GRAD.__doc__)


def move_in_place(old: torch.Tensor, new: torch.Tensor) -> None:
    """``old`` becomes ``new`` (a tensor :func:`crosses_devices` moved it to), keeping its Python object, as torch's
    ``set_data`` moves a parameter between CPU and CUDA on a GPU: its identity (an optimizer's and a hook's
    references to it), the attributes the program gave it, its tensor hooks and ``requires_grad``; its class
    becomes ``new``'s (:class:`SimTensor` on the device). ``new`` is left holding what ``old`` held (drop it).

    On a GPU the tensor stays one throughout (``set_data`` changes its storage alone); here each side is a tensor of
    its own, and the one it was on the other side is kept for ``old`` (:data:`_HELD`, its bytes let go, as
    ``set_data`` lets them go) where a gradient or an ``AccumulateGrad`` node holds it: a backward through a graph
    made before the move accumulates into it, and ``old.grad`` shows its gradient (the session's ``grad``,
    :data:`CROSS_SIDE_GRAD`), as torch keeps a gradient on the side it was (FSDP's ``CPUOffload`` reads the device
    gradient after moving the flat parameter to its host shard). Moved back to that side, ``old`` takes that tensor
    again over ``new``'s bytes, so the node accumulates into the parameter (FSDP's hook on it fires), and a new
    forward's graph gets a new node, as ``set_data`` across devices resets the tensor's accumulator. A graph's saved
    views of ``old`` keep the bytes they had, as on a GPU. The caller moves a gradient the program moves with it
    (``module.to``)."""
    records = dict(_held_for(old))
    t = records.pop(type(new) is SimTensor, None)
    if t is not None and type(t) is type(new):
        # (a change of dtype resets the accumulator, as torch's set_data across devices does; then new's shape,
        # strides, dtype, and a host tensor's bytes)
        other = torch.float32 if t.dtype is not torch.float32 else torch.float64
        _TENSOR_DATA.__set__(t, torch.Tensor._make_wrapper_subclass(SimTensor, (0,), dtype=other, device=META)
                             if type(t) is SimTensor else torch.empty(0, dtype=other))
        _TENSOR_DATA.__set__(t, new)
        if type(new) is SimTensor:
            t.__dict__ = {k: v for k, v in new.__dict__.items() if k in _OWN}
            t._alias = t._sig = None
        new = t
    side = type(old) is SimTensor
    keep = _BASE_GRAD.__get__(old) is not None or _held(old)
    hooks, after = old._backward_hooks, old._post_accumulate_grad_hooks
    kept = {k: v for k, v in new.__dict__.items() if k in _OWN}
    kept.update((k, v) for k, v in old.__dict__.items() if k not in _OWN)
    left = {k: v for k, v in old.__dict__.items() if k in _OWN}
    old.__class__, new.__class__ = new.__class__, old.__class__
    old.__dict__, new.__dict__ = kept, left
    torch._C._swap_tensor_impl(old, new)
    if keep:
        if side:  # (its bytes let go: the node and the gradient hold the tensor, not them)
            new.__dict__ = {}
        else:
            _TENSOR_DATA.__set__(new, torch.empty(0, dtype=new.dtype))
        records[side] = new
    key = id(old)
    entry = _HELD.get(key)
    ref = entry[0] if entry is not None and entry[0]() is old else None
    if records:
        _HELD[key] = (ref if ref is not None else weakref.ref(old, _let_go(key)), records)
    elif ref is not None:
        del _HELD[key]
    # torch keeps a tensor's hooks in its C++ record, which went with the tensor it had: put them on its new one
    # (each setter registers the object's table with the record)
    if hooks is not None:
        old._backward_hooks = hooks
    if after is not None:
        old._post_accumulate_grad_hooks = after


def set_data_across(p: torch.Tensor, value: torch.Tensor) -> None:
    """``p.data = value`` where one of them is a simulated tensor and the other a host one (a weight swapped into
    pinned memory and back, as diffusers' group offloading does): ``p`` keeps its Python object and reads and writes
    ``value``'s bytes from now on, as torch's ``set_data`` makes it on a GPU, where a CPU and a CUDA tensor are of
    compatible types. Its class becomes the other side's (a parameter stays one); its ``requires_grad`` stays. A
    ``grad`` it has stays on the side it was, as torch keeps it, where the drop-in's session shows it
    (:data:`CROSS_SIDE_GRAD`); elsewhere ``NotImplementedError``."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"Variable data has to be a tensor, but got {type(value).__name__}")
    if p.grad is not None and torch.Tensor.__dict__.get("grad") is not CROSS_SIDE_GRAD:
        raise NotImplementedError(f"setting .data of a tensor that has a grad, between the host and the simulated "
                                  f"device, is not simulated (torch keeps the grad on {p.grad.device}): clear the "
                                  "grad first, or swap the tensors themselves")
    requires_grad = p.requires_grad
    # (an alias of value's bytes with a version counter of its own, as set_data leaves p's own: value.detach()
    # would share value's, so an in-place op on value, FSDP's copy into its low-precision shard, would show as one
    # on the views p's graph holds)
    if isinstance(value, SimTensor):
        alias = _view(value._data, value._st, value._ops)
        if value._ipc is not None:
            alias = _held_by(alias, value._ipc)
    else:
        with no_dispatch(), torch.no_grad():
            alias = torch.empty(0, dtype=value.dtype).set_(value)
    if isinstance(p, torch.nn.Parameter):
        alias = torch.nn.Parameter(alias, requires_grad=requires_grad)
    move_in_place(p, alias)
    if p.requires_grad != requires_grad:
        p.requires_grad_(requires_grad)


def data_of(x: Any) -> Any:
    """The CPU bytes behind a simulated tensor (anything else as it is)."""
    return x._data if isinstance(x, SimTensor) else x


def storage_of(t: torch.Tensor) -> Storage:
    """The storage of a simulated tensor (TypeError for any other tensor)."""
    if not isinstance(t, SimTensor):
        raise TypeError(f"expected a tensor on the simulated device, got one on {t.device}")
    return t._st


def ref_of(t: torch.Tensor) -> Ref:
    """A simulated tensor's storage and a new alias of its bytes that does not keep its block allocated (what a
    collective in flight holds: the program's references keep its tensors). Made with Python dispatch off: this is
    called from the program's own code, where the dispatch mode would see the alias's ``view`` and ``as_strided``
    (plain CPU ops of no storage it checks: the same tensors, at a cost)."""
    st = storage_of(t)
    with no_dispatch():
        return st, st.alias(data_of(t))


def _non_blocking(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a copy op was asked for ``non_blocking=True`` (``copy_``'s or ``_foreach_copy_``'s third argument, or
    a keyword)."""
    if (func is aten.copy_.default or func is aten._foreach_copy_.default) and len(args) > 2:
        return bool(args[2])
    return bool(kwargs.get("non_blocking", False))


def _dense(t: torch.Tensor) -> bool:
    """Whether ``t``'s elements fill one run of memory without overlap, its dimensions in some order (ATen's
    ``is_non_overlapping_and_dense``): the strides, smallest first, are those of a contiguous tensor of its
    dimensions in that order (one of no elements is)."""
    if t.numel() <= 1:
        return True
    dense = 1
    for stride, n in sorted((st, n) for st, n in zip(t.stride(), t.shape, strict=True) if n > 1):
        if stride != dense:
            return False
        dense *= n
    return True


def _one_memcpy(dst: torch.Tensor, src: torch.Tensor) -> bool:
    """Whether ATen copies ``src`` into ``dst`` across host and device with one memcpy (``copy_requires_temporaries``
    false): the same dtype, and after broadcasting the same dense layout (TensorIterator coalesces them into one
    contiguous run)."""
    dst, src = data_of(dst), data_of(src)
    if dst.dtype != src.dtype:
        return False
    if dst.numel() <= 1 or (dst.shape == src.shape and dst.is_contiguous() and src.is_contiguous()):
        return True  # (the common copy, told without a view made)
    wide = src.expand_as(dst)
    if any(a != b for a, b, n in zip(dst.stride(), wide.stride(), dst.shape, strict=True) if n > 1):
        return False
    return _dense(dst)


#: torch's own error for ``record_stream`` of a host tensor, pinned or not (the op has a CUDA kernel alone), its
#: dispatcher's table of kernels left out
_HOST_RECORD_STREAM = (
    "Could not run 'aten::record_stream' with arguments from the 'CPU' backend (as torch raises on a GPU: "
    "record_stream takes a device tensor; torch's caching host allocator keeps pinned memory from reuse until the "
    "non-blocking copies that used it are done, and a host read of it must wait for an event or a synchronize)")


def _through_host_temporaries(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], dst: torch.Tensor,
                              src: torch.Tensor) -> tuple[bool, bool]:
    """For a copy between a pinned host tensor and the device that is no single memcpy, how ATen's CUDA copy makes
    it (``copy_kernel_cuda``: temporaries, the conversion on the device when non-blocking, else on the host):
    (whether the host reads the pinned source at issue, making it contiguous or converting it into pageable memory
    that the copy then stages; whether the copy lands in a pageable temporary the host waits for, then copies into
    the pinned destination, which is not contiguous)."""
    if _one_memcpy(dst, src):
        return False, False
    non_blocking = _non_blocking(func, args, kwargs)
    if isinstance(dst, SimTensor):  # H2D from pinned memory
        converts_on_host = not non_blocking and dst.dtype != src.dtype
        return converts_on_host or not data_of(src).expand_as(data_of(dst)).is_contiguous(), False
    return False, non_blocking and not dst.is_contiguous()  # D2H into pinned memory (a blocking one waits anyway)


def _meta_of(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=META)
    if isinstance(x, torch.device):
        return META
    return x


#: values that are their own signature (with their type: 1 and 1.0 and True give outputs of different dtypes)
_PLAIN_VALUES = frozenset({int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format})


def _sig(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        if isinstance(x, SimTensor):  # made once per simulated tensor: its shape never changes
            sig = x._sig
            if sig is None:
                sig = x._sig = ("T", x.shape, x.stride(), x.dtype)
            return sig
        return ("T", x.shape, x.stride(), x.dtype)
    t = type(x)
    if t in _PLAIN_VALUES:
        return (t, x)
    if isinstance(x, (list, tuple)):
        return tuple([_sig(y) for y in x])
    if isinstance(x, dict):
        return tuple([(k, _sig(v)) for k, v in x.items()])
    if isinstance(x, (int, float, bool, str, torch.dtype, torch.device, torch.memory_format)):
        return (t, x)
    return (t, repr(x))


#: the meta kernels' outputs and the bare allocations' templates (:func:`_on_meta`) by (the op's id, signature of its
#: arguments), each with the op, shared by every run of the process (the same programs issue the same ops run after
#: run); emptied past _META_CACHE_MAX entries. Keyed by the op's id, as _FACTS is (hashing the op calls
#: OpOverload.__hash__, a Python method)
_META_CACHE: dict[Any, tuple[Any, Any]] = {}
_META_CACHE_MAX = 8192
_default_dtype = torch.get_default_dtype


def _on_meta(make: Callable[[Any, tuple[Any, ...], dict[str, Any]], Any], func: Any, args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> Any:
    """``make(func, args, kwargs)``, what an op makes on the meta device, cached by the op and the signature of its
    arguments in :data:`_META_CACHE` (the same programs issue the same ops run after run)."""
    # (_sig(args) and _sig(kwargs), inline: the arguments are a tuple, the keywords mostly none; torch's default
    # dtype too, which a factory given no dtype, or an integer tensor times a float, gives its output)
    key = (id(func), tuple([_sig(x) for x in args]), _sig(kwargs) if kwargs else (), _default_dtype())
    got = _META_CACHE.get(key)
    if got is not None and got[0] is func:
        return got[1]
    out = make(func, args, kwargs)
    if len(_META_CACHE) >= _META_CACHE_MAX:
        _META_CACHE.clear()
    _META_CACHE[key] = (func, out)
    return out


#: ``resize_`` and ``resize_as_``: a device tensor's new layout, metadata alone (:meth:`Dispatcher._resize`)
_RESIZES = frozenset({aten.resize_.default, aten.resize_as_.default})
#: in-place views: the tensor's own metadata changed (:meth:`Dispatcher.dispatch`)
_INPLACE_VIEWS = frozenset({aten.squeeze_.default, aten.squeeze_.dim, aten.squeeze_.dims, aten.unsqueeze_.default,
                            aten.t_.default, aten.transpose_.default, aten.swapdims_.default,
                            aten.swapaxes_.default, aten.as_strided_.default})

#: an ``out=`` op's outputs as its meta kernel leaves them, by (the op's id, its arguments' signature), with the op
_OUT_LAYOUTS: dict[Any, tuple[Any, list[torch.Tensor | None] | None]] = {}


def _out_layouts(func: Any, facts: OpFacts, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> list[torch.Tensor | None] | None:
    """For each tensor an ``out=`` op writes (:func:`_written`'s order), its meta tensor where the op gives it a
    new shape or strides (resizes it), else None; None where the meta kernel refuses the arguments. Kept per op and
    signature (:data:`_OUT_LAYOUTS`)."""
    key = (id(func), tuple([_sig(x) for x in args]), _sig(kwargs) if kwargs else ())
    got = _OUT_LAYOUTS.get(key)
    if got is not None and got[0] is func:
        return got[1]
    margs, mkwargs = _tree_map(_meta_of, args), _tree_map(_meta_of, kwargs)
    before = [(m.shape, m.stride(), m.storage_offset()) for m in _written(facts, margs, mkwargs)]
    layouts: list[torch.Tensor | None] | None
    try:
        _on_a_stack_of_its_own(lambda: func(*margs, **mkwargs))
    except Exception:  # (any refusal: the op's own run raises it where a GPU would)
        layouts = None
    else:
        after = _written(facts, margs, mkwargs)
        layouts = [None if (m.shape, m.stride(), m.storage_offset()) == b else m
                   for m, b in zip(after, before, strict=True)]
    if len(_OUT_LAYOUTS) >= _META_CACHE_MAX:
        _OUT_LAYOUTS.clear()
    _OUT_LAYOUTS[key] = (func, layouts)
    return layouts


#: the in-place ops' argument errors (:func:`_check_in_place`), by (the op's id, its arguments' signature), with the
#: op: None where there is none
_IN_PLACE_ERRORS: dict[Any, tuple[Any, RuntimeError | None]] = {}


def _check_in_place(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """An in-place op's argument error (a dtype its kernels do not cover, ``clamp_()`` with no bound, ``fill_`` of a
    1-d value) raised at the call, as CUDA raises it before the launch: its trial on zeros and ones (:func:`_on_zeros`),
    once per op and signature. Asked once per destination tensor and op (``SimTensor._ok``): a later call of the op
    on that tensor with other arguments that it refuses raises as the stream runs it. Aten's ops alone: a library's
    own op whose host kernel raises says nothing of what its CUDA kernel checks before a launch."""
    key = (id(func), tuple([_sig(x) for x in args]), _sig(kwargs) if kwargs else ())
    got = _IN_PLACE_ERRORS.get(key)
    if got is not None and got[0] is func:
        error = got[1]
    else:
        with torch.inference_mode(False):  # (the trial's zeros are its own, updated in place outside any mode)
            error = _argument_error(func, _tree_map(_meta_of, args), _tree_map(_meta_of, kwargs))
        if len(_IN_PLACE_ERRORS) >= _META_CACHE_MAX:
            _IN_PLACE_ERRORS.clear()
        _IN_PLACE_ERRORS[key] = (func, error)
    if error is not None:  # (the signature says nothing of devices: :func:`_devices_first`)
        raise _devices_first(func, args, kwargs, error)


def _devices_first(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], error: Exception) -> Exception:
    """What a GPU raises for arguments whose trial raised ``error``: a CUDA wrapper's check of their devices comes
    first (:func:`_device_error`: ``nll_loss`` given a 2-d host target refuses it before its shape), and
    TensorIterator's refusal of a host tensor before a kernel's dtypes (:func:`_host_tensor_error`); else
    ``error``."""
    return _device_error(func, args, kwargs) or (
        _host_tensor_error(func, args, kwargs) if _DTYPE_GAP.search(str(error)) else None) or error


def _meta_kernel(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """An op's outputs from its meta kernel; None when they depend on the data (the meta kernel refuses). An error
    torch's checks of the arguments raise is raised here, on the host, as CUDA raises it before the launch
    (:func:`_on_zeros`)."""
    margs, mkwargs = _tree_map(_meta_of, args), _tree_map(_meta_of, kwargs)
    # a plain pointwise op by TensorIterator's rules: its meta kernel is a Python reference that imports dynamo
    out = elementwise.output(func, margs, mkwargs)
    if out is None:
        odd: Exception | None = None
        try:
            out = _on_a_stack_of_its_own(lambda: func(*margs, **mkwargs))
        except (NotImplementedError, RuntimeError) as e:
            if isinstance(e, RuntimeError) and not any(
                    isinstance(x, torch.Tensor) for x in _leaves_of((margs, mkwargs))[0]):
                # a factory (``ones``, ``full``, ``arange`` on the device): no data can decide what it makes, so its
                # refusal (a negative size, a zero step) is an argument error, raised at the call as CUDA raises it
                # (:func:`_on_zeros` does not try an op that names a device)
                raise
            out = None  # nonzero, boolean indexing, repeat_interleave without a size: the values decide
        except Exception as e:  # (a Python meta kernel's own failure: the host kernel says more)
            # ``conv1d``'s meta kernel indexes a 2-d weight's third size (IndexError), ``nll_loss``'s asserts
            # (AssertionError): CUDA's kernel raises a RuntimeError of its checks, as the host kernel does on zeros
            out, odd = None, e
        error, tried = _on_zeros(func, margs, mkwargs)
        if error is not None:
            raise _devices_first(func, args, kwargs, error)
        if odd is not None and tried is None:
            raise _devices_first(func, args, kwargs, odd)
        if out is None:  # (no meta kernel, or one that failed where the host kernel runs: shaped as the latter)
            out = tried
    return out


def _host_tensor_error(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> RuntimeError | None:
    """TensorIterator's error for a host tensor of one element or more among an op's device tensors, unless the op
    takes one (a copy, or one that copies its host arguments in itself)."""
    facts = classify(func)
    flat = [x for x in _leaves_of((args, kwargs))[0] if isinstance(x, torch.Tensor)]
    if facts.copy or facts.copies_host_inputs or not any(not isinstance(x, SimTensor) and x.dim() > 0 for x in flat):
        return None
    return RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                        f"{_first_device(flat)} and cpu!")


def _first_device(flat: list[torch.Tensor]) -> str:
    """The simulated device as the program sees it, named by the first of the op's tensors on it."""
    return next((str(x.device) for x in flat if isinstance(x, SimTensor)), "cuda:0")


def _device_error(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> RuntimeError | None:
    """What an op whose CUDA wrapper checks its arguments' devices (:func:`_checks_devices`) raises for these
    arguments, as the wrapper words it: the first tensor argument (in the schema's order) on another device than
    the first one's; None where they are all on one, or the op does not check."""
    if not _checks_devices(func):
        return None
    common: str | None = None
    for i, arg in enumerate(func._schema.arguments):
        value = args[i] if i < len(args) and not arg.kwarg_only else kwargs.get(arg.name)
        for x in value if isinstance(value, (list, tuple)) else (value,):
            if not isinstance(x, torch.Tensor):
                continue
            where = "sim" if isinstance(x, SimTensor) else "cpu"
            if common is None:
                common, named = where, str(x.device)
            elif where != common:
                return RuntimeError(
                    f"Expected all tensors to be on the same device, but got {arg.name} is on {x.device}, different "
                    f"from other tensors on {named} (when checking argument in method {func._schema.name})")
    return None


#: the bytes of an op's tensor arguments up to which :func:`_on_zeros` tries it (once per op and signature)
_TRIAL_BYTES = 1 << 22


def _on_zeros(func: Any, margs: tuple[Any, ...], mkwargs: dict[str, Any]) -> tuple[RuntimeError | None, Any]:
    """The op run once on host tensors of zeros shaped as its arguments (their meta tensors ``margs``, ``mkwargs``):
    what it raises where that is an error of its arguments, and its outputs as meta tensors where it ran.

    The error: torch checks dtypes and shapes on the host before CUDA launches anything, where a meta kernel may not
    check them (``mm`` of float32 and bfloat16) or refuse for another reason, and the op computed on the stream would
    raise them there, past a ``try`` of the program's (a random op runs with the generator's state kept). None where
    it runs, where ones shaped as the arguments do not raise it word for word (an error of the zeros' values:
    ``cholesky_inverse`` of a zero diagonal), or where the CPU kernel may lack what CUDA's has (a reduced-precision
    dtype its dispatch does not cover: :data:`_EVERY_BACKENDS_DTYPES`).

    The outputs shape an op with no meta kernel whose output shape torch does not say the values decide (``geqrf``,
    ``binomial``, ``dequantize`` of a float tensor), which then runs on the stream as any op; before, every op
    without a meta kernel waited as one whose values decide (the host waits for it), a wait a GPU does not make,
    which could hide a race.

    Neither where the op names a device or its tensors are larger than :data:`_TRIAL_BYTES`. Where its output's shape
    is of a kind values may decide (:attr:`OpFacts.dynamic`), whose host kernel checks values zeros and ones do not
    stand for (``repeat_interleave`` given ``output_size`` checks the repeats' sum, which CUDA's kernel does not), the
    error of a dtype its dispatch does not cover alone (``bincount`` of floats), and no outputs."""
    leaves = _leaves_of((margs, mkwargs))[0]
    facts = classify(func)
    if any(isinstance(x, torch.device) for x in leaves):
        return None, None
    if sum(x.numel() * x.element_size() for x in leaves if isinstance(x, torch.Tensor)) > _TRIAL_BYTES:
        return None, None
    try:
        out = _trial(func, facts, _zeros_as, margs, mkwargs)
    except RuntimeError as e:
        text = str(e)
        if "meta" in text.lower():
            return None, None
        gap = _DTYPE_GAP.search(text)
        if (gap is None and facts.dynamic) or (gap is not None and gap.group(2) not in _EVERY_BACKENDS_DTYPES):
            return None, None  # (a reduced-precision dtype the CPU kernel may lack where CUDA's has it)
        if not _raises_on_ones(func, facts, margs, mkwargs, e):
            # an error of the zeros' values, not of the arguments' shapes or dtypes (``cholesky_inverse`` of a
            # zero diagonal: singular), which the program's values need not give: its run on the stream says
            return None, None
        if gap is not None:  # (CUDA's kernel names itself so: ``"bitwise_and_cuda" not implemented for 'Float'``)
            return type(e)(text.replace(f'{gap.group(1)}_cpu"', f'{gap.group(1)}_cuda"', 1)), None
        return e, None
    except Exception:  # another kind of error: not an argument check (the stream's run says it)
        return None, None
    if facts.dynamic:
        return None, None  # (shaped by the zeros' values: not the program's)
    return None, _tree_map(lambda o: torch.empty_strided(o.shape, o.stride(), dtype=o.dtype, device=META)
                           if isinstance(o, torch.Tensor) else o, out)


def _argument_error(func: Any, margs: tuple[Any, ...], mkwargs: dict[str, Any]) -> RuntimeError | None:
    """What the op raises on zeros shaped as its arguments, where that is an error of its arguments
    (:func:`_on_zeros`)."""
    return _on_zeros(func, margs, mkwargs)[0]


#: a kernel's dispatch over dtypes refusing one: ``"bitwise_and_cpu" not implemented for 'Float'``
_DTYPE_GAP = re.compile(r'"(\w+?)(?:_cpu)?" not implemented for \'(\w+)\'')
#: the dtypes every kernel of an op supports on the CPU where it does on CUDA: an op's dispatch refusing one of these
#: on the CPU (an integer op given floats) refuses it on CUDA too; the CPU's gaps are in reduced precisions
_EVERY_BACKENDS_DTYPES = frozenset({"Float", "Double", "Long", "Int", "Short", "Char", "Byte", "Bool", "ComplexFloat",
                                    "ComplexDouble"})


def _trial(func: Any, facts: OpFacts, make: Callable[[Any], Any], margs: tuple[Any, ...],
           mkwargs: dict[str, Any]) -> Any:
    """The op run on host tensors ``make`` makes of its arguments' meta tensors (zeros, ones)."""
    hargs, hkwargs = _tree_map(make, margs), _tree_map(make, mkwargs)
    if facts.seeded:  # (the draw is the trial's: the program's generator goes on where it was)
        with torch.random.fork_rng(devices=[]):
            return _on_a_stack_of_its_own(lambda: func(*hargs, **hkwargs))
    return _on_a_stack_of_its_own(lambda: func(*hargs, **hkwargs))


def _raises_on_ones(func: Any, facts: OpFacts, margs: tuple[Any, ...], mkwargs: dict[str, Any],
                    error: RuntimeError) -> bool:
    """Whether the op raises ``error`` again, word for word, on ones shaped as its arguments: an error of the
    arguments (a shape, a dtype) is raised whatever their values."""
    try:
        _trial(func, facts, _ones_as, margs, mkwargs)
    except RuntimeError as again:
        return type(again) is type(error) and str(again) == str(error)
    except Exception:  # (another error: not the same one)
        return False
    return False


def _ones_as(x: Any) -> Any:
    """As :func:`_zeros_as`, ones."""
    return _zeros_as(x).fill_(1) if isinstance(x, torch.Tensor) else x


def _zeros_as(x: Any) -> Any:
    """A host tensor of zeros laid out as meta tensor ``x`` (its strides, an expanded one's too); anything else as
    it is."""
    if not isinstance(x, torch.Tensor):
        return x
    n = 0 if 0 in x.shape else 1 + sum((k - 1) * s for k, s in zip(x.shape, x.stride(), strict=True))
    return torch.zeros(n, dtype=x.dtype, device="cpu").as_strided(x.shape, x.stride())


#: ops whose implementation takes host tensors in these arguments by design and reads them on the host at the call
#: (a packed sequence's lengths and batch sizes, CTC's lengths: CPU tensors on a GPU too), and the places of their
#: results that are host tensors (``_pack_padded_sequence``'s batch sizes, ``_pad_packed_sequence``'s lengths), by
#: the op's name: the outputs are shaped by the op run on the host with those values (:func:`_host_shaped`), and
#: the host does not wait for the stream (what decides the shapes is on the host)
_HOST_ARGUMENTS: dict[str, tuple[frozenset[str], tuple[int, ...]]] = {
    "_pack_padded_sequence": (frozenset({"lengths"}), (1,)),
    "_pad_packed_sequence": (frozenset({"batch_sizes"}), (1,)),
    "_pack_padded_sequence_backward": (frozenset({"batch_sizes"}), ()),
    "lstm": (frozenset({"batch_sizes"}), ()),
    "gru": (frozenset({"batch_sizes"}), ()),
    "rnn_tanh": (frozenset({"batch_sizes"}), ()),
    "rnn_relu": (frozenset({"batch_sizes"}), ()),
    "_ctc_loss": (frozenset({"input_lengths", "target_lengths"}), ()),
    "_ctc_loss_backward": (frozenset({"input_lengths", "target_lengths"}), ()),
}


def _host_arguments(func: Any) -> tuple[frozenset[str], tuple[int, ...]] | None:
    """``func``'s entry of :data:`_HOST_ARGUMENTS` where its schema has those arguments as tensors."""
    got = _HOST_ARGUMENTS.get(func.__name__.split(".")[0])
    if got is None:
        return None
    names = frozenset(a.name for a in func._schema.arguments if a.name in got[0] and "Tensor" in str(a.type))
    return (names, got[1]) if names else None


def _host_values(facts: OpFacts, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> set[int]:
    """The ids of the host tensors given in an op's host-read arguments (:attr:`OpFacts.host_arguments`)."""
    assert facts.host_arguments is not None
    names = facts.host_arguments[0]
    out: set[int] = set()
    for i, arg in enumerate(func._schema.arguments):
        if arg.name in names:
            value = args[i] if i < len(args) and not arg.kwarg_only else kwargs.get(arg.name)
            if isinstance(value, torch.Tensor) and not isinstance(value, SimTensor):
                out.add(id(value))
    return out


def _host_shaped(func: Any, facts: OpFacts, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The results of an op of :data:`_HOST_ARGUMENTS`: the op run on the host on zeros shaped as its device tensors
    and the host tensors as they are (their values decide the shapes, as on a GPU, where the host reads them): a meta
    tensor for each result on the device, the host results themselves (computed from host values alone)."""
    assert facts.host_arguments is not None
    host_places = facts.host_arguments[1]
    trial_args = _tree_map(lambda x: _zeros_as(_meta_of(x)) if isinstance(x, SimTensor) else x, args)
    trial_kwargs = _tree_map(lambda x: _zeros_as(_meta_of(x)) if isinstance(x, SimTensor) else x, kwargs)
    with no_dispatch():
        got = _on_a_stack_of_its_own(lambda: func(*trial_args, **trial_kwargs))
    if isinstance(got, torch.Tensor):
        return _meta_of(got)
    leaves = iter(range(len(_leaves_of(got)[0])))
    return _tree_map(lambda x: x if next(leaves) in host_places or not isinstance(x, torch.Tensor) else _meta_of(x),
                     got)


#: ``copy_``, named once: :meth:`Dispatcher.dispatch` asks of every op whether it is it
_COPY = aten.copy_.default
_EQUAL = aten.equal.default


def _equal_without_a_kernel(args: tuple[Any, ...]) -> bool | None:
    """What CUDA's ``equal`` of two device tensors answers on the host, with no kernel and no wait (ATen's
    ``cuda_equal``): False for two shapes, True for no elements, True for the same view of the same bytes (same
    storage, offset, dtype, strides and flags); None where it compares their values on the stream, the host waiting
    for the answer (``eq(...).all().item()``)."""
    a, b = args[0], args[1]
    if not (isinstance(a, SimTensor) and isinstance(b, SimTensor)):
        return None  # (a host tensor among them: the op's own device error)
    if a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    if (a._st is b._st and a.storage_offset() == b.storage_offset() and a.dtype == b.dtype
            and a.stride() == b.stride() and a.is_neg() == b.is_neg() and a.is_conj() == b.is_conj()):
        return True
    return None


#: ops that read their value argument on the host where it is a 0-d device tensor (``value.item()`` in ATen, then the
#: op with that number), with its place among the arguments (:data:`_READ_ON_THE_HOST`)
_VALUE_READ_ON_THE_HOST = {aten.masked_fill_.Tensor: 2, aten.masked_fill.Tensor: 2, aten.index_fill_.int_Tensor: 3,
                           aten.index_fill.int_Tensor: 3}
#: ops whose CUDA implementation reads a value of the device's on the host as it runs (an ``item()`` inside ATen),
#: so the host waits for the stream there, as :func:`_reads_on_the_host` says where it depends on the arguments
#: (docs/confirmations.md, fifty-first run: each measured on a GPU)
_READ_ON_THE_HOST = frozenset({
    aten._linalg_check_errors.default,  # (torch.linalg.inv, cholesky, solve, ...: ``infos.any().item()``)
    aten._linalg_svd.default,  # (torch.svd, linalg.svd, nuclear_norm: its infos checked inside)
    aten._linalg_eigh.default,  # (linalg.eigh, eigvalsh: the same)
    aten.linalg_eig.default,  # (computed on the host on CUDA: the matrix copied there and back)
    # (pinverse: through an SVD or eigh, whose infos are checked)
    aten.linalg_pinv.default, aten.linalg_pinv.atol_rtol_tensor, aten.linalg_pinv.atol_rtol_float,
    aten.linalg_pinv.rcond_tensor,
    aten.linalg_matrix_exp.default,  # (the norm that picks the degree, copied to the host)
    aten.histc.default,  # (with no range given, min == max: the input's min and max read)
    aten.normal.Tensor_Tensor, aten.normal.float_Tensor,  # (``std.min() >= 0`` read)
    aten.isin.Tensor_Tensor,  # (the sorting path's ``unique``)
    aten.linalg_ldl_factor_ex.default,  # (measured waiting on an H100; cuSOLVER's own wait: :data:`_UNFLAGGED`)
    aten.cholesky.default,  # (its infos checked inside: an H100 raised a matrix's error at the call)
    # (given a 0-d host tensor among device ones: ``where_self_out`` moves it to the device, a blocking copy)
    aten.where.self, aten.where.self_out,
    *_VALUE_READ_ON_THE_HOST,
})

#: ops of :data:`_READ_ON_THE_HOST` whose wait is not c10's ``memcpy_and_sync`` or ``stream_synchronize`` (a library's
#: own): ``set_sync_debug_mode`` does not flag them (an H100 flagged none, thirty-second sitting)
_UNFLAGGED = frozenset({aten.linalg_ldl_factor_ex.default})


def _reads_on_the_host(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether an op of :data:`_READ_ON_THE_HOST` reads on the host with these arguments, as ATen's CUDA kernels
    decide: ``histc`` where ``min == max`` (its defaults, 0 and 0); ``isin`` where it sorts (as many test elements
    as ``10 * elements.numel() ** 0.145`` or more, numpy's rule) and the elements are not assumed unique;
    ``masked_fill`` and ``index_fill`` where their value is a device tensor; ``where`` where a 0-d host tensor is
    among its device tensors (ATen moves it to the device with a blocking copy: an H100 waited, twenty-ninth
    sitting)."""
    if func is aten.histc.default:
        low = args[2] if len(args) > 2 else kwargs.get("min", 0)
        high = args[3] if len(args) > 3 else kwargs.get("max", 0)
        return bool(low == high)
    if func is aten.isin.Tensor_Tensor:
        elements, test = args[0], args[1]
        unique = args[2] if len(args) > 2 else kwargs.get("assume_unique", False)
        return elements.numel() > 0 and test.numel() >= int(10.0 * elements.numel() ** 0.145) and not unique
    if func is aten.where.self or func is aten.where.self_out:
        return any(isinstance(x, torch.Tensor) and not isinstance(x, SimTensor) and x.dim() == 0 for x in args[:3])
    place = _VALUE_READ_ON_THE_HOST.get(func)
    if place is not None:  # (a value on the host is read there with no wait)
        return isinstance(args[place] if len(args) > place else kwargs.get("value"), SimTensor)
    return True


#: ops whose implementation copies a host tensor argument to the device itself, with a blocking copy: the scatter
#: ops (``output = self.clone(); output.slice(...).copy_(src)``) and ``bernoulli_`` with a tensor ``p``
#: (``p.to(device)``); an H100 took a host ``src`` and ``p`` and waited (docs/confirmations.md, fifty-first run)
_HOST_INPUT_COPIED = frozenset({aten.slice_scatter.default, aten.select_scatter.default, aten.diagonal_scatter.default,
                                aten.as_strided_scatter.default, aten.bernoulli_.Tensor})

#: what native_functions.yaml (torchgen's copy of it) says of the aten functions' CUDA kernels, read once, at the
#: first op classified (empty sets: no file): (1) those whose CUDA wrappers check that their tensors are on one
#: device: torchgen generates the check for a function the file gives a CUDA kernel of its own (a ``CUDA`` dispatch
#: key, or a structured delegate) and no ``device_check: NoCheck`` (TensorIterator's ops have one: they take a 0-d
#: host tensor as a number); (2) those with no kernel a dense CUDA tensor reaches: a dispatch section naming
#: neither ``CUDA`` nor a composite key, and no structured delegate (``histogram``: ``CPU, MPS``; ``q_scale``:
#: ``QuantizedCPU, QuantizedCUDA``), which a GPU refuses at the call
_NATIVE: list[tuple[frozenset[str], frozenset[str]]] = []
#: the dispatch keys whose kernel a dense CUDA tensor reaches
_REACHES_CUDA = frozenset({"CUDA", "CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional",
                           "CompositeImplicitAutograd"})


def _native_name(func: Any) -> str | None:
    """``func``'s name as native_functions.yaml writes it (``add.Tensor``, ``relu``); None for an op not aten's."""
    schema = func._schema
    if not schema.name.startswith("aten::"):
        return None
    name = schema.name.removeprefix("aten::")
    return f"{name}.{schema.overload_name}" if schema.overload_name else name


def _native() -> tuple[frozenset[str], frozenset[str]]:
    if not _NATIVE:
        _NATIVE.append(_read_native())
    return _NATIVE[0]


def _checks_devices(func: Any) -> bool:
    """Whether ``func``'s CUDA wrapper refuses a tensor on another device, a 0-d host one too (:data:`_NATIVE`);
    False for an op the file does not list, or where the file is not there."""
    name = _native_name(func)
    return name is not None and name in _native()[0]


def _lacks_cuda_kernel(func: Any) -> bool:
    """Whether a GPU has no kernel of ``func`` for a dense tensor (:data:`_NATIVE`): it raises at the call. (Not
    a factory given a ``layout``, which dispatches on the layout asked for: ``sparse_coo_tensor``'s.)"""
    name = _native_name(func)
    return name is not None and name in _native()[1] and not any(
        a.name == "layout" for a in func._schema.arguments)


def _read_native() -> tuple[frozenset[str], frozenset[str]]:
    import torchgen  # type: ignore[import-untyped]

    path = Path(torchgen.__file__).parent / "packaged" / "ATen" / "native" / "native_functions.yaml"
    if not path.is_file():
        return frozenset(), frozenset()
    checked: set[str] = set()
    no_cuda: set[str] = set()
    entries: list[tuple[str, list[str]]] = []
    for line in path.read_text().splitlines():
        if line.startswith("- func: "):
            entries.append((line[len("- func: "):].split("(", 1)[0], []))
        elif entries:
            entries[-1][1].append(line)
    for name, lines in entries:
        keys: set[str] = set()
        in_dispatch = False
        for raw in lines:
            if raw.startswith("  ") and not raw.startswith("   "):  # (a field of the entry's)
                in_dispatch = raw.strip() == "dispatch:"
            elif in_dispatch and ":" in raw:  # (``    CPU, CUDA: kernel``)
                keys.update(k.strip() for k in raw.split(":", 1)[0].split(","))
        fields = [x.strip() for x in lines]
        delegate = any(x.startswith("structured_delegate:") for x in fields)
        if (delegate or "CUDA" in keys) and not any(x.startswith("device_check: NoCheck") for x in fields):
            checked.add(name)
        # (not where its CUDA kernel is generated from a ufunc loop, ``add.out``; nor where the file gives a meta
        # kernel alone, which torch's Python references may call on any device)
        if keys - {"Meta"} and not delegate and not keys & _REACHES_CUDA and not any(
                x.startswith("ufunc_inner_loop:") for x in fields):
            no_cuda.add(name)
    return frozenset(checked), frozenset(no_cuda)


def _may_overlap(flat: list[torch.Tensor], w: torch.Tensor) -> bool:
    """Whether ``w``, an op's one destination (``OpFacts.overlap_checked``), may overlap itself (a stride of 0) or
    another of the op's tensors (one of its allocation): where not, :func:`_overlap_error` has nothing to find.
    (Every in-place op asks: one loop.)"""
    if not isinstance(w, SimTensor):
        return False
    if 0 in w._data.stride():
        return True
    st = w._st
    for x in flat:  # (a loop, not any() over a generator)
        if x is not w and isinstance(x, SimTensor) and x._st is st:
            break
    else:
        return False
    return True


def _overlap_error(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], flat: list[torch.Tensor],
                   w: SimTensor, limit: int | None) -> RuntimeError | None:
    """What torch's memory-overlap check raises for an op whose one destination is ``w`` and that
    :func:`_may_overlap` let through (TensorIterator's, on the host before CUDA launches anything: a destination
    whose elements share memory, ``x[:1].expand(4).add_(1)``, or one that overlaps an input in part,
    ``x[1:].copy_(x[:-1])``), found by running the op on zeros laid out with the same aliasing as its device
    tensors; None where the destination overlaps neither itself nor another argument, where the op runs, or where
    the bytes it spans pass ``limit``. The op computed on the stream cannot raise it: it writes a copy of its
    destination (``_Effect``)."""

    def extent(t: SimTensor) -> tuple[int, int, int]:  # (its CPU storage's address, first byte, end byte)
        d = t._data
        k = d.element_size()
        n = 0 if d.numel() == 0 else 1 + sum((m - 1) * s for m, s in zip(d.shape, d.stride(), strict=True))
        return int(d.untyped_storage().data_ptr()), d.storage_offset() * k, (d.storage_offset() + n) * k

    if torch._debug_has_internal_overlap(w._data) != 1:
        c, d, e = extent(w)
        others = [extent(x) for x in flat if isinstance(x, SimTensor) and x is not w and x._st is w._st]
        if not any(b == c and lo < e and d < hi for b, lo, hi in others):
            return None  # (disjoint parts of one allocation)
    # zeros for each CPU storage among the device tensors, from the first byte they use (16-aligned) to the last
    bounds: dict[int, tuple[int, int]] = {}
    for x in flat:
        if isinstance(x, SimTensor):
            b, lo, hi = extent(x)
            old = bounds.get(b, (lo, hi))
            bounds[b] = (min(old[0], lo) // 16 * 16, max(old[1], hi))
    if limit is not None and sum(hi - lo for lo, hi in bounds.values()) > limit:
        return None
    scratch = {b: (lo, torch.zeros(hi - lo, dtype=torch.uint8).untyped_storage()) for b, (lo, hi) in bounds.items()}

    def laid_out(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return CPU if isinstance(x, torch.device) else x
        if not isinstance(x, SimTensor):
            return x.clone()
        b, start, _ = extent(x)
        lo, st = scratch[b]
        d = x._data
        return torch.empty(0, dtype=d.dtype).set_(st, (start - lo) // d.element_size(), d.shape, d.stride())

    hargs, hkwargs = _tree_map(laid_out, args), _tree_map(laid_out, kwargs)
    try:
        _on_a_stack_of_its_own(lambda: func(*hargs, **hkwargs))
    except RuntimeError as e:
        return e if "single memory location" in str(e) else None
    except Exception:
        return None
    return None


def _on_a_stack_of_its_own(call: Callable[[], Any]) -> Any:
    """``call()`` in a thread of its own, its result or what it raised. An op's meta kernel may be Python that
    imports a module the first time it runs (``torch._dynamo``, behind ``torch._disable_dynamo``), and such an
    import can leave a frame in a reference cycle (``torch.fx.wrap`` keeps ``inspect.currentframe()``): on the
    program's stack, that frame held the op's arguments, so the first run in a process kept a tensor the program
    had dropped until a collection, and freed its block later than every other run (a GPU computes no meta
    kernel). On a stack of its own, the frames such an import keeps hold nothing of the run's. (Once per op and
    signature and process: :func:`_on_meta` keeps the answer.)"""
    box: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            box.append((True, call()))
        except BaseException as e:  # (raised again in the caller's thread)
            box.append((False, e))

    worker = threading.Thread(target=run, name="simdevice-meta-kernel", daemon=True)
    start_own_thread(worker)
    worker.join()
    ok, value = box[0]
    if not ok:
        raise value
    return value


def _held_by(t: SimTensor, token: Any) -> SimTensor:
    """``t``, a view of a received tensor, holding its mapping's token (:attr:`SimTensor._ipc`)."""
    t._ipc = token
    return t


def _template(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
    """What a bare allocation (``empty``, ``empty_like``, ``empty_strided``) makes, on the meta device: its shape,
    strides and dtype, no CPU memory taken for a tensor thrown away once the allocator has made the real one (made
    through :func:`_on_meta`: a program allocates the same shapes over and over, and torch's factory call is most of
    an allocation's own cost)."""
    kw = dict(_tree_map(data_of, kwargs))
    kw["device"] = META
    kw.pop("pin_memory", None)
    return classify(func).call(*_unwrapped(args), **kw)  # type: ignore[no-any-return]


def _not_read(
    facts: OpFacts, args: tuple[Any, ...], kwargs: dict[str, Any], flat: list[torch.Tensor], written: list[torch.Tensor]
) -> set[int] | None:
    """The ids of the tensor arguments an op does not read (None: it reads every one). An in-place op reads its
    destination unless it only overwrites it (``copy_``, ``fill_``, ``zero_``); an ``out=`` one does not read its
    outputs."""
    if facts.not_read == "all":
        return {id(x) for x in flat}
    if facts.not_read == "self":
        return {id(x) for x in args[0]} if isinstance(args[0], (list, tuple)) else {id(args[0])}
    if facts.out_variant or "out" in kwargs:
        return {id(x) for x in written}
    return None


def _indices_of(facts: OpFacts, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """An advanced-indexing op's ``indices`` (:attr:`OpFacts.indices`), else none."""
    pos = facts.indices
    if pos is None:
        return []
    got = args[pos] if pos < len(args) else kwargs.get("indices")
    return list(got) if isinstance(got, (list, tuple)) else []


#: the simulated CUDA generators of this process (``torch.Generator(device="cuda")`` in a session, and
#: ``torch.cuda.default_generators[0]``), by the address of the CPU generator each is (``_cdata``: the generator
#: a dispatch mode is given is another Python object over the same one); each has ``next_seed()``
CUDA_GENERATORS: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()


def register_generator(generator: Any) -> None:
    """Make ``generator`` (a CPU ``torch.Generator`` with ``next_seed()``) a simulated CUDA generator."""
    CUDA_GENERATORS[generator._cdata] = generator


def _device_generator(generator: Any) -> Any:
    """The simulated CUDA generator an op on the device was given (``generator=``); a CPU generator is refused as
    CUDA's kernels refuse it."""
    found = CUDA_GENERATORS.get(generator._cdata)
    if found is None:
        raise RuntimeError(f"Expected a 'cuda' device type for generator but found '{generator.device.type}'")
    return found


def _on_host(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and not isinstance(x, SimTensor)


#: the ops that put a value at indices (``t[idx] = v``)
_PUTS = (aten.index_put_.default, aten._index_put_impl_.default)


def _value_moved(args: tuple[Any, ...], kwargs: dict[str, Any], indices: list[Any]) -> bool:
    """Whether ATen's ``_index_put_impl_`` moves the op's value to the device with a blocking copy (the host waits
    for the stream: on an H100, ``t[idx] = 1.0`` waited out a 100 ms kernel): a one-element value on the host
    (``t[idx] = 1.0`` makes it so), unless the op is a mask's fill (``canDispatchToMaskedFill``: one defined index,
    a bool or byte one on the device, which reads the value on the host instead)."""
    value: Any = args[2] if len(args) > 2 else kwargs.get("values")
    if not _on_host(value) or value.numel() != 1 or value.dim() != 0:
        return False
    defined = [x for x in indices if x is not None]
    return not (len(defined) == 1 and isinstance(defined[0], SimTensor)
                and defined[0].dtype in (torch.bool, torch.uint8))


def _with_indices(facts: OpFacts, args: tuple[Any, ...], kwargs: dict[str, Any],
                  indices: list[Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The op's arguments with ``indices`` in its ``indices``' place."""
    pos = facts.indices
    assert pos is not None
    if pos < len(args):
        return (*args[:pos], indices, *args[pos + 1:]), kwargs
    return args, {**kwargs, "indices": indices}


def _written(facts: OpFacts, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The tensors the call writes: its schema's written arguments, but a fused optimizer step's ``grads`` where it
    is given no ``grad_scale`` (CUDA's kernels store the gradients back only to unscale them; else they only read
    them, and a side stream's copy of the gradients beside the step is no race)."""
    out: list[torch.Tensor] = []
    for i, name, kwarg_only in facts.written:
        if facts.grads_if_scaled and name == "grads" and kwargs.get("grad_scale") is None:
            continue
        v = args[i] if i < len(args) and not kwarg_only else kwargs.get(name)
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out += [x for x in v if isinstance(x, torch.Tensor)]
    return out


_ORIGIN = Origin(internal_file)


def _never() -> bool:
    return False


class Dispatcher:
    """Turns aten calls made inside simulated actors into runtime calls: host steps, stream operations."""

    def __init__(self, rt: Runtime, shown: torch.device = META) -> None:
        self.rt = rt
        self.config = rt.config
        #: with a cost for the engine's steps: whether an op comes from autograd's engine (``reference.origin``)
        self._from_engine = _ORIGIN.from_engine if self.config.engine_step_ns else _never
        #: the device simulated tensors show to Python code; factories and copies to it make device memory
        self.shown = shown
        self._device_types = {"meta", shown.type}
        #: the index of the device the running process made current (``torch.cuda.set_device``), where the drop-in
        #: tells it: the simulated tensors show ``shown`` at that index; None: ``shown`` as it is
        self.index_of: Callable[[], int] | None = None

    def shown_now(self) -> torch.device:
        """The device the simulated tensors show to the running process (:attr:`index_of`)."""
        if self.index_of is None:
            return self.shown
        index = self.index_of()
        if index == (self.shown.index or 0):
            return self.shown
        return _DEVICE(self.shown.type, index)

    def on_device(self, d: Any) -> bool:
        """Whether a ``device=`` argument names the simulated device."""
        return d is not None and _DEVICE(d).type in self._device_types

    def release(self, t: SimTensor) -> None:
        """``t.untyped_storage().resize_(0)``."""
        self.rt.release(t._st, user_source())

    def regrow(self, t: SimTensor) -> None:
        """``t.untyped_storage().resize_(n)`` of a storage ``resize_(0)`` released, back to its size (FSDP's and
        torchtitan's parameters, freed after their forward and allocated again before their backward): a new
        allocation on the current stream, which every tensor of the storage now is, as they share the one storage
        in torch (the parameter, its views, what autograd saved of it); its bytes are uninitialized."""
        import gc  # (only here: a storage's tensors are found at its regrowth, not tracked for every tensor)

        old = t._st
        new = self.new_device(torch.empty(old.size, dtype=torch.uint8, device=META), self.rt.current())
        base = new._data.untyped_storage()
        # each tensor of the storage holds it in its instance dict: one scan finds those dicts, and each is
        # pointed at the new bytes as _point_at points a tensor (its own offset, shape and strides)
        for d in gc.get_referrers(old):
            if type(d) is dict and d.get("_st") is old and d.get("_ops") is self:
                was = d["_data"]
                with no_dispatch():
                    data = torch.empty(0, dtype=was.dtype).set_(base, was.storage_offset(), was.shape, was.stride())
                d.update(_data=data, _st=new._st, _alias=None, _sig=None)

    # -- storages ---------------------------------------------------------------------
    def new_device(self, like: torch.Tensor, actor: HostActor) -> SimTensor:
        if torch.is_inference_mode_enabled():
            # the bytes are the device's, no inference tensor: a stream writes them later, outside the program's
            # inference mode, as a kernel writes memory whatever mode made the tensor (the tensor the program
            # gets is made in its mode, an inference tensor)
            with torch.inference_mode(False):
                data, st, fresh, alias = self.rt.allocate(like, actor)
        else:
            data, st, fresh, alias = self.rt.allocate(like, actor)
        if fresh and self.config.values:  # memory nobody wrote yet; a reused block keeps its last owner's bytes
            poison(data)
        t = SimTensor(data, st, self)
        t._alias = alias
        return t

    def from_host(self, host: torch.Tensor, a: HostActor) -> SimTensor:
        """``host``'s values in a new device tensor, as torch puts Python data on the device: made on the host, then
        a blocking copy onto the current stream made below the dispatch modes, which a GPU run's mode never sees
        (``internal_new_from_data`` in torch/csrc/utils/tensor_new.cpp): no step, no operation
        (:meth:`Runtime.unseen_copy`)."""
        t = self.new_device(host, a)
        if not host.numel():  # (torch copies no bytes, and waits for nothing: ``copy_`` of none returns at once)
            return t
        self.rt.unseen_copy(a, a.current_stream, "H2D", [(t._st, t._data)], user_source())
        with self.rt.device_side():
            self.rt.memory.in_flight.before_write([t._data])
            t._data.copy_(host)
        return t

    def new_pinned(self, data: torch.Tensor, actor: str, made: bool = False) -> torch.Tensor:
        """``data`` as pinned memory of ``actor``'s; ``made``: the host gave it its values as it made it (``zeros``,
        ``.pin_memory()`` of a tensor), where an empty buffer's bytes are uninitialized."""
        st = self.rt.register_pinned(data, actor)
        st.made = made
        return data

    def _refs(self, tensors: list[torch.Tensor]) -> list[Ref]:
        """The storage and bytes of each tensor that has a storage of the simulator's (device, pinned, or host memory
        shared between processes)."""
        refs = []
        for t in tensors:
            if isinstance(t, SimTensor):
                refs.append((t._st, t._data))
            else:
                st = self.rt.lookup_host(t)
                if st is not None:
                    refs.append((st, t))
        return refs

    # -- entry point ----------------------------------------------------------------------
    def dispatch(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if func is _COPY and len(args) > 1 and isinstance(args[1], (bool, int, float, complex)):
            # ``t.copy_(0.25)``: torch wraps the number in a 0-d host tensor, which CUDA copies to the device as
            # any host tensor, the host waiting (a blocking copy from pageable memory); the mode is given the number
            args = (args[0], torch.tensor(args[1]), *args[2:])
        facts = classify(func)
        flat = _flat(args, kwargs)
        base = None
        for x in flat:
            if isinstance(x, SimTensor):
                if x._ops is not self:
                    raise RuntimeError(f"simdevice: {facts.name}: a tensor of another simulated run (a SimDevice "
                                       "made before this one, or an earlier run of the program that kept it); a run "
                                       "reads its own tensors only (simdevice.peek(t) reads one after its run)")
                if base is None:
                    base = x
        if base is None and not (kwargs and self.on_device(kwargs.get("device"))):
            return self._host_op(func, facts, args, kwargs, flat)
        if facts.no_cuda_kernel:
            raise NotImplementedError(f"Could not run 'aten::{_native_name(func)}' with arguments from the 'CUDA' "
                                      "backend: the operator has no CUDA kernel (native_functions.yaml)")
        # (the keyword first: asking the set hashes the op, a Python method of OpOverload's)
        if kwargs and kwargs.get("device") is not None and func in _HOST_WHEN_ASKED and not self.on_device(
                kwargs["device"]):
            shaped = tuple([_meta_of(x) if isinstance(x, torch.Tensor) else x for x in args])  # their shape, not bytes
            return self._host_op(func, facts, shaped, kwargs, _flat(shaped, {}))
        if kwargs and kwargs.get("pin_memory") and (kwargs.get("device") is None or self.on_device(kwargs["device"])):
            # (an output on the device asked to be pinned: ATen's empty_cuda refuses; a copy to pinned host memory,
            # ``_to_copy(t, device="cpu", pin_memory=True)``, is a D2H)
            raise RuntimeError("Only dense CPU tensors can be pinned")
        kind = facts.kind
        if kind == "view":
            assert base is not None
            if torch.is_inference_mode_enabled() and not base.is_inference():
                # a view of a normal tensor is a normal tensor in inference mode too (torch sets its version
                # counter to its base's, which an inference tensor has none of)
                with torch.inference_mode(False):
                    return self.dispatch(func, args, kwargs)
            out = facts.call(*_unwrapped(args), **(_tree_map(data_of, kwargs) if kwargs else {}))
            st = base._st
            if base._ipc is not None:
                return _tree_map(lambda t: _held_by(_view(t, st, self), base._ipc) if isinstance(
                    t, torch.Tensor) else t, out)
            if isinstance(out, torch.Tensor):
                return _view(out, st, self)
            return _tree_map(lambda t: _view(t, st, self) if isinstance(t, torch.Tensor) else t, out)
        if kind == "alloc":
            return self.new_device(_on_meta(_template, func, args, kwargs), self.rt.current())
        if facts.kind == "meta":
            if func is aten.is_pinned.default:
                return False
            if func is aten.record_stream.default:
                return self._record_stream(args[0], args[1])
            if func in _RESIZES and isinstance(args[0], SimTensor):
                meta = func(*_tree_map(_meta_of, args), **kwargs)  # the new shape and strides
                return self._resize(args[0], meta, self.rt.current())
            if func in _INPLACE_VIEWS and isinstance(args[0], SimTensor):
                # (``squeeze_``, ``t_``, ``as_strided_``: the tensor itself takes the view's shape, strides and
                # offset, as on a GPU, where no kernel runs)
                t = args[0]
                shell = torch.empty(0, dtype=t.dtype, device=META).set_(
                    torch.empty(t.untyped_storage().nbytes(), dtype=torch.uint8, device=META).untyped_storage(),
                    t.storage_offset(), t.shape, t.stride())
                meta = func(shell, *args[1:], **kwargs)
                return t.set_(SimStorage(t), meta.storage_offset(), meta.shape, meta.stride())
            return func(*_tree_map(data_of, args), **kwargs)
        a = self.rt.host_step(facts.name, engine=self._from_engine())
        # (its caller is SimMode.__torch_dispatch__, the simulator's)
        return self.issue(a, a.current_stream, func, facts, args, kwargs, flat, user_source(1))

    # -- host ops (no device tensor involved) -------------------------------------------------
    def _host_op(
        self, func: Any, facts: OpFacts, args: tuple[Any, ...], kwargs: dict[str, Any], flat: list[torch.Tensor]
    ) -> Any:
        rt = self.rt
        actor = rt.current_or_none()
        if facts.seeded and kwargs.get("generator") is not None and kwargs["generator"]._cdata in CUDA_GENERATORS:
            # (a host op given the device's generator: a CPU generator underneath, which CPU kernels would take)
            raise RuntimeError("Expected a 'cpu' device type for generator but found 'cuda'")
        if kwargs.get("pin_memory") and actor is not None:
            kw = dict(kwargs)
            kw["pin_memory"] = False
            out = func(*args, **kw)
            if facts.kind == "alloc" and self.config.values:
                poison(out)
            return self.new_pinned(out, actor.process, made=facts.kind != "alloc")
        if func is aten.is_pinned.default:
            return rt.lookup_pinned(args[0]) is not None
        if func is aten.record_stream.default and actor is not None:
            raise NotImplementedError(_HOST_RECORD_STREAM)
        if func is aten._pin_memory.default and actor is not None:
            return self.new_pinned(args[0].clone(), actor.process, made=True)
        if facts.kind == "alloc" and actor is not None:
            # host memory nobody wrote, poisoned as device memory is: what the process freed before would otherwise
            # be what a program reading it sees, and the run would not be the same run twice
            out = func(*args, **kwargs)
            if self.config.values:
                poison(out)
            return out
        pinned = [t for t in flat if rt.lookup_pinned(t) is not None]
        if actor is None or facts.kind in ("view", "alloc", "meta"):
            return func(*args, **kwargs)
        if not pinned:
            shared = [t for t in flat if rt.lookup_host(t) is not None] if rt.memory.shared else None
            if not shared or rt.execution.in_engine:
                return func(*args, **kwargs)
            # Host memory shared between processes, pageable: its accesses are checked as the host's, within the
            # actor's last step (a GPU run counts no step for an op on pageable memory either)
            return self._on_the_host(actor, func, facts, args, kwargs, flat, shared, user_source(), step=False)
        # A host step touching pinned memory: check it as a host access, then run it now.
        a = rt.host_step(facts.name, engine=self._from_engine())
        return self._on_the_host(a, func, facts, args, kwargs, flat, pinned, user_source())

    def _on_the_host(self, a: HostActor, func: Any, facts: OpFacts, args: tuple[Any, ...], kwargs: dict[str, Any],
                     flat: list[torch.Tensor], pinned: list[torch.Tensor], source: str, step: bool = True) -> Any:
        """Host actor ``a`` runs an op on host tensors now (its host step taken; ``step`` False: within its last
        one), its accesses of pinned memory (``pinned``, those of ``flat``) checked as the host's."""
        rt = self.rt
        written = _written(facts, args, kwargs)
        # an in-place op reads what it updates (``add_``), unless it only overwrites it (``copy_``, ``fill_``)
        skip = _not_read(facts, args, kwargs, flat, written)
        reads = pinned if skip is None else [t for t in pinned if id(t) not in skip]
        if pinned:
            rt.host_access(a, facts.name, self._refs(reads), self._refs(written), source, step)
            rt.memory.in_flight.before_write(written)
        return func(*args, **kwargs)

    def _resize(self, t: SimTensor, meta: torch.Tensor, actor: HostActor) -> SimTensor:
        """``t`` laid out as ``meta`` (the shape and strides ``resize_``, or an ``out=`` op, gives it), as CUDA's
        resize does: within its storage's bytes, metadata alone; a storage of no bytes (an ``empty(0)``, or one
        ``untyped_storage().resize_(0)`` released) gets a new allocation; a storage that holds bytes and must grow
        would be copied into a new one, which is not simulated."""
        shape, stride, offset = tuple(meta.shape), meta.stride(), t.storage_offset()  # (a resize keeps the offset)
        if shape == tuple(t.shape) and stride == t.stride() and offset == t.storage_offset():
            return t
        size = t.element_size()
        need = 0 if 0 in shape else (offset + 1 + sum((n - 1) * st for n, st in zip(shape, stride, strict=True))) * size
        have = 0 if t._st.released is not None else t._st.size
        if need <= have:
            return t.set_(SimStorage(t), offset, shape, stride)
        if have:
            raise NotImplementedError(
                f"growing a device tensor's storage of {have} bytes to {need} (resize_, or an out= tensor too small "
                "for the result) is not simulated: CUDA copies it into a new allocation; allocate the tensor at its "
                "size, or resize_(0) it first")
        new = self.new_device(torch.empty(need // size, dtype=t.dtype, device=META), actor)
        with no_dispatch():  # the new bytes laid out as ``meta``, and the shell to match: no simulated op
            data = torch.empty(0, dtype=t.dtype, device="cpu").set_(new._data.untyped_storage(), offset, shape, stride)
            shell = torch.empty(need, dtype=torch.uint8, device=META).untyped_storage()
            torch.Tensor.set_(t, shell, offset, shape, stride)
        t._point_at(data, new._st)
        return t

    def _fit_outputs(self, a: HostActor, func: Any, facts: OpFacts, args: tuple[Any, ...],
                     kwargs: dict[str, Any], written: list[torch.Tensor]) -> None:
        """An ``out=`` op resizes an output not shaped as its result (an ``empty(0)`` given to take it), before
        it computes: each such output laid out as the op's meta kernel lays it out (:meth:`_resize`)."""
        layouts = _out_layouts(func, facts, args, kwargs)
        if layouts is None:
            return  # (the op refuses these arguments: its run says so)
        for t, meta in zip(written, layouts, strict=True):
            if isinstance(t, SimTensor) and meta is not None:
                self._resize(t, meta, a)

    def _record_stream(self, t: Any, stream: Any) -> None:
        """``t.record_stream(stream)`` with a stream of this simulated device."""
        s = self.rt.stream_by_id(stream.stream_id) if isinstance(stream, torch.Stream) else None
        if s is None or stream.device_type != _META_TYPE:
            raise TypeError(f"record_stream: {stream!r} is not a stream of this simulated device")
        self.rt.record_stream(storage_of(t), s, user_source())

    # -- stream ops ---------------------------------------------------------------------------
    def _meta_outputs(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The outputs' shapes and dtypes, from the meta kernel (cached per signature); None when they depend on
        the data (the meta kernel refuses, or the schema says so)."""
        if func is aten._to_copy.default:
            # laid out as ATen's _to_copy lays it out: a dense input's strides kept (one of no elements too), any
            # other dense in its dimensions' order (a slice's copy is contiguous, not strided as the slice), unless
            # ``memory_format`` says otherwise
            x = args[0]
            dtype = kwargs.get("dtype") or x.dtype
            layout = kwargs.get("memory_format") or torch.preserve_format
            if layout is torch.preserve_format and (x.is_contiguous() or _dense(x)):
                # (ATen's own branch for a dense input; meta's empty_like would lay out one of no elements anew)
                return torch.empty_strided(x.shape, x.stride(), dtype=dtype, device=META)
            return torch.empty_like(_meta_of(x), dtype=dtype, memory_format=layout)
        return _on_meta(_meta_kernel, func, args, kwargs)

    def _outputs(
        self,
        a: HostActor,
        func: Any,
        facts: OpFacts,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        written: list[torch.Tensor],
        meta: Any,
    ) -> tuple[Any, list[torch.Tensor]]:
        """The call's result and the tensors it writes: the mutated arguments, or fresh allocations (shaped as
        ``meta``, the outputs' meta tensors, when it writes no argument)."""
        if written:
            if not facts.returns_tensor:
                return None, written  # returns nothing, writes its mutable arguments (_foreach_add_, _fused_adam_)
            returned = facts.returned
            if returned is not None and len(written) == len(facts.written):
                # the returns alias written arguments, a tensor each (``_amp_update_scale_`` returns its first of two)
                if len(returned) == 1:
                    return written[returned[0]], written
                return tuple([written[k] for k in returned]), written
            result = args[0] if facts.has_returns else None
            if len(written) > 1 or (facts.has_returns and not isinstance(result, torch.Tensor)):
                result = written if len(written) > 1 else written[0]
            return result, written
        if not facts.returns_tensor:
            return None, []  # nothing (an async kernel that only reads), or a host value (.item(), equal)
        assert meta is not None
        device = kwargs.get("device")
        if func is aten._to_copy.default and device is not None and not self.on_device(device):
            host_out = torch.empty_strided(meta.shape, meta.stride(), dtype=meta.dtype, device="cpu")
            if self.config.values:
                poison(host_out)
            # a non-blocking copy from the device to a new host tensor lands in pinned memory, and the host goes
            # on (ATen's _to_copy pins its output then): ``t.to("cpu", non_blocking=True)`` read at once is a race.
            # Its ``pin_memory`` argument ATen overrides with that choice: asked for alone, the output is pageable
            # and the copy blocking (an H100's answer: docs/confirmations.md, fifty-second run)
            if kwargs.get("non_blocking"):
                self.new_pinned(host_out, a.process)
            return host_out, [host_out]
        if type(meta) is torch.Tensor:  # one output (what the rest does, without a call per leaf)
            out = self.new_device(meta, a)
            return out, [out]
        # (a host tensor among them is a result computed on the host: :func:`_host_shaped`)
        result = _tree_map(lambda m: self.new_device(m, a) if isinstance(m, torch.Tensor) and m.is_meta else m, meta)
        return result, [x for x in _leaves_of(result)[0] if isinstance(x, SimTensor)]

    def _inputs(
        self, func: Any, facts: OpFacts, args: tuple[Any, ...], kwargs: dict[str, Any], flat: list[torch.Tensor],
        written: list[torch.Tensor],
    ) -> tuple[list[torch.Tensor], dict[int, torch.Tensor]]:
        """Every tensor argument that is read, and the pageable ones staged now (read at issue, as CUDA does)."""
        not_read = _not_read(facts, args, kwargs, flat, written)
        # (``flat``: the op's tensors, read as they are where every one is read)
        inputs = flat if not_read is None else [x for x in flat if id(x) not in not_read]
        if facts.indices is not None:  # host indices are host copies already (:meth:`_move_indices`): none read here
            host = {id(x) for x in _indices_of(facts, args, kwargs) if _on_host(x)}
            if host:
                inputs = [x for x in inputs if id(x) not in host]
        staged: dict[int, torch.Tensor] = {}
        read_here = _host_values(facts, func, args, kwargs) if facts.host_arguments is not None else ()
        for x in inputs:
            if isinstance(x, SimTensor):
                continue
            if not facts.copy and id(x) not in read_here and (
                    (x.dim() > 0 and not facts.copies_host_inputs) or _checks_devices(func)):
                # CUDA: only copies cross devices; a 0-d host tensor TensorIterator's ops take as a number, and an op
                # whose CUDA wrapper checks its arguments' devices refuses (``clamp``'s bounds, ``equal``,
                # ``logaddexp``: :data:`_NATIVE`)
                raise _device_error(func, args, kwargs) or _host_tensor_error(func, args, kwargs) or RuntimeError(
                    f"{facts.name}: a 0-d host tensor among its device tensors")
            if self.rt.lookup_pinned(x) is None:
                staged[id(x)] = x.clone() if self.config.values else x
        return inputs, staged

    def issue(
        self,
        a: HostActor,
        s: SimStream,
        func: Any,
        facts: OpFacts,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        flat: list[torch.Tensor],
        src: str,
    ) -> Any:
        """Enqueue one aten op on stream ``s`` for host actor ``a`` (its host step already taken)."""
        if func is _EQUAL:
            answer = _equal_without_a_kernel(args)
            if answer is not None:
                return answer
        moved: list[SimTensor] | None = None
        if facts.indices is not None:  # (an advanced-indexing op: most ops are none, at the cost of this test)
            if _on_host(args[0]):
                return self._index_on_the_host(a, s, func, facts, args, kwargs, src)
            if any(_on_host(x) for x in _indices_of(facts, args, kwargs)):
                args, kwargs, moved = self._move_indices(a, s, facts, args, kwargs, src)
                flat = _flat(args, kwargs)
            if func in _PUTS and _value_moved(args, kwargs, _indices_of(facts, args, kwargs)):
                self.rt.host_waits_for_stream(a, s, f"stream {s.name} to take {facts.name}'s host value (a blocking "
                                                    "copy)")
        written = _written(facts, args, kwargs) if facts.written else []
        if facts.overlap_checked and written and _may_overlap(flat, written[0]):
            # (the trial's zeros: as many bytes as the op's own, where values are computed; bounded in a race-only run)
            error = _overlap_error(func, args, kwargs, flat, written[0], None if self.config.values else _TRIAL_BYTES)
            if error is not None:
                raise error
        if written:
            if facts.written[0][2]:  # (an out= op: its outputs are keyword-only)
                self._fit_outputs(a, func, facts, args, kwargs, written)
            else:
                dst = args[0]
                if isinstance(dst, SimTensor) and dst._ok is not func:  # (once per destination and op)
                    if facts.aten:
                        _check_in_place(func, args, kwargs)
                    dst._ok = func
        meta = None
        if not written and facts.returns_tensor:
            # The meta kernel of an op whose output's shape may depend on its input's values (torch's tag
            # ``dynamic_output_shape``) refuses where it does (``nonzero``, ``masked_select``, ``index`` with a mask),
            # and shapes the output where it does not (``index`` with integer indices, ``repeat_interleave`` given
            # ``output_size``), where CUDA launches it as any other kernel: the host does not wait for it.
            meta = (self._meta_outputs(func, args, kwargs) if facts.host_arguments is None or not _host_values(
                facts, func, args, kwargs) else _host_shaped(func, facts, args, kwargs))
            if meta is None:
                return self._data_dependent(a, s, func, facts, args, kwargs, flat, src)
        result, outputs = self._outputs(a, func, facts, args, kwargs, written, meta)
        inputs, staged = self._inputs(func, facts, args, kwargs, flat, written)
        mask = self._narrow(facts, args, written, src) if facts.indexed is not None else None
        into_pageable = facts.copy and self._copies_through_host(a, func, args, kwargs, outputs, staged, src)

        # one pass over what it reads and one over what it writes: the storages and bytes each touches, what it
        # reads as its effect holds it (an alias: ``_alias_of``), whether the host's memory is among them, and the
        # bytes of all where none is
        reads: list[torch.Tensor] = []
        in_refs: list[Ref] = []
        out_refs: list[Ref] = []
        host_touch = False
        n = 0
        for x in inputs:
            if isinstance(x, SimTensor):
                data = x._data
                in_refs.append((x._st, data))
                n += data.nbytes  # numel() * element_size(); a plain tensor's answers without torch's subclass check
                reads.append(_alias_of(x))
            else:
                host_touch = True
                if id(x) not in staged:
                    st = self.rt.lookup_pinned(x)
                    if st is not None:
                        in_refs.append((st, x))
                    reads.append(x)
                elif self.rt.memory.shared:
                    shared_read = self.rt.lookup_host(x)
                    if shared_read is not None:  # (staged: the host reads it now, as the op is issued)
                        self.rt.host_access(a, facts.name, [(shared_read, x)], [], src)
        for x in outputs:
            if isinstance(x, SimTensor):
                data = x._data
                out_refs.append((x._st, data))
                n += data.nbytes
            else:
                host_touch = True
                st = self.rt.lookup_host(x)  # (pageable memory shared between processes too: the copy writes it)
                if st is not None:
                    out_refs.append((st, x))
        desc = facts.name
        pageable_out = host_touch and (into_pageable or self._pageable(outputs))
        if host_touch:
            n = -1  # (the bytes of its device and pinned tensors: counted by enqueue)
            if facts.copy:
                desc += " (D2H)" if any(not isinstance(o, SimTensor) for o in outputs) else " (H2D)"
            # from a pageable source (staged at issue) or into a pageable destination: the pageable rate
            pageable = "h2d" if staged else "d2h" if pageable_out else None
            duration = self.config.copy_ns(sum(o.numel() * o.element_size() for o in outputs), pageable)
        else:
            duration = self.config.kernel_ns(n)

        # Effects: compute from the inputs as they are at start, land the outputs at completion. The effect holds
        # aliases of the bytes, not the tensors: the program's del frees a block while an op is queued.
        # (not for a 0-d result, where there is no copy to save: a reduction's out= kernel may use its output as
        # scratch of the input's shape first, which it would have to resize: mse_loss)
        into = facts.into if (facts.into is not None and not host_touch and not written and not facts.copy
                              and len(outputs) == 1 and self.config.values and meta is not None
                              and meta.dim() > 0) else None
        aliased_written = _all_aliased(written) if written else []
        # (an op that writes its arguments makes those its outputs: one list, aliased once)
        aliased_outputs = aliased_written if outputs is written else _all_aliased(outputs)
        eff_args, eff_kwargs = _aliased(args), _aliased_kwargs(kwargs) if kwargs else {}
        if host_touch:
            eff_args, eff_kwargs, aliased_written, aliased_outputs, reads, staged = _host_aliased(
                flat, outputs, eff_args, eff_kwargs, aliased_written, aliased_outputs, reads, staged)
        seed = None
        if facts.seeded:
            generator = kwargs.get("generator")
            if generator is None:
                seed = self.rt.next_seed()
            else:  # (the draw is the program's generator's, as it issues the op; the effect draws from that seed)
                seed = _device_generator(generator).next_seed()
                eff_kwargs = {**eff_kwargs, "generator": None}
        eff = _Effect(self, func, eff_args, eff_kwargs, aliased_written, staged, seed, aliased_outputs, reads, into)
        eff.mask = mask
        if meta is not None and type(meta) is not torch.Tensor:  # (several results: which leaves are outputs)
            eff.places = tuple([k for k, m in enumerate(_leaves_of(meta)[0]) if isinstance(m, torch.Tensor)
                                and m.is_meta])
        blocking_copy = facts.copy and host_touch and not _non_blocking(func, args, kwargs)
        if facts.copy and host_touch and outputs and not any(o.numel() for o in outputs):
            # a copy of no elements: ATen's copy_ returns before it copies (``iter.numel() == 0``), so the host waits
            # for nothing and no sync is made (a lazy module's empty placeholder moved: ``LazyLinear(4).cuda()``)
            blocking_copy = pageable_out = False
        host_value = facts.has_returns and not outputs
        # The host waits for results it reads itself (.item(), equal, .cpu(), a pageable destination) and for a
        # copy to or from host memory without non_blocking=True (CUDA synchronizes its stream then).
        reads_on_host = facts.reads_on_host and _reads_on_the_host(func, args, kwargs)
        waits = (host_value or blocking_copy or pageable_out or reads_on_host or (host_touch and
                                                                                 facts.copies_host_inputs))
        start, finish = eff.start, eff.finish
        if reads_on_host:  # (what it reads there, CUDA's implementation raises there: the error is the host's)
            start, finish = eff.holding(start), eff.holding(finish)
        if moved:  # (the host indices' copies: written, and read, by the op)
            out_refs += [(m._st, m._data) for m in moved]
        if waits and self.rt.sync_debug and (host_value or blocking_copy or (host_touch and facts.copies_host_inputs)
                                             or (reads_on_host and func not in _UNFLAGGED)):
            # (ATen's ``memcpy_and_sync`` or stream sync: a value read on the host, a blocking copy, a host input
            # copied; a non-blocking copy into pageable memory waits in CUDA's own copy, a library in its own way)
            self.rt.synchronizing()
        again = None
        if s.capture is not None:  # (a CUDA graph's node: each replay computes it afresh)
            if facts.copy and (staged or pageable_out):  # (pageable memory: torch refuses it, before CUDA's call)
                raise RuntimeError(PAGEABLE)
            again = eff.again if seed is None else lambda: eff.again(self.rt.next_seed())
        index, rec = self.rt.enqueue(
            a, s, desc, duration, in_refs, out_refs, src, start=start, finish=finish,
            # a copy moves its bytes in order; one that reads its source at its completion can trail another
            sweeps=facts.copy and eff.deferred and not staged, record=waits, nbytes=n, again=again,
        )
        if mask is not None:
            self.rt.memory.narrowed.clear()
        if waits:
            assert rec is not None
            self.rt.host_waits_for(a, rec, f"stream {s.name} to finish {desc} #{index}")
            if eff.error is not None:
                # an op whose CUDA implementation reads a result on the host and raises there (``cholesky`` of a
                # matrix that is not positive-definite): raised at the call, once the host has waited for it
                raise eff.error
            if host_value:
                return eff.value
        return result

    def _move_indices(self, a: HostActor, s: SimStream, facts: OpFacts, args: tuple[Any, ...],
                      kwargs: dict[str, Any], src: str) -> tuple[tuple[Any, ...], dict[str, Any], list[SimTensor]]:
        """An advanced-indexing op given indices on the host (``table[idx]``, ``table[mask] = 0``), as ATen's
        ``make_info`` takes them: a host mask expanded into its long indices on the host (``nonzero``: the host
        reads it), then each host index moved to the device, a blocking copy on the current stream
        (``memcpy_and_sync``: the host waits for the stream) into a block of its own that the op reads and that is
        freed after it. Here the masks are read and expanded, the host waits for ``s``, the long indices are read
        (host copies: the op reads their bytes as they are now), and a block is taken for each. The arguments with
        the indices so, and those blocks' tensors (written by the op; dropped once it is issued)."""
        name = facts.name
        indices = _indices_of(facts, args, kwargs)
        masks = [x for x in indices if _on_host(x) and x.dtype in (torch.bool, torch.uint8)]
        if masks and self._refs(masks):  # (pinned memory alone is the simulator's to check)
            self.rt.host_access(a, name, self._refs(masks), [], src)
        self.rt.host_waits_for_stream(a, s, f"stream {s.name} to take {name}'s host index (a blocking copy)")
        longs = [x for x in indices if _on_host(x) and not any(x is m for m in masks)]
        if longs and self._refs(longs):
            self.rt.host_access(a, name, self._refs(longs), [], src)
        expanded: list[Any] = []
        with no_dispatch():  # (host tensors: no simulated op)
            for x in indices:
                if not _on_host(x):
                    expanded.append(x)
                elif any(x is m for m in masks):
                    expanded += [i.clone() for i in x.nonzero().unbind(1)]
                else:
                    expanded.append(x.clone())
        moved = [self.new_device(_meta_of(x), a) for x in expanded if _on_host(x)]
        args, kwargs = _with_indices(facts, args, kwargs, expanded)
        return args, kwargs, moved

    def _index_on_the_host(self, a: HostActor, s: SimStream, func: Any, facts: OpFacts, args: tuple[Any, ...],
                           kwargs: dict[str, Any], src: str) -> Any:
        """A host tensor written at indices on the device (``cpu_table[ids] = 0``, ``index_put_``), as ATen's
        ``make_info`` takes them: each index moved to the host, a blocking D2H on the current stream (the host waits
        for it), then the op on the CPU. One stream operation, as a GPU run counts it: the D2H of the indices, which
        reads their values as it starts; then the op, the host's, on those values. A read at them (``cpu_table[ids]``,
        ``index``) is refused as torch refuses it (on an H100, docs/confirmations.md, twenty-eighth run)."""
        if func is aten.index.Tensor:
            raise RuntimeError(f"indices should be either on cpu or on the same device as the indexed tensor "
                               f"({args[0].device})")
        devs = [x for x in _indices_of(facts, args, kwargs) if isinstance(x, SimTensor)]
        aliases = [_alias_of(x) for x in devs]
        got: list[torch.Tensor] = []

        def start() -> None:  # (values even in a race-only run: the host's op needs them)
            got[:] = [al.clone() for al in aliases]

        desc = f"{facts.name} (D2H)"
        duration = self.config.copy_ns(sum(x.numel() * x.element_size() for x in devs), "d2h")
        index, rec = self.rt.enqueue(a, s, desc, duration, self._refs(devs), [], src, start=start)
        assert rec is not None
        if self.rt.sync_debug:
            self.rt.synchronizing()
        self.rt.host_waits_for(a, rec, f"stream {s.name} to finish {desc} #{index} (its indices, moved to the host)")
        host = dict(zip([id(x) for x in devs], got, strict=True))
        args, kwargs = _with_indices(facts, args, kwargs, [host.get(id(x), x) for x in _indices_of(facts, args,
                                                                                                  kwargs)])
        flat = _flat(args, kwargs)
        if any(isinstance(x, SimTensor) for x in flat):
            raise RuntimeError(f"{facts.name}: expected all tensors on the host, got a device tensor")
        pinned = [t for t in flat if self.rt.lookup_host(t) is not None]
        return self._on_the_host(a, func, facts, args, kwargs, flat, pinned, src)

    def _copies_through_host(self, a: HostActor, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                             outputs: list[torch.Tensor], staged: dict[int, torch.Tensor], source: str) -> bool:
        """A copy between pinned memory and the device that ATen makes through host temporaries
        (:func:`_through_host_temporaries`): a pinned source the host reads now is checked as the host's read and
        staged (the copy reads the staged bytes, as from pageable memory); whether the copy lands in a pageable
        temporary (the host waits for it). For ``_foreach_copy_``, each pair's ``copy_``."""
        if func is aten.copy_.default:
            pairs = [(args[0], args[1])]
        elif func is aten._foreach_copy_.default:
            pairs = list(zip(args[0], args[1], strict=False))
        elif len(args) == 1 and len(outputs) == 1:
            pairs = [(outputs[0], args[0])]
        else:
            return False
        into_pageable = False
        for dst, src in pairs:
            if not isinstance(dst, torch.Tensor) or not isinstance(src, torch.Tensor):
                continue
            host = src if isinstance(dst, SimTensor) else dst
            if isinstance(host, SimTensor) or self.rt.lookup_pinned(host) is None:
                continue
            reads_now, into_temporary = _through_host_temporaries(func, args, kwargs, dst, src)
            if reads_now:
                self.rt.host_access(a, classify(func).name, self._refs([src]), [], source)
                staged[id(src)] = src.clone() if self.config.values else src
            into_pageable = into_pageable or into_temporary
        return into_pageable

    def _narrow(self, facts: OpFacts, args: tuple[Any, ...], written: list[torch.Tensor],
                src: str) -> torch.Tensor | None:
        """An indexed write (:attr:`OpFacts.indexed`) reads and writes its destination only where its index says:
        those bytes are what its accesses cover (``Memory.narrowed``), where the index is known now. That is where
        the run has values and every write issued to the index (or mask) has landed: its bytes are what the op
        will read (a write issued later and unordered with the op is a race on the index, reported as such).
        Else the whole destination, as before. The elements it writes (a mask shaped as the destination) where it
        narrowed, else None."""
        dest = written[0] if len(written) == 1 else None
        if not isinstance(dest, SimTensor) or not self.config.values or dest.dim() == 0:
            return None
        memory = self.rt.memory
        assert facts.indexed is not None
        # (the index alone: a source still being copied, as a swapped-in block is, decides no element written)
        for x in _leaves_of(args[_INDEX_AT[facts.indexed]])[0]:
            if isinstance(x, SimTensor) and not memory.landed(x._st, x._data):
                self.rt.note(f"{facts.name} ({src}) was counted as reading and writing its whole destination: its "
                             "index was still being computed when it was issued (where it has landed, the rows it "
                             "names are counted); a race reported on bytes it does not write is that")
                return None
        data = dest._data
        try:
            mask = torch.zeros(data.shape, dtype=torch.bool, device="cpu")
            facts.indexed(mask, _unwrapped(args))
        except (RuntimeError, IndexError, TypeError, ValueError):
            return None  # (the op raises on these arguments itself: its run says it)
        got = footprint(dest._st, data, mask)
        if got is None:
            return None
        memory.narrowed[id(data)] = got
        return mask

    def _data_dependent(
        self,
        a: HostActor,
        s: SimStream,
        func: Any,
        facts: OpFacts,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        flat: list[torch.Tensor],
        src: str,
    ) -> Any:
        """An op whose output shape depends on its input values: as on CUDA, the host waits for the stream to
        compute it (it needs the size to allocate), then the output is written on the stream."""
        inputs, staged = self._inputs(func, facts, args, kwargs, flat, [])
        duration = self.config.kernel_ns(sum(x.numel() * x.element_size() for x in inputs))
        # its output's size comes from values, so it computes them even in a race-only run (what memory holds)
        eff = _Effect(self, func, _aliased(args), _aliased_kwargs(kwargs), [], staged, None, [], [],
                      compute=True)
        index, rec = self.rt.enqueue(a, s, facts.name, duration, self._refs(inputs), [], src, start=eff.start)
        assert rec is not None
        if self.rt.sync_debug:  # (its kernel launched, then the host reads the size: ATen's sync)
            self.rt.synchronizing()
        self.rt.host_waits_for(a, rec, f"stream {s.name} to finish {facts.name} #{index} (its output size)")
        values = eff.value
        result = _tree_map(lambda v: self.new_device(v, a) if isinstance(v, torch.Tensor) else v, values)
        outs = [(o, v) for o, v in zip(_leaves_of(result)[0], _leaves_of(values)[0], strict=True)
                if isinstance(o, torch.Tensor)]
        self.rt.device_writes(s, facts.name, index, self._refs([o for o, _ in outs]), src)
        with self.rt.device_side():
            self.rt.memory.in_flight.before_write([data_of(o) for o, _ in outs])
            for o, v in outs:
                data_of(o).copy_(v)
        return result

    def _pageable(self, outputs: list[torch.Tensor]) -> bool:
        return any(not isinstance(o, SimTensor) and self.rt.lookup_pinned(o) is None for o in outputs)

def _placeholder(func: Any, args: tuple[Any, ...]) -> Any:
    """What a host read of device memory gets in a race-only run, where no value is computed: True for a truth
    value (``equal``, ``allclose``, ``.item()`` of a bool), 0 for a number (``.item()``), None otherwise."""
    returns = func._schema.returns
    if not returns:
        return None
    kind = str(returns[0].type)
    x = next((a for a in args if isinstance(a, torch.Tensor)), None)
    if kind == "bool" or (x is not None and x.dtype == torch.bool):
        return True
    if kind == "int" or (x is not None and not x.is_floating_point() and not x.is_complex()):
        return 0
    return 0.0 if kind in ("float", "number") else None


def _overlap(reads: list[torch.Tensor], written: list[torch.Tensor]) -> bool:
    """Whether an input other than a destination itself shares bytes with a destination."""
    others = []
    for r in reads:  # (loops, not any() over a generator per read: asked for every in-place operation)
        for d in written:
            if r is d:
                break
        else:
            others.append(r)
    if not others:  # it reads nothing but its destinations (an in-place op on itself)
        return False
    spans = [span(w) for w in written]
    return any(overlap(span(r), w) for r in others for w in spans)


class _Effect:
    """What one stream operation does to the bytes: :meth:`start` when it starts, :meth:`finish` when it completes.

    It reads its inputs at its start; an in-place (or ``out=``) operation whose inputs do not overlap its destination
    reads them at its completion instead (``deferred``), which is the same unless a write lands on them in between
    (then :class:`~simdevice.runtime.memory.InFlight` kept what they held): no copy of the destination is held
    meanwhile. So does an operation that makes one new tensor where its op has an ``out=`` overload (``into``): it
    computes at its completion straight into its output's bytes (no result held, none copied into place). Any other
    operation computes at its start, on copies of what it mutates, and lands at its completion.
    In a race-only run (``SimConfig.values`` off) nothing is computed unless ``compute``: a host value is a
    placeholder (:func:`_placeholder`). ``args`` and ``kwargs`` are the op's, with aliases for device tensors and the
    CPU for devices (:func:`_aliased`)."""

    __slots__ = ("args", "compute", "copies", "deferred", "error", "func", "in_flight", "into", "kwargs", "land",
                 "mask", "outputs", "places", "reading", "reads", "seed", "staged", "value", "written")

    def __init__(self, ops: Dispatcher, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                 written: list[torch.Tensor], staged: dict[int, torch.Tensor], seed: int | None,
                 outputs: list[torch.Tensor], reads: list[torch.Tensor],
                 into: tuple[Any, str, frozenset[str]] | None = None, compute: bool = False) -> None:
        self.func, self.args, self.kwargs, self.seed = func, args, kwargs, seed
        #: ``outputs``: the new tensors it makes (aliases); ``reads``: the inputs it reads from device or pinned
        #: memory (aliases); ``into``: the ``out=`` overload it computes its one output with, at its completion, the
        #: name of its output argument, and the keywords left out of its call (``OpFacts.into``)
        self.written, self.staged, self.outputs, self.reads, self.into = written, staged, outputs, reads, into
        self.in_flight = ops.rt.memory.in_flight
        values = ops.config.values
        #: whether it computes at all (a race-only run computes only what the host must have), and lands its bytes
        self.compute = values or compute
        self.land = values
        self.value: Any = None
        self.copies: dict[int, torch.Tensor] = {}
        self.reading: Any = None
        #: for an indexed write whose index was known at issue (``Dispatcher._narrow``), the elements of its one
        #: destination it writes: it lands those alone, as its kernel writes no other (another stream's write to
        #: another row, landed meanwhile, stays)
        self.mask: torch.Tensor | None = None
        #: whether it reads its inputs at its completion (see the class)
        self.deferred = into is not None or (bool(written) and not _overlap(reads, written))
        #: what its computation raised, held for the host (:meth:`holding`)
        self.error: Exception | None = None
        #: for an op of several results, the places among the results' leaves that are :attr:`outputs` (the meta
        #: kernel's tensors), else None (:func:`_land`)
        self.places: tuple[int, ...] | None = None

    def again(self, seed: int | None = None) -> tuple[Callable[[], None], Callable[[], None]]:
        """The same operation computed afresh (a CUDA graph's replay of it), drawing from ``seed`` where it is random:
        its start and finish."""
        e = _Effect.__new__(_Effect)
        for name in ("func", "args", "kwargs", "written", "staged", "outputs", "reads", "into", "in_flight",
                     "compute", "land", "deferred", "mask", "places"):
            setattr(e, name, getattr(self, name))
        e.seed = seed if self.seed is not None else None
        e.value = e.reading = e.error = None
        e.copies = {}
        return e.start, e.finish

    def holding(self, step: Callable[[], None]) -> Callable[[], None]:
        """``step`` (:meth:`start` or :meth:`finish`) with what it raises held in :attr:`error` for the host, which
        raises it once it has waited for the op, instead of the stream (the first error alone: a computation that
        failed lands nothing)."""

        def held() -> None:
            if self.error is not None:
                return
            try:
                step()
            except Exception as e:  # (the op's own error, whatever its kind: the host raises it)
                self.error = e

        return held

    def start(self) -> None:
        if not self.compute:
            self.value = _placeholder(self.func, self.args)
            return
        if self.deferred:
            self.reading = self.in_flight.open(self.reads)
            return
        copies = {id(w): w.clone() for w in self.written}
        replace = {**self.staged, **copies} if self.staged else copies
        self.value = _run(self.func, self.args, self.kwargs, replace, self.seed)
        self.copies = copies

    def finish(self) -> None:
        if not self.land:
            return  # a race-only run: no bytes move
        written, in_flight = self.written, self.in_flight
        if self.deferred:
            reading = self.reading
            self.reading = None
            in_flight.close(reading)
            in_flight.before_write(written)  # others in flight reading the destination keep what it holds
            snaps = reading.snaps
            if not snaps or not any(id(w) in snaps for w in written):
                replace = {**self.staged, **snaps} if snaps else self.staged
                if self.into is None:
                    self.value = _run(self.func, self.args, self.kwargs, replace, self.seed)  # straight into place
                    return
                in_flight.before_write(self.outputs)  # (its output is new memory: no input is in it)
                op, name, options = self.into
                if id(self.func) not in _REFUSED:
                    kwargs = {k: v for k, v in self.kwargs.items() if k not in options} if options else self.kwargs
                    try:
                        _run(op, self.args, {**kwargs, name: self.outputs[0]}, replace, self.seed)
                        return
                    except Exception:  # an out= kernel that refuses what the op takes
                        _REFUSED.add(id(self.func))
                self.value = _run(self.func, self.args, self.kwargs, replace, self.seed)  # its result copied in
            else:  # a write landed on the destination it reads (a race): the start-time rule, on copies of it
                copies = {id(w): snaps[id(w)].clone() if id(w) in snaps else w.clone() for w in written}
                self.value = _run(self.func, self.args, self.kwargs, {**self.staged, **snaps, **copies}, self.seed)
                self.copies = copies
        in_flight.before_write(written or self.outputs)
        if written:
            copies = self.copies
            if self.mask is not None and copies:
                written[0].copy_(torch.where(self.mask, copies[id(written[0])], written[0]))
                return
            for w in written:
                w.copy_(copies[id(w)])
            return
        value = self.value
        if type(value) is torch.Tensor:
            self.outputs[0].copy_(value)
            return
        _land(self, value)


def _land(eff: _Effect, value: Any) -> None:
    """The results of an op of several computed on the CPU (``value``), landed in its outputs, shaped as CUDA's
    kernel (its meta kernel) shapes them. Where a CPU kernel leaves a result undefined or empty that CUDA's gives
    (``native_batch_norm_backward``'s ``grad_input`` where the input needs none; ``native_batch_norm``'s saved
    statistics in eval mode; ``_embedding_bag``'s ``offset2bag`` on its fast path), that output is not written (its
    bytes stay as the allocation left them), but what :data:`_FILLED` computes as CUDA does; where CUDA's is empty,
    nothing lands."""
    leaves = _leaves_of(value)[0]
    places = eff.places
    if places is not None and len(leaves) > max(places, default=-1):
        vals = [leaves[k] for k in places]
    else:
        vals = [v for v in leaves if isinstance(v, torch.Tensor)]
    for k, (o, v) in enumerate(zip(eff.outputs, vals, strict=True)):
        if isinstance(v, torch.Tensor) and v.shape == o.shape:
            o.copy_(v)
        elif o.numel():
            fill = _FILLED.get(eff.func.__name__.split(".")[0])
            if fill is not None and fill(eff, k, o, v):
                continue
            if isinstance(v, torch.Tensor) and v.numel():  # (not known to be harmless: not guessed at)
                raise NotImplementedError(
                    f"{eff.func.__name__}: its CPU kernel's result {k} is shaped {tuple(v.shape)}, CUDA's "
                    f"{tuple(o.shape)}: not simulated")


def _embedding_bag(eff: _Effect, k: int, out: torch.Tensor, got: Any) -> bool:
    """``_embedding_bag``'s results where CUDA's kernel shapes them otherwise than the CPU's: ``offset2bag`` (its
    second), the bag of each index, which the CPU kernel's sum and mean fast path leaves empty and the backward
    reads; ``bag_size`` (its third), one per offset on CUDA, one per bag on the CPU (with ``include_last_offset``:
    the last offset ends the last bag, and its count is not one), the counts landed in the bags' places and 0 past
    them (CUDA leaves that one unwritten; the CPU's backward, which the simulator runs, reads it)."""
    args = eff.args
    indices, offsets = args[1], args[2]
    last = args[7] if len(args) > 7 else eff.kwargs.get("include_last_offset", False)
    if k == 1:
        starts = (offsets[:-1] if last else offsets).contiguous()
        out.copy_(torch.searchsorted(starts, torch.arange(indices.numel(), dtype=starts.dtype), right=True) - 1)
        return True
    if k == 2 and isinstance(got, torch.Tensor) and got.dim() == 1 and got.numel() <= out.numel():
        out[:got.numel()].copy_(got)
        out[got.numel():].zero_()
        return True
    return False


#: the results a CPU kernel shapes otherwise than CUDA's, or leaves empty where CUDA's computes them, that a
#: program's later ops read: by the op's name, what lands them as CUDA's kernel writes them (True where it did)
_FILLED: dict[str, Callable[[_Effect, int, torch.Tensor, Any], bool]] = {
    "_embedding_bag": _embedding_bag, "_embedding_bag_forward_only": _embedding_bag}


#: the ops (by id, as ``_FACTS``) whose ``into`` overload refused what the op took: from then on each is computed as
#: it is (one refusal, and whatever warning its kernel prints, per op and process)
_REFUSED: set[int] = set()


def _run(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], replace: dict[int, torch.Tensor],
         seed: int | None) -> Any:
    """Run ``func`` on the CPU bytes (``args`` and ``kwargs`` as :func:`_aliased` made them), each tensor in
    ``replace`` (by id) standing for the one given."""
    if replace:

        def real(x: Any) -> Any:
            return replace.get(id(x), x) if isinstance(x, torch.Tensor) else x

        args, kwargs = _tree_map(real, args), _tree_map(real, kwargs)
    call = getattr(func, "_op", func)  # an OpOverload's own call is one Python frame around this
    if seed is None:
        return call(*args, **kwargs)
    with torch.random.fork_rng(devices=[]):  # a random op: its own generator, seeded when the host issued it
        # (the CPU generator alone: torch.manual_seed also seeds CUDA's, which in a drop-in session is the program's,
        # so that a random op computed late would reseed the numbers of those the program issues after it)
        torch.default_generator.manual_seed(seed)
        return call(*args, **kwargs)


def _alias_of(x: SimTensor) -> torch.Tensor:
    """The bytes of a simulated tensor as an alias that does not keep its block allocated (what a queued operation
    holds: the program's ``del`` frees the block as on a GPU), made once per tensor."""
    al = x._alias
    if al is None:
        al = x._alias = x._st.alias(x._data)
    return al


def _aliased(args: Any) -> Any:
    """An op's arguments (its positional tuple, its keywords, or a container among them) as its effect runs them:
    each simulated tensor as its alias (:func:`_alias_of`, made once per tensor), a device as the CPU."""
    t = type(args)
    if t is tuple or t is list or t is dict:  # the usual case, without a call per leaf
        out = []
        for x in args.values() if t is dict else args:
            if isinstance(x, SimTensor):
                al = x._alias  # (_alias_of, inline: every op's arguments come here)
                out.append(al if al is not None else _alias_of(x))
            elif isinstance(x, torch.device):
                out.append(CPU)
            elif isinstance(x, _NODES):
                out.append(_aliased(x))
            else:
                out.append(x)
        if t is dict:
            return dict(zip(args, out, strict=True))
        return tuple(out) if t is tuple else out

    def one(x: Any) -> Any:
        if isinstance(x, SimTensor):
            return _alias_of(x)
        if isinstance(x, torch.device):
            return CPU
        return x

    return _tree_map(one, args)


def _aliased_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """An op's keywords as :func:`_aliased` makes them, the device the CPU (a None one too), ``pin_memory`` left out
    (its effect's bytes are the device's or the caller's own)."""
    out: dict[str, Any] = _aliased(kwargs)
    if "device" in out:
        out["device"] = CPU
    out.pop("pin_memory", None)
    return out


def _host_aliased(flat: list[torch.Tensor], outputs: list[torch.Tensor], args: tuple[Any, ...],
                  kwargs: dict[str, Any], written: list[torch.Tensor], outputs_held: list[torch.Tensor],
                  reads: list[torch.Tensor], staged: dict[int, torch.Tensor]) -> tuple[
                      tuple[Any, ...], dict[str, Any], list[torch.Tensor], list[torch.Tensor], list[torch.Tensor],
                      dict[int, torch.Tensor]]:
    """What an effect holds of an operation touching host memory (the arguments, the written tensors, the outputs,
    the reads, the staged copies, each as :func:`_aliased` made it): each host tensor of the program's (``flat``,
    ``outputs``) as an alias of its bytes, a tensor object of the simulator's, as a device tensor's is: a copy in
    flight moves the bytes it was given, whatever becomes of the program's object meanwhile (``p.data = t``, or
    ``module.to`` moving a parameter between the host and the device in place, :func:`move_in_place`)."""
    memo: dict[int, torch.Tensor] = {}
    with no_dispatch():
        for x in (*flat, *outputs):
            if not isinstance(x, SimTensor) and id(x) not in memo:
                memo[id(x)] = x.detach()
    if not memo:
        return args, kwargs, written, outputs_held, reads, staged

    def one(x: Any) -> Any:
        return memo.get(id(x), x) if isinstance(x, torch.Tensor) else x

    held_written = [one(w) for w in written]
    return (_tree_map(one, args), _tree_map(one, kwargs), held_written,
            held_written if outputs_held is written else [one(o) for o in outputs_held], [one(r) for r in reads],
            {id(memo[k]) if k in memo else k: v for k, v in staged.items()} if staged else staged)


def _all_aliased(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each of ``tensors`` as :func:`_aliased` makes it (a simulated one's alias is the one its arguments' has)."""
    return [_alias_of(t) if isinstance(t, SimTensor) else t for t in tensors]


#: torch's own ``Tensor.record_stream`` (:meth:`SimTensor.record_stream` follows a replacement of it)
_TORCH_RECORD_STREAM = torch.Tensor.record_stream

#: the fake tensor mode torch has on, or None (``torch._C._get_dispatch_mode`` of its key)
_FAKE_MODE = functools.partial(torch._C._get_dispatch_mode, torch._C._TorchDispatchModeKey.FAKE)
#: the functional tensor mode torch has on, or None; and its tensors' class (an op on them, which that mode alone
#: runs, comes to the simulator's mode first: the infra modes are below it)
_FUNCTIONAL_MODE = functools.partial(torch._C._get_dispatch_mode, torch._C._TorchDispatchModeKey.FUNCTIONAL)
_FUNCTIONAL_TENSOR = torch._subclasses.functional_tensor.FunctionalTensor
#: the proxy tensor mode torch has on (``make_fx``'s tracing), or None
_PROXY_MODE = functools.partial(torch._C._get_dispatch_mode, torch._C._TorchDispatchModeKey.PROXY)


class SimMode(TorchDispatchMode):
    """Routes every aten op made in a simulated actor through a :class:`Dispatcher`."""

    def __init__(self, ops: Dispatcher) -> None:
        super().__init__()
        self.ops = ops

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        # (the device's own work on its bytes never comes here: Execution turns Python dispatch off for it)
        if _FAKE_MODE() is not None:
            # torch's fake tensor mode is on (DTensor's sharding propagation shapes an op's output so, as
            # torch.compile's tracing does): an infrastructure mode, below this one on the stack, whose tensors have
            # no bytes; the op is its, as on a GPU, where no kernel runs (with this mode off, the call goes to it)
            return func(*args, **(kwargs or {}))
        if _PROXY_MODE() is not None:
            raise NotImplementedError(
                "torch's proxy tensor mode (make_fx, as torch.compile's and export's tracing enter it) in a run is not "
                "simulated: its infra mode sits below the simulator's")
        for t in types:
            if t is not SimTensor and dispatches_itself(t):
                if t is _FUNCTIONAL_TENSOR and _FUNCTIONAL_MODE() is not None:
                    raise NotImplementedError(
                        "torch's functional tensor mode (FunctionalTensorMode, as AOTAutograd's tracing enters it) "
                        "in a run is not simulated: its infra mode sits below the simulator's")
                # a tensor subclass of the program's or a library's (a wrapper over device tensors, as DTensor,
                # torchao's quantized tensors or a user's own): its __torch_dispatch__ takes the op first, with
                # this mode still current, and the ops it makes on the tensors it wraps come back here
                return NotImplemented
        facts = classify(func)
        if facts.handler is not None:
            with self:
                return facts.handler(func, args if type(args) is tuple else tuple(args), kwargs or {})
        if facts.composite:
            # an op autograd decomposes on its way here, which comes whole where autograd is skipped (under
            # inference mode, ``to``): decomposed as autograd would, its parts come here one by one (``to`` as the
            # ``_to_copy`` a copy is, or the tensor itself, never a view of it)
            with self:
                return func.decompose(*args, **(kwargs or {}))
        return self.ops.dispatch(func, args if type(args) is tuple else tuple(args), kwargs if kwargs else {})


# TorchDispatchMode wraps a subclass's __torch_dispatch__ in torch._disable_dynamo, whose first call imports
# torch._dynamo (about 1 s of every command's start); nothing the simulator runs is compiled, so the plain method.
SimMode.__torch_dispatch__ = getattr(  # type: ignore[method-assign]
    SimMode.__torch_dispatch__, "__wrapped__", SimMode.__torch_dispatch__)
