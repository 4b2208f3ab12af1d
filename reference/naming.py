"""Names for streams made by plain torch.cuda code: where they were created, as a schedule can say it; and names
for the aten ops the program ran, as reports and traces give them on both machines (:func:`op_name`).

``torch.cuda.Stream()`` has no name, and a schedule must name the stream it delays on both machines alike. A
stream is named after the variable it is assigned to on the line that made it (``self._d2h_stream =
torch.cuda.Stream()`` gives ``d2h_stream``; leading underscores dropped; ``copy, compute = torch.cuda.Stream(),
torch.cuda.Stream()`` gives each its own target's name, found by the call's column), or ``s1``, ``s2``, ... when
the line names none; a name already taken gets ``-2``, ``-3``, ... The creation site (``file.py:LINE``) is kept
beside it for reports. Both the simulator's drop-in and ``CudaDevice`` name streams with :class:`StreamNames`, so
the same program gets the same names on both.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import linecache
import os
import re
import sys
import sysconfig
import types
from collections.abc import Callable
from typing import Any

_ASSIGN = re.compile(r"^\s*(?:[A-Za-z_][\w]*\.)*([A-Za-z_]\w*)\s*(?::[^=]*)?=[^=]")
#: files of libraries, never the program's (torch's among them)
LIBRARIES = ("/torch/", "<frozen", "/contextlib.py", "/threading.py", "/weakref.py", "/functools.py")

#: the standard library's folder (its ``site-packages`` below it are no part of it)
_STDLIB = os.path.realpath(sysconfig.get_paths()["stdlib"]) + os.sep


def in_standard_library(filename: str) -> bool:
    """Whether a frame of ``filename`` is the standard library's (``concurrent.futures``, a thread pool it starts
    for itself), not the program's nor an installed package's."""
    path = os.path.realpath(filename) if not filename.startswith("<") else filename
    return path.startswith(_STDLIB) and "-packages" not in path


#: ops named as the program wrote them, where ATen's name is not what it wrote: ``t.item()``, ``float(t)`` and
#: ``if t:`` read one value through ``_local_scalar_dense``
_WRITTEN_AS = {"_local_scalar_dense": "item"}


def op_name(func: Callable[..., object]) -> str:
    """An aten op's name without its overload (``fill_``, not ``fill_.Scalar``), as the program wrote it."""
    name = str(func.__name__).split(".")[0]
    return _WRITTEN_AS.get(name, name)


def creation_site(internal: Callable[[str], bool]) -> tuple[str, int, int | None]:
    """(file, line, column of the call being made there, where Python knows it) of the first caller frame whose file
    ``internal`` does not claim, nor a library's."""
    f = sys._getframe(1)
    while f is not None:
        name = f.f_code.co_filename
        if not internal(name) and not any(s in name.replace("\\", "/") for s in LIBRARIES):
            return name, f.f_lineno, _column(f)
        f = f.f_back  # type: ignore[assignment]
    return "?", 0, None


def _column(f: object) -> int | None:
    """The column where the frame's current instruction (a call) starts on its line."""
    try:
        positions = list(f.f_code.co_positions())  # type: ignore[attr-defined]
        start_line, _, col, _ = positions[f.f_lasti // 2]  # type: ignore[attr-defined]
    except (AttributeError, IndexError, ValueError):
        return None
    return col if start_line == f.f_lineno else None  # type: ignore[attr-defined]


def assigned_name(filename: str, lineno: int, col: int | None = None) -> str | None:
    """The variable or attribute a source line assigns to, if it is a plain assignment; in a tuple assignment of as
    many values as targets (``a, b = f(), g()``), the target of the value at column ``col``."""
    line = linecache.getline(filename, lineno)
    if col is not None and "," in line:
        name = _tuple_target(line, col)
        if name is not None:
            return name.lstrip("_") or None
    m = _ASSIGN.match(line)
    if m is None:
        return None
    name = m.group(1).lstrip("_")
    return name or None


def _tuple_target(line: str, col: int) -> str | None:
    """In a one-line tuple assignment, the name (or attribute) its value at column ``col`` is assigned to."""
    body = line.rstrip("\n")
    indented = body[:1].isspace()
    try:  # (an indented line parsed in a block of its own, so that its columns stay the line's)
        tree = ast.parse("if 1:\n" + body if indented else body)
    except SyntaxError:
        return None
    stmt = tree.body[0].body[0] if indented else tree.body[0]  # type: ignore[attr-defined]
    if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
        return None
    target, value = stmt.targets[0], stmt.value
    if not isinstance(target, (ast.Tuple, ast.List)) or not isinstance(value, (ast.Tuple, ast.List)):
        return None
    if len(target.elts) != len(value.elts):
        return None
    for t, v in zip(target.elts, value.elts, strict=True):
        if v.lineno == 2 - (not indented) and v.col_offset <= col < (v.end_col_offset or 0):
            return t.id if isinstance(t, ast.Name) else t.attr if isinstance(t, ast.Attribute) else None
    return None


def short_path(path: str, cwd: str | None = None) -> str:
    """A source file as a report line names it: relative to the working directory (``cwd``, default the current
    one) when it lies under it (what the user typed), else its last two components (enough to find it, short
    enough for one line)."""
    path = path.replace("\\", "/")
    cwd = (os.getcwd() if cwd is None else cwd).replace("\\", "/").rstrip("/") + "/"
    if path.startswith(cwd):
        return path[len(cwd):]
    return "/".join(path.split("/")[-2:])


def short(filename: str, lineno: int) -> str:
    return f"{short_path(filename)}:{lineno}"


class StreamNames:
    """The names one host actor gave its streams (``prefix`` is ``rank1.`` for a rank, empty for the host)."""

    def __init__(self, prefix: str, taken: Callable[[str], bool] = lambda name: False) -> None:
        self.prefix = prefix
        self._taken = taken
        self._mine: set[str] = set()
        self._unnamed = 0
        #: full name -> where the stream was made
        self.sites: dict[str, str] = {}

    def _free(self, full: str) -> bool:
        return full not in self._mine and not self._taken(full)

    def assign(self, filename: str, lineno: int, col: int | None = None) -> str:
        """The full name of a stream made at ``filename:lineno`` (by the call at column ``col``, where known)."""
        base = assigned_name(filename, lineno, col) if lineno else None
        if base is None:
            while True:
                self._unnamed += 1
                full = f"{self.prefix}s{self._unnamed}"
                if self._free(full):
                    break
        else:
            full, k = f"{self.prefix}{base}", 1
            while not self._free(full):
                k += 1
                full = f"{self.prefix}{base}-{k}"
        self._mine.add(full)
        self.sites[full] = short(filename, lineno)
        return full


def inside(*paths: str) -> Callable[[str], bool]:
    """A predicate: whether a file lies under one of ``paths`` (directories or files)."""
    roots = tuple(os.path.abspath(p) for p in paths)

    def check(filename: str) -> bool:
        return os.path.abspath(filename).startswith(roots) if not filename.startswith("<") else False

    return check


def import_file_as(name: str, path: str, around: Any = None) -> types.ModuleType | None:
    """Import the file ``path`` as module ``name`` (in ``sys.modules`` under it), its folder on ``sys.path`` for its
    own imports of its neighbours, as ``python FILE`` would find them; ``around``: a context the import runs in.
    None where ``path`` is no Python file; what the import raised is raised, the name taken back."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    folder = os.path.dirname(path)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    sys.modules[name] = module
    try:
        with around if around is not None else contextlib.nullcontext():
            spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
