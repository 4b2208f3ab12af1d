"""``torch_memory_saver`` for plain programs: while a session is open, ``import torch_memory_saver`` gives this
module's stand-in, whose singleton ``torch_memory_saver`` is the session's simulated memory saver
(``simdevice.runtime.memsaver``: the calling process's pausable regions over the simulated caching allocator).

The stand-in has the library's interface (``TorchMemorySaver``: ``region``, ``disable``, ``pause``, ``resume``,
``cuda_graph``, ``enabled``, ``hook_mode``, ``memory_margin_bytes``, ``retain_cpu_backup``, ``get_cpu_backup``,
``set_disk_backup_dir``; and ``configure_subprocess``); what the simulator does not model raises
``NotImplementedError`` (no verdict). The library itself, where installed, is left as it was: a name bound from it
before the session (``from torch_memory_saver import torch_memory_saver`` at import time) is the real library's
singleton, as other names bound before a session keep torch's (docs/dropin.md, "Not intercepted"); the module's own
attribute ``torch_memory_saver`` is the stand-in's while the session is open.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator
from typing import Any

from simdevice.dropin.patches import Patches

#: the module name the library is imported by
MODULE = "torch_memory_saver"


def _saver() -> Any:  # the session device's MemorySaverHandle
    from simdevice.dropin.facade import session_device

    return session_device().memory_saver


class TorchMemorySaver:
    """The library's ``TorchMemorySaver`` on the session's simulated device."""

    def region(
        self, tag: str = "default", enable_cpu_backup: bool = False, enable_disk_backup: bool = False,
        cpu_backup_backend: str | None = None,
    ) -> Any:
        return _saver().region(tag, enable_cpu_backup, enable_disk_backup, cpu_backup_backend)

    def cuda_graph(self, *args: Any, **kwargs: Any) -> Any:
        return _saver().cuda_graph(*args, **kwargs)

    def disable(self) -> Any:
        return _saver().disable()

    def pause(self, tag: str | None = None) -> None:
        _saver().pause(tag)

    def resume(self, tag: str | None = None) -> None:
        _saver().resume(tag)

    @property
    def enabled(self) -> bool:
        return True

    @property
    def hook_mode(self) -> str:
        raise AttributeError  # as the library: a setter only

    @hook_mode.setter
    def hook_mode(self, hook_mode: str) -> None:
        pass  # how the library hooks the allocator (preload or torch): the simulated one needs no hook

    @property
    def memory_margin_bytes(self) -> int:
        raise NotImplementedError("Only setter is supported")  # the library's own answer

    @memory_margin_bytes.setter
    def memory_margin_bytes(self, value: int) -> None:
        _saver().memory_margin_bytes = value

    @property
    def retain_cpu_backup(self) -> bool:
        return bool(_saver().retain_cpu_backup)

    @retain_cpu_backup.setter
    def retain_cpu_backup(self, value: bool) -> None:
        _saver().retain_cpu_backup = value

    def get_cpu_backup(self, x: Any, zero_copy: bool = False) -> Any:
        return _saver().get_cpu_backup(x, zero_copy)

    def set_disk_backup_dir(self, path: str) -> None:
        _saver().set_disk_backup_dir(path)


@contextlib.contextmanager
def configure_subprocess() -> Iterator[None]:
    """The library's ``configure_subprocess`` (``LD_PRELOAD`` of its hook for the processes started in it): a
    simulated process needs none."""
    yield


def _module() -> types.ModuleType:
    m = types.ModuleType(MODULE, __doc__)
    m.TorchMemorySaver = TorchMemorySaver  # type: ignore[attr-defined]
    m.torch_memory_saver = TorchMemorySaver()  # type: ignore[attr-defined]
    m.configure_subprocess = configure_subprocess  # type: ignore[attr-defined]
    return m


#: the stand-in, made once
STAND_IN = _module()


def install(p: Patches) -> None:
    """``import torch_memory_saver`` gives the stand-in until ``p.restore()``; the library's module, if imported
    already, answers the stand-in's singleton as its ``torch_memory_saver``."""
    real = sys.modules.get(MODULE)
    if real is not None and real is not STAND_IN:
        p.set(real, "torch_memory_saver", STAND_IN.torch_memory_saver)
    p.set_module(MODULE, STAND_IN)


def patched_owners() -> list[Any]:
    real = sys.modules.get(MODULE)
    return [real] if real is not None and real is not STAND_IN else []
