"""The last of what ``simdevice check``'s fork server imports (:data:`simdevice.jobs.PRELOAD`): it readies the server
for its workers and for its end.

Once the other modules are imported, the garbage collector leaves what they made alone (``gc.freeze``), as the
command's own process does after torch (:func:`simdevice.command._imported`). The workers, forked from the server,
inherit that: a worker's full collections scan only what it made since, not torch's and Hypothesis's objects (0.25
s of collecting in three clean variants' searches became 0.1 s), and no longer write to, and so copy, every page
those objects lie in.

And the server ends as soon as it is told to (:func:`_leave`). It ends after the command, when the command's end of
their pipe closes, and holds the command's stdout and stderr until then: a reader of the command's output (a pipe,
``$(...)``, a script's ``capture_output``) waits for it. Python's own end, a last collection and the modules torn
down one by one, kept it 0.5 s after the command (0.15 s with the freeze).

Only the fork server imports this module, so it holds no constant that Hypothesis would draw (a docstring is not
one): a worker draws what the command would (:mod:`simdevice.jobs`).
"""

import atexit
import gc
import os
import sys


def _leave() -> None:
    """End the process now, skipping the rest of Python's end (nothing of the server's needs it: its workers are
    processes of their own, and its socket's file is the command's to remove)."""
    sys.stderr.flush()
    os._exit(0)


gc.freeze()
# registered after the imports' own handlers (multiprocessing's, torch's), so run first: the server ran nothing of
# theirs to finish, and its workers are not its multiprocessing children, to wait for
atexit.register(_leave)
