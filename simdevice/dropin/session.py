"""A torch.cuda session on the simulated device: ``with simdevice.cuda(...)`` or ``simdevice.cuda(...).run(fn)``.

The session owns one run of a :class:`~simdevice.dropin.facade.DropInDevice` and the patches that make
``torch.cuda`` and ``torch.distributed`` point at it. As a ``with`` block, the block is the program: it runs in
the calling thread as host actor ``host`` (what it raises is reported, as a host error); ``run(fn)`` runs
``fn`` the same way, on ranks ``rank0..`` with ``world_size``. One session at a time.
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
import types
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

import reference
from reference.contract import Run
from reference.naming import in_standard_library
from reference.schedule import Schedule
from simdevice.api import as_schedule
from simdevice.dropin import autocast, distributed, facade, imports, memsaver, processes, stores, threads
from simdevice.dropin.facade import DropInDevice
from simdevice.dropin.patches import Patches
from simdevice.runtime import Options, SimConfig
from simdevice.runtime.reports import internal_file, summarize


class DropIn:
    """One run of plain torch.cuda code on the simulated device."""

    def __init__(
        self, schedule: Schedule | str | None = None, config: SimConfig | None = None, options: Options | None = None
    ) -> None:
        self.schedule = as_schedule(schedule)
        self.device = DropInDevice(self.schedule, config, options)
        self._patches = Patches()
        self._here: Any = None
        self._defaults_back: Callable[[], None] = lambda: None
        #: what the run produced, once it is over
        self.result: Run | None = None

    # -- the patches ---------------------------------------------------------------------------------
    def _install(self) -> None:
        self._defaults_back = torch_defaults_kept()
        facade.activate(self.device)
        if _HELD:
            return  # a search holds them in place across its runs: only the device changes
        try:
            install(self._patches)
        except BaseException:
            self._uninstall()
            raise

    def _uninstall(self) -> None:
        self._patches.restore()
        facade.deactivate(self.device)
        self._defaults_back()

    # -- as a with block -------------------------------------------------------------------------------
    def __enter__(self) -> DropIn:
        self._install()
        try:
            self._here = self.device.here()
            self._here.__enter__()
        except BaseException:
            self._uninstall()
            raise
        return self

    def __exit__(self, *exc: Any) -> bool:
        try:
            suppressed = bool(self._here.__exit__(*exc))
        finally:
            self._uninstall()
        self.result = self.device.outcome(None)
        if exc[1] is not None and isinstance(exc[1], Exception):
            # what the block raised is the run's host error, not raised on: say so where a test would pass unaware
            warnings.warn(f"the simdevice.cuda() block raised {type(exc[1]).__name__}: {exc[1]}; it is a host error "
                          "of the run, not raised on (sim.assert_clean() fails on it: an AssertionError with the "
                          "run's reports)",
                          RuntimeWarning, stacklevel=2)
        return suppressed

    # -- as a call ---------------------------------------------------------------------------------------
    def run(self, fn: Callable[..., Any], *args: Any, world_size: int | None = None, **kwargs: Any) -> Run:
        """Run ``fn(*args, **kwargs)`` as host actor ``host`` (or on ranks ``rank0..`` of ``world_size``)."""

        def body(dev: Any) -> Any:
            seed_host_generators()
            if world_size is None:
                return fn(*args, **kwargs)
            return dev.spawn_ranks(lambda _: fn(*args, **kwargs), world_size)

        back = None if _HELD else host_generators_kept()  # (a search's: kept once, by held())
        self._install()
        found = autocast.thread_state()
        try:
            self.result = self.device.run(body)
        finally:
            autocast.put_back(found)  # (a search holds the patches across its runs: each run starts as the first)
            self._uninstall()
            if back is not None:
                back()
        return self.result

    # -- what it found -------------------------------------------------------------------------------------
    @property
    def reports(self) -> tuple[Any, ...]:
        return self.result.reports if self.result is not None else ()

    @property
    def clean(self) -> bool:
        return self.result is not None and not self.result.reports

    def text(self) -> str:
        """The verdict and every report, one per line (and the notes: what the run could not show)."""
        if self.result is None:
            return "the session has not run yet"
        lines = [summarize(self.result.reports)]
        lines += [f"  {r}" for r in self.result.reports]
        if self.result.unfired:  # a misspelled actor, an index past its operations: the run went as if undelayed
            lines.append(f"  note: delays never applied (their operation never came): {', '.join(self.result.unfired)}")
        lines += [f"  note: {n}" for n in self.result.notes]
        return "\n".join(lines)

    def assert_clean(self) -> None:
        if not self.clean:
            raise AssertionError(self.text())


def install(p: Patches) -> None:
    """What a session patches: torch.cuda and the device, torch.distributed and its stores, multiprocessing, threading,
    torch_memory_saver; then the names the program's modules bound to them before (``from torch.cuda import
    Stream`` at import time) follow them, for the session."""
    facade.install(p)
    distributed.install(p)
    stores.install(p)
    processes.install(p)
    threads.install(p)
    imports.install(p)
    memsaver.install(p)
    p.rebind(program_modules())
    _script_builtins(p)
    present = set(sys.modules)

    def unbind() -> None:  # (the modules first imported while the patches are in place: torch's objects again after)
        new = [m for name, m in sys.modules.copy().items() if name not in present and isinstance(m, types.ModuleType)]
        if new:
            p.unbind(new)

    p.before_restore(unbind)


def _script_builtins(p: Patches) -> None:
    """Each replaced function that TorchScript knows as an aten builtin (``torch.tensor``, ``torch.zeros``) is that
    builtin to TorchScript too, until ``p.restore()``: a function scripted in a run (``torch.distributed.optim``'s
    functional optimizers are, as the package is imported) compiles its call as on a GPU, where it found a Python
    function in its place, tried to compile it and raised (a ``TypeError`` of ``inspect``: no verdict on a
    program that imported the package, as ZeroRedundancyOptimizer does)."""
    from torch.jit import _builtins

    table = _builtins._get_builtin_table()  # (built as torch is imported, of torch's own functions)
    if _SCRIPTED[0] != len(p):  # (the same patches at each install: where they are, found once)
        _SCRIPTED[:] = [len(p), [(owner, name, table[id(old)]) for owner, name, old in p.saved_callables()
                                 if id(old) in table]]
    added = []
    for owner, name, op in _SCRIPTED[1]:
        new = vars(owner).get(name)  # (each replacement lives until restore: its id names no other object)
        if new is not None and id(new) not in table:
            table[id(new)] = op
            added.append(id(new))

    def back() -> None:
        for key in added:
            table.pop(key, None)

    p.on_restore(back)


#: for :func:`_script_builtins`: the patches' count when found, and each (module, name, op) whose original TorchScript
#: knows as a builtin
_SCRIPTED: list[Any] = [-1, []]

_REFERENCE = os.path.dirname(os.path.abspath(reference.__file__)) + os.sep
#: each module seen, by id: (the module, whether it is the program's)
_PROGRAM: dict[int, tuple[types.ModuleType, bool]] = {}


def _of_program(module: types.ModuleType) -> bool:
    """Whether ``module`` is the program's own source: not the standard library, an installed package, torch, the
    simulator or the device contract's package."""
    filename = vars(module).get("__file__")  # (not getattr: a module's own __getattr__ may import or raise)
    if not isinstance(filename, str) or not filename.endswith(".py") or not os.path.isabs(filename):
        return False  # (torch.ops and torch.classes give a bare file name)
    path = os.path.normpath(filename)
    return not (internal_file(path) or in_standard_library(path) or "-packages" in path
                or path.startswith(_REFERENCE))


def program_modules() -> list[types.ModuleType]:
    """The program's modules imported so far (whose names bound at import time a session rebinds)."""
    out = []
    for module in sys.modules.copy().values():  # (a copy made at once: another thread may import)
        if not isinstance(module, types.ModuleType):
            continue
        seen = _PROGRAM.get(id(module))
        if seen is None or seen[0] is not module:
            seen = _PROGRAM[id(module)] = (module, _of_program(module))
        if seen[1]:
            out.append(module)
    return out


#: the patches a ``held()`` block keeps in place (at most one)
_HELD: list[Patches] = []


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Keep torch patched for the whole block, so that the sessions run inside it (a search's many runs) only swap
    the device; outside a session torch.cuda still refuses, and the block's end restores torch exactly."""
    if _HELD:
        yield
        return
    p = Patches()
    try:
        p.on_restore(host_generators_kept())
        install(p)
        _HELD.append(p)
        yield
    finally:
        _HELD.clear()
        p.restore()


def seed_host_generators() -> None:
    """A run of a program starts Python's ``random`` and NumPy's global generator from seed 0, as Hypothesis starts
    them for each example: a program that draws from them unseeded (a random step count, random test data) draws
    the same numbers in every run of a schedule, in a search and in its replay in a new process, so the same
    schedule gives the same run. (A NumPy generator made unseeded is seeded by its order in the run:
    ``facade._default_rng``; a ``random.Random()`` made unseeded takes the OS's entropy.)"""
    random.seed(0)
    np.random.seed(0)


def host_generators_kept() -> Callable[[], None]:
    """Python's and NumPy's global generators as they are: the function that puts them back (after the runs)."""
    state, np_state = random.getstate(), np.random.get_state()

    def back() -> None:
        random.setstate(state)
        np.random.set_state(np_state)

    return back


def torch_defaults_kept() -> Callable[[], None]:
    """torch's default device and dtype as they are: the function that puts them back where a run changed them. A
    program's ``torch.set_default_device("cuda")`` (or ``set_default_dtype``) is its run's, as each run on a GPU is
    a process of its own: the next run, or the next function of the file, starts from torch's defaults as they were,
    and the caller of a ``with`` block gets host tensors from ``torch.ones(3)`` again once the session is over
    (the simulated device is gone; CUDA would not initialize on this build)."""
    dtype = torch.get_default_dtype()
    context = getattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context", None)

    def back() -> None:
        if getattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context", None) is not context:
            torch.set_default_device(None if context is None else context.device)
        if torch.get_default_dtype() != dtype:
            torch.set_default_dtype(dtype)

    return back


def cuda(
    schedule: Schedule | str | None = None, *, config: SimConfig | None = None, options: Options | None = None
) -> DropIn:
    """A torch.cuda session on the simulated device, under ``schedule`` (a schedule line, delays alone such as
    ``"d2h_stream#0+3"``, or None for the default order)."""
    return DropIn(schedule, config, options)
