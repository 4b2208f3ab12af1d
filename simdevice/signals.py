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


#: a stop that was raised and that the command has not answered yet (:func:`stopped` answers it). Python can lose
#: the exception on its way: where it lands in a ``__del__`` or a weakref callback it is "unraisable" (printed as
#: "Exception ignored in ..." and dropped), and C code may clear it (an extension module's import that Hypothesis
#: starts between two runs did). Kept here, :func:`checkpoint` raises it again.
_PENDING: list[KeyboardInterrupt] = []


#: how many sections a stop must not cut are open (0: none). Torch's per-thread state moving between greenlet actors
#: (``simdevice.runtime.tls``) is one: a ``KeyboardInterrupt`` raised halfway leaves it half moved (modes off the
#: dispatch stack, a key-set guard entered or left out of turn), the likely cause of a SIGSEGV in torch's mode pop
#: that ended ``check`` after a Ctrl-C. A stop that comes meanwhile is held, and raised at the next safe point
#: (:func:`raise_held`), else by :func:`checkpoint`.
HOLDING = [0]
#: the stop that came while :data:`HOLDING`, not raised yet
_HELD: list[KeyboardInterrupt] = []


def _raise_kept(e: KeyboardInterrupt) -> None:
    _PENDING[:] = [e]
    if HOLDING[0]:
        _HELD[:] = [e]
        return
    raise e


def raise_held() -> None:
    """A safe point after a section a stop must not cut: the stop held meanwhile is raised here."""
    if _HELD and not HOLDING[0]:
        raise _HELD.pop()


def on_sigint(signum: int, frame: Any) -> None:
    """The SIGINT handler: raise ``KeyboardInterrupt``, as Python's own does, and keep it until it is answered."""
    _raise_kept(KeyboardInterrupt())


def on_sigterm(signum: int, frame: Any) -> None:
    """The SIGTERM handler: raise :class:`Terminated` (a second SIGTERM ends the process at once)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _STOPPED["word"] = "terminated"
    _raise_kept(Terminated())


def _unraisable(u: Any) -> None:
    """``sys.unraisablehook``: keep a swallowed Ctrl-C or SIGTERM for :func:`checkpoint`, silently; anything else
    as Python reports it."""
    if isinstance(u.exc_value, KeyboardInterrupt):
        _PENDING[:] = [u.exc_value]
        return
    sys.__unraisablehook__(u)


def install() -> None:
    """From the command's first moment: SIGINT and SIGTERM raise a stop that is kept until the command answers
    it, and a stop that lands in a callback is kept rather than printed."""
    signal.signal(signal.SIGINT, on_sigint)
    signal.signal(signal.SIGTERM, on_sigterm)
    sys.unraisablehook = _unraisable


def install_worker() -> None:
    """In a worker process of the command (``check --jobs``): Ctrl-C is the command's to answer (a terminal sends
    it to every process of the group; the command stops its workers itself), SIGTERM (how the command stops a
    worker) unwinds the worker's run as it would the command's, and a stop swallowed in a callback is kept."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, on_sigterm)
    sys.unraisablehook = _unraisable


def checkpoint() -> None:
    """A safe point (each simulated run starts and ends at one): a stop that was raised and never reached the
    command is raised here, so the command stops as it would have (it ran on, to its end, before; and a run it
    cut short in a callback could report what it never did)."""
    _HELD.clear()
    if _PENDING:
        raise _PENDING.pop()


def delivered() -> None:
    """A stop left a simulated run as it should, raised to the run's caller: it is on its way, no longer lost
    (the next run does not raise it again)."""
    _PENDING.clear()
    _HELD.clear()


def is_stop(e: BaseException) -> bool:
    """Whether ``e``, a ``KeyboardInterrupt`` that reached a simulated run, stops the command (Ctrl-C, SIGTERM)
    rather than being one the program raised itself: one the handlers raised, or any where they are not installed
    (a test session, a script: Python's own Ctrl-C then, indistinguishable from the program's)."""
    if any(e is k for k in _PENDING) or any(e is k for k in _HELD):
        return True
    return signal.getsignal(signal.SIGTERM) is not on_sigterm


def pending() -> bool:
    """Whether a stop was raised and lost on its way, with no checkpoint since (the command's last moments)."""
    return bool(_PENDING)


def stopped() -> int:
    """Say on stderr that the command was stopped early, and return its exit code (the stop is answered)."""
    _PENDING.clear()
    print(f"simdevice: {_STOPPED['word']}", file=sys.stderr, flush=True)
    return _CODES[_STOPPED["word"]]
