"""Simulated device tensors: aten ops become operations on simulated streams.

``SimTensor`` is a wrapper subclass reporting device ``meta`` (on the CPU
build a wrapper that claims ``cuda`` trips device-guard checks outside the
dispatcher; ``meta`` supports slicing, views and arithmetic). Its bytes live
in a CPU tensor that is a view of a :class:`~simdevice.memory.Storage`.

A :class:`SimMode` dispatch mode is active in every simulated host actor and
sees every aten op there:

- views run at once on the backing data (they alias, as on a GPU);
- allocations (``empty``) make a new storage filled with poison (NaN, or the
  integer maximum), so a read of memory nobody wrote is visible;
- every other op on device data is a host step that enqueues a stream
  operation on the actor's current stream; its output is allocated at once
  (shape from running the op on meta tensors, cached per signature) and the
  op's effect is applied to the backing data when the scheduler runs it:
  inputs are read when it starts, outputs written when it completes;
- copies: to or from pinned host memory with ``non_blocking=True`` they are
  asynchronous; without it, or to pageable host memory (``.cpu()``,
  ``.item()``, a plain CPU destination), the host waits for the copy, as
  CUDA does; from pageable memory the source is read at issue, as CUDA's
  staging does;
- plain CPU ops that touch pinned memory the simulator owns are host steps
  too, checked as host accesses.

Random ops on device data are refused: make values on the host and copy
them, so a run depends on its schedule alone.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from reference.device import op_kind
from simdevice.memory import Storage
from simdevice.report import Access
from simdevice.streams import StreamOp

if TYPE_CHECKING:
    from simdevice.scheduler import HostActor, Scheduler
    from simdevice.streams import SimStream

aten = torch.ops.aten
META = torch.device("meta")
CPU = torch.device("cpu")

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
_WRITE_ONLY_SELF = frozenset({aten.copy_.default, aten.fill_.Scalar, aten.fill_.Tensor, aten.zero_.default})

#: frames of the simulator itself, torch and the standard library: never the program's source line
_SKIP_FILES = (
    *(f"/simdevice/{m}.py" for m in ("tensor", "scheduler", "device", "collectives", "memsaver", "memory", "streams")),
    *("/torch/", "/reference/device.py", "<frozen", "/contextlib.py", "/threading.py"),
)


def _user_source() -> str:
    """The first frame outside the simulator and torch: where the program made this call."""
    f = sys._getframe(2)
    while f is not None:
        name = f.f_code.co_filename.replace("\\", "/")
        if not any(s in name for s in _SKIP_FILES):
            return f"{'/'.join(name.split('/')[-2:])}:{f.f_lineno}"
        f = f.f_back  # type: ignore[assignment]
    return "?"


class SimTensor(torch.Tensor):
    """A tensor on the simulated device: a ``meta`` wrapper around CPU bytes."""

    _data: torch.Tensor
    _st: Storage

    @staticmethod
    def __new__(cls, data: torch.Tensor, st: Storage) -> SimTensor:
        r = torch.Tensor._make_wrapper_subclass(
            cls,
            data.shape,
            strides=data.stride(),
            storage_offset=data.storage_offset(),
            dtype=data.dtype,
            device=META,
            requires_grad=False,
        )
        r._data = data
        r._st = st
        return r  # type: ignore[no-any-return]

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        raise RuntimeError(
            f"{func} on a simulated device tensor outside SimDevice.run: "
            "use simdevice.peek(t) to read one after the run"
        )

    def tolist(self) -> Any:  # torch refuses tolist() on subclasses; on CUDA it is a synchronizing D2H
        return self.cpu().tolist()

    def __repr__(self) -> str:  # never syncs: printing must not change the schedule
        return f"SimTensor({tuple(self.shape)}, {self.dtype}, {self._st.label})"


def peek(t: torch.Tensor) -> torch.Tensor:
    """The current bytes of a simulated tensor as a CPU tensor (for tests, after a run)."""
    return t._data.clone() if isinstance(t, SimTensor) else t.clone()


def _non_blocking(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a copy op was asked for ``non_blocking=True`` (``copy_``'s third argument, or a keyword)."""
    if func is aten.copy_.default and len(args) > 2:
        return bool(args[2])
    return bool(kwargs.get("non_blocking", False))


def _poison(t: torch.Tensor) -> None:
    if t.dtype.is_floating_point or t.dtype.is_complex:
        t.fill_(math.nan)
    elif t.dtype == torch.bool:
        t.fill_(True)
    else:
        t.fill_(torch.iinfo(t.dtype).max)


def _is_meta_device(d: Any) -> bool:
    return d is not None and torch.device(d).type == "meta"


def _meta_of(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=META)
    if isinstance(x, torch.device):
        return META
    return x


def _sig(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return ("T", tuple(x.shape), tuple(x.stride()), x.dtype)
    if isinstance(x, (list, tuple)):
        return tuple(_sig(y) for y in x)
    if isinstance(x, (int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format)):
        return x
    return repr(x)


class TensorOps:
    """Turns aten calls made inside simulated actors into stream operations and host steps."""

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched
        self.config = sched.config
        self.memory = sched.memory
        self._meta_cache: dict[Any, Any] = {}
        #: called with every new device storage (the memory saver tags and maps it)
        self.on_alloc: Callable[[Storage], None] | None = None
        #: the caching allocator: bytes shaped like a tensor, as (tensor data, an alias for the storage
        #: record that does not keep the tensor's bytes alive); None: fresh CPU bytes for every allocation
        self.allocate: Callable[[torch.Tensor, str], tuple[torch.Tensor, torch.Tensor]] | None = None

    # -- storages ---------------------------------------------------------------------
    def _new_device(self, like: torch.Tensor, process: str) -> SimTensor:
        if self.allocate is not None:
            data, record = self.allocate(like, process)
        else:
            data = record = torch.empty_strided(like.shape, like.stride(), dtype=like.dtype)
        _poison(data)
        st = self.memory.register(record, "device", process)
        if self.on_alloc is not None:
            self.on_alloc(st)
        return SimTensor(data, st)

    def new_pinned(self, data: torch.Tensor, process: str) -> torch.Tensor:
        self.memory.register(data, "pinned", process)
        return data

    def _storage_of(self, t: torch.Tensor) -> Storage | None:
        if isinstance(t, SimTensor):
            return t._st
        return self.memory.lookup(t)

    @staticmethod
    def _data(x: Any) -> Any:
        return x._data if isinstance(x, SimTensor) else x

    # -- entry point ----------------------------------------------------------------------
    def dispatch(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        kind = op_kind(func)
        flat, _ = tree_flatten((args, kwargs))
        has_sim = any(isinstance(x, SimTensor) for x in flat)
        if not has_sim and not _is_meta_device(kwargs.get("device")):
            return self._host_op(func, args, kwargs, flat)
        if kind == "view":
            base = next(x for x in flat if isinstance(x, SimTensor))
            out = func(*tree_map(self._data, args), **tree_map(self._data, kwargs))
            return tree_map(lambda t: SimTensor(t, base._st) if isinstance(t, torch.Tensor) else t, out)
        if kind == "alloc":
            kw = dict(tree_map(self._data, kwargs))
            kw["device"] = CPU
            kw.pop("pin_memory", None)
            like = func(*tree_map(self._data, args), **kw)
            return self._new_device(like, self.sched.current().name)
        if kind == "meta":
            if func is aten.is_pinned.default:
                return False
            return None if func is aten.record_stream.default else func(*tree_map(self._data, args), **kwargs)
        if torch.Tag.nondeterministic_seeded in func.tags:
            raise RuntimeError(
                f"{func}: random ops on the simulated device are not supported; "
                "make the values on the host and copy them"
            )
        return self._stream_op(func, args, kwargs, flat)

    # -- host ops (no device tensor involved) -------------------------------------------------
    def _host_op(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], flat: list[Any]) -> Any:
        actor = self.sched.current_or_none()
        if kwargs.get("pin_memory") and actor is not None:
            kw = dict(kwargs)
            kw["pin_memory"] = False
            out = func(*args, **kw)
            if op_kind(func) == "alloc":
                _poison(out)
            return self.new_pinned(out, actor.name)
        if func is aten.is_pinned.default:
            return self.memory.lookup(args[0]) is not None
        if func is aten._pin_memory.default and actor is not None:
            return self.new_pinned(args[0].clone(), actor.name)
        pinned = [(t, st) for t in flat if isinstance(t, torch.Tensor) and (st := self.memory.lookup(t)) is not None]
        if not pinned or actor is None or op_kind(func) in ("view", "alloc", "meta"):
            return func(*args, **kwargs)
        # A host step touching pinned memory: check it as a host access, then run it now.
        a = self.sched.host_step(func.__name__)
        src = _user_source()
        written = self._written(func, args, kwargs)
        for t, st in pinned:
            if any(t is w for w in written):
                continue
            acc = self._access(a.name, a.clock.get(a.name), func.__name__, -1, "read", st, t, src, 0, "host")
            if self.memory.check_mapped(st, acc):
                expected = self.memory.issue_read(st, acc, a.clock)
                self.memory.execute_read(st, acc, expected, self.sched.now)
        for t in written:
            st = self.memory.lookup(t)
            if st is None:
                continue
            acc = self._access(a.name, a.clock.get(a.name), func.__name__, -1, "write", st, t, src, 0, "host")
            if self.memory.check_mapped(st, acc):
                wid = self.memory.issue_write(st, acc, a.clock)
                self.memory.execute_write(st, acc.lo, acc.hi, wid)
        self.sched.progress()
        return func(*args, **kwargs)

    # -- stream ops ---------------------------------------------------------------------------
    @staticmethod
    def _written(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
        out = []
        for i, a in enumerate(func._schema.arguments):
            if a.alias_info is not None and a.alias_info.is_write:
                v = args[i] if i < len(args) and not a.kwarg_only else kwargs.get(a.name)
                if isinstance(v, torch.Tensor):
                    out.append(v)
                elif isinstance(v, (list, tuple)):
                    out += [x for x in v if isinstance(x, torch.Tensor)]
        return out

    def _meta_outputs(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if func is aten._to_copy.default:
            x = args[0]
            shape_like = torch.empty_strided(x.shape, x.stride(), dtype=kwargs.get("dtype") or x.dtype, device=META)
            return shape_like
        key = (func, _sig(args), _sig(kwargs))
        out = self._meta_cache.get(key)
        if out is None:
            out = func(*tree_map(_meta_of, args), **tree_map(_meta_of, kwargs))
            self._meta_cache[key] = out
        return out

    def _access(
        self,
        actor: str,
        epoch: int,
        op: str,
        index: int,
        kind: str,
        st: Storage,
        t: torch.Tensor,
        src: str,
        version: int,
        on: str = "stream",
    ) -> Access:
        lo, hi = st.byte_range(self._data(t))
        return Access(actor, epoch, op, index, kind, st.label, lo, hi, src, version, on)  # type: ignore[arg-type]

    def _stream_op(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], flat: list[Any]) -> Any:
        name = func.__name__.split(".")[0]
        a: HostActor = self.sched.host_step(name)
        return self.issue(a, a.current_stream, func, args, kwargs, flat, name, _user_source())

    def issue(
        self,
        a: HostActor,
        s: SimStream,
        func: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        flat: list[Any],
        name: str,
        src: str,
    ) -> Any:
        """Enqueue one aten op on stream ``s`` for host actor ``a`` (its host step already taken)."""
        written = self._written(func, args, kwargs)
        is_copy = func in (aten.copy_.default, aten._to_copy.default)

        # Outputs: the mutated arguments, or fresh allocations shaped by the meta kernel.
        host_out: torch.Tensor | None = None
        outputs: list[torch.Tensor] = []
        result: Any = None
        if not any("Tensor" in str(r.type) for r in func._schema.returns):
            pass  # a host value (.item(), equal): the host will wait for it
        elif written:
            outputs = written
            result = args[0] if func._schema.returns else None
            if len(written) > 1 or (func._schema.returns and not isinstance(result, torch.Tensor)):
                result = written if len(written) > 1 else written[0]
        else:
            meta = self._meta_outputs(func, args, kwargs)
            to_host = func is aten._to_copy.default and kwargs.get("device") is not None and not _is_meta_device(
                kwargs["device"]
            )
            if to_host:
                host_out = torch.empty_strided(meta.shape, meta.stride(), dtype=meta.dtype)
                _poison(host_out)
                if kwargs.get("pin_memory"):
                    self.new_pinned(host_out, a.name)
                result = host_out
            else:
                result = tree_map(
                    lambda m: self._new_device(m, a.name) if isinstance(m, torch.Tensor) else m, meta
                )
            outputs = [x for x in tree_flatten(result)[0] if isinstance(x, torch.Tensor)]

        # Inputs: every tensor argument that is read (pageable host memory is read now, at issue).
        not_read = set()
        if func in _INPUT_NOT_READ:
            not_read = {id(x) for x in flat}
        elif func in _WRITE_ONLY_SELF:
            not_read = {id(args[0])}
        else:
            not_read = {id(x) for x in written if func._schema.name.endswith("out") or "out" in kwargs}
        inputs = [x for x in flat if isinstance(x, torch.Tensor) and id(x) not in not_read]
        staged: dict[int, torch.Tensor] = {}
        for x in inputs:
            if isinstance(x, SimTensor):
                continue
            if x.dim() > 0 and not is_copy:  # as on CUDA: only copies cross devices
                raise RuntimeError(
                    f"{name}: expected all tensors on the device, got a host tensor of shape {tuple(x.shape)}"
                )
            if self.memory.lookup(x) is None:
                staged[id(x)] = x.clone()

        # Happens-before: the op is ordered after what its stream and its host did before.
        s.clock.join(a.clock)
        epoch = s.clock.tick(s.name)
        index = s.ops
        s.ops += 1
        host_touch = any(not isinstance(x, SimTensor) for x in inputs + outputs)
        desc = name
        if is_copy and host_touch:
            desc += " (D2H)" if any(not isinstance(o, SimTensor) for o in outputs) else " (H2D)"
        nbytes = sum(x.numel() * x.element_size() for x in inputs + outputs)
        if host_touch:
            duration = self.config.copy_ns(sum(o.numel() * o.element_size() for o in outputs))
        else:
            duration = self.config.kernel_ns(nbytes)
        op = StreamOp(s, f"{desc} #{index}", index, duration)
        for x in inputs:
            st = self._storage_of(x)
            if st is not None:
                acc = self._access(s.name, epoch, desc, index, "read", st, x, src, 0)
                expected = self.memory.issue_read(st, acc, s.clock)
                op.reads.append((st, acc, expected))
        for x in outputs:
            st = self._storage_of(x)
            if st is not None:
                acc = self._access(s.name, epoch, desc, index, "write", st, x, src, 0)
                op.writes.append((st, acc, self.memory.issue_write(st, acc, s.clock)))

        # Effects: compute from the inputs as they are at start, land the outputs at completion.
        box: dict[str, Any] = {}
        op.start = self._starter(func, args, kwargs, written, staged, box)
        op.finish = self._finisher(written, outputs, box)
        self.sched.enqueue(s, op)

        blocking_copy = is_copy and host_touch and not _non_blocking(func, args, kwargs)
        if not outputs or blocking_copy or self._pageable(outputs):
            # The host waits for results it reads itself (.cpu(), .item(), a pageable destination) and for
            # a copy to or from host memory without non_blocking=True (CUDA synchronizes its stream then).
            pos = op.position
            self.sched.block(a, f"stream {s.name} to finish {desc} #{index}", lambda: s.completed >= pos)
            a.clock.join(s.clock)
            if not outputs:
                return box["value"]
        return result

    def _pageable(self, outputs: list[torch.Tensor]) -> bool:
        return any(not isinstance(o, SimTensor) and self.memory.lookup(o) is None for o in outputs)

    def _starter(
        self,
        func: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        written: list[torch.Tensor],
        staged: dict[int, torch.Tensor],
        box: dict[str, Any],
    ) -> Callable[[], None]:
        written_ids = {id(w) for w in written}

        def start() -> None:
            # Inputs are read now; mutated arguments are computed on copies that land at completion.
            copies: dict[int, torch.Tensor] = {}

            def snap(x: Any) -> Any:
                if isinstance(x, torch.Tensor):
                    if id(x) in staged:
                        return staged[id(x)]
                    if id(x) in written_ids:
                        if id(x) not in copies:
                            copies[id(x)] = self._data(x).clone()
                        return copies[id(x)]
                    return self._data(x)
                if isinstance(x, torch.device):
                    return CPU
                return x

            real_args = tree_map(snap, args)
            real_kwargs = tree_map(snap, kwargs)
            if "device" in real_kwargs:
                real_kwargs["device"] = CPU
            real_kwargs.pop("pin_memory", None)
            box["value"] = func(*real_args, **real_kwargs)
            box["copies"] = copies

        return start

    def _finisher(
        self, written: list[torch.Tensor], outputs: list[torch.Tensor], box: dict[str, Any]
    ) -> Callable[[], None]:
        def finish() -> None:
            if written:
                for w in written:
                    self._data(w).copy_(box["copies"][id(w)])
                return
            vals = [v for v in tree_flatten(box["value"])[0] if isinstance(v, torch.Tensor)]
            for o, v in zip(outputs, vals, strict=True):
                self._data(o).copy_(v)

        return finish


class SimMode(TorchDispatchMode):
    """Routes every aten op made in a simulated actor through :class:`TensorOps`."""

    def __init__(self, ops: TensorOps) -> None:
        super().__init__()
        self.ops = ops

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if self.ops.sched.in_engine:
            return func(*args, **(kwargs or {}))
        return self.ops.dispatch(func, tuple(args), dict(kwargs or {}))
