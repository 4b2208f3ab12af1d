"""Who issued an operation: the program's Python, or autograd's engine on its own.

A host step costs what the host does before it. In a forward pass that is the program's Python; in a backward
pass most operations (each node's derivative formula, a gradient's accumulation) are issued by autograd's C++
engine with no Python between them: cheaper host steps (on the H200 83 us against activation_offload's 127 us,
both with the GPU backend's own counting in them). Both backends ask :meth:`Origin.from_engine`, so
``scripts/calibrate`` measures the two kinds apart on the GPU and the simulator charges them apart
(``SimConfig.engine_step_ns``).

An operation comes from the engine when, walking out from the backend's own frames (and torch's), the first
frame met is where Python handed the graph to the engine (``torch.autograd.graph._engine_run_backward``: the
simulator runs backward on the calling thread) or there is none (CUDA runs a device's nodes on the engine's own
thread). A saved-tensor hook, a custom ``Function.backward`` or a tensor hook is the program's Python, whoever
called it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import CodeType

#: the function of torch/autograd/graph.py that calls the C++ engine (``backward`` and ``autograd.grad`` both)
_ENTRY = "_engine_run_backward"

_OTHER, _SKIP, _ENGINE = 0, 1, 2


class Origin:
    """``from_engine()`` for one backend: ``internal(filename)`` says which frames are the backend's own or a
    library's (skipped on the way out)."""

    def __init__(self, internal: Callable[[str], bool]) -> None:
        self.internal = internal
        self._kinds: dict[CodeType, int] = {}

    def _kind(self, code: CodeType) -> int:
        kind = self._kinds.get(code)
        if kind is None:
            name = code.co_filename.replace("\\", "/")
            if code.co_name == _ENTRY and name.endswith("/torch/autograd/graph.py"):
                kind = _ENGINE
            else:
                kind = _SKIP if self.internal(code.co_filename) else _OTHER
            self._kinds[code] = kind
        return kind

    def from_engine(self) -> bool:
        """Whether the operation being issued now comes from autograd's engine, not from Python code."""
        f = sys._getframe(1)
        kinds = self._kinds
        while f is not None:
            code = f.f_code
            kind = kinds.get(code)
            if kind is None:
                kind = self._kind(code)
            if kind != _SKIP:
                return kind == _ENGINE
            f = f.f_back  # type: ignore[assignment]
        return True
