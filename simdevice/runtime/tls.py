"""torch's per-thread state, moved off the thread and back where host actors share one thread (greenlets).

A thread has one of each: dispatch-mode stack, torch-function-mode stack and its disabled state, saved-tensor
hooks, grad mode, forward-grad mode, the local dispatch-key sets. Host actors on threads of their own each have
theirs; greenlets share one thread, so at a switch the actor that stops :func:`take` s its state off the thread
(leaving a fresh thread's) and the one that goes on :func:`put` s its own back. A fresh actor starts with a fresh
thread's state, as a new thread does.

Python's own per-thread values, each ``threading.local``'s (the program's, a library's), are moved the same way
(:func:`take_locals`, :func:`put_locals`): each actor of a greenlet run but its first, which has the starting
thread's, sees its own, as a thread of its own does.

The infra dispatch modes (fake, proxy, functional tensors) are on the dispatch-mode stack, popped after the program's
own modes, and move with it.

What cannot be moved from Python is refused with :class:`NeedsThreads` before anything is changed: inference mode
(its flag is set only by a guard object), autocast, disabled saved-tensor hooks, and autograd's engine, whose state
(the graph task, the ready queue) is the thread's own: an actor that starts a backward while another actor's
backward is suspended would share that state (:class:`EngineWatch`). The run then starts again on threads
(``simdevice.runtime.execution``).
"""

from __future__ import annotations

import ctypes
import functools
import threading
from typing import Any

import torch

try:
    from greenlet import getcurrent as _getcurrent  # type: ignore[import-untyped]
except ImportError:  # pragma: no cover - greenlet is a dependency; without it every run is on threads
    _getcurrent = threading.current_thread

_C = torch._C
_AG = torch._C._autograd


#: CPython keeps each ``threading.local``'s values for a thread in that thread's state dict, under this prefix and
#: the local object's address
_LOCAL_KEY = "thread.local."
_STATE_DICT = ctypes.pythonapi.PyThreadState_GetDict
_STATE_DICT.restype = ctypes.c_void_p  # (a borrowed reference: made an object below, which counts its own)
_STATE_DICT.argtypes = []


def _state_dict() -> dict[str, Any]:
    """The running thread's state dict."""
    return ctypes.cast(_STATE_DICT(), ctypes.py_object).value  # type: ignore[no-any-return]


def _locals_in_state_dict() -> bool:
    """Whether this interpreter keeps ``threading.local`` values where :func:`take_locals` finds them."""
    probe = threading.local()
    probe.seen = True
    try:
        return _LOCAL_KEY + hex(id(probe)) in _state_dict()
    except Exception:  # pragma: no cover - another interpreter: the actors share the thread's values, as before
        return False


#: whether :func:`take_locals` can move them (else every actor of a greenlet run sees the thread's)
LOCALS_MOVABLE = _locals_in_state_dict()


def take_locals() -> dict[str, Any]:
    """The running thread's values of every ``threading.local``, taken off it: each local, asked next on this
    thread, starts afresh (a subclass's ``__init__`` runs again), as on a new thread."""
    if not LOCALS_MOVABLE:
        return {}
    state = _state_dict()
    keys = [k for k in state if type(k) is str and k.startswith(_LOCAL_KEY)]
    return {k: state.pop(k) for k in keys}


def put_locals(held: dict[str, Any]) -> None:
    """Put values :func:`take_locals` took back on the running thread (which holds none of its own)."""
    if held:
        _state_dict().update(held)


class NeedsThreads(BaseException):
    """A greenlet run met torch state one thread cannot hold for two actors: the run starts again on threads."""


#: torch's Python methods that call an op through its pybind11 binding (``torch.ops.ns.op(...)``, an
#: ``OpOverload``'s call or redispatch), and TorchScript's pybind11 calls (a scripted or traced function, a scripted
#: module's method; ``torch.jit.trace`` and ``fork``, whose pybind11 calls run the program's code; a future's that
#: run its callbacks), which may call back into Python (the simulator's dispatch): (class or module, name)
_OP_CALL_SITES = tuple((cls, name) for cls, name in (
    (torch._ops.OpOverload, "__call__"), (torch._ops.OpOverload, "redispatch"),
    (torch._ops.OpOverloadPacket, "__call__"), (getattr(torch._ops, "TorchBindOpOverload", None), "__call__"),
    (torch._C.ScriptFunction, "__call__"), (torch._C.ScriptMethod, "__call__"),
    (torch.jit, "trace"), (torch.jit, "trace_module"), (torch.jit, "fork"),
    # (a torch future's callbacks, run inside its pybind11 call where it is done: ``then``, ``set_result``)
    (torch._C.Future, "then"), (torch._C.Future, "add_done_callback"), (torch._C.Future, "set_result"),
    (torch._C.Future, "set_exception"),
) if cls is not None and callable(vars(cls).get(name)))

#: greenlet -> how many such calls it is inside (counted while a greenlet run has them patched)
_INSIDE: dict[Any, int] = {}


def _counting(original: Any) -> Any:
    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:  # (a method's ``self`` among ``args``)
        g = _getcurrent()
        _INSIDE[g] = _INSIDE.get(g, 0) + 1
        try:
            return original(*args, **kwargs)
        finally:
            n = _INSIDE.pop(g, 1) - 1  # (a run unwinding after its end cleared the counts: none left)
            if n:
                _INSIDE[g] = n

    return call


#: (class, method, torch's method, its counting wrapper), made once
_COUNTING = tuple((cls, name, vars(cls)[name], _counting(vars(cls)[name])) for cls, name in _OP_CALL_SITES)


def count_op_calls() -> None:
    """From now on until :func:`uncount_op_calls`, each greenlet's calls of an op through its pybind11 binding are
    counted (:func:`in_op_call`). The simulator's own op calls go to the binding itself (``OpOverload._op``),
    uncounted. (A greenlet run turns it on as its second actor starts: one alone never stops for another.)"""
    for cls, name, _, counting in _COUNTING:
        setattr(cls, name, counting)


def uncount_op_calls() -> None:
    for cls, name, original, _ in _COUNTING:
        setattr(cls, name, original)
    _INSIDE.clear()


def in_op_call() -> str | None:
    """Where the calling greenlet is inside an op called through its pybind11 binding, why it cannot stop there.
    pybind11 keeps a per-thread stack of its calls (``loader_life_support``) and aborts the process where one ends
    that is not the last begun: two greenlets of one thread that each stop inside one close them out of order
    (``torch.ops.aten.mul.Tensor(x, 2)`` on two ranks did)."""
    if _INSIDE and _INSIDE.get(_getcurrent()):
        return ("an actor stopped inside an op called through torch.ops or a TorchScript function (a pybind11 call "
                "of its thread)")
    return None


def _fresh_state() -> tuple[Any, Any, Any]:
    """A new thread's dispatch-key sets and torch-function state."""
    out: list[tuple[Any, Any, Any]] = []

    def read() -> None:
        out.append((_C._dispatch_tls_local_include_set(), _C._dispatch_tls_local_exclude_set(),
                    _C._get_torch_function_state()))

    t = threading.Thread(target=read, name="simdevice-tls-probe")
    t.start()
    t.join()
    return out[0]


_FRESH_INCLUDE, _FRESH_EXCLUDE, _FRESH_FUNCTION_STATE = _fresh_state()


def movable() -> str | None:
    """Why the calling thread's torch state cannot be moved to another greenlet, or None."""
    if _C.is_inference_mode_enabled():
        return "inference mode"
    if _C._is_any_autocast_enabled():
        return "autocast"
    if not _AG._saved_tensors_hooks_is_enabled():
        return "saved-tensor hooks disabled"
    return None


#: a greenlet's hold on the thread's dispatch-key sets: entered with its own sets where it goes on, exited where it
#: stops, which puts back the sets the thread had at entry (a fresh thread's: whoever stopped before left those)
Hold = Any
State = tuple[tuple[Any, ...], tuple[Any, ...], tuple[Any, ...], bool, bool, Any, Any, Any]


def hold() -> Hold:
    """A hold on the sets the thread has now (a fresh actor's first moment, the run's greenlet's)."""
    return _hold(_C._dispatch_tls_local_include_set(), _C._dispatch_tls_local_exclude_set())


def _hold(include: Any, exclude: Any) -> Hold:
    guard = _C._ForceDispatchKeyGuard(include, exclude)
    guard.__enter__()
    return guard


def take(held: Hold) -> State:
    """The calling greenlet's torch state, taken off the thread, which is left as ``held`` found it (a fresh
    thread's, for a fresh actor's and an actor's turn alike)."""
    why = movable()
    if why is not None:
        raise NeedsThreads(why)
    # the sets first: popping the last mode takes the Python keys out of them, which pushing it back puts in
    include, exclude = _C._dispatch_tls_local_include_set(), _C._dispatch_tls_local_exclude_set()
    modes = []
    while _C._len_torch_dispatch_stack():
        modes.append(_C._pop_torch_dispatch_stack(None))
    functions = []
    while _C._len_torch_function_stack():
        functions.append(_C._pop_torch_function_stack())
    hooks = []
    while (h := _AG._top_saved_tensors_default_hooks(True)) is not None:
        hooks.append(h)
        _AG._pop_saved_tensors_default_hooks()
    state = (tuple(modes), tuple(functions), tuple(hooks), _C.is_grad_enabled(), _C._is_fwd_grad_enabled(),
             include, exclude, _C._get_torch_function_state())
    release(held)
    return state


def release(held: Hold) -> None:
    """Leave the thread as ``held`` found it, with no modes or hooks (where a greenlet stops, or an actor ends)."""
    while _C._len_torch_dispatch_stack():
        _C._pop_torch_dispatch_stack(None)
    while _C._len_torch_function_stack():
        _C._pop_torch_function_stack()
    while _AG._top_saved_tensors_default_hooks(True) is not None:
        _AG._pop_saved_tensors_default_hooks()
    _C._set_grad_enabled(True)
    _C._set_fwd_grad_enabled(True)
    _C._set_torch_function_state(_FRESH_FUNCTION_STATE)
    held.__exit__(None, None, None)


def leave_caller() -> tuple[State, Hold]:
    """The run's greenlet (its caller's code) hands the thread to the actors: its state, and a hold on a fresh
    thread's sets, whose release puts the caller's back (:func:`back_to_caller`)."""
    caller = hold()
    state = take(caller)
    return state, _hold(_FRESH_INCLUDE, _FRESH_EXCLUDE)


def back_to_caller(state: State, fresh: Hold) -> None:
    release(fresh)
    put(state).__exit__(None, None, None)  # the caller's own sets are back: no hold of ours stays on them


def put(state: State) -> Hold:
    """Put a greenlet's state (from :func:`take`) back on the thread; the hold :func:`take` releases next."""
    modes, functions, hooks, grad, fwd, include, exclude, function_state = state
    # the hold first: it keeps the sets the thread has now, which its release puts back; pushing a mode puts the
    # Python keys in, and a hold taken after that would put them back with no mode left (an op with no tensor
    # argument run then, as a collective's start did, fails in torch's Python fallback)
    held = _hold(include, exclude)
    # grad modes before the torch-function modes: a mode pushed first would see the simulator set them
    _C._set_grad_enabled(grad)
    _C._set_fwd_grad_enabled(fwd)
    for m in reversed(modes):
        _C._push_on_torch_dispatch_stack(m)
    for f in reversed(functions):
        _C._push_on_torch_function_stack(f)
    for pack, unpack in reversed(hooks):
        _AG._push_saved_tensors_default_hooks(pack, unpack)
    _C._set_torch_function_state(function_state)
    return held


class EngineWatch:
    """Autograd's engine keeps its graph task on the thread: at most one greenlet actor may be inside a backward
    when it stops. :meth:`leaving` is called as an actor stops; it raises :class:`NeedsThreads` when a second
    actor would stop inside a backward of its own while another actor's is suspended."""

    def __init__(self) -> None:
        #: the actor suspended inside a backward, and the graph tasks it was seen in (nested ones included)
        self.owner: object | None = None
        self.tasks: set[int] = set()

    def seen_by(self, actor: object, task: int) -> int:
        """The graph task ``actor`` is inside, where the thread is inside ``task`` (``torch._C.
        _current_graph_task_id()``): none (-1) where ``task`` is that of another actor, suspended inside its
        backward (FSDP2 asks it to tell a forward from a backward's recomputation: another rank's backward made
        its forward skip the reshard)."""
        if task != -1 and self.owner is not None and self.owner is not actor and task in self.tasks:
            return -1
        return task

    def leaving(self, actor: object) -> None:
        task = _C._current_graph_task_id()
        if self.owner is None or self.owner is actor:
            if task == -1:
                self.owner, self.tasks = None, set()
            else:  # (no owner: no tasks either)
                self.owner = actor
                self.tasks.add(task)
            return
        # another actor is suspended inside a backward; this one sees its graph task (the thread's, not its own)
        # unless it started one of its own, which the engine took for a nested backward of the other's
        if task != -1 and task not in self.tasks:
            raise NeedsThreads("two actors inside autograd's backward at once")
