"""torchao's real ``CPUOffloadOptimizer`` (torchao 0.18.0 from PyPI, unmodified) on the simulator.

The optimizer runs byte for byte through the torch.cuda drop-in (``torchao_offload.py``): one step at a time
(no gradient accumulation) every schedule is clean, with and without ``offload_gradients``, with the small
parameters on the on-device optimizer or all offloaded. Each mutant (one of its synchronizations made a no-op)
is found, the race names the operations the missing synchronization ordered, and the suggested fix (the missing
edge) is checked. With gradient accumulation (two backwards before a step) upstream races: the first backward's
gradient D2H on the side stream may still read ``.grad`` while the second backward's ``AccumulateGrad`` adds into
it on the compute stream (nothing orders the compute stream after the side stream); the weights still come out
right, as the second D2H, later on the same stream, overwrites the pinned gradient before the CPU step reads it.
A step skipped (``zero_grad()`` without ``step()``) drops the device gradient while its D2H may still read it, with
the weights right as well. Under ``torch.autocast("cuda")`` (bfloat16) it is clean, and a mutant found, as
without. Under torch's ``GradScaler("cuda")`` the weights come out wrong: ``scaler.step(opt)``
unscales the pinned host gradients before their D2H lands, with the scale copied to the host without a wait
(docs/confirmations.md, forty-fifth run: wrong 20/20 on an H100 under either stall). Needs the extra
``upstream`` (``pip install -e '.[upstream]'``); skipped without it.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import strategies as st

import simdevice
from reference.naming import short_path
from reference.schedule import Schedule
from simdevice import StaleRead
from simdevice.explain import suggest
from simdevice.search.explore import search_target
from simdevice.search.targets import resolve

_torchao = importlib.util.find_spec("torchao")  # (not imported here: the driver imports it, quietly)
if _torchao is None or not _torchao.submodule_search_locations:
    pytest.skip("torchao is not installed (the extra 'upstream')", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
DRIVER = "tests/upstream/torchao_offload.py"


def _line(path: Path, text: str) -> int:
    """The line of ``path`` that holds ``text`` (the sites the reports name, whatever the version's line numbers)."""
    lines = path.read_text().splitlines()
    (n,) = [i for i, line in enumerate(lines, 1) if text in line]
    return n


_upstream = Path(next(iter(_torchao.submodule_search_locations))) / "optim" / "cpu_offload.py"
#: the module as the reports name it (relative to the working directory where it lies under it, as a virtual
#: environment in the checkout does; else its last two components)
UPSTREAM = short_path(str(_upstream))
#: the gradient's D2H in the hook; the CPU optimizer's step and the parameter's H2D in ``step()``
D2H = f"{UPSTREAM}:{_line(_upstream, 'p_host.grad.copy_(p_device.grad, non_blocking=True)')}"
CPU_STEP = f"{UPSTREAM}:{_line(_upstream, 'self.optim_dict[p_device].step()')}"
H2D = f"{UPSTREAM}:{_line(_upstream, 'p_device.copy_(p_host, non_blocking=True)')}"
#: ``zero_grad()``'s drop of the device gradient
ZERO_GRAD = f"{UPSTREAM}:" + str(next(
    i for i, line in enumerate(_upstream.read_text().splitlines(), 1)
    if i > _line(_upstream, "def zero_grad(") and "p_device.grad = None" in line))
#: the driver's lines of ``train_skipping``'s and ``train_scaled``'s forward and backward, and ``scaler.step(opt)``
SKIPPING_PASS = f"{DRIVER}:{_line(ROOT / DRIVER, 'model(x.cuda()).square().mean().backward()')}"
SCALER_STEP = f"{DRIVER}:{_line(ROOT / DRIVER, '        scaler.step(opt)')}"
#: the driver's line of forward and backward (the ops of both, AccumulateGrad's among them, are issued there)
PASS = f"{DRIVER}:{_line(ROOT / DRIVER, 'model(next(batches).cuda()).square().mean().backward()')}"
CONFIG = st.fixed_dictionaries({
    "steps": st.integers(1, 3),
    "minimal_size": st.sampled_from([1, 4096]),  # 4096: the biases stay on the GPU's own AdamW
    "offload_gradients": st.booleans(),
})
MUTANT_CONFIG = st.fixed_dictionaries({"steps": st.integers(1, 3), "minimal_size": st.sampled_from([1, 4096])})


def test_the_real_optimizer_is_clean_one_step_at_a_time() -> None:
    found = simdevice.explore(f"{DRIVER}::train", config=CONFIG, max_examples=60)
    assert found.failure is None, found.text()
    run = resolve(f"{DRIVER}::train").run(Schedule.parse(f"{DRIVER}::train")).run
    # it offloaded: the side stream made the D2H and H2D copies (two weights, two steps)
    assert run.op_counts["stream"] == 8


def test_under_autocast_the_optimizer_is_clean_and_a_missing_event_sync_is_found() -> None:
    """Mixed precision's usual pairing: the loop under ``torch.autocast("cuda", dtype=torch.bfloat16)``, the
    gradients float32 as the weights. Every schedule is clean; with the D2H event's ``synchronize()`` made a no-op,
    the CPU step reads a gradient the D2H has not written and the weights come out wrong."""
    config = st.fixed_dictionaries({"steps": st.integers(1, 3), "minimal_size": st.sampled_from([1, 4096])})
    found = simdevice.explore(f"{DRIVER}::train_autocast", config=config, max_examples=30)
    assert found.failure is None, found.text()
    out = resolve(f"{DRIVER}::train_autocast").run(Schedule.parse(f"{DRIVER}::train_autocast:event_sync=0"))
    stale = [r for r in out.run.reports if isinstance(r, StaleRead)]
    assert stale, out.text()
    for r in stale:
        assert r.read.source == CPU_STEP, out.text()
        assert r.expected is not None
        assert (r.expected.op, r.expected.source) == ("copy_ (D2H)", D2H), out.text()
    assert any(r.kind == "host-error" for r in out.run.reports), out.text()


def test_gradient_accumulation_races_on_the_device_gradient_but_the_weights_come_out_right() -> None:
    out = resolve(f"{DRIVER}::train").run(Schedule.parse(f"{DRIVER}::train:accum=2"))
    assert not any(r.kind == "host-error" for r in out.run.reports)  # the weights equal the CPU run's
    races = [r for r in out.run.reports if r.kind == "race"]
    assert races
    for r in races:
        text = str(r)
        assert text.startswith("race: add_ on stream default ")  # AccumulateGrad of the second backward
        assert "which copy_ (D2H) on stream stream #" in text
        assert f"({D2H}) read" in text
    stale = [r for r in out.run.reports if isinstance(r, StaleRead)]
    assert stale
    assert all(r.read.op == "copy_ (D2H)" and r.read.actor == "stream" for r in stale)
    fix = suggest(resolve(f"{DRIVER}::train"), out, schedules=20)
    assert fix.checked, fix.lines()
    assert [str(e) for e in fix.edges] == [f"stream@{D2H}->default@{PASS}"]
    # and no schedule makes the weights wrong: the last D2H, ordered after every accumulation, is the one read
    accumulating = st.fixed_dictionaries({"accum": st.integers(2, 3), "steps": st.integers(1, 2),
                                          "minimal_size": st.sampled_from([1, 4096])})
    wrong = search_target(resolve(f"{DRIVER}::train"), lambda o: any(r.kind == "host-error" for r in o.run.reports),
                          config=accumulating, max_examples=30)
    assert wrong.failure is None, [str(r) for r in wrong.failure.run.reports]


def test_a_skipped_step_drops_the_device_gradient_its_d2h_may_still_read() -> None:
    # ``zero_grad()`` without ``step()`` sets ``p.grad = None`` with no wait for the side stream's D2H of it and no
    # ``record_stream``: the next forward's allocation takes the block while the D2H may still read it
    target = resolve(f"{DRIVER}::train_skipping")
    out = target.run(Schedule.parse(f"{DRIVER}::train_skipping"))
    races = [str(r) for r in out.run.reports if r.kind == "race"]
    assert races
    for r in races:
        assert r.startswith("race: mm on stream default "), r
        assert "which copy_ (D2H) on stream stream #" in r, r
        assert f"({D2H}) read as" in r, r
        assert f"before the free on stream default ({ZERO_GRAD}) handed its block on" in r, r
    assert not any(r.kind == "host-error" for r in out.run.reports)
    fix = suggest(target, out, schedules=20)
    assert fix.checked, fix.lines()
    assert [str(e) for e in fix.edges] == [f"stream@{D2H}->default@{SKIPPING_PASS}"]
    assert any("`record_stream` on that stream (`stream`)" in a for a in fix.advice), fix.advice
    # the weights come out right in every schedule: the next backward's D2H, later on the same stream, overwrites
    # the pinned gradient before a step reads it
    skipping = st.fixed_dictionaries({"steps": st.integers(2, 3), "skip": st.integers(0, 2),
                                      "minimal_size": st.sampled_from([1, 4096])})
    wrong = search_target(target, lambda o: any(r.kind == "host-error" for r in o.run.reports), config=skipping,
                          max_examples=30)
    assert wrong.failure is None, [str(r) for r in wrong.failure.run.reports]


def test_under_a_gradient_scaler_the_host_unscales_gradients_before_their_d2h_lands() -> None:
    # ``scaler.step(opt)`` unscales the optimizer's gradients where they are: the pinned host gradients the hook's
    # D2H is still writing, with the scale copied ``to("cpu", non_blocking=True)`` (torch's GradScaler) and read by
    # the host kernel at once; the D2H then lands the scaled gradient, which SGD applies
    target = f"{DRIVER}::train_scaled"
    found = simdevice.explore(target, config=st.fixed_dictionaries({"steps": st.integers(1, 2)}), max_examples=20)
    assert found.failure is not None
    reports = [str(r) for r in found.failure.run.reports]
    unscale = f"race: _amp_foreach_non_finite_check_and_unscale_ on host host ({SCALER_STEP}) reads pinned#"
    assert any(r.startswith(unscale) and "which copy_ (D2H) on stream stream #" in r and f"({D2H}) wrote" in r
               for r in reports), reports
    assert any(r.startswith(unscale) and "which _to_copy (D2H) on stream default #" in r
               and f"({SCALER_STEP}) wrote" in r for r in reports), reports
    assert any(r.startswith("host error: host raised AssertionError: parameter ") for r in reports), reports
    fix = suggest(resolve(target), found.failure, schedules=20)
    assert fix.checked, fix.lines()
    assert sorted(str(e) for e in fix.edges) == sorted([f"stream@{D2H}->host@{SCALER_STEP}",
                                                        f"default@{SCALER_STEP}->host@{SCALER_STEP}"])


MUTANTS = {
    # the D2H reads the gradient before backward wrote it: the missing wait is the side stream's on the compute stream
    "train_without_backward_wait": ("race: copy_ (D2H) on stream stream #", f"default@{PASS}->stream@{D2H}",
                                    "make `stream` wait on it before `copy_ (D2H)`"),
    # the CPU AdamW step reads the pinned gradient before its D2H landed: the host's wait on the D2H's event
    "train_without_event_sync": ("race: _fused_adamw_ on host host ", f"stream@{D2H}->host@{CPU_STEP}",
                                 "synchronize on an event recorded on `stream` after `copy_ (D2H)`"),
    # the next forward, or the final read, reads a weight its H2D may still write: the wait on the side stream
    "train_without_stream_sync": ("which copy_ (H2D) on stream stream #", f"stream@{H2D}->default@{DRIVER}:",
                                  "make `default` wait on it before"),
    # offload_gradients frees the gradient while its D2H reads it: the record_stream onto the side stream
    "train_without_record_stream": ("race: mm on stream default ", f"stream@{D2H}->default@{PASS}",
                                    "`record_stream` on that stream (`stream`)"),
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_each_mutant_races_and_the_missing_synchronization_is_named_and_checked(mutant: str) -> None:
    race, edge, advice = MUTANTS[mutant]
    target = f"{DRIVER}::{mutant}"
    found = simdevice.explore(target, config=MUTANT_CONFIG, max_examples=40)
    assert found.failure is not None
    reports = [str(r) for r in found.failure.run.reports]
    assert any(r.startswith("race: ") and race in r for r in reports), reports
    assert any(r.startswith("host error: host raised AssertionError: parameter ") for r in reports), reports
    fix = suggest(resolve(target), found.failure, schedules=20)
    assert fix.checked, fix.lines()
    assert any(str(e).startswith(edge) for e in fix.edges), fix.lines()
    assert any(advice in a for a in fix.advice), fix.advice


def test_a_mutant_replays_from_the_command_line() -> None:
    found = simdevice.explore(f"{DRIVER}::train_without_event_sync", max_examples=20)
    assert found.failure is not None
    p = subprocess.run([sys.executable, "-m", "simdevice", "replay", str(found.schedule), "--no-fix"], cwd=ROOT,
                       capture_output=True, text=True, check=False)
    assert p.returncode == 1
    assert "parameter 0 differs from the run without offload" in p.stdout
