"""Activation offload (reference/activation_offload.py) on the simulated device.

FIXED must hold every property under every drawn configuration (layers 1..4,
microbatches 1..3, fraction 0/0.5/1, iterations 1..3, warmup on/off, an
evaluation pass first or not, the microbatch order: every forward first or
1F1B with one or two microbatches in flight) and schedule. Each property is
also shown to catch a named variant, so none of them holds vacuously: the two
upstream bugs, three correct-but-slower arms that only the wait counts tell
apart, and a mutant of the pinned pool (``pool-reuse-on-enqueue``) that only a
1F1B order shows.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import attrs
import pytest
import torch
from hypothesis import find, given

from reference import activation_offload as ao
from reference.schedule import Schedule
from simdevice import SimDevice
from simdevice.programs.activation_offload import PROGRAM, body, microbatch_order, oracle
from simdevice.search import Outcome, execute, search_settings
from simdevice.search.strategies import configs, schedules, schedules_of
from simdevice.search.targets import ProgramTarget

FIND = search_settings()  # what simdevice check searches with


def run(s: Schedule) -> Outcome:
    """Run a schedule of any variant in ``ao.VARIANTS`` (the slow arms and the mutants are not registered programs)."""
    if s.variant in PROGRAM.variants:
        return execute(s)
    cfg = PROGRAM.parse_config(s.config_dict())
    r = SimDevice(s).run(body, s.variant, cfg)
    problems = tuple(oracle(cfg, r.result)) if r.result is not None else ("no result",)
    return Outcome(s, r, problems)


# ---------------------------------------------------------------------------
# The properties, each a predicate over one run


def no_report(out: Outcome) -> bool:
    """The orderings hold: no race, stale read, deadlock or host error."""
    return not out.run.reports


def values_right(out: Outcome) -> bool:
    """Every popped tensor equals the pushed one and the weights equal a run without offload."""
    return out.run.result is not None and not out.problems


def no_chunk_mismatch(out: Outcome) -> bool:
    return not any("Chunk mismatch" in str(r) for r in out.run.reports)


def prefetch_adds_no_compute_wait(out: Outcome) -> bool:
    """A prefetched group costs the compute stream one wait, on its reload event, never one on the D2H."""
    waits = out.run.result["waits"]
    prefetched = {(r.pass_index, r.chunk, r.group) for r in out.run.result["reloads"] if r.path == "prefetch"}
    for key in prefetched:
        on_compute = [w for w in waits if w.stream == "compute" and (w.pass_index, w.chunk, w.group) == key]
        if [(w.event, w.path) for w in on_compute] != [("reload", "commit")]:
            return False
    return True


def pool_reuse_ordered(out: Outcome) -> bool:
    """The pool hands a pinned buffer to the next D2H only once the H2D that read it is ordered before that D2H: no
    D2H write of a pinned buffer races an H2D read issued before it, and no H2D read sees a D2H issued after it."""
    for r in out.run.reports:
        if r.kind == "race" and r.current.storage.startswith("pinned") and "(D2H)" in r.current.op \
                and r.current.kind == "write" and "(H2D)" in r.previous.op and r.previous.kind == "read":
            return False
        if r.kind == "stale-read" and r.stale_by < 0 and "(H2D)" in r.read.op and r.seen is not None \
                and "(D2H)" in r.seen.op:
            return False
    return True


def no_stale_event_wait(out: Outcome) -> bool:
    """The latch: a group not offloaded in this pass never waits on its (stale) offload event."""
    return not any(w.event == "offload" and not w.offloaded for w in out.run.result["waits"])


PROPERTIES: list[Callable[[Outcome], bool]] = [
    no_report,
    values_right,
    no_chunk_mismatch,
    pool_reuse_ordered,
    prefetch_adds_no_compute_wait,
    no_stale_event_wait,
]


@given(schedules(PROGRAM, "FIXED"))
def test_fixed_holds_every_property(s: Schedule) -> None:
    out = run(s)
    assert out.clean, out.text()
    for prop in PROPERTIES:
        assert prop(out), f"{prop.__name__} fails: {out.text()}"
    cfg = PROGRAM.parse_config(s.config_dict())
    if cfg.warmup and not cfg.evalfirst:  # a training warmup pass offloads and reloads every group
        reloaded = sum(r.tensors for r in out.run.result["reloads"])
        assert reloaded >= 2 * cfg.layers * cfg.mb  # so the comparison above really ran on reloaded tensors


# Each property catches a named variant: (property, variant, a configuration that can show it).
CATCHES = [
    (no_report, "offload-inline-no-wait"),
    (values_right, "offload-inline-no-wait"),
    (no_report, "offload-queue-empty-cursor"),
    (no_chunk_mismatch, "offload-queue-empty-cursor"),
    (prefetch_adds_no_compute_wait, "prefetch-keeps-latch"),
    (no_stale_event_wait, "reset-keeps-latch"),
    (no_stale_event_wait, "unconditional-wait"),
    (pool_reuse_ordered, "pool-reuse-on-enqueue"),
]


#: where a catch searches a narrower space than the program's, to keep the test fast: three microbatches are the
#: fewest at which 1F1B runs a forward between a prefetch and compute's wait for it (the whole space finds it too,
#: after about 45 examples instead of a few)
NARROW: dict[str, dict[str, tuple[str, ...]]] = {"pool-reuse-on-enqueue": {"mb": ("3",)}}


def _fails(prop: Callable[[Outcome], bool]) -> Callable[[Schedule], bool]:
    def fails(s: Schedule) -> bool:
        out = run(s)
        if out.run.result is None and prop not in (no_report, no_chunk_mismatch, pool_reuse_ordered):
            return False  # a wait-count property needs a finished run
        return not prop(out)

    return fails


@attrs.frozen
class _Arm(ProgramTarget):
    """A variant of ``ao.VARIANTS`` as a search target, registered or not (its probe runs it as ``run`` does)."""

    def run(self, schedule: Schedule, backend: str = "sim") -> Outcome:
        return run(schedule)


@pytest.mark.parametrize(("prop", "variant"), CATCHES, ids=lambda x: getattr(x, "__name__", x))
def test_property_catches_variant(prop: Callable[[Outcome], bool], variant: str) -> None:
    space = attrs.evolve(PROGRAM, config_space={**PROGRAM.config_space, **NARROW.get(variant, {})})
    s = find(schedules_of(_Arm(PROGRAM, variant), configs(space)), _fails(prop), settings=FIND)
    again = Schedule.parse(str(s))
    assert again == s
    assert not prop(run(again)), str(s)


def test_microbatch_orders() -> None:
    """Every forward first (the default), or 1F1B: at most ``inflight`` microbatches between forward and backward."""
    def text(mb: int, inflight: int) -> str:
        return " ".join(f"{step}{i}" for step, i in microbatch_order(mb, inflight))

    assert text(3, 0) == text(3, 3) == text(3, 8) == "F0 F1 F2 B0 B1 B2"
    assert text(3, 2) == "F0 F1 B0 F2 B1 B2"
    assert text(3, 1) == "F0 B0 F1 B1 F2 B2"
    assert text(4, 2) == "F0 F1 B0 F2 B1 F3 B2 B3"
    for mb in range(1, 9):
        for inflight in range(9):
            steps = microbatch_order(mb, inflight)
            assert [i for s, i in steps if s == "F"] == [i for s, i in steps if s == "B"] == list(range(mb))
            for k, (step, i) in enumerate(steps):  # a backward after its forward, never more in flight than allowed
                ahead = sum(1 for s, _ in steps[: k + 1] if s == "F") - sum(1 for s, _ in steps[:k] if s == "B")
                assert step == "F" or ("F", i) in steps[:k]
                assert ahead <= (inflight or mb)


@pytest.mark.parametrize("inflight", ["0", "1", "2", "3"])
def test_fixed_holds_under_every_order_with_stalls(inflight: str) -> None:
    """FIXED under each order, with a stalled prefetch (so a waited-for H2D is really still running) and a stalled
    D2H; its pool hands out again, behind a wait, buffers a prefetch gave back."""
    cfg = f"layers=2,mb=3,iters=2,frac=50,inflight={inflight}"
    for delays in ("h2d#0+30", "h2d#2+30,d2h#4+30"):
        out = run(Schedule.parse(f"activation_offload/FIXED:{cfg}:{delays}"))
        assert out.clean, out.text()
        assert not out.run.unfired
        assert all(prop(out) for prop in PROPERTIES), out.text()
        assert out.run.result["pool_waits"] > 0


def test_pool_reuse_mutant_needs_a_pipeline_order() -> None:
    """The pool taking a buffer back once its H2D is enqueued: with every forward first, or one microbatch in
    flight, no D2H comes between a prefetch and compute's wait for it; under 1F1B with two in flight microbatch 2's
    D2H overwrites the buffers microbatch 1's primed reload reads (a race whatever the timing, wrong values when the
    H2D is stalled). FIXED, under the same schedules, waits for the reload before the reuse."""
    mutant = "activation_offload/pool-reuse-on-enqueue"
    for cfg in ("mb=3", "mb=3,inflight=1", "layers=2,mb=3,iters=2,frac=50", "layers=2,mb=3,iters=2,inflight=1"):
        assert run(Schedule.parse(f"{mutant}:{cfg}:h2d#0+30")).clean, cfg
    bare = run(Schedule.parse(f"{mutant}:mb=3,inflight=2"))
    assert not pool_reuse_ordered(bare)
    assert not no_report(bare)
    assert values_right(bare)  # unstalled, the H2D has read the buffer before the D2H writes it
    races = [r for r in bare.run.reports if r.kind == "race"]
    assert len(races) == 2
    assert all("(D2H)" in r.current.op and "(H2D)" in r.previous.op for r in races)
    stalled = run(Schedule.parse(f"{mutant}:mb=3,inflight=2:h2d#0+30"))
    assert not pool_reuse_ordered(stalled)
    assert not values_right(stalled)
    assert any(r.kind == "stale-read" and r.stale_by < 0 for r in stalled.run.reports)
    for line in ("activation_offload/FIXED:mb=3,inflight=2", "activation_offload/FIXED:mb=3,inflight=2:h2d#0+30"):
        fixed = run(Schedule.parse(line))
        assert fixed.clean, fixed.text()
        assert fixed.run.result["pool_waits"] == 2  # the two buffers of microbatch 1's primed group


def test_slow_arms_are_correct_under_their_shrunk_schedules() -> None:
    """The slow arms corrupt nothing: they differ from FIXED only in the waits they spend."""
    for variant, fixes in ao.SLOW_ARMS.items():
        assert fixes != ao.FIXED
        for cfg in ("evalfirst=1,frac=0,layers=2,mb=2,iters=2", "frac=100,layers=3,mb=2,iters=2,warmup=0"):
            out = run(Schedule.parse(f"activation_offload/{variant}:{cfg}:d2h#1+20"))
            assert out.clean, out.text()


# ---------------------------------------------------------------------------
# The bug variants: what shows them and what hides them (found-and-replays: tests/property/quality)


def test_cursor_bug_needs_fraction_zero_after_warmup() -> None:
    """The cursor bug hides while groups are queued: in warmup and at fractions 0.5 and 1."""
    base = "activation_offload/offload-queue-empty-cursor:layers=3,mb=2"
    assert not run(Schedule.parse(f"{base},iters=2,frac=0")).clean
    for frac in ("50", "100"):
        assert run(Schedule.parse(f"{base},iters=2,frac={frac}")).clean
    assert run(Schedule.parse(f"{base},iters=1,frac=0")).clean  # only the warmup pass


def test_inline_bug_corrupts_without_any_stall_and_fixed_waits_instead() -> None:
    """No delay at all: the first backward group is reloaded inline while its D2H is in flight."""
    bug = run(Schedule.parse("activation_offload/offload-inline-no-wait"))
    assert any(r.kind == "stale-read" for r in bug.run.reports)
    assert bug.problems
    fixed = run(Schedule.parse("activation_offload/FIXED"))
    assert fixed.clean
    inline_waits = [w for w in fixed.run.result["waits"] if w.path == "inline"]
    assert [(w.stream, w.event, w.group) for w in inline_waits] == [("compute", "offload", "layer0")]


def test_pre_fix_never_prefetches_in_warmup_and_fix_does() -> None:
    """Upstream saw 24 of 24 warmup reloads inline before the fix: the inline pop left the LIFO stale."""
    cfg = "layers=4,mb=2,iters=1"

    def paths(variant: str) -> list[str]:
        out = run(Schedule.parse(f"activation_offload/{variant}:{cfg}"))
        return [r.path for r in out.run.result["reloads"] if r.tensors]

    assert set(paths("offload-inline-no-wait")) == {"inline"}
    fixed = paths("FIXED")
    assert fixed.count("inline") == 2  # the two tensors of the first backward group, nothing else
    assert fixed.count("prefetch") == 4 * 2 - 1


def test_latch_keeps_stale_events_out_of_steady_state() -> None:
    """Groups offloaded by an evaluation pass and never reloaded: the next pass must not wait on them."""
    s = "activation_offload/{}:evalfirst=1,frac=0,layers=2,mb=2,iters=1"
    waits = {v: run(Schedule.parse(s.format(v))).run.result["waits"]
             for v in ("FIXED", "reset-keeps-latch", "unconditional-wait")}
    stale = {v: [w for w in ws if w.event == "offload" and not w.offloaded] for v, ws in waits.items()}
    assert stale["FIXED"] == []
    # what FIXED does wait for: the evaluation's D2Hs, once, before reset() drops their sources
    assert [(w.pass_index, w.path) for w in waits["FIXED"] if w.event == "offload"] == [(0, "reset")] * 4
    assert {(w.pass_index, w.offloaded) for w in stale["reset-keeps-latch"]} == {(1, False)}
    assert len(stale["reset-keeps-latch"]) == 2 * 2  # one per group and chunk
    assert all(not w.offloaded for w in stale["unconditional-wait"])


def test_report_text_is_pinned() -> None:
    src = inspect.getsource(ao).splitlines()

    def line(fragment: str) -> int:
        return next(i + 1 for i, text in enumerate(src) if fragment in text)

    h2d = line("dst.copy_(t.buf, non_blocking=True)  # on the current (compute) stream")
    d2h = line("buf.copy_(t, non_blocking=True)")
    out = run(Schedule.parse("activation_offload/offload-inline-no-wait"))
    stale = [str(r) for r in out.run.reports if r.kind == "stale-read"]
    expected = (
        f"stale read: copy_ (H2D) on stream default #12 (reference/activation_offload.py:{h2d}) read "
        f"pinned#3[0:65536] at t=4.516; it saw uninitialized memory; stale by 1 write: expected the data of "
        f"copy_ (D2H) on stream d2h #1 (reference/activation_offload.py:{d2h})"
    )
    assert stale[0] == expected
    cursor = run(Schedule.parse("activation_offload/offload-queue-empty-cursor:layers=2,warmup=0"))
    mismatch = line('f"Chunk mismatch: backward reached group')
    assert [str(r) for r in cursor.run.reports] == [
        "host error: host raised AssertionError: Chunk mismatch: backward reached group layer1 of chunk 1 "
        f"while chunk 0 is current (reference/activation_offload.py:{mismatch - 1})"
    ]


def test_config_errors_are_one_line() -> None:
    with pytest.raises(ValueError, match=r"layers must be in 1\.\.8, got 0"):
        PROGRAM.parse_config({"layers": "0"})
    with pytest.raises(ValueError, match="unknown configuration key 'depth'"):
        PROGRAM.parse_config({"depth": "2"})



# -- no leak across runs -------------------------------------------------------------------------------


def _live_tensors() -> int:
    import gc

    gc.collect()
    return sum(1 for o in gc.get_objects() if issubclass(type(o), torch.Tensor))  # type(): no __class__ lookups


@pytest.mark.parametrize("line", ["activation_offload/FIXED", "activation_offload/FIXED:evalfirst=1",
                                  "activation_offload/offload-inline-no-wait",
                                  "activation_offload/offload-queue-empty-cursor:layers=2,warmup=0"])
def test_a_run_frees_its_manager_pool_and_graph(line: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The D2H copies and the saved-tensor hooks hold nothing that holds them back: after a run (an evaluation pass
    whose graph never runs backward, and a run stopped by a Chunk mismatch, included) the manager is gone."""
    import gc
    import weakref

    made: list[weakref.ref[Any]] = []
    init = ao.ActivationOffloadManager.__init__

    def remember(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made.append(weakref.ref(self))

    monkeypatch.setattr(ao.ActivationOffloadManager, "__init__", remember)
    execute(Schedule.parse(line))
    gc.collect()
    assert len(made) == 1
    assert made[0]() is None, "the run's ActivationOffloadManager outlived it"


@pytest.mark.parametrize("runs", [30, pytest.param(200, marks=pytest.mark.slow)])
def test_memory_stays_flat_over_many_runs(runs: int) -> None:
    schedule = Schedule.parse("activation_offload/FIXED:evalfirst=1")
    execute(schedule)
    before = _live_tensors()
    for _ in range(runs):
        execute(schedule)
    assert _live_tensors() == before


def test_the_weights_oracle_takes_rounding_and_names_each_weight_that_differs() -> None:
    """The oracle compares the weights within a tolerance, not bit for bit (a run may round differently from the
    reference), and names each weight beyond it: its equality shortcut decides nothing on its own."""
    cfg = PROGRAM.parse_config({})
    out = execute(Schedule("activation_offload", "FIXED"))
    assert out.problems == ()
    weights = out.run.result["weights"]
    assert len(weights) >= 2
    rounded = [w * (1 + 1e-6) for w in weights]
    assert any(not torch.equal(r, w) for r, w in zip(rounded, weights, strict=True))
    assert oracle(cfg, {"mismatches": [], "weights": rounded}) == []
    wrong = [weights[0] + 1.0, *weights[1:]]
    problems = oracle(cfg, {"mismatches": [], "weights": wrong})
    assert problems == [f"weight 0: {weights[0].numel()} of {weights[0].numel()} values differ from the run without "
                        "offload"]
