"""Cost profiles (``--profile``): a measured profile's costs reach every run, the output names the profile that
judged it, and a bad profile is one line and exit 2."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

import pytest
from script_modules import load_script

from reference.schedule import Schedule
from simdevice import SimDevice
from simdevice.runtime.config import SimConfig, overridden
from simdevice.runtime.profiles import (
    COST_FIELDS,
    ProfileError,
    fields_from,
    load,
    names,
    parse,
    programs_from,
    spawned_measured,
)
from simdevice.search import execute

Cli = Callable[[list[str], Path], CompletedProcess[str]]

#: a race whose window is a few host steps wide: on a fast host (the default) the read overtakes the gather, on a
#: host as slow as Python on a GPU machine (about 200 µs a step) it does not
#: the prefetch's copy waits for the step's last kernel, as the gather does: with a fast host both start at its end
#: and the copy reads the bucket ahead of the gather; with a host step of 200 us the gather is over when it is issued
EAGER = "param_readiness/param-prefetch-no-ready:eager=1,evaluate=0,iters=1,ranks=1"


def _profile(tmp_path: Path, **fields: object) -> Path:
    path = tmp_path / "slow.json"
    path.write_text(json.dumps({"name": "slow-host", "fields": fields, "measured": {"device": "none"}}))
    return path


def test_a_profile_sets_the_cost_fields_and_names_itself(tmp_path: Path) -> None:
    profile = load(str(_profile(tmp_path, host_step_ns=200_000, launch_ns=3_000)))
    config = profile.config()
    assert (config.host_step_ns, config.launch_ns, config.profile) == (200_000, 3_000, "slow-host")
    assert config.copy_bytes_per_ns == SimConfig().copy_bytes_per_ns  # what it does not set stays
    assert load("default").config() == SimConfig()


def test_every_shipped_profile_loads_and_sets_only_costs() -> None:
    for name in names():
        profile = load(name)
        assert profile.name == name
        assert set(profile.fields) <= set(COST_FIELDS)
        assert profile.measured.get("device")  # says where it was measured, and how
        assert profile.measured.get("command")
        # measured, not fitted: its costs are what its own measurements give, nothing edited by hand
        assert profile.fields == fields_from(profile.measured)
        assert profile.programs == programs_from(profile.measured)
    assert "h200-torch2.11" in names()


def test_a_program_the_profile_timed_runs_with_its_own_host_step(tmp_path: Path) -> None:
    """``programs``: each timed program's median host step replaces the profile's median for its runs only."""
    doc = {"name": "own", "fields": {"host_step_ns": 100_000},
           "programs": {"offload_reload": {"host_step_ns": 250_000}}}
    (tmp_path / "own.json").write_text(json.dumps(doc))
    profile = load(str(tmp_path / "own.json"))
    with overridden(**profile.overrides()):
        own = SimDevice(Schedule.parse("offload_reload/correct")).config
        other = SimDevice(Schedule.parse("activation_offload/FIXED")).config
        plain = SimDevice().config
    assert (own.host_step_ns, other.host_step_ns, plain.host_step_ns) == (250_000, 100_000, 100_000)
    # and the run's host steps are charged so: two consecutive host steps of offload_reload 250 us apart
    with overridden(**profile.overrides()):
        run = execute(Schedule.parse("offload_reload/correct"))
    host = [t for t, actor, what in run.run.trace if actor == "host" and not what.startswith("stall")]
    assert min(b - a for a, b in itertools.pairwise(host)) == 250_000


def test_a_profiles_pace_scales_the_hosts_costs_alone(tmp_path: Path) -> None:
    doc = {"name": "p", "fields": {"host_step_ns": 100_000, "engine_step_ns": 40_000, "collective_host_ns": 8_000,
                                   "copy_bytes_per_ns": 50, "launch_ns": 6_000},
           "programs": {"a": {"host_step_ns": 200_000}}}
    (tmp_path / "p.json").write_text(json.dumps(doc))
    profile = load(str(tmp_path / "p.json"))
    assert profile.overrides(pace=1.0) == profile.overrides()
    slow = profile.overrides(pace=1.5)
    assert (slow["host_step_ns"], slow["engine_step_ns"], slow["collective_host_ns"]) == (150_000, 60_000, 12_000)
    assert slow["program_host_step_ns"] == (("a", 300_000),)
    assert (slow["copy_bytes_per_ns"], slow["launch_ns"], slow["profile"]) == (50, 6_000, "p")  # the GPU's own
    fast = load("default").overrides(pace=0.5)  # the fast host, faster still
    assert fast["host_step_ns"] == SimConfig().host_step_ns // 2
    assert "engine_step_ns" not in fast  # unset stays unset (0: as any other step)


def test_programs_come_from_each_programs_own_measurement() -> None:
    measured = {"host_steps": {"a/FIXED": {"median_ns": 40_000.4}, "b/FIXED:ranks=1": {"median_ns": 100_000},
                               "c/FIXED": {"skipped": "x"}}}
    assert programs_from(measured) == {"a": {"host_step_ns": 40_000}, "b": {"host_step_ns": 100_000}}


@pytest.mark.parametrize(("programs", "why"), [
    ([], "'programs' must be an object"),
    ({"a": {"launch_ns": 5}}, "programs['a'] must be"),
    ({"a": {"host_step_ns": 0}}, "programs['a'].host_step_ns must be a positive integer"),
])
def test_a_bad_programs_block_is_one_line(tmp_path: Path, programs: Any, why: str) -> None:
    (tmp_path / "bad.json").write_text(json.dumps({"name": "x", "fields": {"host_step_ns": 5}, "programs": programs}))
    with pytest.raises(ProfileError, match=re.escape(why)):
        load(str(tmp_path / "bad.json"))


def test_the_costs_come_from_the_measurements() -> None:
    measured = {"host_steps": {"a": {"median_ns": 40_000}, "b": {"median_ns": 100_000}, "c": {"skipped": "x"},
                               "d": {"median_ns": 60_000}},
                "copies": {"bytes_per_ns": 54.6}, "kernels": {"bytes_per_ns": 3000.4}, "launch": {"ns": 0.2}}
    assert fields_from(measured) == {"host_step_ns": 60_000, "copy_bytes_per_ns": 55, "kernel_bytes_per_ns": 3000,
                                     "launch_ns": 1}
    with pytest.raises(ValueError, match="no program's host steps"):
        fields_from({**measured, "host_steps": {"c": {"skipped": "x"}}})
    # a collective's issue beyond a kernel's: the median issue (40 us) less the kernel's (8 us)
    gather = {"samples": [{"issue_ns": 50_000}, {"issue_ns": 30_000}, {"issue_ns": 40_000}], "kernel_issue_ns": 8_000}
    assert fields_from({**measured, "collective": gather})["collective_host_ns"] == 32_000
    # pageable copies: bytes over each direction's median time (64 MiB in 10.5 ms: 6,391 bytes per us)
    pageable = {"bytes": 67108864, "h2d_ms": [10.5, 9.8, 13.2], "d2h_ms": [48.7, 54.4, 49.6, 54.0]}
    got = fields_from({**measured, "pageable": pageable})
    assert (got["pageable_h2d_bytes_per_us"], got["pageable_d2h_bytes_per_us"]) == (6391, 1296)


def test_the_engines_steps_are_costed_apart_from_the_programs() -> None:
    """Where calibrate told the engine's steps apart: each program's step is the median before its Python's steps,
    the engine's its own field (the median of every program's engine gaps together)."""
    measured = {"host_steps": {"a/FIXED": {"median_ns": 90_000, "python_median_ns": 150_000},
                               "b/FIXED": {"median_ns": 60_000, "python_median_ns": 70_000.4},
                               "c/FIXED": {"median_ns": 50_000},  # measured before the split: all its gaps
                               "engine": {"n": 40, "median_ns": 21_000.2}},
                "copies": {"bytes_per_ns": 50}, "kernels": {"bytes_per_ns": 3000}, "launch": {"ns": 5000}}
    fields = fields_from(measured)
    assert (fields["host_step_ns"], fields["engine_step_ns"]) == (70_000, 21_000)
    assert programs_from(measured) == {"a": {"host_step_ns": 150_000}, "b": {"host_step_ns": 70_000},
                                       "c": {"host_step_ns": 50_000}}
    del measured["host_steps"]["engine"]
    assert "engine_step_ns" not in fields_from(measured)  # none measured: every step the program's cost


def test_a_spawned_processs_start_and_step_come_from_the_measurements() -> None:
    """The spawned processes are the actors a run's starts name; their steps' median and their starts' median are
    the profile's ``spawned_host_step_ns`` and ``spawn_start_ns``, which a pace scales like any host cost."""
    traces = [{"host": [90_000] * 5, "worker0": [150_000, 200_000, 400_000]},
              {"host": [80_000] * 5, "worker0": [180_000], "worker1": [190_000, 210_000]}]
    starts = [{"worker0": 5_000_000_000}, {"worker0": 4_000_000_000, "worker1": 4_500_000_000}]
    spawned = spawned_measured(traces, starts)
    assert (spawned["steps"], spawned["step_median_ns"], spawned["start_median_ns"]) == (6, 195_000, 4_500_000_000)
    assert spawned_measured(traces, [{}, {}]) == {}  # no spawned process: nothing
    measured = {"host_steps": {"a": {"median_ns": 60_000}}, "copies": {"bytes_per_ns": 50},
                "kernels": {"bytes_per_ns": 3000}, "launch": {"ns": 5000}}
    fields = fields_from({**measured, "spawned": spawned})
    assert (fields["spawned_host_step_ns"], fields["spawn_start_ns"]) == (195_000, 4_500_000_000)
    assert "spawn_start_ns" not in fields_from({**measured, "spawned": {"skipped": "x"}})
    profile = parse({"name": "x", "fields": fields}, "x")
    doubled = profile.overrides(pace=2.0)
    assert (doubled["spawned_host_step_ns"], doubled["spawn_start_ns"]) == (390_000, 9_000_000_000)
    assert doubled["copy_bytes_per_ns"] == 50


#: the H200's costs of 2026-12-03's fifth sitting (its calibration, and its zcc/FIXED trials' workers: a start 4.88 s
#: after the trainer's ``Process.start``, a step of 192 us against the trainer's 88 us)
H200_HOST = SimConfig(host_step_ns=88_384, copy_bytes_per_ns=55, kernel_bytes_per_ns=2985, launch_ns=13_760,
                      engine_step_ns=119_369, collective_host_ns=37_250)
H200_WORKERS = {"spawn_start_ns": 4_882_912_268, "spawned_host_step_ns": 192_128}


@pytest.mark.parametrize(("schedule", "turns_with"), [
    ("zcc/zcc-frozen-step::default#6+5", "spawned_host_step_ns"),
    ("zcc/zcc-late-barrier::default#6+5", "spawn_start_ns"),
])
def test_zccs_workers_pace_and_start_turn_a_verdict_the_gpu_gave(schedule: str, turns_with: str) -> None:
    """Both corrupted the snapshot on the H200 in 2/2 trials; with the trainer's costs alone the simulator's workers
    keep the trainer's pace from its ``start`` on and its D2H reads the buffers before the step writes them. With
    a worker's own start and step (each of these two turns with one of them alone) the read lands in the step's
    writes, as on the GPU. FIXED stays clean with them."""
    import attrs

    assert not execute(Schedule.parse(schedule), sim_config=H200_HOST).shows_on_gpu
    assert execute(Schedule.parse(schedule), sim_config=attrs.evolve(H200_HOST, **H200_WORKERS)).corrupted
    one = attrs.evolve(H200_HOST, **{turns_with: H200_WORKERS[turns_with]})
    assert execute(Schedule.parse(schedule), sim_config=one).corrupted
    fixed = schedule.replace(schedule.split("/")[1].split(":")[0], "FIXED")
    assert not execute(Schedule.parse(fixed), sim_config=attrs.evolve(H200_HOST, **H200_WORKERS)).shows_on_gpu


def test_calibrate_tells_the_engines_gaps_from_the_programs() -> None:
    """Each gap belongs to the step it ends in: before an engine step, the engine's; one actor's stamps only."""
    cal = load_script("calibrate")
    stamps = {"host": [0, 100, 110, 125, 300], "d2h": [1, 2, 3], "rank0": [0, 7]}
    python, engine = cal._gaps_by_origin(stamps, {"host", "rank0"}, {"host": {2, 3}, "d2h": {1}})
    assert (sorted(python), sorted(engine)) == ([7, 100, 175], [10, 15])


#: the evaluation's read of a bucket one host step after its gather was issued, on a host as slow as the H200's
NO_DRAIN = "param_readiness/param-no-drain-on-disable:bucket=4,eager=1,iters=1,layers=2,ranks=2"


def test_a_collective_costs_the_host_its_issue() -> None:
    """``collective_host_ns``: the host returns from issuing a collective that much later than from a launch, so
    the step after it comes later; on a host like the H200's that closes this window (the gather of 2 x 128 MiB
    lands before the evaluation reads it), which a host step alone leaves open."""
    import attrs

    from reference.schedule import Schedule
    from simdevice.search import execute

    host = SimConfig(host_step_ns=84_454, copy_bytes_per_ns=55, kernel_bytes_per_ns=3059, launch_ns=12_352)
    plain = execute(Schedule.parse(NO_DRAIN), sim_config=host)
    issued = execute(Schedule.parse(NO_DRAIN), sim_config=attrs.evolve(host, collective_host_ns=30_000))
    assert plain.corrupted
    assert not issued.corrupted
    assert any("race" in line for line in issued.text().splitlines())  # the race is there under any costs

    def after_gathers(out: object) -> list[int]:
        trace = out.run.trace  # type: ignore[attr-defined]
        steps = [(t, what) for t, actor, what in trace if actor == "rank0"]  # rank1's are alike
        return [b[0] - a[0] for a, b in itertools.pairwise(steps) if a[1] == "all_gather_into_tensor"]

    assert len(after_gathers(plain)) == 2  # the step and the evaluation each gather once
    assert [g - 30_000 for g in after_gathers(issued)] == after_gathers(plain)


def test_the_profile_judges_the_run_and_the_output_says_which(tmp_path: Path, run_cli: Cli) -> None:
    fast = run_cli(["replay", EAGER, "--json", "--no-fix"], tmp_path)
    slow = run_cli(["replay", EAGER, "--json", "--no-fix", "--profile", str(_profile(tmp_path, host_step_ns=200_000))],
                   tmp_path)
    fast_doc, slow_doc = json.loads(fast.stdout), json.loads(slow.stdout)
    # the race is there under any costs (no edge orders the two accesses); the wrong values only where the read
    # overtakes the gather
    assert "wrong values" in fast_doc["verdicts"][0]
    assert "wrong values" not in slow_doc["verdicts"][0]
    assert "race" in slow_doc["verdicts"][0]
    assert (fast_doc["profile"], slow_doc["profile"]) == ("default", "slow-host")
    text = run_cli(["replay", EAGER, "--no-fix", "--profile", str(_profile(tmp_path, host_step_ns=200_000))], tmp_path)
    assert "judged with the cost profile slow-host" in text.stdout
    assert "judged with" not in run_cli(["replay", EAGER, "--no-fix"], tmp_path).stdout


def test_replay_says_when_the_verdict_turns_on_the_hosts_pace(tmp_path: Path, run_cli: Cli) -> None:
    """Under a measured profile, replay judges the schedule again with the host's costs x0.75 and x1.33 (how far one
    calibration of a GPU lies from another) and says so where the verdict turns: a GPU shows it at a rate."""
    edge = "activation_offload/offload-inline-no-wait::host#29+5"  # GPU: 0/2, then 6/10 (docs/fidelity.md)
    doc = json.loads(run_cli(["replay", edge, "--json", "--no-fix", "--profile", "h200-torch2.11"], tmp_path).stdout)
    assert "wrong values" not in doc["verdicts"][0]
    assert doc["pace_sensitive"] is True
    assert "wrong values" in doc["pace"]["0.75"]
    assert "wrong values" not in doc["pace"]["1.33"]
    text = run_cli(["replay", edge, "--no-fix", "--profile", "h200-torch2.11"], tmp_path).stdout
    assert "pace-sensitive: with the host's costs x0.75: wrong values" in text
    robust = "offload_reload/racy::d2h#0+5"  # the stall decides it: wrong values at any pace
    doc = json.loads(run_cli(["replay", robust, "--json", "--no-fix", "--profile", "h200-torch2.11"], tmp_path).stdout)
    assert doc["pace_sensitive"] is False
    assert "pace-sensitive" not in run_cli(["replay", robust, "--no-fix", "--profile", "h200-torch2.11"],
                                           tmp_path).stdout
    # the fast default is for finding bugs, not for judging a GPU's verdict: nothing said, nothing run again
    assert "pace" not in json.loads(run_cli(["replay", edge, "--json", "--no-fix"], tmp_path).stdout)


@pytest.mark.parametrize(("doc", "message"), [
    ("[1, 2]", "a profile is a JSON object"),
    ('{"name": "x"}', "'fields' must be an object"),
    ('{"name": "x", "fields": {"max_host_steps": 5}}', "'max_host_steps' is not a cost a profile may set"),
    ('{"name": "x", "fields": {"host_step_ns": 0}}', "host_step_ns must be a positive integer"),
    ('{"name": "x", "fields": {"host_step_ns": 1.5}}', "host_step_ns must be a positive integer"),
    ('{"name": "x", "fields": {"host_step_ns": true}}', "host_step_ns must be a positive integer"),
    ('{"fields": {"host_step_ns": 5}}', "'name' must be a short string"),
    ("{nope", "not JSON"),
])
def test_a_malformed_profile_is_one_line_and_exit_2(tmp_path: Path, run_cli: Cli, doc: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(doc)
    with pytest.raises(ProfileError, match=r"\S"):
        load(str(path))
    p = run_cli(["replay", "offload_reload/racy", "--profile", str(path)], tmp_path)
    assert p.returncode == 2
    assert message in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert p.stdout == ""


def test_an_unknown_profile_names_the_known_ones(tmp_path: Path, run_cli: Cli) -> None:
    p = run_cli(["check", "--program", "offload_reload", "--profile", "no-such-gpu"], tmp_path)
    assert p.returncode == 2
    assert "no cost profile 'no-such-gpu' (known: default" in p.stderr


def test_the_replay_line_carries_the_profile_that_judged_the_run(tmp_path: Path, run_cli: Cli) -> None:
    """The same schedule under other costs can get another verdict: the line printed to replay it asks for the same
    profile (by the path it was given), and exhaust says which profile judged it."""
    path = _profile(tmp_path, host_step_ns=200_000)
    p = run_cli(["replay", "offload_reload/racy::d2h#0+1", "--no-fix", "--profile", str(path)], tmp_path)
    assert f'replay: simdevice replay "offload_reload/racy::d2h#0+1" --profile {path} [--gpu]' in p.stdout
    p = run_cli(["replay", "offload_reload/racy::d2h#0+1", "--no-fix", "--profile", "h200-torch2.11"], tmp_path)
    assert '--profile h200-torch2.11 [--gpu]' in p.stdout
    p = run_cli(["replay", "offload_reload/racy::d2h#0+1", "--no-fix"], tmp_path)
    assert 'replay: simdevice replay "offload_reload/racy::d2h#0+1" [--gpu]' in p.stdout
    p = run_cli(["exhaust", "offload_reload/racy:", "--units", "1", "--profile", str(path)], tmp_path)
    assert "(judged with the cost profile slow-host)" in p.stdout


def test_calibrate_times_host_steps_of_host_actors_only() -> None:
    """A host step's cost is the gap between two counted steps of one host actor; a stream's stamps (its
    operations' issue times, named ``d2h`` on the host, ``rank0.default`` on a rank) are no host steps, and two
    actors' stamps never make a gap."""
    cal = load_script("calibrate")
    stamps = {"host": [(0,), (10,)], "d2h": [(1,), (500,)], "default": [(2,), (3,)], "rank0": [(20,), (50,), (51,)],
              "rank0.default": [(21,), (900,)]}
    gaps = cal._host_gaps(stamps, {"host", "rank0"})
    assert sorted(g for g, _, _ in gaps) == [1, 10, 30]


def test_calibrate_times_a_spawning_programs_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """calibrate's ``spawned``: zcc/FIXED on the GPU, a warm-up then each run inside ``host_traces()``; the workers'
    steps and starts (what ``measured_hosts`` gives) make the block ``fields_from`` reads. A run that raises leaves
    it out, said in one line. (On fakes: the CPU has no GPU.)"""
    import contextlib

    import reference.cuda as cuda
    from simdevice.search import targets

    cal = load_script("calibrate")
    ran: list[tuple[str, str]] = []
    measured = iter([({"host": (90_000,) * 3, "worker0": (150_000, 250_000)}, {"worker0": 4_000_000_000}),
                     ({"host": (80_000,), "worker0": (200_000,)}, {"worker0": 6_000_000_000})])
    monkeypatch.setattr(targets.ProgramTarget, "run", lambda self, s, backend="sim": ran.append((str(s), backend)))
    monkeypatch.setattr(cuda, "host_traces", contextlib.contextmanager(lambda: iter([[]])))
    monkeypatch.setattr(cuda, "measured_hosts", lambda devices: next(measured))
    out = cal.spawned(2)
    assert ran == [("zcc/FIXED", "cuda")] * 3  # the warm-up, then the two timed runs
    assert (out["spec"], out["steps"], out["step_median_ns"], out["start_median_ns"]) == (
        "zcc/FIXED", 3, 200_000, 5_000_000_000)
    assert fields_from({"host_steps": {"a": {"median_ns": 1}}, "copies": {"bytes_per_ns": 1},
                        "kernels": {"bytes_per_ns": 1}, "launch": {"ns": 1}, "spawned": out})["spawn_start_ns"] == 5e9

    def fails(self: Any, s: Any, backend: str = "sim") -> None:
        raise RuntimeError("CUDA error: out of memory\nmore")

    monkeypatch.setattr(targets.ProgramTarget, "run", fails)
    assert cal.spawned(2) == {"skipped": "RuntimeError: CUDA error: out of memory"}


def test_a_runs_config_takes_the_overrides_in_force_whatever_their_values() -> None:
    """A run's config is made once per (config, overrides), and each run gets the fields in force then: the defaults
    outside any block, the block's inside, a given config's own fields beside them, and a field whose value is not
    hashable (a list of steps) converted as before.

    Mutations caught: the cache keyed on the config alone (the second block's runs got the first's host step); no
    way for a value that cannot be hashed (a list raised TypeError)."""
    plain = SimDevice().config
    assert SimDevice().config is plain  # made once
    with overridden(host_step_ns=7_000):
        assert SimDevice().config.host_step_ns == 7_000
        assert SimDevice(config=SimConfig(launch_ns=9_000)).config.launch_ns == 9_000
        with overridden(host_step_ns=8_000, host_trace=[("host", [1, 2])]):
            inner = SimDevice().config
            assert (inner.host_step_ns, inner.host_trace) == (8_000, (("host", (1, 2)),))
        assert SimDevice().config.host_step_ns == 7_000
    assert SimDevice().config == SimConfig()
