"""How a command was stopped early: Ctrl-C (``KeyboardInterrupt``, exit 130) or SIGTERM (:class:`Terminated`, a
``KeyboardInterrupt`` raised by :func:`on_sigterm`, exit 143). Either unwinds the run as the other does (its actors'
``finally`` blocks run, temporary folders are removed) and the command prints what it did so far."""

from __future__ import annotations

import signal
import sys
from typing import Any

#: how the command was stopped early: what it says, and its exit code
_STOPPED: dict[str, str] = {"word": "interrupted"}
_CODES = {"interrupted": 130, "terminated": 143}


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread."""


def on_sigterm(signum: int, frame: Any) -> None:
    """The SIGTERM handler: raise :class:`Terminated` (a second SIGTERM ends the process at once)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _STOPPED["word"] = "terminated"
    raise Terminated


#: a stop whose exception Python swallowed: it came while a weakref callback or a ``__del__`` ran, where an
#: exception is "unraisable" (printed as "Exception ignored in ..." and dropped); :func:`checkpoint` raises it again
_SWALLOWED: list[KeyboardInterrupt] = []


def _unraisable(u: Any) -> None:
    """``sys.unraisablehook``: keep a swallowed Ctrl-C or SIGTERM for :func:`checkpoint`, silently; anything else
    as Python reports it."""
    if isinstance(u.exc_value, KeyboardInterrupt):
        _SWALLOWED[:] = [u.exc_value]
        return
    sys.__unraisablehook__(u)


def install() -> None:
    """From the command's first moment: SIGTERM raises :class:`Terminated`, and a stop that lands in a callback is
    kept rather than lost."""
    signal.signal(signal.SIGTERM, on_sigterm)
    sys.unraisablehook = _unraisable


def checkpoint() -> None:
    """A safe point (each simulated run starts at one): a stop Python swallowed is raised here, so the command
    stops as it would have (it ran on, to its end, before)."""
    if _SWALLOWED:
        raise _SWALLOWED.pop()


def stopped() -> int:
    """Say on stderr that the command was stopped early, and return its exit code."""
    print(f"simdevice: {_STOPPED['word']}", file=sys.stderr, flush=True)
    return _CODES[_STOPPED["word"]]
