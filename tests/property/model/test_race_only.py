"""A race-only run (``SimConfig(values=False)``, ``--no-values``): no operation moves bytes, so memory does not grow
with the simulated device's; the shadow memory is the same, so it finds the races and stale reads a run with values
finds. Rules, each with a test a mutation of it fails:

- on every program whose host code reads no device value to decide what to do next (memsaver_guard's does: its
  connection check compares what came back), the same schedule gives the same reports (races, stale reads, host
  errors, deadlocks) with and without values, for schedules drawn as the search draws them;
- a race-only run checks no value (no wrong values, nothing from the oracle), says so in a note, and its replay
  line asks for the same mode;
- a host read of device memory gets a placeholder: True for a truth value, 0 for a number;
- a configuration that reserves 64 GiB of simulated device memory runs in well under 2 GiB of this machine's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reference.schedule import Schedule
from simdevice import SimDevice
from simdevice.programs import REGISTRY, load_all
from simdevice.runtime.config import SimConfig
from simdevice.search import execute
from simdevice.search.strategies import configs, schedules_of
from simdevice.search.targets import ProgramTarget

load_all()
ROOT = Path(__file__).resolve().parents[3]
#: the programs whose control flow reads no device value (memsaver_guard's connection check does)
PROGRAMS = ("offload_reload", "activation_offload", "param_readiness", "zcc")
RACE_ONLY = SimConfig(values=False)


def _found(out: Any) -> list[str]:
    """Every report (races, stale reads, host errors, deadlocks, illegal accesses), as the user reads them."""
    return sorted(str(r) for r in out.run.reports)


def _variants() -> list[tuple[str, str]]:
    return [(name, v) for name in PROGRAMS for v in REGISTRY[name].variants]


@pytest.mark.parametrize(("program", "variant"), _variants())
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_race_only_finds_what_values_find(program: str, variant: str, data: st.DataObject) -> None:
    target = ProgramTarget(REGISTRY[program], variant)
    schedule = data.draw(schedules_of(target, configs(REGISTRY[program]), max_delays=2))
    full, bare = execute(schedule), execute(schedule, sim_config=RACE_ONLY)
    assert _found(bare) == _found(full), schedule
    assert not bare.problems  # nothing is checked that was not computed
    assert bool(bare.run.reports) or not full.run.reports, schedule  # a report with values is one without


def test_the_pinned_counterexamples_are_found_without_values() -> None:
    for name in PROGRAMS:
        for texts in REGISTRY[name].pinned.values():
            for text in texts:
                full, bare = execute(Schedule.parse(text)), execute(Schedule.parse(text), sim_config=RACE_ONLY)
                assert full.corrupted, text
                assert _found(bare) == _found(full), text
                assert bare.corrupted == bool(bare.corruption), text  # corrupted by reports alone


def test_a_race_only_run_checks_no_value_and_says_so() -> None:
    out = execute(Schedule.parse("offload_reload/racy::d2h#0+1"), sim_config=RACE_ONLY)
    assert "wrong values" not in out.verdict()
    assert any(n.startswith("race-only (--no-values)") for n in out.run.notes)
    assert '--no-values [--gpu]' in out.text()
    with_values = execute(Schedule.parse("offload_reload/racy::d2h#0+1"))
    assert "wrong values" in with_values.verdict()
    assert "--no-values" not in with_values.text()


def _reads(dev: Any) -> tuple[Any, ...]:
    x = torch.full((8,), 3.0, device=dev.device)
    flags = x > 1
    return x.sum().item(), bool(flags.all().item()), torch.equal(x, x + 1), int(x.long().sum().item())


def test_a_host_read_gets_a_placeholder_without_values() -> None:
    assert SimDevice().run(_reads).result == (24.0, True, False, 24)
    got = SimDevice(None, RACE_ONLY).run(_reads).result
    assert got == (0.0, True, True, 0)
    assert [type(x) for x in got] == [float, bool, bool, int]  # ``.item()`` of a float tensor is a float


def test_no_bytes_move_without_values() -> None:
    """The device's bytes stay as the allocator left them (untouched: zeros) however the program writes them."""

    def fill(dev: Any) -> Any:
        x = torch.empty(1 << 16, device=dev.device)
        x.fill_(7.0)
        return x

    from simdevice import peek

    assert torch.equal(peek(SimDevice().run(fill).result), torch.full((1 << 16,), 7.0))
    assert torch.equal(peek(SimDevice(None, RACE_ONLY).run(fill).result), torch.zeros(1 << 16))


BIG = "offload_reload/racy:kib=1048576,scratch=64:d2h#0+1"
_CHILD = """
import json, resource, sys
from reference.schedule import Schedule
from simdevice import SimDevice
from simdevice.programs import resolve
from simdevice.runtime.config import SimConfig
s = Schedule.parse(sys.argv[1])
program, config = resolve(s)
dev = SimDevice(s, SimConfig(values=False, device_memory=1 << 40), program.options(s.variant, config))
run = dev.run(program.body, s.variant, config)
print(json.dumps({"reserved": dev.runtime.memsaver.allocator.stats()["reserved"],
                  "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "races": sum(r.kind == "race" for r in run.reports)}))
"""


def test_64_gib_of_simulated_device_memory_in_a_few_hundred_mib() -> None:
    """1 GiB activations and a 64 GiB scratch buffer: 68 GiB of segments reserved, on a machine of 24."""
    out = subprocess.run([sys.executable, "-c", _CHILD, BIG], capture_output=True, text=True, cwd=ROOT, check=True,
                         timeout=300)
    facts = json.loads(out.stdout.splitlines()[-1])
    assert facts["reserved"] >= 64 << 30
    assert facts["rss"] < 2 << 30
    assert facts["races"] >= 1


def test_the_command_line_runs_race_only() -> None:
    def replay(*extra: str) -> Any:
        out = subprocess.run([sys.executable, "-m", "simdevice", "replay", "offload_reload/racy::d2h#0+1", "--json",
                              "--no-fix", *extra], capture_output=True, text=True, cwd=ROOT, timeout=120)
        return json.loads(out.stdout)

    bare, full = replay("--no-values"), replay()
    assert (bare["values"], full["values"]) == (False, True)
    assert "wrong values" not in bare["verdicts"][0]
    assert "wrong values" in full["verdicts"][0]


def _big_reload(n: int = 1 << 30) -> None:
    """Plain torch.cuda: 4 GiB offloaded and reloaded without a wait (n floats), its own check at the end."""
    act = torch.ones(n, device="cuda")
    pinned = torch.empty(n, pin_memory=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        pinned.copy_(act, non_blocking=True)
    back = torch.empty_like(act)
    back.copy_(pinned, non_blocking=True)
    torch.cuda.synchronize()


def test_a_fuzz_test_can_be_race_only() -> None:
    """``@simdevice.fuzz(values=False)``: its runs and its probe are race-only, so 8 GiB of device tensors and
    4 GiB of pinned memory cost this machine nothing; the failure's replay line keeps the mode."""
    import simdevice
    from simdevice.fuzzing import FuzzFailure

    fuzzed = simdevice.fuzz(_big_reload, values=False, max_examples=3)
    with pytest.raises(FuzzFailure) as caught:
        fuzzed()
    assert "race" in caught.value.outcome.verdict()
    assert caught.value.outcome.values is False
    assert "--no-values [--gpu]" in caught.value.block()
