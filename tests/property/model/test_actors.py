"""Host actors as greenlets give the runs that actors as threads give (``simdevice.runtime.execution``, ``.tls``).

- The same run: random schedules of every program's variants give the same outcome, operation counts and trace
  with actors as greenlets (the default) and as threads.
- Each actor keeps its own torch state across switches, as a thread of its own would: grad mode, a dispatch mode
  it entered, saved-tensor hooks. A fresh actor starts with a fresh thread's state, not its caller's.
- What one thread cannot hold for two actors makes the run start again on threads, with the thread run's
  outcome: two backwards at once (autograd's engine keeps its graph task on the thread), inference mode.
- A Ctrl-C (a signal's exception lands in whichever actor's greenlet runs) ends the run, every actor unwinds.
"""

from __future__ import annotations

import itertools
import signal
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from reference.schedule import Delay
from simdevice import SimConfig, SimDevice
from simdevice.programs import REGISTRY, load_all
from simdevice.runtime.config import overridden
from simdevice.search.targets import ProgramTarget

load_all()
VARIANTS = [(p, v) for p in REGISTRY.values() for v in p.variants]


def _key(run: Any) -> tuple[Any, ...]:
    return (tuple(map(repr, run.reports)), tuple(sorted(run.op_counts.items())), run.trace, run.unfired,
            repr(run.result))


@given(st.data())
def test_greenlets_and_threads_give_the_same_run(data: st.DataObject) -> None:
    program, variant = data.draw(st.sampled_from(VARIANTS), label="variant")
    target = ProgramTarget(program, variant)
    config = data.draw(st.sampled_from(target.configs()), label="config")
    counts = target.probe(config)
    slots = sorted((a, k) for a, n in counts.items() for k in range(n))
    picked = data.draw(st.lists(st.sampled_from(slots), max_size=3, unique=True), label="slots") if slots else []
    delays = [Delay(a, k, data.draw(st.sampled_from((1, 5, 20)))) for a, k in picked]
    schedule = target.canonical(target.schedule(config, delays))
    runs = {}
    for mode in ("thread", "greenlet"):
        with overridden(actors=mode):
            runs[mode] = target.run(schedule)
    assert runs["greenlet"].verdict() == runs["thread"].verdict(), schedule
    assert _key(runs["greenlet"].run) == _key(runs["thread"].run), schedule


# -- each actor's own torch state ---------------------------------------------------------------------------


BOTH = pytest.mark.parametrize("actors", ["greenlet", "thread"])


def _interleaved(log: list[tuple[str, Any]]) -> bool:
    names = [n for n, _ in log]
    return any(a != b for a, b in itertools.pairwise(names)) and names.count("host") > 1


@BOTH
def test_each_actor_keeps_its_grad_mode(actors: str) -> None:
    def worker(dev: Any, log: list[tuple[str, bool]]) -> None:
        with torch.no_grad():
            for _ in range(5):
                dev.sleep(1)
                log.append(("worker", torch.is_grad_enabled()))

    def host(dev: Any) -> list[tuple[str, bool]]:
        log: list[tuple[str, bool]] = []
        p = dev.Process(worker, (log,))
        p.start()
        for _ in range(5):
            dev.sleep(1)
            log.append(("host", torch.is_grad_enabled()))
        p.join()
        return log

    run = SimDevice(config=SimConfig(actors=actors)).run(host)
    assert run.reports == ()
    assert _interleaved(run.result), run.result
    assert {(n, g) for n, g in run.result} == {("host", True), ("worker", False)}


class _Counting(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def _stack() -> tuple[Any, ...]:
    return tuple(torch._C._get_dispatch_stack_at(i) for i in range(torch._C._len_torch_dispatch_stack()))


@BOTH
def test_a_dispatch_mode_an_actor_entered_sees_its_ops_alone(actors: str) -> None:
    stacks: list[bool] = []

    def worker(dev: Any, mode: _Counting) -> None:
        x = torch.zeros(16, device=dev.device)
        with mode:
            mine = _stack()
            for _ in range(4):
                x.mul_(2.0)
                dev.sleep(1)
                stacks.append(_stack() == mine)

    def host(dev: Any) -> list[str]:
        mode = _Counting()
        y = torch.zeros(16, device=dev.device)
        p = dev.Process(worker, (mode,))
        p.start()
        mine = _stack()
        for _ in range(6):
            y.add_(1.0)
            dev.sleep(1)
            stacks.append(_stack() == mine)
        p.join()
        return mode.ops

    alone = _Counting()
    SimDevice(config=SimConfig(actors=actors)).run(worker, alone)  # the worker with no other actor: no switch
    stacks.clear()
    run = SimDevice(config=SimConfig(actors=actors)).run(host)
    assert run.reports == ()
    # the worker's own ops, as the mode sees them where nothing switches; never the host's add_
    assert alone.ops
    assert set(alone.ops) == {"aten.mul_.Tensor"}
    assert run.result == alone.ops, run.result
    assert stacks == [True] * 10  # each actor's own modes, after every switch


class _Spy(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.calls.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


@BOTH
def test_a_torch_function_mode_an_actor_entered_sees_its_calls_alone(actors: str) -> None:
    """Rule (``tls.take``/``put``): a torch-function mode is the actor's that entered it, across every switch, and
    sees the program's calls alone. Mutations: the function modes not pushed back where an actor goes on (the
    worker's mode saw its first call only); grad mode set after they are pushed back (the mode saw the
    simulator's ``_set_grad_enabled`` at each switch, on greenlets alone)."""

    def worker(dev: Any, spy: _Spy) -> None:
        x = torch.zeros(16, device=dev.device)
        with spy:
            for _ in range(3):
                x.mul_(2.0)
                dev.sleep(1)

    def host(dev: Any) -> list[str]:
        spy = _Spy()
        y = torch.zeros(16, device=dev.device)
        p = dev.Process(worker, (spy,))
        p.start()
        for _ in range(4):
            y.add_(1.0)
            dev.sleep(1)
        p.join()
        return spy.calls

    alone = _Spy()
    SimDevice(config=SimConfig(actors=actors)).run(worker, alone)  # no other actor: no switch
    run = SimDevice(config=SimConfig(actors=actors)).run(host)
    assert run.reports == ()
    assert alone.calls.count("mul_") == 3
    assert run.result == alone.calls


def test_an_infra_mode_an_actor_entered_moves_with_it() -> None:
    """Rule (``tls.take``/``put``): torch's infra dispatch modes (here the fake tensor mode, which DTensor's sharding
    propagation enters) are on the dispatch-mode stack and move with the actor that entered one: the run stays on
    greenlets and gives the thread run's outcome, the worker's factories making fake tensors and the host's plain
    ones. Mutation: the dispatch modes not put back where an actor goes on (the worker's second tensor a plain
    one)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    def program(log: list[tuple[str, str]]) -> Any:
        def worker(dev: Any) -> None:
            with FakeTensorMode():
                for _ in range(3):
                    torch.ones(4).add_(1)
                    dev.sleep(1)
                    log.append(("worker", type(torch.empty(2)).__name__))

        def host(dev: Any) -> float:
            y = torch.zeros(16, device=dev.device)
            p = dev.Process(worker)
            p.start()
            for _ in range(4):
                y.add_(1.0)
                dev.sleep(1)
                log.append(("host", type(torch.empty(2)).__name__))
            p.join()
            return float(y.sum().item())

        return host

    runs, logs = {}, {}
    for actors in ("greenlet", "thread"):
        logs[actors] = []
        dev = SimDevice(config=SimConfig(actors=actors))
        runs[actors] = dev.run(program(logs[actors]))
        assert dev.config.actors == actors
    assert runs["greenlet"].reports == ()
    assert _key(runs["greenlet"]) == _key(runs["thread"])
    assert logs["greenlet"] == logs["thread"]
    assert {name for who, name in logs["greenlet"] if who == "worker"} == {"FakeTensor"}
    assert {name for who, name in logs["greenlet"] if who == "host"} == {"Tensor"}
    assert _interleaved(logs["greenlet"])


def test_a_greenlet_run_gives_torch_its_op_call_methods_back() -> None:
    """Rule (``tls.uncount_op_calls``): the counting wrappers a greenlet run of two actors sets on torch's pybind11
    entry points (``OpOverload.__call__``, a TorchScript function's, a future's ``then``) are torch's methods again
    after it. Mutation: the wrappers left in place."""
    from simdevice.runtime import tls

    before = {(cls, name): vars(cls)[name] for cls, name in tls._OP_CALL_SITES}

    def worker(dev: Any) -> None:
        dev.sleep(1)

    def host(dev: Any) -> None:
        p = dev.Process(worker)
        p.start()
        dev.sleep(1)
        p.join()

    dev = SimDevice(config=SimConfig(actors="greenlet"))
    assert dev.run(host).reports == ()
    assert dev.config.actors == "greenlet"
    assert {(cls, name): vars(cls)[name] for cls, name in tls._OP_CALL_SITES} == before


def test_a_run_called_inside_a_dispatch_mode_leaves_the_caller_its_keys_and_mode() -> None:
    """Rule (``tls.leave_caller``/``back_to_caller``): a greenlet run of two actors, called inside the caller's own
    dispatch mode, gives the caller back its dispatch keys and its mode, which sees the caller's ops after it and
    none of the run's. Mutation: the caller's state not put back after the run (its mode gone, its next ops
    unseen)."""

    def worker(dev: Any) -> None:
        dev.sleep(1)

    def host(dev: Any) -> None:
        x = torch.zeros(4, device=dev.device)
        p = dev.Process(worker)
        p.start()
        x.add_(1.0)
        dev.sleep(1)
        p.join()

    mode = _Counting()
    with mode:
        include, exclude = torch._C._dispatch_tls_local_include_set(), torch._C._dispatch_tls_local_exclude_set()
        dev = SimDevice(config=SimConfig(actors="greenlet"))
        assert dev.run(host).reports == ()
        assert dev.config.actors == "greenlet"
        assert torch._C._dispatch_tls_local_include_set() == include
        assert torch._C._dispatch_tls_local_exclude_set() == exclude
        assert mode.ops == []
        torch.ones(2).add_(1)
    assert mode.ops == ["aten.ones.default", "aten.add_.Tensor"]


def test_a_state_put_back_and_released_leaves_the_threads_keys_as_it_found_them() -> None:
    """Where a greenlet goes on (``put``) and later ends (``release``), the thread's dispatch keys are those it had
    before: with a mode taken off and put back, the Python keys go with the mode (the mutant that holds the keys
    after pushing the modes leaves them set with no mode, where an op with no tensor argument fails)."""
    from simdevice.runtime import tls

    before = torch._C._dispatch_tls_local_include_set()
    held = tls.hold()
    _Counting().__enter__()  # an actor's mode: pushed, the Python keys in
    state = tls.take(held)
    assert torch._C._dispatch_tls_local_include_set() == before
    again = tls.put(state)
    assert torch._C._len_torch_dispatch_stack() == 1
    tls.release(again)  # the actor ends
    assert torch._C._len_torch_dispatch_stack() == 0
    assert torch._C._dispatch_tls_local_include_set() == before
    torch.empty(0)  # no tensor argument: torch's Python fallback refused it when the keys stayed


def test_a_collective_that_starts_after_an_actor_ended_runs_race_only() -> None:
    """The run that showed it: the host's last switch put its state back, it ended, and the nccl stream's send
    (``torch.empty(0)`` in a race-only run) started next, on the thread it left."""
    from reference.schedule import Schedule
    from simdevice.search.execute import execute

    s = Schedule.parse("param_readiness/FIXED:bucket=2,eager=1,evaluate=0,iters=1,layers=2,overlap=1,ranks=1"
                       ":rank0.nccl#1+3")
    assert execute(s, sim_config=SimConfig(values=False)).run.reports == ()


@BOTH
def test_saved_tensor_hooks_an_actor_entered_see_its_saves_alone(actors: str) -> None:
    def worker(dev: Any, packed: list[str]) -> None:
        def pack(t: torch.Tensor) -> torch.Tensor:
            packed.append("worker")
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            for _ in range(3):
                a = torch.ones(4, requires_grad=True)
                (a * a).sum()
                dev.sleep(1)

    def host(dev: Any) -> list[str]:
        packed: list[str] = []
        p = dev.Process(worker, (packed,))
        p.start()
        for _ in range(5):
            b = torch.ones(4, requires_grad=True)
            (b * b).sum()  # saves b twice: the host's saves, which no hook of the worker's may see
            dev.sleep(1)
        p.join()
        return packed

    run = SimDevice(config=SimConfig(actors=actors)).run(host)
    assert run.reports == ()
    assert run.result == ["worker"] * 6, run.result


@BOTH
def test_an_actor_starts_with_a_fresh_threads_state_not_its_callers(actors: str) -> None:
    def host(dev: Any) -> tuple[bool, int]:
        return torch.is_grad_enabled(), torch._C._len_torch_dispatch_stack()

    outer = _Counting()
    with torch.no_grad(), outer:
        run = SimDevice(config=SimConfig(actors=actors)).run(host)
        after = torch.is_grad_enabled(), torch._C._len_torch_dispatch_stack()
    assert run.reports == ()
    assert run.result == (True, 1)  # the actor's own SimMode alone
    assert after == (False, 1)  # and the caller's state is its own again
    assert outer.ops == []


# -- what one thread cannot hold: the run starts again on threads ----------------------------------------------


def _backward_rank(dev: Any) -> float:
    w = torch.ones(64, device=dev.device, requires_grad=True)
    x = torch.full((64,), float(dev.rank + 1), device=dev.device)
    for _ in range(4):  # long enough a backward that the ranks' steps interleave inside it
        x = (x * w).tanh()
    loss = x.sum()
    loss.backward()  # without the engine watch, the two greenlets' backwards share one graph task: the process dies
    assert w.grad is not None
    return float(w.grad.sum().item())


def test_two_backwards_at_once_start_the_run_again_on_threads() -> None:
    runs = {}
    for actors in ("greenlet", "thread"):
        dev = SimDevice(config=SimConfig(actors=actors))
        runs[actors] = dev.run(lambda d: d.spawn_ranks(_backward_rank, 2))
        assert dev.config.actors == "thread"  # the greenlet run met the engine's state and started again
    assert runs["thread"].reports == ()
    assert _key(runs["greenlet"]) == _key(runs["thread"])
    assert runs["greenlet"].result[0] != runs["greenlet"].result[1]  # each rank's own gradient


def test_one_backward_at_a_time_stays_on_greenlets() -> None:
    def one_then_other(dev: Any) -> list[float]:
        return [_backward_rank(dev), _backward_rank(dev)]

    dev = SimDevice(config=SimConfig(actors="greenlet"))
    run = dev.run(one_then_other)
    assert run.reports == ()
    assert dev.config.actors == "greenlet"


def test_inference_mode_across_a_switch_starts_the_run_again_on_threads() -> None:
    def worker(dev: Any) -> None:
        with torch.inference_mode():
            for _ in range(3):
                dev.sleep(1)

    def host(dev: Any) -> bool:
        p = dev.Process(worker)
        p.start()
        for _ in range(3):
            dev.sleep(1)
        p.join()
        return torch.is_inference_mode_enabled()

    runs = {}
    for actors in ("greenlet", "thread"):
        dev = SimDevice(config=SimConfig(actors=actors))
        runs[actors] = dev.run(host)
        assert dev.config.actors == "thread"
    assert runs["greenlet"].reports == ()
    assert _key(runs["greenlet"]) == _key(runs["thread"])


# -- a Ctrl-C ----------------------------------------------------------------------------------------------------


@BOTH
def test_a_ctrl_c_in_an_actor_ends_the_run_and_every_actor_unwinds(actors: str) -> None:
    unwound: list[str] = []

    def worker(dev: Any) -> None:
        try:
            for _ in range(50):
                dev.sleep(1)
        finally:
            unwound.append("worker")

    def host(dev: Any) -> None:
        p = dev.Process(worker)
        p.start()
        try:
            for k in range(50):
                dev.sleep(1)
                if k == 5:
                    signal.raise_signal(signal.SIGINT)
        finally:
            unwound.append("host")

    dev = SimDevice(config=SimConfig(actors=actors))
    # Python's own handler, whatever the process had (a test suite's worker may have had another: CI's twice did
    # not raise here, with no other test here finding it changed)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            dev.run(host)
    finally:
        signal.signal(signal.SIGINT, before)
    assert sorted(unwound) == ["host", "worker"]
