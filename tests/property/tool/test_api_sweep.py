"""``scripts/api-sweep`` (docs/confirmations.md, forty-ninth run): its simulator sweep calls each name in a run of
its own and records what came back, an error of the call, or an error its stream raised; ``diff`` counts two errors
of one type as alike and reports the rest; an unreadable file is exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from script_modules import ROOT, load_script

SWEEP = load_script("api-sweep")


def test_the_simulator_sweep_records_results_call_errors_and_stream_errors() -> None:
    got = SWEEP.run_sim(SWEEP.names(["abs", "bitwise_not", "clamp", "clamp_", "is_coalesced", "is_pinned"]))
    assert got["device.abs"] == "ok Tensor cuda torch.float32 (4, 4) sum=4.25"  # (1 + ... + 16) / 32
    assert got["pinned.abs"] == "ok Tensor cpu torch.float32 (4, 4) sum=4.25"
    assert got["device.is_pinned"] == "ok bool"
    # raised at the call, by the host kernel's check (an H100's words; torch's Python meta kernel raises a ValueError)
    assert got["device.torch.clamp"] == "RuntimeError: torch.clamp: At least one of 'min' or 'max' must not be None"
    # a dtype its kernels do not cover: raised at the call, as an H100 raised it
    assert got["device.bitwise_not"] == "NotImplementedError: \"bitwise_not_cuda\" not implemented for 'Float'"
    # an in-place op's argument error too (its first call on a destination is tried at the call)
    assert got["device.clamp_"] == "RuntimeError: torch.clamp: At least one of 'min' or 'max' must not be None"
    # raised by the CPU kernel as the stream reaches it (a GPU raises it at the call: a known difference)
    assert got["device.is_coalesced"].startswith("STREAMERR host error: stream default raised RuntimeError: ")


def test_diff_leaves_a_random_op_s_values_out() -> None:
    gpu = {"device.torch.rand_like": "ok Tensor cuda torch.float32 (4, 4) sum=8.1",
           "device.bernoulli_(cpu)": "ok Tensor cuda torch.float32 (4, 4) sum=3",
           "device.abs": "ok Tensor cuda torch.float32 (4, 4) sum=4.25"}
    sim = {"device.torch.rand_like": "ok Tensor cuda torch.float32 (4, 4) sum=7.9",
           "device.bernoulli_(cpu)": "ok Tensor cuda torch.float32 (4, 4) sum=5",
           "device.abs": "ok Tensor cuda torch.float32 (4, 4) sum=4.5"}
    assert [key for key, _, _ in SWEEP.differences(gpu, sim)] == ["device.abs"]
    # a function of a module is known by its own name (``torch.nn.functional.dropout2d``), not the module's
    gpu = {"device.torch.nn.functional.dropout2d": "ok Tensor cuda torch.float32 (4, 4) sum=4",
           "pinned.torch.nn.functional.dropout(dev)": "ok Tensor cpu torch.float32 (4, 4) sum=1.6",
           "device.torch.nn.functional.relu": "ok Tensor cuda torch.float32 (4, 4) sum=4"}
    sim = {"device.torch.nn.functional.dropout2d": "ok Tensor cuda torch.float32 (4, 4) sum=5.6",
           "pinned.torch.nn.functional.dropout(dev)": "ok Tensor cpu torch.float32 (4, 4) sum=3",
           "device.torch.nn.functional.relu": "ok Tensor cuda torch.float32 (4, 4) sum=5"}
    assert [key for key, _, _ in SWEEP.differences(gpu, sim)] == ["device.torch.nn.functional.relu"]


def test_diff_counts_errors_of_one_type_alike_and_reports_the_rest(tmp_path: Path) -> None:
    gpu = {"device.a": "ok Tensor cuda", "device.b": "RuntimeError: cuda says", "device.c": "ok bool",
           "device.d": "RuntimeError: x"}
    sim = {"device.a": "ok Tensor cuda", "device.b": "RuntimeError: cpu says", "device.c": "TypeError: no",
           "device.d": "STREAMERR host error: stream default raised RuntimeError: x"}
    assert SWEEP.differences(gpu, sim) == [("device.c", "ok bool", "TypeError: no"),
                                           ("device.d", "RuntimeError: x",
                                            "STREAMERR host error: stream default raised RuntimeError: x")]
    (tmp_path / "g.json").write_text(json.dumps(gpu))
    (tmp_path / "s.json").write_text(json.dumps(sim))
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "api-sweep"), "diff", str(tmp_path / "g.json"),
                        str(tmp_path / "s.json")], capture_output=True, text=True, check=False, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("2 of 4 outcomes differ\n")


def test_an_unreadable_file_is_exit_2_with_one_line(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "api-sweep"), "diff", str(tmp_path / "none.json"),
                        str(tmp_path / "none.json")], capture_output=True, text=True, check=False, cwd=ROOT)
    assert p.returncode == 2
    assert p.stderr.startswith("api-sweep: error: cannot read ")
    assert len(p.stderr.strip().splitlines()) == 1


def test_expressions_are_swept_with_the_names_they_may_use(tmp_path: Path) -> None:
    """``--exprs FILE``: each line an expression of ``t`` and the tensors made before the call (``m`` a device mask,
    ``c`` a 0-d device tensor), run as the names are; with ``--waits`` whether the host waits for a stalled stream."""
    calls = [SWEEP.EXPR + "t.masked_fill(m, c)", SWEEP.EXPR + "t[m]", SWEEP.EXPR + "t.sum()"]
    got = SWEEP.run_sim(calls)
    # (t is (1..16) / 32, m its columns 0 and 2: eight 0.5s and the other columns' 72 / 32; those columns' 64 / 32)
    assert got[calls[0]] == "ok Tensor cuda torch.float32 (4, 4) sum=6.25"
    assert got[calls[1]] == "ok Tensor cuda torch.float32 (8,) sum=2"
    waited = SWEEP.run_sim(calls, measure=SWEEP.waits)
    # ``masked_fill`` reads its 0-d device value on the host (``item()``), masked indexing its mask (its output's
    # shape); a sum is a kernel alone
    assert [waited[c] for c in calls] == ["waits", "waits", "no wait"]
    (tmp_path / "e.txt").write_text("# a comment\n\nt.sum()\n")
    out = tmp_path / "e.json"
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "api-sweep"), "run", str(out), "--sim", "--exprs",
                        str(tmp_path / "e.txt")], capture_output=True, text=True, check=False, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert list(json.loads(out.read_text())) == [SWEEP.EXPR + "t.sum()"]


@pytest.mark.parametrize(("text", "says"), [("t.sum(\n", "not an expression: 't.sum('"),
                                            ("# only a comment\n", "holds no expression")])
def test_a_file_of_no_expressions_is_exit_2_with_one_line(tmp_path: Path, text: str, says: str) -> None:
    (tmp_path / "e.txt").write_text(text)
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "api-sweep"), "run", str(tmp_path / "e.json"),
                        "--sim", "--exprs", str(tmp_path / "e.txt")], capture_output=True, text=True, check=False,
                       cwd=ROOT)
    assert p.returncode == 2
    assert says in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "e.json").exists()


def test_the_tree_s_expressions_name_only_what_the_sweep_makes() -> None:
    """``scripts/api-sweep-exprs.txt`` (the twenty-ninth sitting's sweep): every line is an expression, and none names
    what the sweep does not make (a NameError would be the file's, not torch's or the simulator's)."""
    lines = [x.strip() for x in (ROOT / "scripts" / "api-sweep-exprs.txt").read_text().splitlines()]
    calls = [SWEEP.EXPR + x for x in lines if x and not x.startswith("#")]
    assert len(calls) > 200
    got = SWEEP.run_sim(calls)
    assert not [c for c in calls if got[c].startswith(("NameError", "SyntaxError"))]
