"""Host memory nobody wrote is poisoned as device memory is, and a failed ``assert`` whose message holds a tensor
is the run's host error.

A host ``torch.empty`` (``empty_like``, ``new_empty``, ``empty_strided``) made in a run held whatever the process
had freed there before: a program that read it (``torch.empty(n).pin_memory()`` as a staging buffer read before
the copy into it landed) gave another value in each run, so the same schedule was not the same run, and whether
its check failed depended on the heap. Such a tensor is now filled as a device one is (NaN, the integer maximum,
True), in a run's actors and with values computed; ``CudaDevice.run_plain`` fills it the same way on a GPU.

``assert ok, p.cpu()`` (a tensor as the message) crashed the command: describing the run's error formats the
tensor, and the check that a program's print of pinned memory is a host read looked for the program's line above
the simulator's own frames, past the top of the actor's stack. The runtime's own formatting is no read of the
program's. Mutations caught: the fill left out (the runs differ, the stale read passes); the printing check's walk
not stopped at the runtime's frames (the command raises ValueError).
"""

from __future__ import annotations

import math

import pytest
import torch
from hazard_checks import races_only_unwaited

import simdevice
from simdevice import Race


def _host_values() -> dict[str, object]:
    got: dict[str, object] = {}

    def program() -> None:
        got["float"] = torch.empty(64).tolist()
        got["like"] = torch.empty_like(torch.ones(8, dtype=torch.float64)).tolist()
        got["int"] = torch.empty(8, dtype=torch.int32).tolist()
        got["bool"] = torch.empty(8, dtype=torch.bool).tolist()
        got["new"] = torch.ones(2).new_empty(8).tolist()
        got["strided"] = torch.empty_strided((2, 4), (4, 1)).flatten().tolist()

    run = simdevice.cuda()
    run.run(program)
    run.assert_clean()
    return got


def test_a_host_allocation_in_a_run_is_poisoned() -> None:
    got = _host_values()
    for key in ("float", "like", "new", "strided"):
        assert all(math.isnan(v) for v in got[key]), (key, got[key])  # type: ignore[attr-defined]
    assert got["int"] == [torch.iinfo(torch.int32).max] * 8
    assert got["bool"] == [True] * 8


def test_a_dtype_with_no_number_to_fill_is_left_as_it_is() -> None:
    """Raw bits (``bits8``) and quantized values have no value of their own to poison with: the allocation is left
    as torch made it (filling raised ``TypeError`` there, the program's host error)."""

    def program() -> None:
        assert torch.empty(16, dtype=torch.bits8).numel() == 16
        assert torch.empty(4, dtype=torch.int16).tolist() == [torch.iinfo(torch.int16).max] * 4

    run = simdevice.cuda()
    run.run(program)
    run.assert_clean()


def _staging(sync: bool) -> list[float]:
    """Gradients to a pinned staging buffer made from a host ``empty``, read on the host before (or after) the D2H
    into it landed: the read sees the poison, the same in every run."""
    seen: list[float] = []

    def program() -> None:
        g = torch.full((2048,), 2.0, device="cuda")
        host = torch.empty(2048).pin_memory()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            host.copy_(g, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
        if sync:
            done.synchronize()
        seen.append(float(host.sum()))

    run = simdevice.cuda()
    run.run(program)
    if not sync:
        assert any(isinstance(r, Race) for r in run.result.reports), run.result.reports
    else:
        run.assert_clean()
    return seen


def test_a_stale_read_of_an_unwritten_staging_buffer_is_the_same_every_run() -> None:
    runs = [_staging(False)[0] for _ in range(5)]
    assert all(math.isnan(v) for v in runs), runs
    assert _staging(True) == [4096.0]


@pytest.mark.parametrize("in_flight", [False, True])
def test_an_assert_whose_message_is_a_tensor_is_the_runs_host_error(
        in_flight: bool, tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    """From the command (a program file, whose ``assert`` pytest does not rewrite): the message is formatted by the
    run's report, not read by the program, so a pinned buffer a D2H may still be filling (``in_flight``) is no
    race there."""
    from pathlib import Path

    from simdevice.cli import main

    path = Path(str(tmp_path)) / "prog.py"
    path.write_text(
        "import torch\n\n\n"
        "def prog():\n"
        "    p = torch.full((4,), 3.0, device='cuda')\n"
        "    host = torch.zeros(4).pin_memory()\n"
        + ("    side = torch.cuda.Stream()\n"
           "    side.wait_stream(torch.cuda.current_stream())\n"
           "    with torch.cuda.stream(side):\n"
           "        host.copy_(p, non_blocking=True)\n" if in_flight else "")
        + "    assert p.sum().item() == 0, host\n"
    )
    code = main(["check", f"{path}::prog", "--no-fix", "-q", "--examples", "20"])
    out = capsys.readouterr()
    assert code == 1, out
    assert "Traceback" not in out.out + out.err
    assert "host error: host raised AssertionError: tensor([" in out.out, out.out
    assert "race:" not in out.out, out.out


def test_the_command_reports_a_stale_read_of_an_unwritten_staging_buffer(
        tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    from pathlib import Path

    from simdevice.cli import main

    path = Path(str(tmp_path)) / "prog.py"
    path.write_text(
        "import torch\n\n\n"
        "def prog():\n"
        "    p = torch.full((4,), 3.0, device='cuda')\n"
        "    host = torch.empty(4).pin_memory()\n"
        "    side = torch.cuda.Stream()\n"
        "    side.wait_stream(torch.cuda.current_stream())\n"
        "    with torch.cuda.stream(side):\n"
        "        host.copy_(p, non_blocking=True)\n"
        "    assert torch.equal(host, torch.full((4,), 3.0)), host\n"
    )
    code = main(["check", f"{path}::prog", "--no-fix", "-q", "--examples", "20"])
    out = capsys.readouterr()
    assert code == 1, out
    assert "Traceback" not in out.out + out.err
    assert "host error: host raised AssertionError: tensor([nan, nan, nan, nan])" in out.out, out.out


def test_the_hazard_program_run_on_a_gpu_races_only_unwaited() -> None:
    """``tests/hazards.py::unwritten_staging_read`` (run on a GPU in ``tests/gpu/test_dropin_gpu.py``, where its
    check of the poison holds only if the GPU's run poisons host memory as the simulator does)."""
    races_only_unwaited("unwritten_staging_read", "side#0+20")
