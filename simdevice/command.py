"""The ``simdevice`` command's entry point: Ctrl-C and SIGTERM are handled from its first moment, before torch is
imported (a Ctrl-C during the imports printed a traceback of torch's import; :mod:`simdevice.signals` says how),
and the process exits without a last garbage collection of the run's objects (interpreter shutdown spent up to a
second on it).
"""

from __future__ import annotations

import gc
import os
import signal
import sys

from simdevice.signals import install, pending, stopped


def entry() -> None:
    """The ``simdevice`` command."""
    install()
    try:
        from simdevice.jobs import start_early

        start_early(sys.argv[1:])  # check's workers' fork server imports torch while this process does
        from simdevice.cli import main

        code = main()
    except BrokenPipeError:  # the reader went away (simdevice ... | head): stop quietly, as a killed writer would
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        code = 141  # 128 + SIGPIPE
    except KeyboardInterrupt:  # during the imports, before main's own handling (and its parsing of --json)
        if "--json" in sys.argv[1:]:
            print('{"interrupted": true}')
        code = stopped()
    if pending():  # a stop that was lost on its way after the last simulated run: the command was stopped all the same
        code = stopped()
    # the command is done: a signal now would only turn its exit code into a traceback or a death by signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.stdout.flush()
    gc.freeze()
    sys.exit(code)
