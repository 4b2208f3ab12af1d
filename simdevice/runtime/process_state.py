"""Each simulated process's own module-level state, in the program's modules and the libraries it uses.

A run's processes share one interpreter, so a module's state is one for all of them where each process of a real
world has its own: a counter a library keeps on a class (DeepSpeed's ``Init.param_id``, each parameter's id under
ZeRO-3) counted on across the ranks, so the ranks' ids differed and DeepSpeed's own check that they agree failed; a
flag one rank's initialization set (``global _initialized``) made the other skip its own. Here each process has its
own of such state: at each turn that changes the process, the state moves out of the modules into the process that
ran and the next process's goes in; a process that has not run yet starts from the state as the module was made (its
import ended, or the run began), as a fresh process imports the library afresh.

What counts, found once per module from its functions' code (nothing is guessed at run time):

- a name a function of the module binds with ``global`` (``STORE_GLOBAL``, ``DELETE_GLOBAL``);
- an attribute a function assigns on a class the module names (``Init.param_id += 1``, ``Registry.instance = ...``);
- the contents of a list, dict or set among its functions' default arguments (``def _register(self, module,
  count=[0])``: DeepSpeed numbers the modules it registers so, and checks that the ranks' numbers agree);
- the dict a class's instances share as their ``__dict__`` (``self.__dict__ = self._shared_state``, the "Borg"
  pattern: accelerate's ``PartialState`` told rank 1 it was process 0);
- in an installed library, the contents of a list, dict or set a function changes in place through the module's
  name for it (``_STATE["rank"] = rank``, ``_GROUPS.append(group)``, ``del _CACHE[key]``). The program's own modules
  keep theirs shared, where a test collects its ranks' results.

- a module-level function cached with ``functools.lru_cache`` (or ``functools.cache``), where the module binds it
  (the one that defines it, and one that imports it from there): each process calls a cache of its own, empty as a
  fresh process's is, and so does the run's first process at each run (a workspace buffer a cached function makes
  on the device is each rank's own, and each run's; before, the ranks shared one, a false race, and a second run
  read the first's tensor).

A container as its module made it (a registry filled at import) is kept as a mark, not copied, at each turn. The
modules: those that use torch (``import torch`` or a torch module among their globals), not torch's own, the standard
library's or the simulator's; the :data:`~simdevice.runtime.execution.PROCESS_MODULES` have all their bindings
swapped already. A value changed in place otherwise (through another name, an attribute of an object) is the same
object for every process, as before; so is state kept elsewhere (an instance's attributes: each process makes its own
instances anyway; the cache of a method, or of a function reached otherwise than through a module's global).
"""

from __future__ import annotations

import dis
import functools
import os
import sys
import types
from typing import Any

from reference.naming import in_standard_library

_STORE_GLOBAL = dis.opmap["STORE_GLOBAL"]
_DELETE_GLOBAL = dis.opmap["DELETE_GLOBAL"]
_STORE_ATTR = dis.opmap["STORE_ATTR"]
_LOAD_GLOBAL = dis.opmap["LOAD_GLOBAL"]
_LOAD_ATTR = dis.opmap["LOAD_ATTR"]
_LOAD_FAST = dis.opmap["LOAD_FAST"]
_LOAD_METHOD = dis.opmap.get("LOAD_METHOD", -1)
_SUBSCRIPTS = {dis.opmap["STORE_SUBSCR"], dis.opmap["DELETE_SUBSCR"]}
#: what loads a subscript's key in one instruction (``STATE["rank"] = ...``, ``STATE[key] = ...``)
_KEYS = {dis.opmap[n] for n in ("LOAD_CONST", "LOAD_FAST", "LOAD_DEREF", "LOAD_GLOBAL") if n in dis.opmap}
#: the methods that change a list, dict or set in place
_MUTATORS = frozenset(("append", "extend", "insert", "remove", "pop", "popitem", "clear", "update", "setdefault",
                       "add", "discard", "difference_update", "intersection_update", "symmetric_difference_update"))
_COPY = dis.opmap.get("COPY", -1)
_EXTENDED_ARG = dis.EXTENDED_ARG
_CACHE = dis.opmap.get("CACHE", -1)
#: what a global's or an attribute's absence is kept as
_ABSENT = object()
#: where an installed library's modules lie (``site-packages``, ``dist-packages``)
_INSTALLED = "-packages" + os.sep
#: what a container's contents are kept as where they are as its module made them
_AS_MADE = object()

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: the simulator's own packages and the device contract's: their state is the simulator's, not a process's
_OWN = tuple(os.path.join(_ROOT, d) + os.sep for d in ("simdevice", "reference"))


def _instructions(code: types.CodeType) -> list[tuple[int, int]]:
    """``code``'s instructions as (opcode, argument), its inline caches left out."""
    raw = code.co_code
    out = []
    ext = 0
    for i in range(0, len(raw), 2):
        op, arg = raw[i], raw[i + 1]
        if op == _CACHE:
            continue
        if op == _EXTENDED_ARG:
            ext = (ext | arg) << 8
            continue
        out.append((op, ext | arg))
        ext = 0
    return out


def _global_name(code: types.CodeType, arg: int) -> str:
    # (LOAD_GLOBAL's argument carries a flag in its low bit from Python 3.11 on)
    return code.co_names[arg >> 1] if sys.version_info >= (3, 11) else code.co_names[arg]


def _attr_name(code: types.CodeType, arg: int) -> str:
    return code.co_names[arg >> 1] if sys.version_info >= (3, 12) else code.co_names[arg]


def _scan(code: types.CodeType, names: set[str], attrs: set[tuple[str, str]], shared: set[str],
          changed: set[str]) -> None:
    """The globals ``code`` rebinds and the (global, attribute) pairs it assigns, into ``names`` and ``attrs``; the
    attributes whose dict it makes an instance's own (``self.__dict__ = self._shared_state``: the "Borg" pattern,
    accelerate's ``PartialState``), into ``shared``; the globals it changes in place (``STATE[key] = value``,
    ``del STATE[key]``, ``GROUPS.append(g)``, ``SEEN.add(x)``), into ``changed``."""
    ins = _instructions(code)
    for k, (op, arg) in enumerate(ins):
        if op in (_STORE_GLOBAL, _DELETE_GLOBAL):
            names.add(code.co_names[arg])
        elif op in _SUBSCRIPTS:
            if k >= 2 and ins[k - 2][0] == _LOAD_GLOBAL and ins[k - 1][0] in _KEYS:
                changed.add(_global_name(code, ins[k - 2][1]))
        elif op in (_LOAD_METHOD, _LOAD_ATTR) and k and ins[k - 1][0] == _LOAD_GLOBAL:
            if (code.co_names[arg] if op == _LOAD_METHOD else _attr_name(code, arg)) in _MUTATORS:
                changed.add(_global_name(code, ins[k - 1][1]))
        elif op == _STORE_ATTR:
            attr = code.co_names[arg]
            before = ins[k - 1] if k else (0, 0)
            if attr == "__dict__":  # LOAD_ATTR shared (of self or the class), LOAD_FAST self, STORE_ATTR __dict__
                if k >= 2 and before[0] == _LOAD_FAST and ins[k - 2][0] == _LOAD_ATTR:
                    shared.add(_attr_name(code, ins[k - 2][1]))
                continue
            if before[0] == _LOAD_GLOBAL:  # ``Cls.attr = value``
                attrs.add((_global_name(code, before[1]), attr))
                continue
            # ``Cls.attr += value``: LOAD_GLOBAL Cls, COPY 1, LOAD_ATTR attr, ..., STORE_ATTR attr
            for j in range(k - 1, max(k - 10, 1), -1):
                op_j, arg_j = ins[j]
                if op_j == _LOAD_ATTR and _attr_name(code, arg_j) == attr:
                    if ins[j - 1][0] == _COPY and j >= 2 and ins[j - 2][0] == _LOAD_GLOBAL:
                        attrs.add((_global_name(code, ins[j - 2][1]), attr))
                    break
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _scan(const, names, attrs, shared, changed)


def _functions_of(module: types.ModuleType) -> list[tuple[types.FunctionType, type | None]]:
    """``module``'s own functions and its own classes' methods, each with its class (nested code is scanned with
    them)."""
    out: list[tuple[types.FunctionType, type | None]] = []
    mine = module.__name__
    for value in list(vars(module).values()):
        if isinstance(value, types.FunctionType) and value.__module__ == mine:
            out.append((value, None))
        elif isinstance(value, type) and value.__module__ == mine:
            for member in list(vars(value).values()):
                member = getattr(member, "__func__", member)  # (a classmethod's, a staticmethod's)
                if isinstance(member, property):
                    out += [(f, value) for f in (member.fget, member.fset, member.fdel)
                            if isinstance(f, types.FunctionType)]
                elif isinstance(member, types.FunctionType):
                    out.append((member, value))
    return out


def _containers_of(functions: list[tuple[types.FunctionType, type | None]],
                   shared: dict[type, set[str]]) -> tuple[list[Any] | dict[Any, Any] | set[Any], ...]:
    """The lists, dicts and sets among ``functions``' default arguments: state a function keeps in itself
    (``def _register(self, module, count=[0])``, DeepSpeed's count of the modules it registers); and the dicts a
    class's instances share as their ``__dict__`` (``shared``: each class's such attributes)."""
    out: dict[int, Any] = {}
    for f, _ in functions:
        for value in (*(f.__defaults__ or ()), *(f.__kwdefaults__ or {}).values()):
            if type(value) in (list, dict, set):
                out[id(value)] = value
    for cls, attrs in shared.items():
        for attr in attrs:
            value = vars(cls).get(attr)
            if type(value) is dict:
                out[id(value)] = value
    return tuple(out.values())


def _copy(value: Any) -> Any:
    return type(value)(value)


def _uses_torch(module: types.ModuleType) -> bool:
    """Whether ``module`` names torch or something of torch's among its globals (``import torch``, ``import
    torch.distributed as dist``, ``from torch import nn``, ``from torch.nn import Module``)."""
    for value in list(vars(module).values()):
        if isinstance(value, types.ModuleType):
            owner = value.__name__
        elif isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType)):
            owner = getattr(value, "__module__", None) or ""
        else:
            continue
        if isinstance(owner, str) and (owner == "torch" or owner.startswith("torch.")):
            return True
    return False


#: a module's per-process state, as :func:`_track` finds it
_State = tuple[tuple[str, ...], tuple[tuple[type, str], ...], tuple[Any, ...], tuple[str, ...]]
#: a function ``functools.lru_cache`` (or ``functools.cache``) made
_CACHED = functools._lru_cache_wrapper


class _Fresh:
    """A cached function's place where a process that has not run yet starts: a cache of its own, empty (one for
    each cached function, whichever places bind it)."""

    __slots__ = ("cached",)

    def __init__(self, cached: Any) -> None:
        self.cached = cached


def _fresh(cached: Any, made: dict[int, Any]) -> Any:
    """A new cache of ``cached``'s function, as ``cached`` was made (``made``: those made for this process so far)."""
    new = made.get(id(cached))
    if new is None:
        params = cached.cache_parameters()
        new = made[id(cached)] = functools.lru_cache(maxsize=params["maxsize"], typed=params["typed"])(
            cached.__wrapped__)
    return new


def _same(a: Any, b: Any) -> bool:
    """Whether two copies of a container hold the same objects. Python's ``==`` on a list or dict takes an item
    identical to its counterpart as equal without asking it (a tensor's own ``==`` is elementwise: where one
    differs, it answers a tensor, or raises, and the two are taken as different)."""
    try:
        return bool(a == b)
    except Exception:  # (a tensor's ==, asked where the items differ)
        return False


def _track(module: types.ModuleType, skip: frozenset[str]) -> _State | None:
    """``module``'s per-process state (the names its functions rebind, the class attributes they assign, the
    containers whose contents are the state), or None where it keeps none (or is not a process's: see the
    module)."""
    name = getattr(module, "__name__", None)
    filename = vars(module).get("__file__")
    if (not isinstance(name, str) or name in skip or name == "torch" or name.startswith("torch.")
            or not isinstance(filename, str) or not filename.endswith(".py")):
        return None
    path = os.path.abspath(filename)
    if path.startswith(_OWN) or in_standard_library(path) or not _uses_torch(module):
        return None
    names: set[str] = set()
    pairs: set[tuple[str, str]] = set()
    functions = _functions_of(module)
    shared: dict[type, set[str]] = {}
    changed: set[str] = set()
    for f, cls in functions:
        borg: set[str] = set()
        _scan(f.__code__, names, pairs, borg, changed)
        if borg and cls is not None:
            shared.setdefault(cls, set()).update(borg)
    d = vars(module)
    containers = _containers_of(functions, shared)
    if _INSTALLED in path:  # (a library's: the program's own may collect its ranks' results so, as tests do)
        containers += tuple(d[n] for n in sorted(changed) if type(d.get(n)) in (list, dict, set) and n not in names)
    attrs = tuple(sorted(((d[c], a) for c, a in pairs if isinstance(d.get(c), type) and not a.startswith("__")),
                         key=lambda p: (p[0].__qualname__, p[1])))
    names.discard("__all__")
    caches = tuple(sorted(n for n, v in d.items() if isinstance(v, _CACHED) and n not in names))
    if not names and not attrs and not containers and not caches:
        return None
    return tuple(sorted(names)), attrs, containers, caches


class ProcessState:
    """The per-process module state of one interpreter's runs: which modules keep it (scanned once each), as one
    flat list of places (a module's global, a class's attribute) and one of containers, each with its value as its
    module was made; a process's own values are two lists in that order (:meth:`move`)."""

    def __init__(self, skip: tuple[str, ...]) -> None:
        self._skip = frozenset(skip)
        #: each module seen, by id: whether it keeps per-process state
        self._seen: dict[int, tuple[types.ModuleType, bool]] = {}
        self._modules_seen = 0
        #: each place: the namespace read (a module's dict, a class's mapping), the owner written (the dict, the
        #: class), the name, whether the owner is a class
        self._places: list[tuple[Any, Any, str, bool]] = []
        self._first: list[Any] = []
        self._containers: list[Any] = []
        self._first_contents: list[Any] = []
        #: the places that bind a cached function (their first value a :class:`_Fresh`)
        self._caches: list[int] = []

    def tracked(self) -> bool:
        """Whether any module keeps per-process state (those imported since the last call scanned first)."""
        if len(sys.modules) != self._modules_seen:
            for module in list(sys.modules.values()):
                self.made(module)
            self._modules_seen = len(sys.modules)
        return bool(self._places or self._containers)

    def made(self, module: Any) -> None:
        """``module`` is made (its import ended, or it is first seen): its state as it is now is a new process's."""
        if not isinstance(module, types.ModuleType):
            return
        seen = self._seen.get(id(module))
        if seen is not None and seen[0] is module:
            return
        state = _track(module, self._skip)
        self._seen[id(module)] = (module, state is not None)
        if state is None:
            return
        names, attrs, containers, caches = state
        d = vars(module)
        for name in names:
            self._places.append((d, d, name, False))
            self._first.append(d.get(name, _ABSENT))
        for name in caches:
            self._places.append((d, d, name, False))
            self._first.append(_Fresh(d[name]))
            self._caches.append(len(self._places) - 1)
        for cls, attr in attrs:
            self._places.append((vars(cls), cls, attr, True))
            self._first.append(vars(cls).get(attr, _ABSENT))
        for container in containers:
            self._containers.append(container)
            self._first_contents.append(_copy(container))

    def begin(self) -> None:
        """A run begins: its first process calls caches of its own, empty, as a fresh process does (the places of
        cached functions; the rest of the state is as the run finds it)."""
        made: dict[int, Any] = {}
        for i in self._caches:
            _, owner, name, _ = self._places[i]
            cached = self._first[i].cached
            if isinstance(owner.get(name), _CACHED):
                owner[name] = _fresh(cached, made)

    def move(self, out: list[Any], into: list[Any]) -> None:
        """The running process's state goes into ``out`` (its own: the places' values, the containers' contents);
        the next process's (``into``: a place or container tracked since it was kept, or one of a process that has
        not run, as its module was made) goes into the modules."""
        places = self._places
        now = [ns.get(name, _ABSENT) for ns, _, name, _ in places]
        # (a container as its module made it, a registry filled at import, is kept as a mark, not copied)
        contents = [_AS_MADE if _same(c, first) else _copy(c)
                    for c, first in zip(self._containers, self._first_contents, strict=True)]
        values, kept = (into[0], into[1]) if into else ((), ())
        first, first_contents = self._first, self._first_contents
        n = len(values)
        made: dict[int, Any] = {}
        for i, (_, owner, name, is_class) in enumerate(places):
            value = values[i] if i < n else first[i]
            if type(value) is _Fresh:
                value = _fresh(value.cached, made)
            if value is now[i]:
                continue
            if not is_class:
                if value is _ABSENT:
                    owner.pop(name, None)
                else:
                    owner[name] = value
            elif value is _ABSENT:
                delattr(owner, name)
            else:
                setattr(owner, name, value)
        n = len(kept)
        for i, container in enumerate(self._containers):
            target = kept[i] if i < n else _AS_MADE
            if target is contents[i]:  # (both as made)
                continue
            want: Any = first_contents[i] if target is _AS_MADE else target
            if not _same(want, first_contents[i] if contents[i] is _AS_MADE else contents[i]):
                container.clear()
                if isinstance(container, list):
                    container.extend(want)
                else:
                    container.update(want)
        out[:] = [now, contents]
