"""The ``simdevice`` command's entry point: Ctrl-C and SIGTERM are handled from its first moment, before torch is
imported (a Ctrl-C during the imports printed a traceback of torch's import; :mod:`simdevice.signals` says how);
the garbage collector never scans torch's own objects (:func:`_imported`); and the process ends as soon as the
command is done (:func:`leave`): no interpreter shutdown, which spent up to a second on a last garbage collection
of the run's objects, and about 0.1 s after a replay tearing down the modules' objects (torch's) one by one.
"""

from __future__ import annotations

import atexit
import gc
import io
import os
import signal
import sys
import threading
from typing import NoReturn

from simdevice.signals import install, pending, stopped


def entry() -> None:
    """The ``simdevice`` command."""
    fixed_string_hashes()
    install()
    whole_writes()
    gc.disable()  # until torch is imported: _imported
    try:
        from simdevice.jobs import start_early

        start_early(sys.argv[1:])  # check's workers' fork server imports torch while this process does
        from simdevice.cli import main

        code = main(imported=_imported)
    except BrokenPipeError:  # the reader went away (simdevice ... | head): stop quietly, as a killed writer would
        code = _pipe_closed()
    except KeyboardInterrupt:  # during the imports, before main's own handling (and its parsing of --json)
        if "--json" in sys.argv[1:]:
            print('{"interrupted": true}')
        code = stopped()
    if pending():  # a stop that was lost on its way after the last simulated run: the command was stopped all the same
        code = stopped()
    # the command is done: a signal now would only turn its exit code into a traceback or a death by signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    leave(code)


def fixed_string_hashes() -> None:
    """Python hashes strings with a seed drawn per process unless ``PYTHONHASHSEED`` fixes it, so a program that
    iterates a set of names (which buckets, layers or ranks to go through first) takes another order in each process:
    a replay (a new process) could take another path than the search that printed its line, and ``replay --gpu``
    another than the simulator's. The command runs with ``PYTHONHASHSEED=0`` where the environment has not fixed
    one: it starts itself again so, at once (before any import of its own; the interpreter's start, about 20 ms)."""
    if os.environ.get("PYTHONHASHSEED", "random") != "random" or not _started_as_the_command():
        return
    os.environ["PYTHONHASHSEED"] = "0"
    try:
        os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
    except (OSError, TypeError, ValueError):  # (no interpreter to start again: the command goes on as it is)
        return


def _started_as_the_command() -> bool:
    """Whether this interpreter was started to run the command (``python -m simdevice``, the ``simdevice`` script),
    not another program that calls :func:`entry` (a test's): only the command's own may be started again."""
    orig = sys.orig_argv
    if "-m" in orig[1:]:
        i = orig.index("-m", 1)
        return orig[i + 1:i + 2] == ["simdevice"]
    return len(orig) > 1 and orig[1] not in ("-c", "-") and os.path.basename(orig[1]) == "simdevice"


def whole_writes() -> None:
    """Under ``PYTHONUNBUFFERED`` (or ``python -u``) stdout's and stderr's text layers write straight to the file, and
    a write that a pipe takes only in part (its reader went away mid-write, or a signal came) loses the rest without
    a word: ``simdevice replay --trace | head -1`` then ended 0, as if all was written. A buffered layer between them
    writes everything or raises (``BrokenPipeError``), and is flushed at every line, as unbuffered output asks."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        raw = getattr(stream, "buffer", None)
        if isinstance(raw, io.FileIO) and getattr(stream, "write_through", False):
            own = io.FileIO(raw.fileno(), "w", closefd=False)  # the stream it replaces keeps the file
            setattr(sys, name, io.TextIOWrapper(io.BufferedWriter(own), encoding=stream.encoding,
                                                errors=stream.errors, line_buffering=True, write_through=True))


def _imported() -> None:
    """Torch is imported, with the collector off: what the imports made stays out of every later collection
    (``gc.freeze``), and the collector is on again for the run. A replay's start made three full collections, each
    scanning torch's objects (0.2 s in all on this 2-core machine), and freed nothing of note; frozen, a collection
    scans only what was made after."""
    gc.freeze()
    gc.enable()


def _pipe_closed() -> int:
    """What is left to write goes nowhere; the exit code of a writer killed by SIGPIPE."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 141  # 128 + SIGPIPE


def leave(code: int) -> NoReturn:
    """End the process with ``code``: what Python's exit does that someone may see (other threads finish, the
    ``atexit`` handlers run: logging's flush, multiprocessing's children, a user's own), then ``os._exit``, which
    skips the rest (freeing every object of every module, torch's C++ destructors)."""
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        code = _pipe_closed()
    sys.stderr.flush()
    os._exit(code)
