"""Functions of the user's as targets the tool runs under a schedule: ``path/to/file.py::fn``, ``pkg.mod::fn``.

A target function is either plain torch.cuda code, ``fn(**config)``, run under the drop-in
(:func:`simdevice.cuda`), or written against the device contract, ``fn(dev, **config)`` (its first parameter is
named ``dev``), run on a :class:`~simdevice.SimDevice`. Its other parameters, if any, are its configuration: each
must have a default, and a schedule's ``KEY=VALUE`` items set them (converted to the default's type). An
``assert`` in the function is its value oracle: a failing one ends the run as a host error.

What a target does is learned from a probe run (the default schedule): its actors and how many operations each
makes, so that a search draws delays only at operations that exist.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import functools
import hashlib
import importlib
import importlib.util
import inspect
import itertools
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn, Protocol

import attrs

from reference.contract import Run
from reference.naming import import_file_as
from reference.schedule import Schedule, ScheduleError, is_function_target, parse_int
from simdevice.api import SimDevice
from simdevice.dropin import DropIn
from simdevice.dropin.session import held, host_generators_kept, seed_host_generators
from simdevice.programs import Program
from simdevice.runtime import inserted_edges
from simdevice.runtime.config import MAX_WORLD_SIZE, SimConfig, active_profile, active_values, overrides_active
from simdevice.runtime.reports import describe, error_source, exit_succeeded
from simdevice.search.execute import NESTED, Outcome, counts_as_failure, execute

#: the GPU's calibrated sleep cycles per ms, measured once per process
_CYCLES: list[float] = []


class TargetError(ScheduleError):
    """A target that cannot be run: no such file or function, or parameters the tool cannot fill."""


class Target(Protocol):
    """What the search, the exhaustive mode, the decorator and the command line need of anything they run: a user's
    function (:class:`FunctionTarget`) or a built-in program's variant (:class:`ProgramTarget`)."""

    #: how schedule lines name it (``file.py::fn``, ``program/variant``)
    @property
    def name(self) -> str: ...
    def schedule(self, config: dict[str, Any] | None = None, delays: Any = ()) -> Schedule: ...
    def run(self, schedule: Schedule, backend: str = "sim") -> Outcome: ...
    def probe(self, config: dict[str, Any] | None = None) -> dict[str, int]: ...
    def canonical(self, schedule: Schedule) -> Schedule: ...
    def failed(self, out: Outcome) -> bool: ...
    def configs(self) -> list[dict[str, Any]]: ...


@attrs.frozen(eq=False)
class FunctionTarget:
    """A user's function, ready to run under any schedule."""

    #: the schedule target: ``path.py::fn`` or ``pkg.mod::fn``
    name: str
    fn: Callable[..., Any]
    #: "plain" (torch.cuda code, the drop-in) or "contract" (``fn(dev, ...)``)
    style: str
    #: configuration parameters and their defaults
    params: dict[str, Any] = attrs.field(factory=dict)
    #: ranks to run it on (None: the host actor alone)
    world_size: int | None = None
    #: False: every simulated run of it is race-only (``SimConfig.values``), its probe's too
    values: bool = True
    #: the strategy of its configurations a ``simdevice.fuzz`` test draws them from (None: its defaults), which a
    #: search of it draws from too (``check FILE.py::test_fn``, ``simdevice.explore(test_fn)``)
    strategy: Any = attrs.field(default=None, eq=False, repr=False)
    #: the delay-free run of each configuration made so far (the probe's)
    _defaults: dict[Any, Outcome] = attrs.field(factory=dict, repr=False)

    def config(self, values: dict[str, str]) -> dict[str, Any]:
        """Keyword arguments from a schedule's configuration (text), converted to the defaults' types."""
        out = {}
        for k, v in values.items():
            if k not in self.params:
                known = ", ".join(sorted(self.params)) or "none"
                raise TargetError(f"{self.name} has no parameter {k!r} (parameters: {known})")
            out[k] = _convert(k, v, self.params[k])
        return out

    def validate(self, schedule: Schedule, edges: Sequence[Any] = ()) -> dict[str, Any]:
        """``schedule``'s configuration as keyword arguments, after checking that every delay, and every inserted
        edge's two sites (``edges``, :class:`~simdevice.runtime.sync.Edge`), name an actor the function has in that
        configuration (learned from its probe run); TargetError otherwise."""
        kwargs = self.config(schedule.config_dict())
        named = [(f"delay {d}", d.actor) for d in schedule.delays]
        named += [(f"edge {e}", site.actor) for e in edges for site in (e.after, e.before)]
        if named:
            actors = self.probe(kwargs)
            for what, actor in named:
                if actor not in actors:
                    plain = self.run(self.schedule(schedule.config_dict()))  # (the probe's run, kept)
                    early = [r for r in plain.run.reports if r.kind in ("host-error", "step-limit", "deadlock")]
                    # (the report's first line, cut short: an error's text may run to many, and long ones, as
                    # torch's dispatcher's does)
                    why = ""
                    if early:
                        first = str(early[0]).splitlines()[0]
                        first = first if len(first) <= 160 else first[:157] + "..."
                        why = f" (its run without delays ended early, before it could make one: {first})"
                    raise TargetError(
                        f"{what} names actor {actor!r}, which {self.name} does not have{why}; "
                        f"actors: {', '.join(sorted(actors))}"
                    )
        return kwargs

    def run(self, schedule: Schedule, backend: str = "sim") -> Outcome:
        """Run the function under ``schedule`` (its target must be this one) and judge it. On the simulator a
        schedule without delays is run once per configuration (the probe's run): a run is deterministic."""
        kwargs = self.config(schedule.config_dict())
        if backend != "sim":
            return self._run_cuda(schedule, kwargs)
        return _once(self._defaults, schedule, _key(kwargs), lambda: self._run_sim(schedule, kwargs))

    def _run_sim(self, schedule: Schedule, kwargs: dict[str, Any]) -> Outcome:
        config = None if self.values else SimConfig(values=False)
        with module_state_kept(self.fn):
            if self.style == "plain":
                run = DropIn(schedule, config).run(self.fn, world_size=self.world_size, **kwargs)
            else:
                run = SimDevice(schedule, config).run(self._contract_body(kwargs))
        return Outcome(schedule, run, (), "sim", active_profile(), self.values and active_values(), self.world_size)

    def _run_cuda(self, schedule: Schedule, kwargs: dict[str, Any]) -> Outcome:
        """On the GPU: what the function raises (a failing ``assert``) is the run's problem, as a host error is
        on the simulator; the counts made up to there are kept."""
        import torch

        from reference.cuda import CudaDevice

        dev = CudaDevice(schedule, cycles_per_ms=_CYCLES[0] if _CYCLES else None)
        _CYCLES[:] = [dev.cycles_per_ms]
        back = host_generators_kept()
        try:
            seed_host_generators()  # (the numbers the simulator's run drew: the same run)
            with module_state_kept(self.fn):
                if self.style == "plain":
                    # on ranks, each a process of its own: the function by where it is, found again there
                    fn = self.fn if self.world_size is None else RankFunction(self.name, os.getcwd())
                    run = dev.run_plain(fn, world_size=self.world_size, **kwargs)
                else:
                    run = dev.run(self._contract_body(kwargs))
        except (Exception, SystemExit) as e:
            torch.cuda.synchronize()
            run = Run(result=None, op_counts=dict(dev.counter.counts), unfired=dev.counter.unfired())
            # (``sys.exit(0)``: the script succeeded, as on the simulator: ``reports.exit_succeeded``)
            failed = not (isinstance(e, SystemExit) and exit_succeeded(e))
            return Outcome(schedule, run, (f"host raised {describe(e)} ({error_source(e)})",) if failed else (),
                           "cuda", world_size=self.world_size)
        finally:
            back()
        return Outcome(schedule, run, (), "cuda", world_size=self.world_size)

    def _contract_body(self, kwargs: dict[str, Any]) -> Callable[[Any], Any]:
        def body(dev: Any) -> Any:
            if self.world_size is None:
                return self.fn(dev, **kwargs)
            return dev.spawn_ranks(lambda d: self.fn(d, **kwargs), self.world_size)

        return body

    def schedule(self, config: dict[str, Any] | None = None, delays: Any = ()) -> Schedule:
        return Schedule(self.name, "", config or {}, delays)

    def failed(self, out: Outcome) -> bool:
        """What a search counts as found: what a GPU would show (anything but a race alone)."""
        return out.corrupted

    def configs(self) -> list[dict[str, Any]]:
        """The configurations the exhaustive mode walks: the defaults."""
        return [{}]

    def canonical(self, schedule: Schedule) -> Schedule:
        """The same schedule with configuration values equal to the defaults left out (the shortest line)."""
        defaults = {k: Schedule(self.name, "", {k: v}).config[0][1] for k, v in self.params.items()
                    if isinstance(v, (bool, int, float, str))}
        return attrs.evolve(schedule, config=tuple((k, v) for k, v in schedule.config if defaults.get(k) != v))

    def probe(self, config: dict[str, Any] | None = None) -> dict[str, int]:
        """Operations per actor of the default schedule in ``config``."""
        return dict(self.run(self.schedule(config)).run.op_counts)


@contextlib.contextmanager
def module_state_kept(fn: Callable[..., Any]) -> Any:
    """Run the block (one run of ``fn``) and put ``fn``'s module's globals back as they were: the names it bound or
    rebound, and the contents of the plain lists, dicts and sets among them. Each run of a target is a process of
    its own on a GPU: a stream, a buffer or a count the program keeps in its module (``_STREAM = None``, made at
    the first call) starts afresh at every run, not from what an earlier run (a probe, a simulated run before a GPU
    one) left there. The program's ``sys.argv`` is its file's alone meanwhile (:func:`_no_arguments`)."""
    names = getattr(fn, "__globals__", None)
    if not isinstance(names, dict):
        with _no_arguments(getattr(fn, "__module__", None) or "<program>"):
            yield
        return
    with _no_arguments(names.get("__file__") or names.get("__name__") or "<program>"):
        yield from _globals_kept(names)


@contextlib.contextmanager
def _no_arguments(script: str) -> Iterator[None]:
    """The block runs as ``python SCRIPT`` would, with no arguments: ``sys.argv`` is ``[SCRIPT]``, not the command
    line of the tool (or of pytest) that runs it, so a ``main()`` that parses its arguments (``argparse``) takes its
    defaults, as on a GPU."""
    argv = sys.argv
    sys.argv = [script]
    try:
        yield
    finally:
        sys.argv = argv


def _globals_kept(names: dict[str, Any]) -> Iterator[None]:
    before = dict(names)
    contents: list[tuple[Any, Any]] = []
    for value in before.values():
        kind = type(value)
        if kind is list or kind is dict or kind is set:
            contents.append((value, kind(value)))
    try:
        yield
    finally:
        for name in [n for n in names if n not in before]:
            del names[name]
        for name, value in before.items():
            if names.get(name, _GONE) is not value:
                names[name] = value
        for container, kept in contents:
            if not _same(container, kept):
                container.clear()
                if type(container) is list:
                    container.extend(kept)
                else:
                    container.update(kept)


_GONE = object()


def _same(container: Any, kept: Any) -> bool:
    """Whether a list, dict or set holds the very objects it held (by identity: ``==`` on tensors is a tensor)."""
    if len(container) != len(kept):
        return False
    if type(container) is list:
        return all(a is b for a, b in zip(container, kept, strict=True))
    if type(container) is dict:
        return all(k in container and container[k] is v for k, v in kept.items())
    return all(x in container for x in kept)


def _key(config: dict[str, Any]) -> Any:
    """A configuration as a cache key (None: not hashable, not cached)."""
    key = tuple(sorted((k, v) for k, v in config.items()))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _once(cache: dict[Any, Outcome], schedule: Schedule, key: Any, run: Callable[[], Outcome]) -> Outcome:
    """``run()``, or the outcome of the same configuration's delay-free run made before (a run is deterministic;
    not while edges are inserted: the cached run had none)."""
    if schedule.delays or schedule.choices or key is None or inserted_edges() or overrides_active():
        return run()
    out = cache.get(key)
    if out is None:
        out = cache[key] = run()
    return attrs.evolve(out, schedule=schedule)


@attrs.frozen
class ProgramTarget:
    """A variant of a built-in program (``simdevice.programs``), through the same interface as a user's function:
    ``simdevice check`` without a target, the tests and the benchmarks search these."""

    program: Program
    variant: str
    #: the delay-free run of each configuration made so far (the probe's)
    _defaults: dict[Any, Outcome] = attrs.field(factory=dict, eq=False, repr=False)

    @property
    def name(self) -> str:
        return f"{self.program.name}/{self.variant}"

    def schedule(self, config: dict[str, Any] | None = None, delays: Any = ()) -> Schedule:
        return Schedule(self.program.name, self.variant, {k: str(v) for k, v in (config or {}).items()}, delays)

    def run(self, schedule: Schedule, backend: str = "sim") -> Outcome:
        """Run ``schedule``; on the simulator, a delay-free one once per configuration (a run is deterministic)."""
        if backend != "sim":
            return execute(schedule, backend)
        return _once(self._defaults, schedule, self._key(schedule), lambda: execute(schedule))

    def _key(self, schedule: Schedule) -> Any:
        """The configuration a schedule runs in, as a cache key: the one its values make, so that a line that leaves
        the defaults out and one that spells them are the same run."""
        try:
            return _key(attrs.asdict(self.program.parse_config(schedule.config_dict())))
        except ScheduleError:  # a configuration the program refuses (ConfigError): its run says why, uncached
            return None

    def probe(self, config: dict[str, Any] | None = None) -> dict[str, int]:
        """Operations per actor of the default schedule in ``config``, restricted to the actors the program lets a
        schedule delay."""
        out = self.run(self.schedule(config))
        return {a: n for a, n in out.run.op_counts.items() if a in self.program.actors}

    def canonical(self, schedule: Schedule) -> Schedule:
        return self.program.canonical(schedule)

    def failed(self, out: Outcome) -> bool:
        return counts_as_failure(self.program, self.variant, out)

    def configs(self) -> list[dict[str, Any]]:
        """Every configuration of the program's space (that its filter lets through)."""
        space = self.program.config_space
        keys = sorted(space)
        every = [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(space[k] for k in keys))]
        keep = self.program.config_filter
        return [c for c in every if keep is None or keep(c)]


def kept_patched(target: Target) -> contextlib.AbstractContextManager[Any]:
    """Plain code: torch stays patched across a search's runs, each run only swaps the device."""
    return held() if isinstance(target, FunctionTarget) and target.style == "plain" else contextlib.nullcontext()


def target_of(text: str, world_size: int | None = None) -> Target:
    """The target a schedule target names: ``file.py::fn`` / ``module::fn`` (run on ``world_size`` ranks, where
    given), or ``program/variant`` (ScheduleError with a world size: a built-in program makes its own ranks)."""
    if is_function_target(text) or "::" in text or (":" in text and "/" not in text.split(":")[0]):
        return resolve(text, world_size)
    if world_size is not None:
        raise ScheduleError(f"--world-size is for a function target (FILE.py::FUNCTION); {text[:200]!r} is a "
                            "built-in program, which makes its own ranks")
    from simdevice.programs import resolve as resolve_program

    schedule = Schedule.parse(text)
    program, _ = resolve_program(schedule)
    return ProgramTarget(program, schedule.variant)


def _convert(key: str, text: str, default: Any) -> Any:
    try:
        if isinstance(default, bool):
            if text not in ("0", "1", "True", "False", "true", "false"):
                raise ValueError(text)
            return text in ("1", "True", "true")
        if isinstance(default, int):
            return parse_int(text)
        if isinstance(default, float):
            return float(text)
    except ValueError:
        kind = "true or false" if isinstance(default, bool) else "an integer" if isinstance(default, int) \
            else "a number"
        raise TargetError(f"configuration {key}={text!r}: expected {kind}, as the default {default!r}") from None
    if default is not None and not isinstance(default, str):
        raise TargetError(f"configuration {key}={text!r}: its default {default!r:.60} is a {type(default).__name__}, "
                          "which a schedule line cannot give (it gives integers, numbers, true or false, and text)")
    return text


# -- finding the function -------------------------------------------------------------------------------------


def split(text: str) -> tuple[str, str]:
    """``(path or module, function)`` of ``x.py::fn``, ``pkg.mod::fn`` or ``pkg.mod:fn``."""
    where, sep, name = text.rpartition("::")
    if not sep:
        where, sep, name = text.rpartition(":")
    if not sep or not where or not name:
        raise TargetError(f"bad target {text[:200]!r}: expected FILE.py::FUNCTION or MODULE::FUNCTION")
    return where, name


@functools.lru_cache(maxsize=64)
def _load_file(path: str) -> Any:
    digest = hashlib.sha1(path.encode()).hexdigest()[:12]
    name = f"simdevice_target_{os.path.splitext(os.path.basename(path))[0]}_{digest}"
    # (a module that parses its arguments as it is imported: none given)
    module = import_file_as(name, path, _no_arguments(path))
    if module is None:
        raise TargetError(f"cannot import {path}: not a Python file")
    return module


class _ExitAtImport(BaseException):
    """``os._exit(n)`` while a target's file or module is imported: the import fails, the command goes on."""

    def __str__(self) -> str:
        return f"os._exit({self.args[0]})"


def _exit_at_import(status: int) -> NoReturn:
    raise _ExitAtImport(status)


def _module_of(where: str) -> Any:
    real_exit = os._exit
    os._exit = _exit_at_import  # (it would end the command at once, with nothing said, under its exit code)
    try:
        return _imported(where)
    finally:
        os._exit = real_exit


def path_problem(where: str) -> str | None:
    """Why ``where`` (a target's file or module, before its ``::``) names no Python file or module, where it names
    something else on disk: a folder (a package with its ``__init__.py``, named by its dotted name, is a module) or a
    file that is not a ``.py``; None otherwise (a FILE.py, or a module's name, found or not)."""
    shown = where[:200]
    if os.path.isdir(where):
        dotted = all(part.isidentifier() for part in where.split("."))
        if dotted and not where.endswith(".py") and os.path.isfile(os.path.join(where, "__init__.py")):
            return None  # a package: imported as MODULE
        return f"{shown!r} is a folder, not a file: name a FILE.py in it"
    if os.path.exists(where) and not where.endswith(".py"):
        return f"{shown!r} is not a Python file: name a FILE.py (or a module by its dotted name, pkg.mod)"
    return None


def _imported(where: str) -> Any:
    why = path_problem(where)
    if why is not None:
        raise TargetError(why)
    try:
        if where.endswith(".py"):
            path = os.path.abspath(where)
            if not os.path.isfile(path):
                raise TargetError(f"no file {where[:200]!r}")
            return _load_file(path)
        here = os.getcwd()
        if "" not in sys.path and here not in sys.path:
            sys.path.insert(0, here)  # a module of the folder the command runs in, as python -m would find it
        with _no_arguments(where):
            return importlib.import_module(where)
    except TargetError:
        raise
    except ModuleNotFoundError as e:
        if not where.endswith(".py") and e.name is not None and (where == e.name or where.startswith(e.name + ".")):
            raise TargetError(f"no module {where[:200]!r} ({e.msg})") from None
        raise TargetError(f"importing {where[:200]!r} failed: ModuleNotFoundError: {e.msg[:200]}") from None
    except _ExitAtImport as e:
        raise TargetError(f"importing {where[:200]!r} failed: it called {e}") from None
    except BaseException as e:  # its own import failed: say so in one line
        try:
            text = str(e)
        except Exception:  # (an exception class of the program's whose __str__ raises)
            text = "(its text could not be made: its str() raised)"
        first = text.splitlines()[0] if text else ""
        raise TargetError(f"importing {where[:200]!r} failed: {type(e).__name__}: {first[:200]}"
                          f"{_import_site(e)}{_cuda_at_import(first)}") from None


def _import_site(e: BaseException) -> str:
    """`` (FILE:LINE)`` of the innermost frame outside torch where an import raised ``e``, or nothing."""
    torch_dir = os.path.dirname(importlib.util.find_spec("torch").origin or "")  # type: ignore[union-attr]
    site = ""
    tb = e.__traceback__
    while tb is not None:
        path = tb.tb_frame.f_code.co_filename
        if os.path.isfile(path) and not path.startswith(torch_dir) and not path.startswith(os.path.dirname(__file__)):
            shown = os.path.relpath(path)
            site = f" ({path if shown.startswith('..') else shown}:{tb.tb_lineno})"
        tb = tb.tb_next
    return site


def _cuda_at_import(message: str) -> str:
    """A hint where an import failed at CUDA (a stream, an event or a device tensor made at the module's top
    level): the module is imported outside any run, on a torch without CUDA."""
    if "CUDA" not in message and "dummy base class" not in message:
        return ""
    return ("; a module's top level runs as it is imported, outside the simulated device: make its CUDA streams, "
            "events and tensors inside the function (or on its first call)")


#: the function name that stands for a script's ``if __name__ == "__main__":`` block (``script.py::__main__``)
MAIN = "__main__"


def _main_block(node: ast.stmt) -> bool:
    """Whether a statement is ``if __name__ == "__main__":`` (either way round)."""
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare) or len(node.test.ops) != 1:
        return False
    sides = [node.test.left, *node.test.comparators]
    return (isinstance(node.test.ops[0], ast.Eq) and any(isinstance(x, ast.Name) and x.id == "__name__" for x in sides)
            and any(isinstance(x, ast.Constant) and x.value == "__main__" for x in sides))


def main_block_hint(where: str) -> str:
    """``"; its main block: FILE.py::__main__"`` where ``where`` is a file with an ``if __name__ == "__main__":``
    block (what a user told "no function" may have meant), else ``""``."""
    try:
        with open(where, "rb") as f:
            found = any(_main_block(node) for node in ast.parse(f.read(), where).body)
    except (OSError, SyntaxError, ValueError):
        return ""
    return f"; its main block: {where[:200]}::{MAIN}" if found else ""


def script_main(where: str) -> Callable[[], Any]:
    """A function that runs the file ``where`` as ``python FILE`` does: its code in a namespace of its own made anew
    at each call (``__name__`` ``"__main__"``, so its ``if __name__ == "__main__":`` block runs), with the file's
    folder on ``sys.path`` as Python puts it there. ``sys.modules["__main__"]`` stays the tool's (``runpy``'s swap
    of it is not undone in order where ranks run the script at once, and a later fork server would start the
    script as its main). TargetError where the file is not one, does not compile, or has no such block (its run
    would run none of the script's protocol)."""
    why = path_problem(where)
    if why is not None:
        raise TargetError(why)
    if not where.endswith(".py"):
        raise TargetError(f"{where[:200]}::{MAIN}: a script's main block is named by its file (FILE.py::{MAIN})")
    path = os.path.abspath(where)
    if not os.path.isfile(path):
        raise TargetError(f"no file {where[:200]!r}")
    try:
        with open(path, "rb") as f:
            source = f.read()
        tree = ast.parse(source, path)
        code = compile(tree, path, "exec")
    except (SyntaxError, ValueError, OSError) as e:
        raise TargetError(f"{where[:200]} does not compile: {type(e).__name__}: {e}") from None
    if not any(_main_block(node) for node in tree.body):
        raise TargetError(f"{where[:200]} has no `if __name__ == \"__main__\":` block to run as {MAIN}: name one of "
                          "its functions (simdevice list FILE.py)")
    folder = os.path.dirname(path)
    if folder not in sys.path:
        sys.path.insert(0, folder)

    doc = ast.get_docstring(tree)

    def run() -> None:
        exec(code, {"__name__": MAIN, "__file__": path, "__builtins__": builtins, "__spec__": None,
                    "__loader__": None, "__package__": None, "__cached__": None, "__doc__": doc})

    # a function of its own globals (its ``__file__`` the script's, as ``module_state_kept`` reads it for the
    # script's ``sys.argv``), named ``__main__``
    names: dict[str, Any] = {"__file__": path, "__name__": f"simdevice_main_{os.path.basename(path)}", "run": run}
    exec(compile(f"def {MAIN}():\n    run()\n", __file__, "exec"), names)  # (a frame of the tool's, not the script's)
    main: Callable[[], Any] = names[MAIN]
    return main


def resolve(text: str, world_size: int | None = None) -> FunctionTarget:
    """The function a target names, checked: callable, and every parameter but ``dev`` with a default; or a
    script's main block (``FILE.py::__main__``, :func:`script_main`)."""
    where, name = split(text)
    if name == MAIN:
        return from_function(script_main(where), f"{_where_text(where)}::{MAIN}", world_size)
    module = _module_of(where)
    obj: Any = module
    for part in name.split("."):
        if not hasattr(obj, part):
            raise TargetError(f"{where[:200]} has no function {name!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise TargetError(f"{where[:200]}::{name} is not a function (its type is {type(obj).__name__})")
    return from_function(obj, f"{_where_text(where)}::{name}", world_size)


def functions_in(where: str, world_size: int | None = None) -> list[FunctionTarget]:
    """The functions of a file or module that a schedule can target: public, defined there, every parameter but a
    leading ``dev`` with a default (a function decorated by ``simdevice.fuzz`` included, and a ``test*`` fuzz test
    made there of a function defined elsewhere); each run on ``world_size`` ranks where given."""
    module = _module_of(where)
    out = []
    for name, obj in vars(module).items():
        fn = getattr(obj, "__simdevice_target__", obj)
        if name.startswith("_") or not inspect.isfunction(fn):
            continue
        # a fuzz test of a function imported from elsewhere (``test_x = simdevice.fuzz(x)``) is one of this file's,
        # as pytest collects it (and ``check FILE.py::test_x`` runs it); a function imported is not
        if fn.__module__ != module.__name__ and not (fn is not obj and name.startswith("test")):
            continue
        try:
            out.append(from_function(obj, f"{_where_text(where)}::{name}", world_size))
        except TargetError:
            continue
    return out


@attrs.frozen
class RankFunction:
    """A function target's function as a rank's process of a GPU run finds it: by its target text (a file or a
    module, then its name) and the folder the command ran in, where a relative file or a module of that folder is
    found. A function loaded from a file lives in a module no other process can import by name; so it is sent as
    this, and loaded again there (once a process)."""

    text: str
    cwd: str

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        where, name = split(self.text)
        if where.endswith(".py"):
            where = os.path.join(self.cwd, where)
        elif self.cwd not in sys.path:
            sys.path.insert(0, self.cwd)
        return resolve(f"{where}::{name}").fn(*args, **kwargs)


def _where_text(where: str) -> str:
    if not where.endswith(".py"):
        return where
    rel = os.path.relpath(os.path.abspath(where))
    return rel if not rel.startswith("..") else os.path.abspath(where)


def from_function(
    fn: Callable[..., Any], name: str | None = None, world_size: int | None = None, values: bool = True
) -> FunctionTarget:
    """A target for a function object (``name``: how schedule lines call it; default from its module). A test
    made by ``@simdevice.fuzz`` stands for the function it decorates."""
    if world_size is None:
        world_size = getattr(fn, "__simdevice_world_size__", None)
    values = values and getattr(fn, "__simdevice_values__", True)
    strategy = getattr(fn, "__simdevice_config__", None)
    unrunnable = getattr(fn, "__simdevice_unrunnable__", None)
    if unrunnable is not None:  # a @simdevice.fuzz test of a function it cannot run
        raise TargetError(f"{name or _name_of(fn)}: @simdevice.fuzz: {unrunnable}")
    fn = getattr(fn, "__simdevice_target__", fn)
    if not callable(fn) or isinstance(fn, type):  # (a class: calling it makes an instance, and runs no body of it)
        raise TargetError(f"{name or repr(fn)[:200]} is not a function" + (
            " (it is a class)" if isinstance(fn, type) else ""))
    if name is None:
        name = _name_of(fn)
    if "<locals>" in getattr(fn, "__qualname__", ""):  # (its replay line goes through the function object)
        NESTED.add(name)
    if world_size is not None and not 1 <= world_size <= MAX_WORLD_SIZE:
        raise TargetError(f"{name}: world_size must be in 1..{MAX_WORLD_SIZE}, got {world_size}")
    kind = ("a generator function" if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn)
            else "a coroutine function (async def)" if inspect.iscoroutinefunction(fn) else None)
    if kind is not None:  # (a call makes a generator or a coroutine and runs none of its body)
        raise TargetError(f"{name} is {kind}: calling it runs none of its body; check a plain function that "
                          "runs it to its end")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        raise TargetError(f"{name}: cannot read its parameters") from None
    params = list(sig.parameters.values())
    style = "plain"
    if params and params[0].name == "dev":
        style, params = "contract", params[1:]
    if params and params[0].name == "self" and params[0].default is params[0].empty:
        raise TargetError(f"{name} is a method (its first parameter is 'self', an instance no schedule line can "
                          "make): make it a @staticmethod, or a function of the module")
    defaults = {}
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.default is p.empty and p.name == "simdevice" and name.rpartition("::")[2].startswith("test"):
            raise TargetError(
                f"{name} is a test that takes the simdevice fixture (it explores what it names itself): run it with "
                "pytest, or check the function it explores"
            )
        if p.default is p.empty:
            raise TargetError(
                f"{name} has a parameter {p.name!r} without a default: give it one in the function's signature "
                "(a schedule line's KEY=VALUE changes defaults, it cannot supply a missing one), "
                "or take none but dev"
            )
        defaults[p.name] = p.default
    if not is_function_target(name):
        raise TargetError(f"cannot name {name!r} in a schedule line: expected FILE.py::FUNCTION or MODULE::FUNCTION")
    return FunctionTarget(name, fn, style, defaults, world_size, values, strategy)


def _name_of(fn: Callable[..., Any]) -> str:
    """``file.py::fn`` for a function of a file under the current directory (as a test's), else
    ``module::fn``; a function defined inside another gets its qualified name with ``<locals>`` dropped (such a
    line replays through the same object, not from the command line)."""
    module = sys.modules.get(getattr(fn, "__module__", ""), None)
    qual = getattr(fn, "__qualname__", getattr(fn, "__name__", "fn")).replace(".<locals>", "")
    path = getattr(module, "__file__", None)
    if path and os.path.abspath(path).startswith(os.getcwd() + os.sep):
        return f"{os.path.relpath(path)}::{qual}"
    return f"{getattr(fn, '__module__', 'unknown')}::{qual}"
