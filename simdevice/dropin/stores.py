"""``torch.distributed``'s key-value stores in a torch.cuda session: those a program makes in a run are simulated.

A ``TCPStore``, ``FileStore`` or ``HashStore`` made by a rank or process of the run is a :class:`SimStore`: every
store of one address in the run (a ``TCPStore``'s host and port, a ``FileStore``'s file; a ``HashStore`` is its
own) shares its keys, as the processes that connect to one server or open one file do. The actors take turns on
one thread, so a real store's blocking ``get`` or ``wait`` for a key another rank sets would block the whole run
(a hang, or the store's timeout raised where the program is right). Each call is a host step of the caller: a
``get`` or ``wait`` waits for the key without polling and is then ordered after the call that set it (the same
edge a queue's get has with its put); ``add``, ``compare_set``, ``append`` and ``delete_key`` read and write the key
in one step. A key no one ever sets is a deadlock, where a real store would raise its timeout after 300 s;
``wait(keys, timeout)`` given a timeout gives up after that much virtual time with torch's ``DistStoreError``. A
store orders the hosts, not their streams. ``PrefixStore`` over one of them is a simulated store too, over the
same keys under its prefix, as torch's. A store made outside the run's actors is torch's own.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from simdevice.dropin.facade import in_actor, session_device
from simdevice.dropin.patches import Patches
from simdevice.dropin.processes import timed
from simdevice.runtime.runtime import SharedCell


def _bytes(value: Any) -> bytes:
    """What torch stores for a value: a ``str`` as its UTF-8 bytes, bytes as they are."""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, list):  # (pybind11 takes a list of ints as a std::vector<uint8_t>)
        return bytes(value)
    raise TypeError(f"a store's value is a str or bytes, not {type(value).__name__}")


class SimStore(dist.Store):
    """A store of the run: its keys (each a shared cell, None while unset) are those of every store of its
    address."""

    def __init__(self, keys: dict[str, SharedCell], prefix: str = "", **attributes: Any) -> None:
        super().__init__()
        self._dev = session_device()
        self._keys = keys
        self._prefix = prefix  # (a PrefixStore's: ``prefix/`` before each key, as torch's)
        self._dev.stores_made.append(self)
        for name, value in attributes.items():  # (a TCPStore's host and port)
            setattr(self, name, value)

    def prefixed(self, prefix: str) -> SimStore:
        """``PrefixStore(prefix, self)``: the same keys, each under ``prefix/``."""
        return SimStore(self._keys, f"{self._prefix}{prefix}/")

    def _cell(self, key: str) -> SharedCell:
        key = self._prefix + key
        cell = self._keys.get(key)
        if cell is None:
            cell = self._keys[key] = SharedCell(None)
        return cell

    def _wait(self, key: str, step: str) -> bytes:
        self._dev.runtime.value_wait(self._cell(key), lambda v: v is not None, step,
                                     f"key {key!r} of a store, which another rank or process sets")
        return self._cell(key).value  # type: ignore[no-any-return]

    def _update(self, key: str, update: Callable[[bytes | None], bytes | None], step: str) -> bytes | None:
        return self._dev.runtime.value_update(self._cell(key), update, step)  # type: ignore[no-any-return]

    def set(self, key: str, value: Any) -> None:
        self._dev.runtime.value_set(self._cell(key), _bytes(value), "Store.set")

    def get(self, key: str) -> bytes:
        return self._wait(key, "Store.get")

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        if timeout is not None:
            if not timed(lambda: self.check(keys), timeout.total_seconds()):
                raise dist.DistStoreError(f"Wait timeout for keys {keys}")
            for key in keys:  # (each ordered after its setter: the check that saw them read them)
                self._wait(key, "Store.wait")
            return
        for key in keys:
            self._wait(key, "Store.wait")

    def check(self, keys: list[str]) -> bool:
        rt = self._dev.runtime
        return all(rt.value_get(self._cell(key), "Store.check") is not None for key in keys)

    def add(self, key: str, amount: int) -> int:
        new = self._update(key, lambda v: str(int(v or b"0") + int(amount)).encode(), "Store.add")
        return int(new or b"0")

    def compare_set(self, key: str, expected_value: Any, desired_value: Any) -> bytes:
        expected, desired = _bytes(expected_value), _bytes(desired_value)
        seen: list[bytes | None] = []

        def update(v: bytes | None) -> bytes | None:
            seen.append(v)
            return desired if (v is None and not expected) or v == expected else v

        new = self._update(key, update, "Store.compare_set")
        # (as c10d's: the desired value where it was set, the current one where not, the expected one for no key)
        return expected if seen[0] is None and new is None else new  # type: ignore[return-value]

    def append(self, key: str, value: Any) -> None:
        self._update(key, lambda v: (v or b"") + _bytes(value), "Store.append")

    def delete_key(self, key: str) -> bool:
        seen: list[bytes | None] = []
        self._update(key, lambda v: seen.append(v) or None, "Store.delete_key")  # type: ignore[func-returns-value]
        return seen[0] is not None

    def num_keys(self) -> int:
        rt = self._dev.runtime
        cells = [cell for key, cell in list(self._keys.items()) if key.startswith(self._prefix)]
        return sum([rt.value_get(cell, "Store.num_keys") is not None for cell in cells])

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return [self._wait(key, "Store.multi_get") for key in keys]

    def multi_set(self, keys: list[str], values: list[Any]) -> None:
        for key, value in zip(keys, values, strict=True):
            self.set(key, value)

    def has_extended_api(self) -> bool:
        return True


def _keys(address: tuple[Any, ...] | None) -> dict[str, SharedCell]:
    """The keys of the run's store at ``address`` (None: a store of its own)."""
    if address is None:
        return {}
    stores = session_device().stores
    if address not in stores:
        stores[address] = {}
    return stores[address]  # type: ignore[no-any-return]


def _tcp_store(original: Any) -> Any:
    def make(host_name: str, port: int, *args: Any, **kwargs: Any) -> Any:
        if not in_actor():
            return original(host_name, port, *args, **kwargs)
        _refuse_gpu()
        return SimStore(_keys(("tcp", str(host_name), int(port))), host=str(host_name), port=int(port))

    return make


def _file_store(original: Any) -> Any:
    def make(file_name: str, *args: Any, **kwargs: Any) -> Any:
        if not in_actor():
            return original(file_name, *args, **kwargs)
        _refuse_gpu()
        return SimStore(_keys(("file", os.path.abspath(file_name))))

    return make


def _hash_store(original: Any) -> Any:
    def make(*args: Any, **kwargs: Any) -> Any:
        if not in_actor():
            return original(*args, **kwargs)
        _refuse_gpu()
        return SimStore(_keys(None))

    return make


def _prefix_store(original: Any) -> Any:
    def make(prefix: str, store: Any) -> Any:
        # (torch's PrefixStore would call the simulated store from C++, where an actor cannot stop and let
        # another run: the simulated one prefixes the keys itself)
        return store.prefixed(prefix) if isinstance(store, SimStore) else original(prefix, store)

    return make


def _refuse_gpu() -> None:
    # (reference.cuda_plain refuses the program's stores: their steps are not counted on the GPU yet; the replay
    # line offers no --gpu)
    session_device().runtime.gpu_replay = False


_MAKERS = {"TCPStore": _tcp_store, "FileStore": _file_store, "HashStore": _hash_store, "PrefixStore": _prefix_store}


def install(p: Patches) -> None:
    """Put the simulated stores in place of ``torch.distributed``'s (and ``distributed_c10d``'s names of them)."""
    c10d = dist.distributed_c10d
    for name, maker in _MAKERS.items():
        original = getattr(dist, name)
        p.set(dist, name, maker(original))
        if name in vars(c10d):
            p.set(c10d, name, maker(original))


def patched_owners() -> list[Any]:
    return [dist, dist.distributed_c10d]
