"""Parameter readiness for prefetching consumers (``reference.param_readiness``).

- FIXED on the simulator: for every configuration (ranks 1..3, layers 2..4,
  bucket sizes, iterations 1..3, overlap on/off, eager/lazy first gather,
  evaluation with the hooks disabled) and schedule, no report and every
  forward read sees this iteration's weights. The same property is shown to
  catch every bug variant, and the pinned counterexamples (the GPU test
  replays them) still break it (found-and-replays:
  ``tests/property/quality/test_found_and_replays.py``). It also catches a
  mutant of FIXED whose consumer waits for readiness on its own stream
  (``tests/mutants.py``): the layers read their weights on compute too.
- The readiness callback's own rules, on a host-only stand-in device where a
  gather lands when its handle is waited: idempotent, never "not dispatched
  but has a handle", never starts a gather with the hooks removed or during a
  graph capture, never gathers twice into one buffer in one iteration, a dead
  wrapper is a no-op, re-wrapping removes stale callbacks, dedupe by identity.
  "Hooks removed" is read on the state before the call: a callback that
  starts a gather and waits it ends PUBLISHED, like one that started nothing
  (the mutant ``_StartsGatherWithHooksRemoved`` shows the difference).
"""

from __future__ import annotations

import gc
import inspect
from typing import Any

import attrs
import pytest
import torch
from hypothesis import find, given, settings
from hypothesis import strategies as st
from mutants import ready_on_the_prefetch_stream

import reference.param_readiness as pr
from reference.naming import short_path
from reference.schedule import Schedule
from simdevice.programs import param_readiness as harness
from simdevice.programs.param_readiness import PROGRAM, SHRUNK, load, weight_values
from simdevice.runtime.reports import Race, StaleRead
from simdevice.search import Outcome, check_variant, execute, exhaust, search_settings
from simdevice.search.strategies import schedules
from simdevice.search.targets import ProgramTarget

_FIND = search_settings()  # what simdevice check searches with

def forward_reads_are_fresh(s: Schedule) -> Outcome:
    """The property: no report of any kind, and every forward read saw this iteration's weights."""
    out = execute(s)
    assert out.problems == ()
    assert out.run.reports == ()
    return out


def _breaks(s: Schedule) -> bool:
    try:
        forward_reads_are_fresh(s)
    except AssertionError:
        return True
    return False


@given(schedules(PROGRAM, "FIXED"))
def test_fixed_forward_reads_are_fresh_under_every_schedule(s: Schedule) -> None:
    forward_reads_are_fresh(s)


@pytest.fixture(scope="module")
def only_when_slow_selected(pytestconfig: pytest.Config) -> None:
    # tests/conftest.py does not deselect ``slow``: keep the default run of this file short
    if "slow" not in (pytestconfig.option.markexpr or "") or "not slow" in pytestconfig.option.markexpr:
        pytest.skip("slow: run with -m slow")


@pytest.mark.slow
@pytest.mark.usefixtures("only_when_slow_selected")
@settings(max_examples=1000, deadline=None)
@given(schedules(PROGRAM, "FIXED"))
def test_fixed_forward_reads_are_fresh_thorough(s: Schedule) -> None:
    forward_reads_are_fresh(s)


@pytest.mark.slow
@pytest.mark.usefixtures("only_when_slow_selected")
def test_fixed_is_clean_over_every_single_delay_schedule() -> None:
    # exhaust() also walks the whole configuration space (648 configurations): bound it to two of them
    space = {k: v[:1] for k, v in PROGRAM.config_space.items()} | {"ranks": ("2",), "eager": ("0", "1")}
    program = attrs.evolve(PROGRAM, config_space=space)
    n, failed = exhaust(program, "FIXED", max_delays=1, units=(1, 5, 20))
    assert failed is None
    # a delay at each operation each configuration's probe saw, 3 stalls each, plus the empty schedule
    target = ProgramTarget(program, "FIXED")
    assert n == sum(1 + sum(target.probe(c).values()) * 3 for c in target.configs())


@pytest.mark.parametrize(
    "cfg",
    [
        "ranks=3,layers=4,bucket=1,iters=3,overlap=1,eager=1,evaluate=1",
        "ranks=3,layers=4,bucket=4,iters=3,overlap=1,eager=0,evaluate=1",
        "ranks=2,layers=3,bucket=2,iters=2,overlap=0,eager=0,evaluate=1",
    ],
)
def test_fixed_is_clean_at_the_largest_configurations(cfg: str) -> None:
    forward_reads_are_fresh(Schedule.parse(f"param_readiness/FIXED:{cfg}"))


@pytest.mark.parametrize("variant", sorted(SHRUNK))
def test_the_pinned_counterexamples_are_what_the_search_finds_and_break_the_property(variant: str) -> None:
    finding = check_variant(PROGRAM, variant, max_examples=150)
    assert finding.schedule == SHRUNK[variant]
    assert execute(Schedule.parse(SHRUNK[variant])).corrupted
    assert _breaks(Schedule.parse(SHRUNK[variant]))  # the property FIXED holds is the one this schedule breaks


def test_overlap_off_hides_every_bug() -> None:
    # published synchronously after the step: nothing is ever in flight for a consumer to outrun
    for variant in SHRUNK:
        s = Schedule.parse(f"param_readiness/{variant}:overlap=0,eager=1,evaluate=1,ranks=2")
        assert execute(s).clean


def test_a_stalled_gather_is_what_the_unready_prefetch_outruns() -> None:
    stalled = "eager=1,evaluate=0,iters=1,layers=2,ranks=1:rank0.nccl#0+2"
    bug = execute(Schedule.parse(f"param_readiness/param-prefetch-no-ready:{stalled}"))
    assert sorted({r.kind for r in bug.run.reports}) == ["race", "stale-read"]
    assert bug.problems[0] == (
        "rank 0 iteration 0 forward, the consumer's prefetched copy: layer 0 read 16384 of 16384 weights of another "
        "version (off by [-1] steps)"
    )
    assert execute(Schedule.parse(f"param_readiness/FIXED:{stalled}")).clean


def test_the_property_catches_readiness_waited_on_the_consumer_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    # the harness's layers read their weights on compute too, not only through the consumer's copies
    monkeypatch.setattr(pr.PrefetchingConsumer, "prefetch", ready_on_the_prefetch_stream)
    found = find(schedules(PROGRAM, "FIXED"), _breaks, settings=_FIND)
    out = execute(found)
    weight_read = _line(harness, "seen[row, i].copy_(w.data)")
    races = [str(r) for r in out.run.reports if isinstance(r, Race)]
    # compute's own read of the weight, unordered after the gather the consumer's callback waited elsewhere
    assert races
    assert races[0].startswith(f"race: copy_ on stream rank0.default #4 ({short_path(harness.__file__)}:{weight_read})")
    assert "all_gather (receive) on stream rank0.nccl" in races[0]


def _line(module: Any, fragment: str) -> int:
    return next(i + 1 for i, text in enumerate(inspect.getsource(module).splitlines()) if fragment in text)


def test_report_text_is_pinned() -> None:
    out = execute(Schedule.parse("param_readiness/param-prefetch-no-ready:eager=1,layers=2,ranks=1:rank0.nccl#0+2"))
    stale = [str(r) for r in out.run.reports if isinstance(r, StaleRead)]
    race = [str(r) for r in out.run.reports if isinstance(r, Race)]
    prefetch = _line(pr, "self.buffers[i].copy_(w.data)")
    gather = _line(pr, "ddp.dev.all_gather_into_tensor(b.buffer, b.main_shard) for b in self.buckets")
    load = _line(harness, "bucket.buffer.copy_(weight_values(version - 1")
    expected_stale = (
        f"stale read: copy_ on stream rank0.prefetch #0 (reference/param_readiness.py:{prefetch}) read "
        f"device#1[0:65536] at t=5.404; it saw copy_ (H2D) on stream rank0.default #0 "
        f"({short_path(harness.__file__)}:{load}); stale by 1 write: expected the data of all_gather (receive) on "
        f"stream rank0.nccl (reference/param_readiness.py:{gather})"
    )
    expected_race = (
        f"race: copy_ on stream rank0.prefetch #0 (reference/param_readiness.py:{prefetch}) reads "
        f"device#1[0:65536], which all_gather (receive) on stream rank0.nccl (reference/param_readiness.py:{gather}) "
        "wrote; no happens-before edge orders them"
    )
    assert stale[0] == expected_stale
    assert race[0] == expected_race


# ---------------------------------------------------------------------------
# The callback's rules on a host-only stand-in device.


class _Work:
    """A gather in flight: its data lands when the handle is waited (the worst case a GPU allows)."""

    def __init__(self, dev: _HostDev, out: torch.Tensor, inp: torch.Tensor) -> None:
        self.dev, self.out, self.inp = dev, out, inp

    def wait(self) -> None:
        self.out.copy_(self.inp)
        self.dev.waits += 1


class _HostDev:
    device = torch.device("cpu")

    def __init__(self) -> None:
        self.gathers = 0
        self.waits = 0

    def all_gather_into_tensor(self, out: torch.Tensor, inp: torch.Tensor, async_op: bool = True) -> Any:
        self.gathers += 1
        work = _Work(self, out, inp)
        if not async_op:
            work.wait()
            return None
        return work


def _wrap(fixes: pr.Fixes = pr.FIXED, layers: int = 4, bucket: int = 1, overlap: bool = True) -> Any:
    dev = _HostDev()
    params = [pr.Param(f"layer{i}.weight", 8) for i in range(layers)]
    ddp = pr.DistributedDataParallel(dev, params, bucket, overlap, fixes)
    for b in ddp.buckets:
        load(b, 0)
    return dev, params, ddp


_ACTIONS = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["hook", "ensure", "capture"]), st.integers(0, 3)),
        st.tuples(st.sampled_from(["disable", "enable", "step", "eager"]), st.just(0)),
    ),
    max_size=14,
)


def callback_rules_hold(fixes: pr.Fixes, actions: list[tuple[str, int]]) -> None:
    """The callback's invariants after every action of a random driver (raises AssertionError)."""
    dev, params, ddp = _wrap(fixes, bucket=1)
    version = 0
    for act, i in actions:
        g = ddp.group_of[id(params[i])]
        before = dev.gathers
        if act == "hook":
            ddp.forward_pre_hook(params[i])
        elif act == "ensure":
            # read before the call: a callback that starts a gather and waits it ends PUBLISHED with fresh
            # weights, so the state after it cannot tell whether the gather was started with the hooks removed
            hooks_removed = not ddp.hooks_installed
            pr.ensure_params_ready([params[i]])
            if hooks_removed:
                assert dev.gathers == before  # hooks removed: the callback never starts a gather
            if ddp.hooks_installed:
                assert g.state == pr.PUBLISHED
            if g.state == pr.PUBLISHED:
                assert torch.equal(params[i].data, weight_values(version, ddp.buckets[i].start, 8))
            else:
                assert dev.gathers == before  # left unpublished: it started no gather either
            counts = (dev.gathers, dev.waits)
            pr.ensure_params_ready([params[i]])
            assert (dev.gathers, dev.waits) == counts  # idempotent
        elif act == "capture":
            with ddp.graph_capture():
                pr.ensure_params_ready([params[i]])
            assert dev.gathers == before
        elif act == "disable":
            ddp.disable_forward_pre_hook(param_sync=False)
            assert all(x.state != pr.IN_FLIGHT for x in ddp.groups)
        elif act == "enable":
            ddp.enable_forward_pre_hook()
        elif act == "step":
            if any(x.state == pr.IN_FLIGHT for x in ddp.groups):
                continue  # backward waits the gathers it reads; not the callback's business
            ddp.finish_grad_sync()
            ddp.optimizer_step()
            version += 1
        elif act == "eager" and ddp.hooks_installed:
            ddp.start_param_sync()
        for x in ddp.groups:
            assert x.param_gather_dispatched or x.param_gather_handle is None


@settings(max_examples=150, deadline=None)
@given(_ACTIONS)
def test_fixed_callback_rules_hold_for_any_driver(actions: list[tuple[str, int]]) -> None:
    callback_rules_hold(pr.FIXED, actions)


@pytest.mark.parametrize("variant", ["param-ready-skips-undispatched", "param-no-drain-on-disable"])
def test_callback_rules_catch_the_callback_bugs(variant: str) -> None:
    def breaks(actions: list[tuple[str, int]]) -> bool:
        try:
            callback_rules_hold(pr.VARIANTS[variant], actions)
        except AssertionError:
            return True
        return False

    found = find(_ACTIONS, breaks, settings=_FIND)
    assert found == {
        "param-ready-skips-undispatched": [("ensure", 0)],
        "param-no-drain-on-disable": [("hook", 0), ("disable", 0)],  # the hook chained group 1
    }[variant]


class _StartsGatherWithHooksRemoved(pr.BucketParamReady):
    """A mutant of FIXED's callback: it starts an undispatched gather whether or not the hooks are installed.

    It waits the gather before it returns, so the group ends PUBLISHED with this iteration's weights and the hooks
    are still removed: only the state before the call shows the rule broken.
    """

    __slots__ = ()

    def __call__(self) -> None:
        group, ddp = self._group(), self._ddp()
        if group is None or group.published or ddp is None or ddp.capturing:
            return
        # FIXED starts (and finishes) an undispatched gather only while ddp.hooks_installed: that test is dropped
        group.finish_param_sync(skip_next=not ddp.owns_schedule)


def test_callback_rules_catch_a_gather_started_with_the_hooks_removed(monkeypatch: pytest.MonkeyPatch) -> None:
    def breaks(actions: list[tuple[str, int]]) -> bool:
        try:
            callback_rules_hold(pr.FIXED, actions)
        except AssertionError:
            return True
        return False

    # the wrapper stamps pr.BucketParamReady on its parameters: every wrapper made in this test gets the mutant
    monkeypatch.setattr(pr, "BucketParamReady", _StartsGatherWithHooksRemoved)
    found = find(_ACTIONS, breaks, settings=_FIND)
    assert found == [("disable", 0), ("ensure", 0)]
    monkeypatch.undo()
    callback_rules_hold(pr.FIXED, found)  # the real callback does nothing there


def test_the_state_after_the_call_lets_a_gather_with_the_hooks_removed_through(monkeypatch: pytest.MonkeyPatch) -> None:
    # the old check read only the state after the call: hooks removed (so no demand to be PUBLISHED), the group
    # PUBLISHED with this iteration's weights (so the data check passes), and the gather count was looked at only
    # for a group left unpublished: it passed this mutant
    monkeypatch.setattr(pr, "BucketParamReady", _StartsGatherWithHooksRemoved)
    dev, params, ddp = _wrap()
    ddp.disable_forward_pre_hook(param_sync=False)
    pr.ensure_params_ready([params[0]])
    assert dev.gathers == 1  # started with the hooks removed
    assert ddp.groups[0].state == pr.PUBLISHED
    assert not ddp.hooks_installed
    assert torch.equal(params[0].data, weight_values(0, ddp.buckets[0].start, 8))  # and the data is right


def test_hot_path_does_nothing_on_a_published_group() -> None:
    dev, params, ddp = _wrap()
    pr.ensure_params_ready([params[0]])
    counts = (dev.gathers, dev.waits)
    for _ in range(3):
        pr.ensure_params_ready(params[:1])
    assert (dev.gathers, dev.waits) == counts
    assert ddp.groups[0].state == pr.PUBLISHED


def test_in_flight_chains_only_while_the_hooks_own_the_schedule() -> None:
    _, params, ddp = _wrap()
    ddp.start_param_sync()
    pr.ensure_params_ready([params[0]])
    assert [g.state for g in ddp.groups] == [pr.PUBLISHED, pr.IN_FLIGHT, pr.UNDISPATCHED, pr.UNDISPATCHED]
    _, params, ddp = _wrap()
    ddp.start_param_sync()
    ddp.hooks_installed = False  # hooks gone without the drain: the callback finishes, but starts nothing more
    pr.ensure_params_ready([params[0]])
    assert [g.state for g in ddp.groups] == [pr.PUBLISHED, pr.UNDISPATCHED, pr.UNDISPATCHED, pr.UNDISPATCHED]


def test_a_dropped_wrapper_leaves_callbacks_that_do_nothing() -> None:
    dev, params, ddp = _wrap()
    del ddp
    gc.collect()
    pr.ensure_params_ready(params)
    assert dev.gathers == 0


def test_rewrap_removes_callbacks_the_new_wrapper_does_not_publish() -> None:
    dev, params, first = _wrap(layers=3)
    old = [getattr(p, pr.PARAM_READY_ATTR) for p in params]
    again = pr.DistributedDataParallel(dev, params, 3, True, pr.FIXED)
    new = [getattr(p, pr.PARAM_READY_ATTR) for p in params]
    assert all(n is new[0] for n in new)  # one group now: one callback
    assert not any(n is o for n, o in zip(new, old, strict=True))
    pr.DistributedDataParallel(dev, params, 1, False, pr.FIXED)  # publishes synchronously: nothing to call
    assert [hasattr(p, pr.PARAM_READY_ATTR) for p in params] == [False] * 3
    assert len(first.groups) == 3  # the first wrapper is alive: its callbacks were replaced, not dead
    assert len(again.groups) == 1


def test_ensure_runs_each_distinct_callback_once_in_order() -> None:
    calls: list[str] = []

    def cb(name: str) -> Any:
        return lambda: calls.append(name)

    a, b, c = cb("a"), cb("b"), cb("c")
    params = [pr.Param(str(i), 1) for i in range(6)]
    for p, f in zip(params, [a, b, a, b, b, c], strict=True):
        setattr(p, pr.PARAM_READY_ATTR, f)
    pr.ensure_params_ready([*params, pr.Param("plain", 1)])
    assert calls == ["a", "b", "c"]


def test_two_gathers_into_one_buffer_in_one_iteration_are_refused() -> None:
    _, _, ddp = _wrap()
    ddp.start_param_sync()
    with pytest.raises(AssertionError, match="a second all-gather into one buffer"):
        ddp.groups[0].start_param_sync()
    with pytest.raises(AssertionError, match="not dispatched but has a handle"):
        ddp.finish_grad_sync()
