"""The layout rules CONTRIBUTING.md states, checked on the source (ast), so a change that breaks one fails here.

- No module of ``simdevice`` reads a private name (``x._name``) that another module of the package defines, nor
  imports one: it calls the owner.
- The modules of ``simdevice`` and ``reference`` import each other without a circle (imports under
  ``TYPE_CHECKING`` and inside functions count too).
- Every happens-before edge is made in ``simdevice/runtime/sync.py``: nowhere else is a vector clock joined or
  ticked, or an event record (a clock snapshot) made.
- Nothing in ``reference/`` or in the programs' harnesses asks which backend it runs on.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("simdevice", "reference")


def modules(package: str) -> dict[str, ast.Module]:
    out = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join(parts)] = ast.parse(path.read_text(), str(path))
    return out


ALL = {name: tree for pkg in PACKAGES for name, tree in modules(pkg).items()}
SIMDEVICE = {name: tree for name, tree in ALL.items() if name.split(".")[0] == "simdevice"}


def private_definitions(tree: ast.Module) -> set[str]:
    """Private names a module defines: functions, classes, assigned names and attributes, slots."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def external_modules(tree: ast.Module) -> set[str]:
    """Names a module binds to modules outside the two packages (``torch``, ``sys``): their privates are theirs."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names if not a.name.startswith(PACKAGES)}
    return names


def test_no_module_reads_another_modules_private_names() -> None:
    defined = {name: private_definitions(tree) for name, tree in SIMDEVICE.items()}
    offences = []
    for name, tree in SIMDEVICE.items():
        others = set().union(*(d for m, d in defined.items() if m != name))
        external = external_modules(tree)
        for node in ast.walk(tree):
            root = node
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in external:
                continue  # torch._ops.OpOverload, sys._getframe: another library's business
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and node.attr in others
                and node.attr not in defined[name]
            ):
                offences.append(f"{name}:{node.lineno} reads .{node.attr}")
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("simdevice"):
                offences += [f"{name}:{node.lineno} imports {a.name}" for a in node.names
                             if a.name.startswith("_") and not a.name.startswith("__")]
    assert offences == []


def imports_of(name: str, tree: ast.Module) -> set[str]:
    """The modules of the two packages that ``name`` imports (a name imported from a package that is one of its
    modules counts as that module)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = node.module
            if node.level:
                base = ".".join([*name.split(".")[: -node.level], node.module])
            submodules = {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in ALL}
            out |= submodules
            if len(submodules) < len(node.names):  # names defined by the package (or module) itself
                out.add(base)
    return {m for m in out if m in ALL and m != name}


def test_no_import_circle() -> None:
    graph = {name: imports_of(name, tree) for name, tree in ALL.items()}
    cycles = []
    state: dict[str, int] = {}

    def visit(n: str, path: list[str]) -> None:
        state[n] = 1
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                cycles.append(" -> ".join([*path[path.index(m):], m]))
            elif m not in state:
                visit(m, [*path, m])
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n, [n])
    assert cycles == []


CLOCK_CALLS = {"join", "tick"}


@pytest.mark.parametrize("name", sorted(SIMDEVICE))
def test_happens_before_edges_are_made_in_the_sync_module_only(name: str) -> None:
    if name in ("simdevice.runtime.sync", "simdevice.runtime.clock"):
        return
    offences = []
    for node in ast.walk(SIMDEVICE[name]):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            f = node.func
            on_clock = (isinstance(f.value, ast.Attribute) and f.value.attr == "clock") or (
                isinstance(f.value, ast.Name) and f.value.id == "clock"
            )
            if f.attr in CLOCK_CALLS and on_clock:
                offences.append(f"line {node.lineno}: .clock.{f.attr}(...)")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "EventRecord":
            offences.append(f"line {node.lineno}: EventRecord(...)")
    assert offences == []


BACKEND_NAMES = {"SimDevice", "CudaDevice", "SimMemorySaver", "MemorySaverHandle", "isinstance_backend"}


@pytest.mark.parametrize("name", sorted(n for n in ALL if n.startswith(("reference.", "simdevice.programs"))
                                        and n not in ("reference.cuda", "reference.cuda_plain", "reference.device",
                                                      "reference.contract")))
def test_protocols_and_harnesses_never_ask_which_backend_runs_them(name: str) -> None:
    used = {n.id for n in ast.walk(ALL[name]) if isinstance(n, ast.Name)}
    used |= {n.attr for n in ast.walk(ALL[name]) if isinstance(n, ast.Attribute)}
    assert used & BACKEND_NAMES == set()
