"""Run one schedule and judge it: the :class:`Outcome` (reports, wrong values, the line that replays it).

For a clean variant any report or wrong value is a failure; for a bug
variant a search counts corruption (a stale read, a deadlock, an illegal
access, a host error or wrong values: what a GPU would show), see
:func:`counts_as_failure`.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any

import attrs

from reference.contract import Device, Run
from reference.schedule import Schedule, is_function_target
from simdevice.api import SimDevice
from simdevice.programs import Program, resolve
from simdevice.runtime import SimConfig
from simdevice.runtime.reports import Race, StaleRead, summarize
from simdevice.runtime.runtime import collector_paused


@attrs.frozen
class Outcome:
    schedule: Schedule
    run: Run
    #: what the value oracle found wrong
    problems: tuple[str, ...]
    backend: str = "sim"
    #: the cost profile that judged a simulated run (``--profile``)
    profile: str = "default"
    #: False for a race-only run (``--no-values``): no value computed, no value checked
    values: bool = True
    #: the ranks a function target ran on (``--world-size``), where it was given one
    world_size: int | None = None

    @property
    def races(self) -> tuple[Race, ...]:
        return tuple(r for r in self.run.reports if isinstance(r, Race))

    @property
    def corruption(self) -> tuple[Any, ...]:
        return tuple(r for r in self.run.reports if not isinstance(r, Race))

    @property
    def corrupted(self) -> bool:
        """Wrong values or a report a GPU would show (anything but a race)."""
        return bool(self.problems or self.corruption)

    @property
    def shows_on_gpu(self) -> bool:
        """What a GPU run of the schedule would show: wrong values, or a report a GPU shows itself (a host error,
        an illegal access, an out-of-memory error, a deadlock's hang). Races and stale reads are the simulator's
        own sight: on a GPU a stale read shows only through the values it leads to, which a run with values
        checks. A race-only run has no values, so there a stale read counts (as :attr:`corrupted`)."""
        if not self.values:
            return self.corrupted
        return bool(self.problems or any(not isinstance(r, (Race, StaleRead)) for r in self.run.reports))

    @property
    def clean(self) -> bool:
        return not self.problems and not self.run.reports

    def assert_clean(self) -> None:
        """Fail with the whole explanation and the replay line unless the run is clean."""
        if not self.clean:
            raise AssertionError(self.text())

    def trace_text(self) -> str:
        """The run's trace, a line per host step and stream operation (a GPU run: its timeline, when kept)."""
        return "".join(f"{t / 1e6:10.3f}  {actor:<16} {what}\n" for t, actor, what in self.run.trace)

    def verdict(self) -> str:
        parts = []
        if self.problems:
            parts.append("wrong values")
        if self.run.reports:
            parts.append(summarize(self.run.reports))
        return "; ".join(parts) if parts else "clean"

    def text(self, shown: int | None = None) -> str:
        """The verdict, the wrong values and the reports, the notes and the replay line; ``shown``: at most that many
        reports of each kind (a read repeated over a buffer's bytes makes thousands), the rest counted in a line that
        names the replay, which shows them all."""
        lines = [f'schedule "{self.schedule}" on {self.backend}: {self.verdict()}']
        lines += [f"  {p}" for p in self.problems]
        of_kind: dict[str, int] = {}
        for r in self.run.reports:
            of_kind[r.kind] = of_kind.get(r.kind, 0) + 1
            if shown is None or of_kind[r.kind] <= shown:
                lines.append(f"  {r}")
        lines += [f"  ... and {n - shown} more {kind} reports (simdevice replay shows them all)"
                  for kind, n in of_kind.items() if shown is not None and n > shown]
        lines += [f"  note: {n}" for n in self.run.notes]
        if self.run.unfired:
            lines.append(f"  note: delays never applied (their operation never came): {', '.join(self.run.unfired)}")
        lines.append(replay_line(self.schedule, self.replay_options(), self.run.gpu))
        return "\n".join(lines)

    def replay_options(self) -> str:
        """The options a replay of this run needs to be the same run: its cost profile (or the verdict may
        differ), race-only, the step limit and device memory it ran under, its ranks."""
        again = ""
        if self.backend == "sim" and self.profile != "default":
            from simdevice.runtime.profiles import spec_of

            again = f" --profile {spec_of(self.profile)}"
        if not self.values:
            again += " --no-values"
        if self.backend == "sim":  # the command's limits, which the run was made under (and judged by)
            from simdevice.runtime.config import active_overrides

            fields = dict(active_overrides())
            if "max_host_steps" in fields:
                again += f" --max-steps {fields['max_host_steps']}"
            if "device_memory" in fields:
                again += f" --device-memory {fields['device_memory']}"
        return again + self.ranks_option()

    def ranks_option(self) -> str:
        """The option a replay of a function target on ranks needs (its line does not say how many)."""
        return f" --world-size {self.world_size}" if self.world_size is not None else ""


#: reports of one kind that ``check`` and ``exhaust`` show of a failure (``replay`` shows them all)
SHOWN_OF_A_KIND = 8

#: the names (``FILE.py::outer.inner``) of the function targets defined inside another function, which no command
#: can import (:func:`simdevice.search.targets.from_function` keeps them); another dotted name is a class's
#: attribute (a test class's ``@staticmethod``), which the command line finds as it finds a function
NESTED: set[str] = set()


def replay_command(schedule: Schedule, options: str) -> str:
    """How to run ``schedule`` again: the command line; for a function defined inside another (its line names it
    ``FILE.py::outer.inner``), which no command can import, through the function object."""
    qual = schedule.program.partition("::")[2]
    if qual and schedule.program in NESTED and is_function_target(schedule.program):
        name = qual.rsplit(".", 1)[1]
        ranks = re.search(r"--world-size (\d+)", options)
        size = f", world_size={ranks.group(1)}" if ranks else ""
        return (f'simdevice.explore({name}{size}, examples=["{schedule}"]) (a function defined inside another: its '
                "line replays through the function object, not from the command line)")
    return f'simdevice replay "{schedule}"{options}'


def replay_line(schedule: Schedule, options: str, gpu: bool = True) -> str:
    """The ``replay:`` line of an outcome's text: :func:`replay_command`, and ``[--gpu]`` where it is a command
    and a GPU can replay it (``gpu``: ``Run.gpu``)."""
    command = replay_command(schedule, options)
    return f"  replay: {command}" + (" [--gpu]" if gpu and command.startswith("simdevice replay") else "")


def gpu_config(program: Program, config: Any, byte_scale: int) -> Any:
    """The configuration a GPU run uses: sizes scaled as the simulator's cost model scales them."""
    scaled = {k: getattr(config, k) * byte_scale for k in program.size_keys}
    return attrs.evolve(config, **scaled)


def device_for(schedule: Schedule, backend: str = "sim", sim_config: SimConfig | None = None) -> tuple[Device, Any]:
    """The device a schedule runs on, and the configuration its program gets there."""
    program, config = resolve(schedule)
    if backend == "sim":
        return SimDevice(schedule, sim_config, program.options(schedule.variant, config)), config
    from reference.cuda import CudaDevice

    return CudaDevice(schedule), gpu_config(program, config, (sim_config or SimConfig()).byte_scale)


def execute(schedule: Schedule, backend: str = "sim", sim_config: SimConfig | None = None) -> Outcome:
    """Run one schedule; ScheduleError if it names no known program, variant or actor."""
    program, _ = resolve(schedule)
    # on the simulator, Python's cycle collector waits until the run's device is dropped: what the run made then
    # dies by reference counting, and the collection that follows has only what outlives the run to look at (right
    # after the run it looked at all of the run's objects, a tenth of a search's time)
    with collector_paused() if backend == "sim" else contextlib.nullcontext():
        dev, config = device_for(schedule, backend, sim_config)
        run = dev.run(program.body, schedule.variant, config)
        problems: tuple[str, ...] = ()
        # the profile of the device that judged it (a sim_config given here, or the command's --profile), and
        # whether it computed values: a race-only run did not, so the program's value checks have nothing to check
        profile, values = (dev.config.profile, dev.config.values) if isinstance(dev, SimDevice) else ("default", True)
        del dev
        if values and (run.result is not None or not run.reports):
            problems = tuple(program.oracle(config, run.result)) if run.result is not None else ("no result",)
    return Outcome(schedule, run, problems, backend, profile, values)


def counts_as_failure(program: Program, variant: str, out: Outcome) -> bool:
    """What a search counts as found: corruption for a bug variant (what a GPU would show), any report or wrong
    value for a clean one."""
    return out.corrupted if variant not in program.clean else not out.clean
