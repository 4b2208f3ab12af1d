"""What ``simdevice check``'s fork server does once, before it forks any worker (:data:`simdevice.jobs.PRELOAD`): it
imports torch, the simulator, Hypothesis and the search with the garbage collector off, freezes what they made, and
readies the server to end as soon as it is told to.

The imports. Each worker imported Hypothesis and the search after its fork (0.4 s of its start on a 2-core machine,
both workers at once). Of the package's modules, only those every worker imports before its first search anyway
(:func:`simdevice.jobs._work`'s own) are imported here, so that a worker's draws are what they would be without the
server's imports: Hypothesis draws from the constants of the local modules loaded in its process. This module holds
none (a docstring is not one), and only the fork server imports it.

The collector. On during the imports, it made full collections over torch's objects while the rest was imported: the
server's imports took 0.4 s longer than the same imports in the command's process, which turns it off until torch is
imported and freezes torch's objects after (:func:`simdevice.command._imported`). Here it is off for all of them, and
what they made is frozen (``gc.freeze``). The workers inherit that: a worker's full collections scan only what it
made since (0.25 s of collecting in three clean variants' searches became 0.1 s), and no longer write to, and so copy,
every page of the server's objects.

The end (:func:`_leave`). The server ends after the command, when the command's end of their pipe closes, and holds
the command's stdout and stderr until then: a reader of the command's output (a pipe, ``$(...)``, a script's
``capture_output``) waits for it. Python's own end, a last collection and the modules torn down one by one, kept it
0.5 s after the command (0.15 s with the freeze).
"""

import atexit
import gc
import os
import sys


def _imports() -> None:
    import hypothesis  # noqa: F401
    import torch  # noqa: F401

    import simdevice.programs
    import simdevice.search.engine
    import simdevice.search.find  # noqa: F401


def _leave() -> None:
    """End the process now, skipping the rest of Python's end (nothing of the server's needs it: its workers are
    processes of their own, and its socket's file is the command's to remove)."""
    sys.stderr.flush()
    os._exit(0)


gc.disable()
try:
    _imports()
finally:  # the server swallows an ImportError here: its workers still collect
    gc.freeze()
    gc.enable()
# registered after the imports' own handlers (multiprocessing's, torch's), so run first: the server ran nothing of
# theirs to finish, and its workers are not its multiprocessing children, to wait for
atexit.register(_leave)
