"""``torch.autocast("cuda")`` applied to the simulated device's tensors, as ATen applies it to CUDA tensors.

On a GPU, autocast is a dispatch key (``AutocastCUDA``) that every CUDA tensor carries, above autograd: enabled, an
op of its table casts its CUDA arguments before autograd records anything (a matmul's inputs to the lower precision,
a softmax's to float32), so the casts are operations of their own on the stream and the graph saves the cast
tensors. The simulated device's tensors live on the meta device, which carries no such key, so ATen's kernels never
ran for them: ops kept the dtypes they were given.

Here, in a run, the thread's dispatch keys include ``AutocastCUDA`` while ``torch.set_autocast_enabled("cuda", True)``
holds (``torch.autocast`` calls it as it is entered and left), and a kernel of this module takes the key's place for
each op of ATen's table: the same policy for each (``lower_precision_fp``, ``fp32``, ``fp32_set_opt_dtype``,
``fp32_append_dtype``, ``promote``, the banned ``binary_cross_entropy``), the same eligibility (a floating tensor on
the device, not double), and the same cache of a float32 leaf weight's cast within the outermost autocast block.
Where no argument is on the device, the op goes on as on a GPU, where it would not have reached the key. The
kernels are registered once a run enables CUDA autocast, and removed as the session ends (``torch.library``).
"""

from __future__ import annotations

import functools
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch

_KEY = torch._C.DispatchKey.AutocastCUDA
#: where an op reached the key on a GPU: every autocast key is off for what the kernel runs (ATen's
#: ``ExcludeDispatchKeyGuard(AutocastFunctionality)``)
_ALL_AUTOCAST = torch._C.DispatchKeySet(_KEY)
for _name in ("AutocastCPU", "AutocastMPS", "AutocastXPU", "AutocastHPU", "AutocastIPU", "AutocastPrivateUse1"):
    if hasattr(torch._C.DispatchKey, _name):
        _ALL_AUTOCAST = _ALL_AUTOCAST | torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, _name))
_CUDA_ONLY = torch._C.DispatchKeySet(_KEY)

#: ATen's CUDA autocast table (``aten/src/ATen/autocast_mode.{h,cpp}``): op name (and overload) -> policy. A test
#: checks it names exactly the ops that have an ``AutocastCUDA`` kernel in the installed torch.
POLICIES: dict[str, str] = {}
for _op in ("_convolution", "_convolution.deprecated", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d",
            "conv_transpose2d.input", "conv_transpose3d.input", "convolution", "prelu", "addmm", "addmv", "addr",
            "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul",
            "linalg_multi_dot", "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell",
            "rnn_tanh_cell", "rnn_relu_cell", "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
            "cudnn_convolution", "cudnn_convolution_transpose"):
    POLICIES[_op] = "lower_precision_fp"
for _op in ("acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
            "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus", "layer_norm",
            "native_layer_norm", "rms_norm", "group_norm", "frobenius_norm.dim", "nuclear_norm", "nuclear_norm.dim",
            "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
            "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
            "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
            "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
            "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d", "_upsample_nearest_exact2d",
            "upsample_nearest3d", "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d",
            "_upsample_bilinear2d_aa", "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa"):
    POLICIES[_op] = "fp32"
for _op in ("prod", "prod.dim_int", "prod.dim_Dimname", "softmax.int", "softmax.Dimname", "log_softmax.int",
            "log_softmax.Dimname", "cumprod", "cumprod.dimname", "cumsum", "cumsum.dimname", "linalg_vector_norm",
            "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum", "sum.dim_IntList", "sum.dim_DimnameList"):
    POLICIES[_op] = "fp32_set_opt_dtype"
#: fp32_append_dtype: the overload without a dtype, redispatched to the one with it
APPENDED = {"norm.Scalar": "ScalarOpt_dtype", "norm.ScalarOpt_dim": "ScalarOpt_dim_dtype",
            "norm.names_ScalarOpt_dim": "names_ScalarOpt_dim_dtype"}
for _op in APPENDED:
    POLICIES[_op] = "fp32_append_dtype"
for _op in ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler", "index_put",
            "tensordot", "scatter_add"):
    POLICIES[_op] = "promote"
POLICIES["binary_cross_entropy"] = "banned"

BANNED = ("torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
          "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
          "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
          "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
          "safe to autocast.")


@functools.cache
def registered() -> frozenset[str]:
    """The ops (``name`` or ``name.overload``, no namespace) of the installed torch with an ``AutocastCUDA`` kernel
    (a walk of every op, found once)."""
    return frozenset(name[len("aten::"):] for name in torch._C._dispatch_get_all_op_names()
                     if name.startswith("aten::")
                     and torch._C._dispatch_has_kernel_for_dispatch_key(name, "AutocastCUDA"))


def _overload(name: str) -> Any:
    op, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, op), overload or "default")


def _on_device(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and bool(t.is_cuda)


def _eligible(t: Any) -> bool:
    """ATen's ``is_eligible``: a floating tensor on the device, not double."""
    return _on_device(t) and t.is_floating_point() and t.dtype is not torch.float64


#: id(fp32 leaf) -> (a weak reference to it, its cast): ATen's cache of weights cast within an autocast block
_CACHE: dict[int, tuple[Any, torch.Tensor]] = {}


def clear_cache() -> None:
    _CACHE.clear()


def _cast(to: torch.dtype, t: Any) -> Any:
    """ATen's ``cached_cast`` of one argument (a tensor, a list of them, or anything else, returned as it is)."""
    if isinstance(t, (list, tuple)) and t and any(isinstance(x, torch.Tensor) for x in t):
        return type(t)(_cast(to, x) for x in t)
    if not _eligible(t) or t.dtype is to:
        return t
    if (to is torch.get_autocast_dtype("cuda") and t.dtype is torch.float32 and t.requires_grad and t.is_leaf
            and not t._is_view() and torch.is_autocast_cache_enabled()):
        held = _CACHE.get(id(t))
        if held is not None and held[0]() is t:
            return held[1]
        out = t.to(to)
        _CACHE[id(t)] = (weakref.ref(t), out)
        return out
    return t.to(to)


def _tensors(args: Any) -> Any:
    for a in args:
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from (x for x in a if isinstance(x, torch.Tensor))


def _promoted(args: Any) -> torch.dtype:
    """ATen's ``promote_type``: float32 where an eligible argument is, else the lower precision."""
    low = torch.get_autocast_dtype("cuda")
    to = low
    for t in _tensors(args):
        if _eligible(t):
            if t.dtype is torch.float32:
                to = torch.float32
            elif t.dtype is not low:
                raise RuntimeError("Unexpected floating ScalarType in at::autocast::prioritize")
    return to


def _kernel(name: str, policy: str) -> Callable[..., Any]:
    op = _overload(name)
    dtype_at = next((i for i, a in enumerate(op._schema.arguments) if a.name == "dtype" and not a.kwarg_only), None)
    appended = _overload(f"norm.{APPENDED[name]}") if policy == "fp32_append_dtype" else None

    def kernel(*args: Any, **kwargs: Any) -> Any:
        values = list(args) + list(kwargs.values())
        if not any(_on_device(t) for t in _tensors(values)):
            # no device tensor: on a GPU the op would not have reached the CUDA key
            with torch._C._ExcludeDispatchKeyGuard(_CUDA_ONLY):
                return op(*args, **kwargs)
        with torch._C._ExcludeDispatchKeyGuard(_ALL_AUTOCAST):
            if policy == "banned":
                raise RuntimeError(BANNED)
            if policy == "lower_precision_fp" or policy == "fp32" or policy == "promote":
                to = (torch.get_autocast_dtype("cuda") if policy == "lower_precision_fp"
                      else torch.float32 if policy == "fp32" else _promoted(values))
                return op(*[_cast(to, a) for a in args], **{k: _cast(to, v) for k, v in kwargs.items()})
            first = next(_tensors(values), None)
            if policy == "fp32_append_dtype":
                assert appended is not None
                assert first is not None  # (norm's first argument is its tensor)
                # (the overload with a dtype has no defaults before it: ``keepdim`` given as the program's, or False)
                positional = [args[i] if i < len(args) else kwargs.get(a.name, a.default_value)
                              for i, a in enumerate(op._schema.arguments) if not a.kwarg_only]
                return appended(*positional, dtype=torch.float32 if _eligible(first) else first.dtype)
            # fp32_set_opt_dtype: the output dtype set to float32 where the program left it unset
            if not _eligible(first):
                return op(*args, **kwargs)
            if dtype_at is not None and dtype_at < len(args):
                if args[dtype_at] is None:
                    args = (*args[:dtype_at], torch.float32, *args[dtype_at + 1:])
            elif kwargs.get("dtype") is None:
                kwargs = {**kwargs, "dtype": torch.float32}
            return op(*args, **kwargs)

    kernel.__name__ = f"autocast_cuda_{name.replace('.', '_')}"
    return kernel


@functools.cache
def _kernels() -> tuple[tuple[str, Callable[..., Any]], ...]:
    """A kernel for each op of the table the installed torch autocasts for CUDA, made once (another torch's op the
    table lacks keeps ATen's kernel, which casts no simulated tensor)."""
    return tuple((name, _kernel(name, POLICIES[name])) for name in sorted(registered()) if name in POLICIES)


def _nesting() -> int:
    """The calling thread's count of autocast blocks entered and not left (torch reads it only as it changes it)."""
    n = torch.autocast_increment_nesting() - 1
    torch.autocast_decrement_nesting()
    return int(n)


def thread_state() -> tuple[int, bool, torch.dtype, bool]:
    """The calling thread's CUDA autocast state: its count of blocks, the flag, the dtype, the cache flag."""
    return (_nesting(), torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda"),
            torch.is_autocast_cache_enabled())


def put_back(found: tuple[int, bool, torch.dtype, bool]) -> None:
    """The calling thread's CUDA autocast state as :func:`thread_state` found it, this module's cache emptied and
    the key out of the thread's dispatch keys: where a run's actors ran on this thread (greenlets) and left a block
    entered, the next run, of a search say, would start inside it, with a cache of casts made on another run's
    device that torch clears only as the outermost block is left."""
    clear_cache()
    torch._C._dispatch_tls_set_dispatch_key_included(_KEY, False)
    now = thread_state()
    if now == found:
        return
    nesting, enabled, dtype, cache = found
    if now[0] != nesting:
        torch.clear_autocast_cache()
        for _ in range(now[0] - nesting):
            torch.autocast_decrement_nesting()
        for _ in range(nesting - now[0]):
            torch.autocast_increment_nesting()
    torch.set_autocast_enabled("cuda", enabled)
    torch.set_autocast_dtype("cuda", dtype)
    torch.set_autocast_cache_enabled(cache)
    torch._C._dispatch_tls_set_dispatch_key_included(_KEY, False)


class Kernels:
    """This module's kernels, registered for ``AutocastCUDA`` over ATen's (:meth:`install`) until :meth:`remove`,
    which also puts back the session thread's CUDA autocast state as the session found it (:func:`put_back`)."""

    def __init__(self) -> None:
        self._lib: Any = None
        self._found = thread_state()

    def install(self) -> None:
        if self._lib is not None:
            return
        lib = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ("Overriding a previously registered kernel": ATen's, put back after)
            for name, kernel in _kernels():
                lib.impl(name, kernel, "AutocastCUDA")
        self._lib = lib

    def remove(self) -> None:
        if self._lib is not None:
            self._lib._destroy()
            self._lib = None
        put_back(self._found)


def set_enabled(original: Callable[..., None], kernels: Kernels) -> Callable[..., None]:
    """``torch.set_autocast_enabled(device_type, enabled)`` in a session: for CUDA, the thread's dispatch keys
    include ``AutocastCUDA`` while it is enabled, this module's kernels in ATen's place (the simulated tensors carry
    no such key of their own)."""

    def set_autocast_enabled(*args: Any) -> None:
        original(*args)
        device, enabled = (args[0], args[1]) if len(args) == 2 else ("cuda", args[0])
        if device == "cuda":
            if enabled:
                kernels.install()
            torch._C._dispatch_tls_set_dispatch_key_included(_KEY, bool(enabled))

    set_autocast_enabled.__name__ = "set_autocast_enabled"
    set_autocast_enabled.__doc__ = original.__doc__
    return set_autocast_enabled


def clear(original: Callable[[], None]) -> Callable[[], None]:
    """``torch.clear_autocast_cache()`` (the outermost autocast block left): this module's cache too."""

    def clear_autocast_cache() -> None:
        original()
        clear_cache()

    clear_autocast_cache.__name__ = "clear_autocast_cache"
    return clear_autocast_cache
