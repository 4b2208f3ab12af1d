"""What one simulated process sends another, pickled as the real send pickles it (``multiprocessing``'s queues and
arguments, ``torch.distributed``'s object collectives): at the send, so that what the sender changes afterwards does
not reach the receiver, and each receipt a copy of its own. What must not go through pickle (a tensor, a primitive
of the run) is left out as a persistent id: the sender says what, and how each receiver gets it back."""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable
from typing import Any


def pickled(obj: Any, left_out: Callable[[Any], bool]) -> tuple[bytes | None, list[Any]]:
    """``obj`` pickled with the objects ``left_out`` names taken out (each once, by identity, in the order met);
    (None, []) where it does not pickle here (a local function or class in it)."""
    refs: list[Any] = []
    index: dict[int, int] = {}
    buf = io.BytesIO()
    pickler = pickle.Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL)

    def persistent_id(x: Any) -> int | None:
        if not left_out(x):
            return None
        if id(x) not in index:
            index[id(x)] = len(refs)
            refs.append(x)
        return index[id(x)]

    pickler.persistent_id = persistent_id  # type: ignore[method-assign]
    try:
        pickler.dump(obj)
    except (pickle.PicklingError, TypeError, AttributeError, RecursionError, ValueError):
        return None, []
    return buf.getvalue(), refs


def unpickled(payload: bytes, load: Callable[[int], Any]) -> Any:
    """The receiver's copy of a payload :func:`pickled` made: ``load(i)`` gives back what was left out as ``i``."""
    unpickler = pickle.Unpickler(io.BytesIO(payload))
    unpickler.persistent_load = load  # type: ignore[method-assign]
    return unpickler.load()
