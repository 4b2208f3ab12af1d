"""``SimConfig.host_trace``: each counted host step costs what a GPU run's host measured for it.

A GPU's host does not keep one pace: the Python between two steps differs from step to step and from run to run,
and a schedule whose window is as wide as that spread fails on the GPU at a rate. With a trial's own steps
(``reference.cuda.host_traces``, ``_Counter.host_costs``) the simulator judges that trial with its host, and its
own device costs: what ``scripts/fidelity rejudge`` does with a campaign's measured trials. Shown here: a traced
step is followed by the next one exactly its cost later (the trace's entry holds whatever the host did between
them: a wait, a sleep, a collective's own work, so none of those is charged again), a step past the trace or a poll
the schedule does not count costs ``host_step_ns``, a wait that ends later on the simulator than the trace says
holds the next step until it ends, and a race window turns with the trace. Each rule has a mutant that fails.
"""

from __future__ import annotations

import itertools
from typing import Any

import attrs
import pytest
import torch

import simdevice
from reference.cuda import _Counter
from reference.schedule import Delay, Schedule
from simdevice import SimDevice
from simdevice.runtime import execution, runtime
from simdevice.runtime.config import UNIT_NS, SimConfig

STEP = 100_000


def _gaps(program: Any, trace: dict[str, list[int]], **config: Any) -> list[tuple[str, int]]:
    run = SimDevice(Schedule.parse("t/t"), SimConfig(host_step_ns=STEP, host_trace=trace, **config)).run(program)
    host = [(t, what) for t, actor, what in run.trace if actor == "host" and not what.startswith("stall")]
    return [(what, b - a) for (a, _), (b, what) in itertools.pairwise(host)]


def _steps(dev: Any) -> None:
    x = torch.full((1 << 10,), 2.0, device=dev.device)
    x.mul_(3)
    x.add_(1)
    x.neg_()
    dev.synchronize()


@pytest.mark.parametrize("actors", ["greenlet", "thread"])
def test_a_traced_step_is_followed_by_the_next_its_measured_cost_later(actors: str) -> None:
    _steps_follow_their_trace(actors)


def _steps_follow_their_trace(actors: str = "greenlet") -> None:
    assert _gaps(_steps, {"host": [7_000, 250_000, 3_000]}, actors=actors) == [
        ("mul_", 7_000), ("add_", 250_000), ("neg_", 3_000),
        ("synchronize", STEP),  # past the trace: the profile's step
    ]
    assert _gaps(_steps, {}) == [("mul_", STEP), ("add_", STEP), ("neg_", STEP), ("synchronize", STEP)]
    assert _gaps(_steps, {"rank0": [1, 1, 1]}) == _gaps(_steps, {})  # another actor's trace is not this one's


def test_an_engine_step_in_the_trace_is_charged_as_measured() -> None:
    def train(dev: Any) -> None:
        w = torch.ones(1 << 10, device=dev.device, requires_grad=True)
        (w * torch.full((1 << 10,), 2.0, device=dev.device)).tanh().sum().backward()

    measured = list(range(11_000, 20_000, 1_000))
    gaps = _gaps(train, {"host": measured}, engine_step_ns=5_000)
    assert [g for _, g in gaps] == measured[: len(gaps)]


def _sleeper(dev: Any) -> None:
    x = torch.zeros(4, device=dev.device)
    dev.sleep(2)
    x.add_(1)
    dev.synchronize()


def test_a_traced_sleep_is_in_its_steps_cost() -> None:
    assert _gaps(_sleeper, {"host": [10_000, 3_000_000]}) == [("sleep(2)", 10_000), ("add_", 3_000_000),
                                                            ("synchronize", STEP)]
    # untraced: the sleep's units after the step
    assert _gaps(_sleeper, {})[1] == ("add_", STEP + 2 * UNIT_NS)


def _waiter(dev: Any) -> None:
    side = dev.Stream("side")
    x = torch.zeros(1 << 16, device=dev.device)
    with dev.stream(side):
        x.mul_(2)  # held back by the schedule's stall on the side stream
    side.synchronize()
    x.add_(1)


def _wait(trace: list[int]) -> tuple[int, int, int]:
    """When the host synchronized, when the side stream's operation was done, and when the host's next step came."""
    run = SimDevice(Schedule("t", "t", {}, (Delay("side", 0, 3),)),
                    SimConfig(host_step_ns=STEP, host_trace={"host": trace})).run(_waiter)
    (sync,) = [t for t, actor, what in run.trace if actor == "host" and what == "side.synchronize"]
    (done,) = [t for t, actor, what in run.trace if actor == "side" and what.startswith("done")]
    (add,) = [t for t, actor, what in run.trace if actor == "host" and what == "add_"]
    return sync, done, add


def test_a_wait_that_ends_later_than_the_trace_holds_the_next_step_until_it_ends() -> None:
    # the synchronize waits out the 3-unit stall: the next step comes when the wait ends, not a host step after
    sync, done, add = _wait([10_000, 10_000, 10_000])
    assert done > sync + 3 * UNIT_NS
    assert add == done
    # a host that went on later than the wait ends: the trace's
    sync, done, add = _wait([10_000, 10_000, 9 * UNIT_NS])
    assert add == sync + 9 * UNIT_NS > done


def _poller(dev: Any) -> None:
    side = dev.Stream("side")
    x = torch.zeros(1 << 16, device=dev.device)
    with dev.stream(side):
        x.mul_(2)
    while not side.query():
        pass
    x.add_(1)


def test_a_poll_the_schedule_does_not_count_costs_a_host_step() -> None:
    run = SimDevice(Schedule("t", "t", {}, (Delay("side", 0, 1),)),
                    SimConfig(host_step_ns=STEP, host_trace={"host": [1_000, 1_000, 400_000, 1_000]})).run(_poller)
    times = [t for t, actor, what in run.trace if actor == "host" and what == "side.query"]
    # the first query is counted (index 2, after zeros and mul_): its measured cost; the rest a host step each
    assert times[1] - times[0] == 400_000
    assert len(times) > 3
    assert {b - a for a, b in itertools.pairwise(times[1:])} == {STEP}


def _reduce() -> None:
    import torch.distributed as dist

    x = torch.ones(4, device="cuda")
    dist.all_reduce(x)
    x.add_(1)
    torch.cuda.synchronize()


def _gather(dev: Any) -> Any:
    def rank(d: Any) -> None:
        x = torch.ones(4, device=d.device)
        out = torch.empty(4, device=d.device)
        d.all_gather_into_tensor(out, x, async_op=False)
        out.add_(1)
        d.synchronize()

    return dev.spawn_ranks(rank, 1)


def _rank_gaps(trace: dict[str, list[int]], gather: bool) -> list[tuple[str, int]]:
    config = SimConfig(host_step_ns=STEP, collective_host_ns=500_000, host_trace=trace)
    if gather:
        run = SimDevice(Schedule.parse("t/t"), config).run(_gather)
        steps = [(t, what) for t, actor, what in run.trace if actor == "rank0"]
    else:
        session = simdevice.cuda(config=config)
        session.run(_reduce, world_size=1)
        assert session.result is not None
        steps = [(t, what) for t, actor, what in session.result.trace if actor == "rank0"]
    # each step and the gap after it
    return [(what, b - a) for (a, what), (b, _) in itertools.pairwise(steps)]


@pytest.mark.parametrize("gather", [True, False], ids=["all_gather", "all_reduce"])
def test_a_traced_collective_is_not_charged_its_host_cost_again(gather: bool) -> None:
    measured = [10_000, 20_000, 30_000, 40_000, 50_000]
    untraced = _rank_gaps({}, gather)
    k = next(i for i, (what, _) in enumerate(untraced) if what.startswith("all_"))
    assert untraced[k][1] == STEP + 500_000  # a host step, then the collective's own host cost
    assert _rank_gaps({"rank0": measured}, gather)[k][1] == measured[k]


@pytest.mark.parametrize("rule", ["trace", "wait", "sleep", "collective"])
def test_a_mutant_of_each_rule_is_caught(monkeypatch: pytest.MonkeyPatch, rule: str) -> None:
    if rule == "trace":  # the trace never read
        monkeypatch.setattr(execution.Execution, "__init__", _without(execution.Execution.__init__))
        with pytest.raises(AssertionError):
            _steps_follow_their_trace()
        return
    if rule == "wait":  # after a wait, a host step as if untraced
        block = execution.Execution.block

        def untraced_block(self: Any, a: Any, desc: str, pred: Any) -> None:
            was, a.traced = a.traced, False
            try:
                block(self, a, desc, pred)
            finally:
                a.traced = was

        monkeypatch.setattr(execution.Execution, "block", untraced_block)
        with pytest.raises(AssertionError):
            test_a_wait_that_ends_later_than_the_trace_holds_the_next_step_until_it_ends()
        return
    if rule == "sleep":  # the sleep's units charged again
        sleep = runtime.Runtime.sleep

        def twice(self: Any, units: float) -> None:
            sleep(self, units)
            self.execution.current().time += int(units * UNIT_NS)

        monkeypatch.setattr(runtime.Runtime, "sleep", twice)
        with pytest.raises(AssertionError):
            test_a_traced_sleep_is_in_its_steps_cost()
        return
    for name, gather in (("all_gather", True), ("collective", False)):
        with monkeypatch.context() as m:
            m.setattr(runtime.Runtime, name, _charged(getattr(runtime.Runtime, name)))
            with pytest.raises(AssertionError):
                test_a_traced_collective_is_not_charged_its_host_cost_again(gather)


def _charged(method: Any) -> Any:
    """A collective that charges its host cost after a traced step too."""

    def charged(self: Any, *args: Any, **kwargs: Any) -> Any:
        g = method(self, *args, **kwargs)
        a = self.execution.current()
        if a.traced:
            a.time += self.config.collective_host_ns
        return g

    return charged


def _without(init: Any, field: str = "_traces") -> Any:
    """``Execution.__init__`` that then forgets the config's measured steps (or starts): a mutant."""
    def patched(self: Any, config: SimConfig, *args: Any) -> None:
        init(self, config, *args)
        setattr(self, field, {})

    return patched


def test_the_gpus_counter_gives_each_steps_cost_less_the_schedules_stall() -> None:
    counter = _Counter(Schedule("t", "t", {}, (Delay("host", 1, 2), Delay("default", 0, 5))), 1.0, timed=True)
    counter.stamps = {"host": [0, 100, 2_000_400, 2_000_600], "default": [50, 60]}
    counter.hosts = {"host"}
    # step 1's gap holds its 2-unit stall (2 ms), taken off; the overshoot (300 ns) stays; streams are no hosts
    assert counter.host_costs() == {"host": (100, 300, 200)}
    assert _Counter(None, 1.0).host_costs() == {}  # untimed: nothing


def test_a_trace_must_be_positive_integers_per_actor() -> None:
    assert SimConfig(host_trace={"b": [2], "a": (1,)}).host_trace == (("a", (1,)), ("b", (2,)))
    for bad in ({"host": [0]}, {"host": [1.5]}, {3: [1]}):
        with pytest.raises(ValueError, match="host_trace"):
            SimConfig(host_trace=bad)


def _spawner(dev: Any) -> None:
    """The trainer starts a worker and polls a shared value until the worker has set it, as zcc's trainer does."""
    flag = dev.Value("i", 0)

    def worker(d: Any, flag: Any) -> None:
        x = torch.ones(4, device=d.device)
        x.add_(1)
        flag.value = 1

    p = dev.Process(worker, (flag,), name="worker0")
    p.start()
    while flag.value == 0:
        dev.sleep(1)
    p.join()


def _worker_start(starts: dict[str, int]) -> tuple[int | None, Any]:
    """How long after the trainer's start step the worker's first step came (None: it never ran), and the run."""
    run = SimDevice(Schedule.parse("t/t"), SimConfig(host_step_ns=STEP, host_starts=starts)).run(_spawner)
    (start,) = [t for t, actor, what in run.trace if actor == "host" and what.startswith("Process.start")]
    first = next((t for t, actor, _ in run.trace if actor == "worker0"), None)
    return None if first is None else first - start, run


def test_a_spawned_process_first_steps_when_its_start_was_measured() -> None:
    lag, run = _worker_start({"worker0": 3 * UNIT_NS // 2})
    assert lag == 3 * UNIT_NS // 2
    assert not run.reports  # the trainer polled for 1.5 ms of a start: waiting, not a deadlock
    assert _worker_start({})[0] == STEP
    # a start longer than the stall horizon: still no deadlock while the parent polls for it
    long = SimConfig().stall_horizon_ns * 3
    lag, run = _worker_start({"worker0": long})
    assert lag == long
    assert not run.reports, run.reports


def test_a_mutant_that_ignores_a_measured_start_or_calls_its_wait_a_deadlock(monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as m:
        m.setattr(execution.Execution, "__init__", _without(execution.Execution.__init__, "_starts"))
        with pytest.raises(AssertionError):
            test_a_spawned_process_first_steps_when_its_start_was_measured()
    with monkeypatch.context() as m:
        m.setattr(execution.Execution, "waiting_until", lambda self, t: None)
        with pytest.raises(AssertionError):
            test_a_spawned_process_first_steps_when_its_start_was_measured()


def _worker_pace(**config: Any) -> tuple[int | None, list[int], list[int], Any]:
    """The worker's start after the trainer's start step, the worker's gaps between steps, the trainer's, the run."""
    def spawner(dev: Any) -> None:
        flag = dev.Value("i", 0)

        def worker(d: Any, flag: Any) -> None:
            x = torch.ones(4, device=d.device)
            x.add_(1)
            x.mul_(2)
            x.neg_()
            flag.value = 1

        p = dev.Process(worker, (flag,), name="worker0")
        p.start()
        y = torch.ones(4, device=dev.device)
        y.add_(1)
        y.mul_(2)
        while flag.value == 0:
            dev.sleep(1)
        p.join()

    run = SimDevice(Schedule.parse("t/t"), SimConfig(host_step_ns=STEP, **config)).run(spawner)
    (start,) = [t for t, actor, what in run.trace if actor == "host" and what.startswith("Process.start")]
    worker = [t for t, actor, _ in run.trace if actor == "worker0"]
    host = [t for t, actor, what in run.trace if actor == "host" and what in ("add_", "mul_")]
    lag = worker[0] - start if worker else None
    return lag, [b - a for a, b in itertools.pairwise(worker)], [b - a for a, b in itertools.pairwise(host)], run


def test_a_spawned_process_starts_and_steps_at_the_profiles_pace_for_one() -> None:
    lag, worker, host, run = _worker_pace(spawn_start_ns=3 * UNIT_NS, spawned_host_step_ns=2 * STEP)
    assert lag == 3 * UNIT_NS
    assert worker
    assert set(worker) == {2 * STEP}  # its own interpreter's step
    assert host == [STEP]  # the trainer keeps the run's
    assert not run.reports  # the trainer polling for its start is waiting, not a deadlock
    # a measured start (a trial's own, host_starts) wins over the profile's
    assert _worker_pace(spawn_start_ns=3 * UNIT_NS, host_starts={"worker0": UNIT_NS})[0] == UNIT_NS
    # a measured step wins too; past the trace, the spawned step
    _, worker, _, _ = _worker_pace(spawned_host_step_ns=2 * STEP, host_trace={"worker0": [7_000]})
    assert worker[0] == 7_000
    assert set(worker[1:]) == {2 * STEP}
    # 0 (the default): a host step after its parent's, at the run's step
    lag, worker, _, _ = _worker_pace()
    assert lag == STEP
    assert set(worker) == {STEP}


def test_a_worlds_ranks_are_no_spawned_processes() -> None:
    def world(dev: Any) -> None:
        def rank(d: Any) -> None:
            x = torch.ones(4, device=d.device)
            x.add_(1)
            x.mul_(2)

        dev.spawn_ranks(rank, 2)

    config = SimConfig(host_step_ns=STEP, spawn_start_ns=3 * UNIT_NS, spawned_host_step_ns=2 * STEP)
    run = SimDevice(Schedule.parse("t/t"), config).run(world)
    steps = [t for t, actor, _ in run.trace if actor == "rank0"]
    assert steps[0] < UNIT_NS
    assert {b - a for a, b in itertools.pairwise(steps)} == {STEP}


def test_a_mutant_that_treats_a_spawned_process_as_any_actor_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    new_actor = execution.Execution.new_actor
    with monkeypatch.context() as m:  # the process flag dropped: no spawned start, no spawned step
        m.setattr(execution.Execution, "new_actor", lambda self, name, parent, process=False:
                  new_actor(self, name, parent))
        with pytest.raises(AssertionError):
            test_a_spawned_process_starts_and_steps_at_the_profiles_pace_for_one()
    with monkeypatch.context() as m:  # every actor a spawned process: the ranks too
        m.setattr(execution.Execution, "new_actor", lambda self, name, parent, process=False:
                  new_actor(self, name, parent, parent is not None))
        with pytest.raises(AssertionError):
            test_a_worlds_ranks_are_no_spawned_processes()


def test_the_gpus_process_brings_its_workers_steps_and_start_back_at_join() -> None:
    import queue
    import types

    from reference.cuda import CudaProcess

    counter = _Counter(None, 1.0, timed=True)
    counter.stamps = {"host": [0, 10]}
    counter.hosts = {"host"}
    dev = types.SimpleNamespace(counter=counter, _host_step=lambda: None)
    raw = types.SimpleNamespace(name="worker0", exitcode=None, start=lambda: None, join=lambda timeout=None: None)
    counts: queue.Queue[Any] = queue.Queue()
    p = CudaProcess(dev, raw, counts)  # type: ignore[arg-type]
    p.start()
    counts.put(({"worker0": 3}, set(), {"worker0": (7, 9)}, p.started + 2_500_000))
    raw.exitcode = 0
    p.join()
    assert counter.counts["worker0"] == 3
    assert counter.host_costs() == {"host": (10,), "worker0": (7, 9)}
    assert counter.starts == {"worker0": 2_500_000}
    # untimed: counts only
    plain = _Counter(None, 1.0)
    dev2 = types.SimpleNamespace(counter=plain, _host_step=lambda: None)
    q2: queue.Queue[Any] = queue.Queue()
    q2.put(({"worker0": 3}, set(), {}, None))
    p2 = CudaProcess(dev2, raw, q2)  # type: ignore[arg-type]
    p2.join()
    assert (plain.counts, plain.starts, plain.host_costs()) == ({"worker0": 3}, {}, {})


def test_a_start_must_be_a_positive_integer_per_actor() -> None:
    assert SimConfig(host_starts={"w1": 5, "w0": 7}).host_starts == (("w0", 7), ("w1", 5))
    for bad in ({"w": 0}, {"w": 1.5}, {3: 1}):
        with pytest.raises(ValueError, match="host_starts"):
            SimConfig(host_starts=bad)


# -- a run's own steps, measured as the GPU's counter measures them, give the same run ----------------------------


def _run_of(schedule: Schedule, config: SimConfig) -> tuple[Any, list[str]]:
    from simdevice.search.execute import device_for, resolve

    program, _ = resolve(schedule)
    dev, cfg = device_for(schedule, "sim", config)
    run = dev.run(program.body, schedule.variant, cfg)
    return run, list(dev.runtime.execution.actors)


def _measured_from(run: Any, actors: list[str], schedule: Schedule) -> dict[str, list[int]]:
    """Each host actor's step costs as ``reference.cuda._Counter.host_costs`` defines them on a GPU, read off a
    simulated run: the time from a step to the actor's next, less the stall the schedule put at the next one (whose
    step the stall precedes on the simulator; on the GPU the stamp comes before the sleep)."""
    stalls = {(d.actor, d.index): d.units * UNIT_NS for d in schedule.delays}
    out = {}
    for actor in actors:
        times = [t for t, who, what in run.trace if who == actor and not what.startswith("stall ")]
        out[actor] = [max(1, times[k + 1] - stalls.get((actor, k + 1), 0) - times[k]) for k in range(len(times) - 1)]
    return {a: c for a, c in out.items() if c}


def _starts_from(run: Any, actors: list[str]) -> dict[str, int]:
    """How long after the step that spawned it each spawned actor's first step came."""
    out = {}
    for actor in actors:
        first = next((t for t, who, what in run.trace if who == actor and not what.startswith("stall ")), None)
        spawns = [t for t, who, what in run.trace
                  if who != actor and (what.startswith("spawn_ranks(") or what == f"Process.start({actor})")]
        before = [t for t in spawns if first is not None and t <= first]
        if before:
            out[actor] = max(1, first - before[-1])  # type: ignore[operator]
    return out


@pytest.mark.parametrize("text", [
    "offload_reload/racy::d2h#0+1",
    "offload_reload/correct::default#3+5,host#9+1",
    "activation_offload/FIXED:iters=2,layers=2:host#12+5",
    "activation_offload/offload-inline-no-wait:inflight=1,iters=2,mb=2",
    "param_readiness/FIXED:ranks=2:rank1#7+5,rank0.nccl#1+1",
    "param_readiness/param-prefetch-no-ready:ranks=1:rank0#4+20",
])
def test_a_runs_own_steps_measured_as_on_a_gpu_replay_it(text: str) -> None:
    """The simulator's timeline is a fixed point of its own measurement: measure a run's host steps as the GPU's
    counter does and judge the schedule again with them, and the run is the same, step for step (with a profile's
    slow host, so the steps' costs differ from the fast default's). Waits included: a step that blocked measures
    its wait, and the next step comes when the measurement says. Programs whose host polls are left out: a GPU
    counts a polling loop as one step, whose cost holds the whole loop."""
    schedule = Schedule.parse(text)
    config = SimConfig(host_step_ns=93_000, collective_host_ns=40_000)
    run, actors = _run_of(schedule, config)
    measured, starts = _measured_from(run, actors, schedule), _starts_from(run, actors)
    again, _ = _run_of(schedule, attrs.evolve(config, host_trace=measured, host_starts=starts))
    assert again.trace == run.trace
    assert again.reports == run.reports
    # the measurement decides the host's pace whatever the config's own: judged from the fast default with it, the
    # same run, where the fast default alone runs another
    fast, _ = _run_of(schedule, SimConfig(host_trace=measured, host_starts=starts))
    assert fast.trace == run.trace
    assert _run_of(schedule, SimConfig())[0].trace != run.trace
