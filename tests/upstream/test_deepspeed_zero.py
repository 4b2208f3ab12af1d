"""DeepSpeed's real ZeRO (DeepSpeed from PyPI, unmodified) on the simulator (``deepspeed_zero.py``), two ranks:
stages 1, 2 (with the optimizer offloaded to the host too) and 3 are clean, each rank's parameters equal to a plain
model's; on an accelerator that claims to order kernels by their data (DeepSpeed then leaves out the stream waits it
makes for CUDA), ZeRO-2's gradient reduction and ZeRO-3's parameter all-gathers race with the compute stream, named
at DeepSpeed's own lines (ZeRO-2's parameters come out wrong in the default schedule; a search finds a schedule where
ZeRO-3's do).

Each runs as ``simdevice check`` (or ``replay``) in a process of its own: DeepSpeed patches torch for the process
(ZeRO-3 puts its own ``torch.nn.functional.linear`` in place), which other tests of a pytest worker would meet.
DeepSpeed is not among the extras CI installs (its source distribution builds against torch, which pip's isolated
build would fetch, a CUDA build): installed by hand, ``DS_BUILD_OPS=0 pip install --no-build-isolation
deepspeed==0.19.8``, these tests run; skipped without it."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from reference.naming import short_path

_spec = importlib.util.find_spec("deepspeed")
if _spec is None or not _spec.submodule_search_locations:
    pytest.skip("deepspeed is not installed (DS_BUILD_OPS=0 pip install --no-build-isolation deepspeed)",
                allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
DRIVER = "tests/upstream/deepspeed_zero.py"
_ZERO = Path(next(iter(_spec.submodule_search_locations))) / "runtime" / "zero"
STAGE_1_AND_2 = short_path(str(_ZERO / "stage_1_and_2.py"))
STAGE3 = short_path(str(_ZERO / "stage3.py"))


def _simdevice(*args: str) -> tuple[int, dict[str, Any]]:
    p = subprocess.run([sys.executable, "-m", "simdevice", *args, "--world-size", "2", "--no-fix", "--json"],
                       cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
                       timeout=600)
    assert p.returncode in (0, 1), p.stderr[-3000:]
    return p.returncode, json.loads(p.stdout)


@pytest.mark.parametrize("program", ["zero1", "zero2", "zero2_offload", "zero3"])
def test_each_stage_is_clean_with_a_plain_model_s_parameters(program: str) -> None:
    code, out = _simdevice("check", f"{DRIVER}::{program}", "--examples", "3")
    assert code == 0, out
    assert out["found"] is False, out


@pytest.mark.parametrize(("program", "upstream", "wrong"), [("zero2_trusting_the_device", STAGE_1_AND_2, True),
                                                            ("zero3_trusting_the_device", STAGE3, False)])
def test_without_deepspeed_s_stream_waits_its_copies_race(program: str, upstream: str, wrong: bool) -> None:
    code, out = _simdevice("replay", f"{DRIVER}::{program}")
    assert code == 1, out
    races = [r for r in out["reports"] if r.startswith("race: ")]
    assert any(f"({upstream}:" in r for r in races), races
    assert any("differs from the plain model's" in r for r in out["reports"]) is wrong, out["reports"]
