"""``torch.nn.parallel.DistributedDataParallel`` in a run: the broadcasts and the gradient all-reduce torch's makes
(its C++ ``Reducer``'s), made of the simulated process group's operations, on the streams torch's runs them on.

torch's DDP cannot take the simulated group (its construction and its reducer call C++ functions that take a real
process group), so in a run its ``__init__``, ``forward`` and ``no_sync`` are these (the class stays torch's, so a
name the program bound at import makes one too):

- construction: every parameter and buffer broadcast from rank 0 (``_sync_module_states``; blocking: the current
  stream waits for each; none with ``init_sync=False``, no buffer with ``broadcast_buffers=False`` alone); the
  parameters that need a gradient in one bucket per dtype, in reverse order, as torch's reducer starts without
  ``find_unused_parameters`` (it rebuilds its buckets after the first iteration, by the order the gradients came
  in; this one keeps them: a bucket's all-reduce starts when its last gradient is in, later than a rebuilt one's
  may);
- ``forward``: the buffers broadcast from rank 0 first (``forward_sync_buffers``, else the deprecated
  ``broadcast_buffers``, where the module has any), a host
  tensor among the inputs moved to the module's device where ``device_ids`` names it (a blocking copy, as torch's
  ``_to_kwargs`` makes from the host), the module called; with grad enabled and outside ``no_sync()``, the next
  backward reduces;
- backward: as each parameter's gradient is accumulated (a post-accumulate hook, on the stream its backward op ran
  on), it is copied into its bucket divided by the world's size (one ``mul`` into the bucket's view, as the
  reducer's ``mark_variable_ready_dense``); a bucket whose every gradient is in is all-reduced at once
  (``async_op``, on the ``nccl`` stream, after the issuing stream); at the backward's end (the engine's final
  callback, the caller's stream current) the current stream waits for each bucket's work and each gradient is
  copied back from its bucket; with ``gradient_as_bucket_view``, a gradient becomes its bucket's slot instead
  (copied there once, accumulated there by autograd after), divided there in place, and is not copied back;
- a communication hook (``register_comm_hook(state, hook)``: ``allreduce_hook``, ``fp16_compress_hook``, a
  program's own) reduces each full bucket in place of the all-reduce: the gradients are copied into the bucket
  undivided, the hook is called with a ``GradBucket`` (``buffer()``, ``gradients()``, ``parameters()``, ``index()``,
  ``is_last()``, ``set_buffer()``) as the bucket fills, and at the backward's end its future is waited for (the
  current stream after the stream its value was written on: a ``then`` callback's, from the pool) and its tensor
  copied into the gradients (into the bucket's slots first, with ``gradient_as_bucket_view``);
- a backward that left a bucket unreduced (a parameter that got no gradient) makes the next forward raise torch's
  "Expected to have finished reduction in the prior iteration" error;
- with ``find_unused_parameters``: the parameters the forward's outputs do not reach are marked ready at the
  backward's first hook (their slots zeroed), the map of what each rank used is all-reduced after the last bucket
  and read by the host at the backward's end (a blocking copy), and a parameter no rank used keeps its gradient
  (None), one another rank used gets the bucket's (the world's mean).

Not simulated (``NotImplementedError``, no verdict): ``static_graph``, ``skip_all_reduce_unused_params``,
``delay_all_reduce_named_params``, ``param_to_hook_all_reduce``, ``mixed_precision``, ``device_mesh``, the built-in
(C++) comm hooks (``_register_builtin_comm_hook``), ``join``, a module with parameters on the host. The parameters and
buffers ``_set_params_and_buffers_to_ignore_for_model`` names are left alone. A run that wraps a model is not
replayed on a GPU: torch's reducer makes its copies in other operations (a bucket's rebuild after the first
iteration, ...), so a schedule's indices would not mean the same operations there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.utils._pytree as pytree
from torch._utils import _get_device_index


class _Bucket:
    def __init__(self, params: list[torch.Tensor]) -> None:
        self.params = params
        self.offsets: list[int] = []
        n = 0
        for p in params:
            self.offsets.append(n)
            n += p.numel()
        self.flat = torch.zeros(n, dtype=params[0].dtype, device=params[0].device)

    def view(self, k: int, flat: torch.Tensor | None = None) -> torch.Tensor:
        """Parameter ``k``'s slot in the bucket's buffer, or in ``flat``, a tensor laid out as it (a hook's result)."""
        p = self.params[k]
        flat = self.flat if flat is None else flat
        return flat[self.offsets[k]:self.offsets[k] + p.numel()].view(p.shape)


class _GradBucket:
    """``torch.distributed.GradBucket`` as the reducer hands one to a communication hook: its index, its flat buffer
    (the bucket's gradients, undivided), their views, its parameters, whether it is the last; ``set_buffer`` changes
    this object's buffer alone, as torch's (a wrapper hook hands its inner hook a cast of it)."""

    def __init__(self, index: int, count: int, bucket: _Bucket) -> None:
        self._index, self._count, self._bucket = index, count, bucket
        self._buffer = bucket.flat

    def index(self) -> int:
        return self._index

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def set_buffer(self, tensor: torch.Tensor) -> None:
        self._buffer = tensor

    def gradients(self) -> list[torch.Tensor]:
        return [self._bucket.view(k, self._buffer) for k in range(len(self._bucket.params))]

    def parameters(self) -> list[torch.Tensor]:
        return list(self._bucket.params)

    def is_last(self) -> bool:
        return self._index == self._count - 1


def _hook_result(value: Any, bucket: _Bucket) -> torch.Tensor:
    """What a communication hook's future gave, as torch's reducer takes it (``parseHookResult``): one tensor, of the
    bucket's size."""
    if not isinstance(value, torch.Tensor):
        raise RuntimeError(f"a DDP communication hook's future must hold a tensor (the bucket's reduced gradients), "
                           f"got {type(value).__name__}")
    if value.numel() != bucket.flat.numel():
        raise RuntimeError(f"a DDP communication hook's result has {value.numel()} elements, its bucket "
                           f"{bucket.flat.numel()}")
    return value


class _Reducer:
    """The gradient all-reduce of one DDP module (:mod:`simdevice.dropin.ddp`)."""

    def __init__(self, params: list[torch.Tensor], group: Any, find_unused: bool = False,
                 as_view: bool = False) -> None:
        self.group = group
        self.world = dist.get_world_size(group)
        self.params = params
        self.find_unused = find_unused
        self.as_view = as_view
        self.unused: list[torch.Tensor] = []  # this forward's parameters its outputs' graph does not reach
        self.used_map: torch.Tensor | None = None
        self.used_work: Any = None
        self.buckets = _assign(params)
        self.where: dict[int, tuple[int, int]] = {}
        for b, bucket in enumerate(self.buckets):
            for k, p in enumerate(bucket.params):
                self.where[id(p)] = (b, k)
                p.register_post_accumulate_grad_hook(self._ready)
        self.expecting = False  # a forward under grad, with sync, came since the last finalize
        self.in_flight = False  # a backward's reduction started and did not finish
        self.ready: list[int] = []
        self.works: list[Any] = []
        self.queued = False
        #: the communication hook and its state (``register_comm_hook``), which reduces each bucket in place of the
        #: all-reduce: the reducer then leaves the gradients undivided
        self.hook: tuple[Any, Any] | None = None

    def prepare(self) -> None:
        """A forward that the next backward reduces (``prepare_for_backward``)."""
        if self.in_flight:
            raise RuntimeError(
                "Expected to have finished reduction in the prior iteration before starting a new one. This error "
                "indicates that your module has parameters that were not used in producing loss. You can enable unused "
                "parameter detection by passing the keyword argument `find_unused_parameters=True` to "
                "`torch.nn.parallel.DistributedDataParallel`, and by making sure all `forward` function outputs "
                "participate in calculating loss.")
        self.expecting = True
        self.ready = [0] * len(self.buckets)
        self.works = [None] * len(self.buckets)
        self.queued = False
        self.unused = []
        self.used_work = None

    def outputs(self, out: Any) -> None:
        """``find_unused_parameters``: the parameters the forward's outputs do not reach through their graph (torch's
        reducer searches it from the outputs in ``prepare_for_backward``): marked ready at the backward's first
        hook, their bucket slots zeroed, so that the buckets fill."""
        if not self.find_unused:
            return
        reached: set[int] = set()
        seen: set[Any] = set()
        stack = []
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                if t.grad_fn is not None:
                    stack.append(t.grad_fn)
                elif t.requires_grad:
                    reached.add(id(t))
        while stack:
            fn = stack.pop()
            if fn is None or fn in seen:
                continue
            seen.add(fn)
            variable = getattr(fn, "variable", None)  # (an AccumulateGrad node: the parameter it accumulates into)
            if variable is not None:
                reached.add(id(variable))
            stack.extend(f for f, _ in fn.next_functions)
        self.unused = [p for p in self.params if id(p) not in reached]

    def _ready(self, p: torch.Tensor) -> None:
        if not self.expecting or p.grad is None:
            return
        self.in_flight = True
        if not self.queued:
            self.queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finalize)
            for q in self.unused:  # (torch's reducer marks them at the first hook: their slots zeroed)
                b, k = self.where[id(q)]
                self.buckets[b].view(k).zero_()
                self._bucket_ready(b)
        b, k = self.where[id(p)]
        view = self.buckets[b].view(k)
        # copied into its slot divided by the world's size, in one op (as ``mark_variable_ready_dense``), or as it is
        # where a communication hook reduces; with ``gradient_as_bucket_view`` the gradient becomes its slot, and once
        # it is, divided there in place (not by a hook's reducer)
        if not _aliases(p.grad, view):
            if self.hook is None:
                torch.mul(p.grad, 1.0 / self.world, out=view)
            else:
                view.copy_(p.grad)
            if self.as_view:
                p.grad = view
        elif self.hook is None:
            view.div_(self.world)
        self._bucket_ready(b)

    def _bucket_ready(self, b: int) -> None:
        """One more slot of bucket ``b`` is in: a full bucket is all-reduced; after the last, with
        ``find_unused_parameters``, the map of the parameters each rank used (torch's ``local_used_map``)."""
        bucket = self.buckets[b]
        self.ready[b] += 1
        if self.ready[b] != len(bucket.params):
            return
        if self.hook is None:
            self.works[b] = dist.all_reduce(bucket.flat, group=self.group, async_op=True)
        else:  # (its future: waited for at the backward's end)
            hook, state = self.hook
            self.works[b] = hook(state, _GradBucket(b, len(self.buckets), bucket))
        if self.find_unused and all(w is not None for w in self.works):
            unused = {id(q) for q in self.unused}
            used = torch.tensor([0 if id(q) in unused else 1 for q in self.params], dtype=torch.int32,
                                pin_memory=True)
            self.used_map = used.to(bucket.flat.device, non_blocking=True)
            self.used_work = dist.all_reduce(self.used_map, group=self.group, async_op=True)

    def _finalize(self) -> None:
        self.expecting = False
        if any(w is None for w in self.works):
            return  # (a parameter got no gradient: the next forward raises, as torch's does)
        used: dict[int, bool] = {}
        if self.used_map is not None and self.used_work is not None:
            # torch's finalize waits for the map and copies it to the host, blocking: a parameter no rank used keeps
            # its gradient as it was (None), one another rank used gets the bucket's (the world's mean)
            self.used_work.wait()
            used = {id(q): n > 0 for q, n in zip(self.params, self.used_map.cpu().tolist(), strict=True)}
        for bucket, work in zip(self.buckets, self.works, strict=True):
            # the reduced gradients: the bucket's buffer, or a hook's result (its future waited for: the current stream
            # after the stream that wrote it), copied into each gradient (a view of its slot, with
            # ``gradient_as_bucket_view``)
            if self.hook is None:
                work.wait()
                out = bucket.flat
            else:
                out = _hook_result(work.wait(), bucket)
            for k, p in enumerate(bucket.params):
                view = bucket.view(k)
                reduced = view if out is bucket.flat else bucket.view(k, out)
                if p.grad is not None:
                    if not _aliases(p.grad, reduced):  # (as a view of its slot, the gradient is the reduced one)
                        p.grad.copy_(reduced)
                elif used.get(id(p)):
                    if self.as_view and reduced is not view:
                        view.copy_(reduced)
                    p.grad = view if self.as_view else reduced.clone()
        self.in_flight = False


def _aliases(t: torch.Tensor, view: torch.Tensor) -> bool:
    """Whether ``t`` is ``view``'s bytes (a gradient already its bucket's slot)."""
    return bool(t.data_ptr() == view.data_ptr() and t.shape == view.shape and t.stride() == view.stride())


def _assign(params: list[torch.Tensor]) -> list[_Bucket]:
    """One bucket of the parameters per dtype and device, each in reverse order, as torch's reducer starts without
    ``find_unused_parameters`` (its ``compute_bucket_size_limits``: ``sys.maxsize``)."""
    groups: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for p in reversed(params):
        groups.setdefault((p.dtype, p.device), []).append(p)
    return [_Bucket(members) for members in groups.values()]


def _init(self: Any, module: torch.nn.Module, device_ids: Any = None, output_device: Any = None, dim: int = 0,
          broadcast_buffers: bool | None = None, init_sync: bool = True, process_group: Any = None,
          bucket_cap_mb: float | None = None, find_unused_parameters: bool = False, check_reduction: bool = False,
          gradient_as_bucket_view: bool = False, static_graph: bool = False, delay_all_reduce_named_params: Any = None,
          param_to_hook_all_reduce: Any = None, mixed_precision: Any = None, device_mesh: Any = None,
          skip_all_reduce_unused_params: bool = False, bucket_cap_mb_list: Any = None, batched_grad_copy: bool = False,
          forward_sync_buffers: bool | None = None) -> None:
    """torch 2.13's parameters, in its order (``bucket_cap_mb``, ``bucket_cap_mb_list`` and ``batched_grad_copy``
    change nothing here: one bucket per dtype)."""
    from simdevice.dropin.facade import session_device

    unsimulated = {"static_graph=True": static_graph,
                   "skip_all_reduce_unused_params=True": skip_all_reduce_unused_params,
                   "delay_all_reduce_named_params=...": delay_all_reduce_named_params is not None,
                   "param_to_hook_all_reduce=...": param_to_hook_all_reduce is not None,
                   "mixed_precision=...": mixed_precision is not None, "device_mesh=...": device_mesh is not None}
    for option, given in unsimulated.items():
        if given:
            raise NotImplementedError(f"torch.nn.parallel.DistributedDataParallel({option}) is not simulated")
    torch.nn.Module.__init__(self)
    ignored = set(getattr(module, "_ddp_params_and_buffers_to_ignore", ()))
    params = [p for n, p in module.named_parameters() if n not in ignored]
    buffers = [b for n, b in module.named_buffers() if n not in ignored]
    if any(not p.is_cuda for p in params):
        raise NotImplementedError("torch.nn.parallel.DistributedDataParallel of a module with parameters on the "
                                  "host is not simulated (move it to the device first)")
    session_device().runtime.gpu_replay = False  # (torch's reducer makes other operations: see the module's note)
    self.module = module
    # (torch keeps them for a module on one device: its inputs are moved there)
    self.device_ids = [_get_device_index(d, True) for d in device_ids] if device_ids else None
    self.output_device = output_device
    self.dim = dim
    # buffers synced at each forward: ``forward_sync_buffers``, else the deprecated ``broadcast_buffers`` (True by
    # default); at construction, unless ``broadcast_buffers=False`` alone said not to
    sync = forward_sync_buffers if forward_sync_buffers is not None else broadcast_buffers is not False
    self._simdevice_buffers = buffers
    self._simdevice_sync_buffers = sync
    self.broadcast_buffers = sync
    self.process_group = process_group
    self.require_backward_grad_sync = True
    self.require_forward_param_sync = True
    self._simdevice_reducing = False  # (whether the last forward's backward reduces: ``_pre_forward``)
    if init_sync:
        at_init = params + (buffers if forward_sync_buffers is not None or broadcast_buffers is not False else [])
        with torch.no_grad():
            for t in at_init:
                dist.broadcast(t.detach(), 0, group=process_group)
    self.find_unused_parameters = find_unused_parameters
    self.gradient_as_bucket_view = gradient_as_bucket_view
    self.logger = None  # (torch's C++ logger, which its checks of a communication hook report to where there is one)
    self._comm_hooks: list[tuple[Any, object]] = []
    self._simdevice_reducer = _Reducer([p for p in params if p.requires_grad], process_group, find_unused_parameters,
                                       gradient_as_bucket_view)


def _pre_forward(self: Any, *inputs: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """torch's ``_pre_forward`` (the composable ``replicate`` calls it as a forward pre-hook of the module it
    replicates): the buffers synced, host inputs moved to the module's device, the reducer readied where this
    forward's backward reduces; the inputs."""
    reducer: _Reducer = self._simdevice_reducer
    if self._simdevice_sync_buffers and self._simdevice_buffers:
        with torch.no_grad():
            for t in self._simdevice_buffers:
                dist.broadcast(t.detach(), 0, group=self.process_group)
    if self.device_ids:  # (torch's ``_to_kwargs``: a host tensor among the inputs moved to the module's device)
        device = torch.device("cuda", self.device_ids[0])
        inputs, kwargs = pytree.tree_map_only(
            torch.Tensor, lambda t: t.to(device) if t.device.type == "cpu" else t, (inputs, kwargs))
    self._simdevice_reducing = torch.is_grad_enabled() and self.require_backward_grad_sync
    if self._simdevice_reducing:
        reducer.prepare()
    return inputs, kwargs


def _post_forward(self: Any, output: Any) -> Any:
    """torch's ``_post_forward``: the reducer told which outputs the backward starts from; the output."""
    if self._simdevice_reducing:
        self._simdevice_reducer.outputs(output)
    return output


def _forward(self: Any, *inputs: Any, **kwargs: Any) -> Any:
    inputs, kwargs = _pre_forward(self, *inputs, **kwargs)
    return _post_forward(self, self.module(*inputs, **kwargs))


def _register_comm_hook(self: Any, state: object, hook: Any) -> None:
    """torch's ``register_comm_hook``: its checks of the hook (callable; its ``bucket`` and return annotations), then
    the hook reduces each bucket from the next backward on, once registered (torch's reducer refuses a second)."""
    self._check_comm_hook(hook)
    reducer: _Reducer = self._simdevice_reducer
    if reducer.hook is not None:
        raise RuntimeError("register_comm_hook or register_builtin_comm_hook can only be called once.")
    self._comm_hooks.append((hook, state))
    reducer.hook = (hook, state)


@contextlib.contextmanager
def _no_sync(self: Any) -> Iterator[None]:
    before = self.require_backward_grad_sync
    self.require_backward_grad_sync = False
    try:
        yield
    finally:
        self.require_backward_grad_sync = before


def _refused(name: str) -> Any:
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"torch.nn.parallel.DistributedDataParallel.{name} is not simulated")

    call.__name__ = name
    return call


#: what a run puts in place of torch's methods of the class
METHODS: dict[str, Any] = {"__init__": _init, "forward": _forward, "no_sync": _no_sync,
                           "_pre_forward": _pre_forward, "_post_forward": _post_forward,
                           "register_comm_hook": _register_comm_hook,
                           **{name: _refused(name) for name in ("join", "join_hook", "_register_builtin_comm_hook",
                                                                "_register_fused_optim", "_set_static_graph")}}
