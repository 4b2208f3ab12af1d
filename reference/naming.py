"""Names for streams made by plain torch.cuda code: where they were created, as a schedule can say it.

``torch.cuda.Stream()`` has no name, and a schedule must name the stream it delays on both machines alike. A
stream is named after the variable it is assigned to on the line that made it (``self._d2h_stream =
torch.cuda.Stream()`` gives ``d2h_stream``; leading underscores dropped), or ``s1``, ``s2``, ... when the line
names none; a name already taken gets ``-2``, ``-3``, ... The creation site (``file.py:LINE``) is kept beside it
for reports. Both the simulator's drop-in and ``CudaDevice`` name streams with :class:`StreamNames`, so the same
program gets the same names on both.
"""

from __future__ import annotations

import linecache
import os
import re
import sys
from collections.abc import Callable

_ASSIGN = re.compile(r"^\s*(?:[A-Za-z_][\w]*\.)*([A-Za-z_]\w*)\s*(?::[^=]*)?=[^=]")
#: files of libraries, never the program's (torch's among them)
LIBRARIES = ("/torch/", "<frozen", "/contextlib.py", "/threading.py", "/weakref.py", "/functools.py")


def creation_site(internal: Callable[[str], bool]) -> tuple[str, int]:
    """(file, line) of the first caller frame whose file ``internal`` does not claim, nor a library's."""
    f = sys._getframe(1)
    while f is not None:
        name = f.f_code.co_filename
        if not internal(name) and not any(s in name.replace("\\", "/") for s in LIBRARIES):
            return name, f.f_lineno
        f = f.f_back  # type: ignore[assignment]
    return "?", 0


def assigned_name(filename: str, lineno: int) -> str | None:
    """The variable or attribute a source line assigns to, if it is a plain assignment."""
    line = linecache.getline(filename, lineno)
    m = _ASSIGN.match(line)
    if m is None:
        return None
    name = m.group(1).lstrip("_")
    return name or None


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

    def assign(self, filename: str, lineno: int) -> str:
        """The full name of a stream made at ``filename:lineno``."""
        base = assigned_name(filename, lineno) if lineno else None
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
