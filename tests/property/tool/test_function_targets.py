"""``simdevice check FILE.py::FUNCTION`` and ``replay`` on functions of the user's: plain torch.cuda code and
its contract version give the same verdicts; bad targets are one line and exit 2."""

from __future__ import annotations

import json
import shlex
import textwrap
from pathlib import Path

import pytest
import torch

import simdevice
from reference.schedule import Schedule
from simdevice.cli import main
from simdevice.search.targets import resolve

ROOT = Path(__file__).resolve().parents[3]
PROTOCOLS = ("reload", "freed", "gather")


@pytest.fixture(autouse=True)
def _at_the_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


def _check(target: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, object]]:
    code = main(["check", target, "--json", "--examples", "40", "--no-fix"])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_plain_and_contract_versions_get_the_same_verdicts(protocol: str, capsys: pytest.CaptureFixture[str]) -> None:
    verdicts = {}
    for style in ("plain", "contract"):
        for variant, expect in (("racy", 1), ("correct", 0)):
            code, doc = _check(f"examples/offload_{style}.py::{protocol}_{variant}", capsys)
            assert code == expect, doc
            verdicts[style, variant] = (doc["found"], doc["summary"], str(doc["schedule"]).split("::")[-1])
    assert verdicts["plain", "racy"] == verdicts["contract", "racy"]
    assert verdicts["plain", "correct"] == verdicts["contract", "correct"] == (False, "clean", "None")


@pytest.mark.parametrize(("variant", "expect"), [("racy", 1), ("correct", 0)])
def test_the_pipeline_example_on_two_ranks(variant: str, expect: int, capsys: pytest.CaptureFixture[str]) -> None:
    # the line tests/gpu/test_dropin_gpu.py replays on two GPUs: found with the send's stream stalled, as there
    code = main(["check", f"examples/pipeline_plain.py::handoff_{variant}", "--world-size", "2", "--json",
                 "--examples", "40", "--no-fix"])
    doc = json.loads(capsys.readouterr().out)
    assert code == expect, doc
    line = f"examples/pipeline_plain.py::handoff_{variant}::rank0.p2p1-nccl#0+20"
    assert resolve(Schedule.parse(line).program, 2).run(Schedule.parse(line)).corrupted == bool(expect)


@pytest.mark.parametrize(("target", "expect", "kind"), [
    ("replay_racy", 1, "race"), ("replay_correct", 0, None), ("input_freed", 1, "illegal-access")])
def test_the_cuda_graph_example(target: str, expect: int, kind: str | None, capsys: pytest.CaptureFixture[str]) -> None:
    """docs/dropin.md's CUDA graphs example: a replay that does not wait for its static input's copy races; one that
    reads a tensor the program dropped reads freed memory; the printed line replays to the same reports."""
    code, doc = _check(f"examples/graph_plain.py::{target}", capsys)
    assert code == expect, doc
    if kind is not None:
        assert any(r.startswith(kind.replace("-", " ")) for r in doc["reports"]), doc  # type: ignore[attr-defined]
        assert main(["replay", str(doc["schedule"]), "--json"]) == 1
        assert json.loads(capsys.readouterr().out)["reports"] == doc["reports"]


def test_the_printed_line_replays_to_the_same_reports(capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = _check("examples/offload_plain.py::reload_racy", capsys)
    assert code == 1
    assert main(["replay", str(doc["schedule"]), "--json"]) == 1
    again = json.loads(capsys.readouterr().out)
    assert again["reports"] == doc["reports"]


def test_a_configuration_in_the_target_is_held_fixed(capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = _check("examples/offload_plain.py::reload_racy:n=512", capsys)
    assert code == 1
    assert str(doc["schedule"]).startswith("examples/offload_plain.py::reload_racy:n=512")
    assert "[0:2048]" in " ".join(doc["reports"])  # type: ignore[arg-type]


def test_a_fixed_configuration_is_the_one_whose_default_schedule_is_judged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # racy at its defaults whatever the timing (the default stream reads what the side stream wrote, unordered);
    # with wait=1 ordered: a check of wait=1 must not report the defaults' race as its own
    f = tmp_path / "user.py"
    f.write_text(textwrap.dedent("""
        import torch

        def side_sum(n: int = 256, wait: bool = False) -> None:
            side = torch.cuda.Stream()
            x = torch.ones(n, device="cuda")
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                y = x * 2
            if wait:
                torch.cuda.current_stream().wait_stream(side)
            z = y + 1
            torch.cuda.synchronize()
    """))
    code, doc = _check(f"{f}::side_sum", capsys)
    assert code == 1, doc
    assert "race" in str(doc["summary"]), doc
    code, doc = _check(f"{f}::side_sum:wait=1", capsys)
    assert code == 0, doc
    assert (doc["found"], doc["summary"]) == (False, "clean")


def test_delays_name_streams_by_their_creation_site_and_replay() -> None:
    t = resolve("examples/offload_plain.py::reload_racy")
    assert set(t.probe()) == {"host", "default", "d2h_stream"}
    out = t.run(Schedule.parse("examples/offload_plain.py::reload_racy::d2h_stream#0+5"))
    assert out.corrupted
    assert out.run.unfired == ()


def streams_made_together() -> list[str]:
    copy, compute = torch.cuda.Stream(), torch.cuda.Stream()
    holder = type("Holder", (), {})()
    holder._d2h, holder.h2d = torch.cuda.Stream(), torch.cuda.Stream()
    first, count = torch.cuda.Stream(), 2
    assert count == 2
    return [s.name for s in (copy, compute, holder._d2h, holder.h2d, first)]  # type: ignore[attr-defined]


def test_streams_made_in_one_tuple_assignment_take_their_own_targets_names() -> None:
    """``copy, compute = torch.cuda.Stream(), torch.cuda.Stream()``: each stream its own target's name, found by the
    call's column on the line (both were ``s1``, ``s2`` before)."""
    run = simdevice.cuda()
    run.run(streams_made_together)
    assert run.result is not None
    assert run.result.result == ["copy", "compute", "d2h", "h2d", "first"]


BAD = {
    "missing.py::f": "no file 'missing.py'",
    "examples/offload_plain.py::nope": "examples/offload_plain.py has no function 'nope'",
    "no_such_module_here::f": "no module 'no_such_module_here'",
    "examples/offload_plain.py::reload_racy:m=3": "examples/offload_plain.py::reload_racy has no parameter 'm'",
    "examples/offload_plain.py::reload_racy:n=abc": "configuration n='abc': expected an integer",
    "examples/offload_plain.py::reload_racy::d2h_stream#0+1": "check draws the delays itself",
}


@pytest.mark.parametrize("target", sorted(BAD))
def test_bad_check_targets_are_one_line_and_exit_2(target: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", target]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"simdevice: error: {BAD[target]}")
    assert err.count("\n") == 1


def test_functions_the_tool_cannot_call_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "user.py"
    f.write_text(textwrap.dedent("""
        VALUE = 3
        def needs(n): pass
        import nonexistent_dependency_of_the_user
    """))
    assert main(["check", f"{f}::needs"]) == 2
    assert "importing" in capsys.readouterr().err
    g = tmp_path / "user2.py"
    g.write_text(textwrap.dedent("""
        import torch
        VALUE = 3
        def needs(n): pass
        class K:
            def __call__(self): pass
        def gen():
            torch.ones(2, device="cuda")
            assert False
            yield
        async def coro():
            assert False
        def shaped(t=(1, 2), n=3): pass
    """))
    # (a class, a generator and a coroutine function were "clean": calling them ran none of the body)
    cases = (("VALUE", "is not a function (its type is int)"), ("needs", "parameter 'n' without a default"),
             ("K", "is not a function (it is a class)"), ("gen", "is a generator function: calling it runs none"),
             ("coro", "is a coroutine function (async def): calling it runs none"),
             ("shaped:t=3", "its default (1, 2) is a tuple, which a schedule line cannot give"))
    for name, message in cases:
        assert main(["check", f"{g}::{name}"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1
        assert message in err[0]


def test_empty_or_bad_command_line_values_are_one_line_and_exit_2(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """An empty TARGET ran the whole table (exit 0 where the caller meant a target); ``--db ""`` wrote the example
    database into the current folder; an edge's FILE:LINE without a line number ran with the edge doing nothing (or
    a deadlock the edge made); ``--max-schedules`` below 1 was taken."""
    schedule = "examples/offload_plain.py::reload_racy::d2h_stream#0+1"
    cases = ((["check", ""], "empty TARGET"), (["list", " "], "empty PATH"),
             (["check", "examples/offload_plain.py::reload_racy", "--db", ""], "--db: an empty path"),
             (["check", "examples/offload_plain.py::reload_racy", "--db", str(tmp_path / "no" / "db")],
              "its folder does not exist"),
             (["exhaust", "examples/offload_plain.py::reload_racy", "--max-schedules", "-1"],
              "--max-schedules must be >= 1"))
    edges = ("d2h_stream@examples/offload_plain.py:22[+x]=>default@examples/offload_plain.py:30",
             "d2h_stream@foo->default@bar",
             "d2h_stream@examples/offload_plain.py:22->default@examples/offload_plain.py:-3",
             "d2h_stream@examples/offload_plain.py:22[-1]->default@examples/offload_plain.py:30")
    for args, message in (*cases, *((["replay", schedule, "--edge", e], "bad edge") for e in edges)):
        assert main(args) == 2, args
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
        assert message in err[0], (args, err)
    assert not list(tmp_path.iterdir())


def test_an_edge_naming_its_file_by_another_path_is_the_edge_the_reports_name(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--edge`` with the file named as the user may type it (an absolute path, ``./``): the same edge as the one the
    reports' ``examples/offload_plain.py:22`` names (it matched no operation, and the race stayed)."""
    schedule = "examples/offload_plain.py::reload_racy::d2h_stream#0+1"
    here = ROOT / "examples" / "offload_plain.py"
    for a, b in ((here, here), ("./examples/offload_plain.py", "examples/../examples/offload_plain.py")):
        assert main(["replay", schedule, "--edge", f"d2h_stream@{a}:22->default@{b}:30"]) == 0, (a, b)
        out = capsys.readouterr().out
        assert out.startswith(f'schedule "{schedule}" on sim: clean'), out
        assert "d2h_stream@examples/offload_plain.py:22->default@examples/offload_plain.py:30" in out


def test_replay_refuses_a_delay_on_an_actor_the_function_lacks(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "examples/offload_plain.py::reload_racy::gpu#0+1"]) == 2
    err = capsys.readouterr().err
    assert "delay gpu#0+1 names actor 'gpu', which examples/offload_plain.py::reload_racy does not have" in err
    assert "actors: d2h_stream, default, host" in err


def test_a_module_target_is_found_in_the_folder_the_command_runs_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """``MODULE::FUNCTION`` of a package in the current folder, as ``python -m`` would import it, also from the
    installed ``simdevice`` command (whose ``sys.path`` starts with its own folder, not the current one).

    Mutation caught: the current folder not put on ``sys.path`` ("no module 'userpkg.proto'", exit 2)."""
    (tmp_path / "userpkg").mkdir()
    (tmp_path / "userpkg" / "__init__.py").write_text("")
    (tmp_path / "userpkg" / "proto.py").write_text((ROOT / "examples" / "offload_plain.py").read_text())
    monkeypatch.setattr("sys.path", [p for p in __import__("sys").path if p not in ("", str(tmp_path))])
    monkeypatch.chdir(tmp_path)
    assert main(["replay", "userpkg.proto::reload_racy", "--no-fix"]) == 1
    assert 'replay: simdevice replay "userpkg.proto::reload_racy"' in capsys.readouterr().out


RANKS = """
import torch
import torch.distributed as dist


def gather_racy(n: int = 64) -> None:
    full = torch.zeros(n * dist.get_world_size(), device="cuda")
    work = dist.all_gather_into_tensor(full, torch.full((n,), float(dist.get_rank() + 1), device="cuda"),
                                       async_op=True)
    seen = full.cpu()  # before work.wait()
    work.wait()
    assert torch.equal(seen, torch.arange(1.0, dist.get_world_size() + 1).repeat_interleave(n))
"""


WAITED_ELSEWHERE = """
import torch
import torch.distributed as dist


def read_on_a_side_stream(n: int = 64) -> None:
    grad = torch.full((n,), float(dist.get_rank() + 1), device="cuda")
    work = dist.all_reduce(grad, async_op=True)
    side = torch.cuda.Stream()
    work.wait()  # with the default stream current: it orders the default stream, not side
    with torch.cuda.stream(side):
        total = grad.sum()
    torch.cuda.current_stream().wait_stream(side)
    assert total.item() == 3.0 * n
"""


def test_a_collective_waited_with_another_stream_current_is_told_which_stream_must_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The program calls ``work.wait()``, on the default stream, and reads on ``side``: the fix names the stream
    that must wait and that ``wait()`` orders the stream current at the call (it once said only "wait for the
    collective's work", which the program already did)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "waited.py").write_text(WAITED_ELSEWHERE)
    assert main(["check", "waited.py::read_on_a_side_stream", "--world-size", "2", "-q"]) == 1
    said = capsys.readouterr().out.splitlines()
    (fix,) = [x for x in said if x.startswith("  suggested fix")]
    assert "wait for the collective's work on `side` (`work.wait()` of an `async_op=True` call with `side` current" in (
        fix), fix
    assert any(x.startswith("  checked: with these inserted") for x in said), said


def test_a_function_on_ranks_is_checked_and_replayed_with_world_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--world-size N`` runs a function target on N ranks; the replay line printed for it says so, and replays.
    (Without the option in the line, its delays name ranks a one-rank run does not have: exit 2.)"""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ranks.py").write_text(RANKS)
    assert main(["check", "ranks.py::gather_racy", "--world-size", "2", "--no-fix", "-q"]) == 1
    line = next(x for x in capsys.readouterr().out.splitlines() if "replay: " in x)
    assert line.endswith(" --world-size 2 [--gpu]")
    words = shlex.split(line.split("replay: ", 1)[1].removesuffix(" [--gpu]"))
    assert words[:2] == ["simdevice", "replay"]
    assert main([*words[1:], "--no-fix"]) == 1
    assert "rank1" in capsys.readouterr().out
    assert main(["check", "ranks.py::gather_racy", "--world-size", "2", "-q"]) == 1
    said = capsys.readouterr().out.splitlines()
    # each rank's edge, between the same lines: one fix, said once, for both ranks; replayed with both edges
    (fix,) = [x for x in said if x.startswith("  suggested fix")]
    assert fix.startswith("  suggested fix (in each of rank0, rank1): wait for the collective's work"), fix
    assert "`nccl` (ranks.py:" in fix, fix
    assert "rank0." not in fix, fix
    assert any(x.startswith("  checked: with these inserted") for x in said)
    fixed = next(x for x in said if "replay with them: " in x)
    assert fixed.count("--edge") == 2
    assert fixed.endswith(" --world-size 2")  # the fix replayed on the same ranks
    assert main([*shlex.split(fixed.split("replay with them: ", 1)[1])[1:], "--no-fix"]) == 0
    capsys.readouterr()
    for args, message in ((["check", "offload_reload/racy", "--world-size", "2"], "is a built-in program"),
                          (["check", "ranks.py::gather_racy", "--world-size", "0"], "must be in 1..32"),
                          (["list", "--world-size", "2"], "--world-size is for a file or module"),
                          (["list", "ranks.py", "--world-size", "33"], "must be in 1..32")):
        assert main(args) == 2
        err = capsys.readouterr().err
        assert message in err
        assert err.count("\n") == 1


def test_list_and_explore_name_what_a_run_on_ranks_needs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``list --world-size N`` probes on N ranks, so it names the actors a schedule of such a run can delay; what
    ``explore(fn, world_size=N)`` found replays with ``.replay``, which carries ``--world-size``."""
    import simdevice

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "ranks.py").write_text(RANKS)
    assert main(["list", "ranks.py", "--world-size", "2"]) == 0
    assert "rank1.nccl 1" in capsys.readouterr().out
    assert main(["list", "ranks.py"]) == 0
    assert "rank1" not in capsys.readouterr().out
    import ranks

    found = simdevice.explore(ranks.gather_racy, world_size=2)
    assert found.replay is not None
    assert found.replay.endswith(" --world-size 2")
    assert main([*shlex.split(found.replay)[1:], "--no-fix"]) == 1


def test_a_program_using_what_the_simulator_does_not_run_gets_no_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``check`` of a program that stops at what the simulator does not run (CUDA graphs) is no finding of a race:
    one line saying so, exit 2 (as for a target it cannot call), and in --json no "found"."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "graphs.py").write_text("import torch\n\n\ndef captured():\n    torch.cuda.ExternalStream(1234)\n")
    assert main(["check", "graphs.py::captured", "-q"]) == 2
    got = capsys.readouterr()
    assert got.out == ""
    assert got.err.startswith("simdevice: error: graphs.py::captured: the program uses what the simulator does not "
                              "run: NotImplementedError")
    assert got.err.count("\n") == 1
    assert main(["check", "graphs.py::captured", "-q", "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["found"] is False
    assert "ExternalStream" in doc["unsupported"]
    assert main(["replay", "graphs.py::captured", "--no-fix"]) == 2  # the run is shown, and it is no verdict
    assert "NotImplementedError" in capsys.readouterr().out
    assert main(["exhaust", "graphs.py::captured", "--delays", "1", "-q"]) == 2  # as check says it
    got = capsys.readouterr()
    assert got.err.startswith("simdevice: error: graphs.py::captured: the program uses what the simulator does not "
                              "run: NotImplementedError")
    assert main(["exhaust", "graphs.py::captured", "--delays", "1", "-q", "--json"]) == 2
    assert "ExternalStream" in json.loads(capsys.readouterr().out)["unsupported"]


def test_exhaust_stopped_at_its_step_bound_gives_no_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["exhaust", "examples/offload_plain.py::reload_racy", "--delays", "1", "--max-steps", "3", "-q"]) == 2
    assert "no verdict under schedule" in capsys.readouterr().err


@pytest.mark.parametrize(("call", "says"), [
    ("torch.cuda.memory._set_memory_metadata('step')", "no attribute '_cuda_setMemoryMetadata'"),
    ("torch._C._cuda_getCurrentBlasHandle()", "no attribute '_cuda_getCurrentBlasHandle'"),
    ("torch.cuda.caching_allocator_alloc(4096)", "caching_allocator_alloc"),
    ("torch.cuda.ExternalStream(0)", "ExternalStream"),
    ("torch.accelerator.get_device_capability()", "Cannot access accelerator device when none is available"),
    ("torch.Generator(device='cuda').get_offset()", "philox offset"),
], ids=["memory-metadata", "blas-handle", "raw-alloc", "external-stream", "accelerator-capability",
                                     "generator-offset"])
def test_cuda_s_own_apis_the_cpu_build_lacks_are_no_verdict(
    call: str, says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """CUDA's C API (memory metadata, BLAS handles), raw allocator pointers, external streams, the accelerator's
    device capability and a CUDA generator's philox offset: the program uses what the simulator does not run, one
    line and exit 2, as docs/dropin.md says (it was a finding, exit 1: "an error of its own")."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "apis.py").write_text(f"import torch\n\n\ndef uses():\n    {call}\n")
    assert main(["check", "apis.py::uses", "-q", "--no-fix"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("simdevice: error: apis.py::uses: the program uses what the simulator does not run: ")
    assert says in err
    assert err.count("\n") == 1


def test_a_run_stopped_at_its_step_limit_is_no_verdict_of_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run that hits the step limit with nothing found before it has no verdict (README): ``check`` says so in one
    line naming the schedule, exit 2, and in --json no "found"; with the limit raised it judges the program."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "long.py").write_text(
        "import torch\n\n\ndef steps(n: int = 40):\n    x = torch.zeros(4, device='cuda')\n"
        "    for _ in range(n):\n        x.add_(1)\n    assert x.cpu().tolist() == [float(n)] * 4\n"
    )
    assert main(["check", "long.py::steps", "-q", "--max-steps", "20"]) == 2
    got = capsys.readouterr()
    assert got.out == ""
    assert got.err.startswith('simdevice: error: long.py::steps: no verdict under schedule "long.py::steps')
    assert "step limit at" in got.err
    assert got.err.count("\n") == 1
    assert main(["check", "long.py::steps", "-q", "--max-steps", "20", "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["found"] is False
    assert "step limit" in doc["step_limit"]
    assert main(["check", "long.py::steps", "-q", "--max-steps", "2000"]) == 0


def test_the_replay_line_carries_the_limits_the_run_was_made_under(capsys: pytest.CaptureFixture[str]) -> None:
    """A run made under ``--max-steps`` or ``--device-memory`` is replayed under them: its line says them (without
    them the replay was another run, with another verdict)."""
    target = "examples/offload_plain.py::reload_racy"
    assert main(["replay", target, "--max-steps", "5", "--no-fix"]) == 2  # a step limit alone: no verdict
    out = capsys.readouterr().out
    assert "1 step-limit" in out
    line = next(x for x in out.splitlines() if "replay: " in x)
    assert line.endswith(" --max-steps 5 [--gpu]")
    assert main([*shlex.split(line.split("replay: ", 1)[1].removesuffix(" [--gpu]"))[1:], "--no-fix"]) == 2
    assert "1 step-limit" in capsys.readouterr().out
    assert main(["replay", target, "--device-memory", "1G", "--no-fix"]) == 1
    assert " --device-memory 1073741824 [--gpu]" in capsys.readouterr().out


def test_json_stdout_holds_the_document_alone_whatever_the_program_prints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "noisy.py").write_text(
        'import torch\nprint("imported")\n\n\ndef f():\n    print("running")\n    torch.ones(3, device="cuda")\n')
    # (check holds what the program prints back unless --show-output: then, as replay's, it goes to stderr)
    for args in (["check", "noisy.py::f", "--json", "-q"], ["check", "noisy.py::f", "--json", "-q", "--show-output"],
                 ["replay", "noisy.py::f", "--json"]):
        assert main(args) == 0
        got = capsys.readouterr()
        assert json.loads(got.out)
        assert ("running" in got.err) == (args[0] == "replay" or "--show-output" in args), args


def test_list_says_when_a_functions_default_run_is_not_clean(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The operations ``list`` counts are its default run's: where an error ended that run early, it says so (it
    showed "operations: none" as for a function that uses no device)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "two.py").write_text('import torch\n\n\ndef fine():\n    torch.ones(2, device="cuda")\n\n\n'
                                     'def broken():\n    raise ValueError("early")\n')
    assert main(["list", "two.py"]) == 0
    out = capsys.readouterr().out
    assert 'two.py::broken  [plain torch.cuda]()\n  operations: none\n  its default schedule ends early: ' \
           '1 host-error (simdevice replay "two.py::broken")\n' in out
    assert "two.py::fine  [plain torch.cuda]()\n  operations: default 1, host 1\n" in out
    assert out.count("ends early") == 1


def test_list_takes_one_function_as_check_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``list FILE.py::FUNCTION[:KEY=VALUE]`` lists that function alone, probed in that configuration, as ``check``
    and ``replay`` name it; a bad one is one line. Before, it was taken for a module's name: "no module
    'two.py::fine' (No module named 'two.py::fine'; 'two' is not a package)"."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "two.py").write_text('import torch\n\n\ndef fine(n: int = 2):\n    torch.ones(n, device="cuda")\n'
                                     '    if n > 2:\n        torch.ones(n, device="cuda")\n\n\n'
                                     'def other():\n    pass\n')
    assert main(["list", "two.py::fine"]) == 0
    assert capsys.readouterr().out == "two.py::fine  [plain torch.cuda](n=2)\n  operations: default 1, host 1\n"
    assert main(["list", "two.py::fine:n=3"]) == 0
    assert capsys.readouterr().out == "two.py::fine  [plain torch.cuda](n=3)\n  operations: default 2, host 2\n"
    for bad, says in (("two.py::nope", "two.py has no function 'nope'"),
                      ("two.py::fine:m=1", "two.py::fine has no parameter 'm'"),
                      ("two.py::fine::default#0+1", "list probes the default schedule; drop the delays")):
        assert main(["list", bad]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
        assert says in err[0], err


def test_exhaust_json_gives_the_answer_for_scripts(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["exhaust", "offload_reload/racy:", "--delays", "1", "--units", "1", "--json", "-q"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["clean"], doc["ok"], doc["schedule"]) == (False, True, "offload_reload/racy::d2h#0+1")
    assert doc["ran"] <= doc["total"]
    assert any(r.startswith("race: ") for r in doc["reports"])
    assert main(["exhaust", "examples/offload_plain.py::reload_correct", "--delays", "1", "--units", "1", "--json",
                 "-q"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["clean"], doc["ok"], doc["schedule"], doc["ran"]) == (True, True, None, doc["total"])


LATE_READER = """
import torch


def late_reader(n: int = 64) -> None:
    side = torch.cuda.Stream()
    out = torch.zeros(n, device="cuda")
    x = torch.zeros(n, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    x.fill_(1.0)
    with torch.cuda.stream(side):
        torch.cuda._sleep(10_000_000)  # about 15 ms
        out.copy_(x)  # no wait for the fill: a race that a stall of the fill under 15 ms never shows
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), torch.ones(n))
"""


def test_exhaust_of_a_function_reports_a_race_no_schedule_shows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As check does, exhaust counts a race at the default schedule as found, though no schedule it ran made it
    show as wrong values: a race is there whatever the timing (it said clean, exit 0)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "late.py").write_text(LATE_READER)
    args = ["exhaust", "late.py::late_reader", "--delays", "1", "--units", "1,5", "--jobs", "1", "-q"]
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "no schedule of the 25 shows wrong values, but the default one races" in out
    assert 'replay: simdevice replay "late.py::late_reader" [--gpu]' in out
    assert main([*args, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["clean"] is False
    assert doc["summary"] == "1 race"


SINGLETON = '''
import torch

_STREAM = None
_BUFFERS = {}
CALLS = [0]


def _d2h_stream():
    global _STREAM
    if _STREAM is None:  # made at the first call, reused by every later one
        _STREAM = torch.cuda.Stream()
    return _STREAM


def offload(wait: bool = True, n: int = 1024):
    CALLS[0] += 1
    x = torch.arange(n, dtype=torch.float32, device="cuda")
    pinned = _BUFFERS.setdefault(n, torch.empty(n, pin_memory=True))
    s = _d2h_stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        pinned.copy_(x, non_blocking=True)
    if wait:
        s.synchronize()
    assert CALLS[0] == 1, "an earlier run's count"
    assert torch.equal(pinned, torch.arange(n, dtype=torch.float32))
'''


def test_what_a_run_leaves_in_the_function_s_module_is_gone_at_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stream kept in a module global (made at the first call), a buffer in a module dict and a count in a module
    list start afresh at every run, as in a process of its own: the correct program is clean (it failed at its
    second run on a stream of the first), the racy one is found, and the module is left as it was."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "single.py").write_text(SINGLETON)
    assert main(["check", "single.py::offload", "--json", "--examples", "30", "--no-fix"]) == 0, capsys.readouterr()
    capsys.readouterr()
    assert main(["check", "single.py::offload:wait=0", "--json", "--examples", "30", "--no-fix"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert "AssertionError" in " ".join(doc["reports"]) or doc["summary"] != "clean"
    names = resolve("single.py::offload").fn.__globals__  # the module the command ran
    assert (names["_STREAM"], names["_BUFFERS"], names["CALLS"]) == (None, {}, [0])


SWAPS = '''
import torch


def device_to_host() -> None:
    p = torch.nn.Parameter(torch.ones(4, device="cuda"))
    p.data = torch.ones(4, pin_memory=True)
    assert not p.is_cuda and p.is_pinned() and isinstance(p, torch.nn.Parameter)


def host_to_device() -> None:
    p = torch.nn.Parameter(torch.ones(4))
    p.data = torch.ones(4, device="cuda")
    assert p.is_cuda and isinstance(p, torch.nn.Parameter)
'''


@pytest.mark.parametrize("fn", ["device_to_host", "host_to_device"])
def test_a_parameter_s_data_swapped_between_host_and_device_is_simulated(
    fn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``p.data = t`` between a host and a device tensor (an offload that swaps a weight to pinned memory and back)
    runs as torch's ``set_data`` on a GPU: clean, exit 0 (it was no verdict, exit 2, and before that a finding)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "swaps.py").write_text(SWAPS)
    assert main(["check", f"swaps.py::{fn}", "-q", "--no-fix"]) == 0, capsys.readouterr()


def test_a_clean_check_gives_the_default_runs_notes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A clean verdict says what it may not cover (a stream that got no operation), as ``replay`` of the default
    schedule does, in its text and in ``--json``."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "idle.py").write_text(textwrap.dedent("""
        import torch

        def idle(n: int = 64) -> None:
            side = torch.cuda.Stream()
            x = torch.ones(n, device="cuda")
            assert x.sum().item() == n
    """))
    assert main(["check", "idle.py::idle", "-q", "--examples", "5"]) == 0
    out = capsys.readouterr().out
    assert "clean over" in out
    assert "  note: stream side (made at idle.py:5) got no operation: nothing ran on it to race" in out
    assert main(["check", "idle.py::idle", "-q", "--examples", "5", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["notes"] == ["stream side (made at idle.py:5) got no operation: nothing ran on it to race"]


def test_a_clean_check_of_a_function_that_made_no_cuda_operation_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Tensors left on the host (``device=`` forgotten): "clean over 2 schedules" alone read as a protocol checked;
    the clean verdict now says no schedule could change what the function does, in its text and in ``--json``."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "host.py").write_text(textwrap.dedent("""
        import torch

        def on_host(n: int = 64) -> None:
            x = torch.ones(n)
            assert x.sum().item() == n
    """))
    note = "its run made no CUDA operation (no stream work, no host step on device or pinned memory)"
    assert main(["check", "host.py::on_host", "-q"]) == 0
    assert f"  note: {note}" in capsys.readouterr().out
    assert main(["check", "host.py::on_host", "-q", "--json"]) == 0
    assert any(n.startswith(note) for n in json.loads(capsys.readouterr().out)["notes"])
    (tmp_path / "dev.py").write_text("import torch\n\n\ndef on_device(n: int = 64) -> None:\n"
                                     "    torch.ones(n, device='cuda').add_(1)\n")
    assert main(["check", "dev.py::on_device", "-q", "--examples", "3"]) == 0
    assert "note:" not in capsys.readouterr().out


def test_a_clean_line_names_the_configuration_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A TARGET that fixes a configuration (``idle.py::idle:n=32``) is named with it in the lines that say what was
    checked and that it was clean (they named the function alone, as if its defaults had been), in ``check``'s and
    in ``exhaust``'s."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "idle.py").write_text(textwrap.dedent("""
        import torch

        def idle(n: int = 64) -> None:
            x = torch.ones(n, device="cuda")
            assert x.sum().item() == n
    """))
    assert main(["check", "idle.py::idle:n=32", "--examples", "5"]) == 0
    out, err = capsys.readouterr()
    assert "checking idle.py::idle:n=32 ..." in err
    assert out.startswith("idle.py::idle:n=32: clean over "), out
    assert main(["exhaust", "idle.py::idle:n=32", "--delays", "1", "--units", "1"]) == 0
    assert capsys.readouterr().out.startswith("idle.py::idle:n=32 (the configuration given): clean over ")
    assert main(["check", "idle.py::idle", "-q", "--examples", "5"]) == 0
    assert capsys.readouterr().out.startswith("idle.py::idle: clean over ")


def test_an_edge_naming_an_actor_the_function_lacks_is_refused_as_a_delay_is(
    capsys: pytest.CaptureFixture[str],
) -> None:
    target = "examples/offload_plain.py::reload_racy"
    edge = "nosuch@examples/offload_plain.py:9->default@examples/offload_plain.py:16"
    assert main(["replay", target, "--edge", edge, "--no-fix"]) == 2
    err = capsys.readouterr().err
    assert err == (f"simdevice: error: edge {edge} names actor 'nosuch', which {target} does not have; "
                   "actors: d2h_stream, default, host\n")


def test_json_says_the_world_size_and_the_replay_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A script replaying ``--json``'s schedule needs the world it was found on: the document says it, and the whole
    replay command, for check and exhaust."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ranks.py").write_text(RANKS)
    for args in (["check", "ranks.py::gather_racy", "--no-fix"], ["exhaust", "ranks.py::gather_racy", "--delays", "1"]):
        assert main([*args, "--world-size", "2", "-q", "--json"]) == 1
        doc = json.loads(capsys.readouterr().out)
        assert doc["world_size"] == 2
        assert doc["replay"].startswith('simdevice replay "ranks.py::gather_racy')
        assert doc["replay"].endswith(" --world-size 2")


_PRINTS = """
import torch


def noisy(fail: int = 0) -> None:
    x = torch.ones(4, device="cuda")
    print("step", x.sum().item())
    assert not fail, "asked to fail"
"""


@pytest.mark.parametrize("command", ["check", "exhaust"])
def test_what_the_program_prints_is_held_back_while_its_schedules_run(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A search runs the program hundreds of times: what it prints is counted and held back (stdout keeps the
    verdict), with a line on stderr saying how to see one run's; ``--show-output`` lets it through."""
    (tmp_path / "prints.py").write_text(_PRINTS)
    target = f"{tmp_path / 'prints.py'}::noisy"
    options = ["--examples", "20"] if command == "check" else ["--delays", "1", "--units", "1"]
    assert main([command, target, *options]) == 0
    out, err = capsys.readouterr()
    assert "step 4.0" not in out
    runs = int(err.split("the program printed ")[1].split(" line")[0])
    assert runs > 1
    assert f'simdevice replay "{target}" shows one run' in err
    assert main([command, target, *options, "--show-output"]) == 0
    out, err = capsys.readouterr()
    assert out.count("step 4.0") == runs
    assert "the program printed" not in err
    assert main([command, f"{target}:fail=1", *options, "--no-fix"] if command == "check" else
                [command, f"{target}:fail=1", *options]) == 1
    out, err = capsys.readouterr()
    assert "step 4.0" not in out
    assert "asked to fail" in out
    assert f'simdevice replay "{tmp_path / "prints.py"}::noisy:fail=1' in err


_WARNS = """
import logging
import sys
import warnings

import torch


def noisy() -> None:
    warnings.warn("careful")
    logging.getLogger(__name__).warning("logged")
    print("to stderr", file=sys.stderr)
    torch.ones(4, device="cuda")
"""


@pytest.mark.filterwarnings("ignore:careful:UserWarning")  # (the program's own, which pytest records as well)
@pytest.mark.parametrize("command", ["check", "exhaust"])
def test_what_the_program_writes_to_stderr_is_held_back_too(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its warnings, log lines and prints to stderr were let through at every run (a search's hundreds of copies
    of each on the terminal): they are held back and counted as its prints to stdout are; the command's own
    lines still reach stderr, and ``--show-output`` lets them through."""
    (tmp_path / "warns.py").write_text(_WARNS)
    target = f"{tmp_path / 'warns.py'}::noisy"
    options = ["--examples", "20"] if command == "check" else ["--delays", "1", "--units", "1"]
    assert main([command, target, *options]) == 0
    out, err = capsys.readouterr()
    for line in ("careful", "logged", "to stderr"):
        assert line not in err, err
        assert line not in out
    assert "clean over" in out
    assert ("checking " if command == "check" else "running ") in err
    assert main([command, target, *options, "--show-output"]) == 0
    out, err = capsys.readouterr()
    assert err.count("to stderr") > 1


_AUTOCAST = """
import torch


def dtype_under_autocast() -> None:
    lin = torch.nn.Linear(8, 8).cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = lin(torch.randn(2, 8, device="cuda"))
    assert y.dtype == torch.bfloat16


def racy_under_autocast(n: int = 256) -> None:
    x = torch.arange(n, dtype=torch.float32, device="cuda")
    pinned = torch.empty(n, pin_memory=True)
    side = torch.cuda.Stream()
    with torch.autocast("cuda", dtype=torch.bfloat16), torch.cuda.stream(side):
        pinned.copy_(x, non_blocking=True)
    assert torch.equal(pinned, torch.arange(n, dtype=torch.float32))
"""


def test_a_program_under_autocast_gets_its_dtypes_and_its_races(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """``torch.autocast("cuda")`` is applied: a program that checks its dtypes under it is clean (it was no verdict,
    exit 2, when autocast was not applied), and a race under autocast is found as ever."""
    (tmp_path / "amp.py").write_text(_AUTOCAST)
    assert main(["check", f"{tmp_path / 'amp.py'}::dtype_under_autocast", "--examples", "5"]) == 0
    assert "clean over" in capsys.readouterr().out
    assert main(["check", f"{tmp_path / 'amp.py'}::racy_under_autocast", "--examples", "5", "--no-fix"]) == 1
    assert "race: copy_ (D2H)" in capsys.readouterr().out


def test_the_python_api_refuses_what_it_cannot_search() -> None:
    """``explore(3)`` raised an ``AttributeError`` of the simulator's; ``world_size=0`` was a "found" failure whose
    replay line the command line refuses; 99 ranks ran where the command line takes at most 32."""
    import simdevice

    for bad in (3, None):
        with pytest.raises(TypeError, match="expected a function"):
            simdevice.explore(bad)  # type: ignore[arg-type]

    def f() -> None:
        pass

    for n in (0, 99):
        with pytest.raises(ValueError, match=r"world_size must be in 1\.\.32"):
            simdevice.explore(f, world_size=n)


def test_a_fuzz_test_that_cannot_be_fuzzed_is_refused_by_check(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """``check`` of a ``@simdevice.fuzz`` test whose function cannot be run (a parameter without a default) said
    "found", the test's own failure taken for the program's; it is refused as the function itself is."""
    f = tmp_path / "test_user.py"
    f.write_text("import simdevice\n\n\n@simdevice.fuzz\ndef test_needs(n):\n    pass\n")
    assert main(["check", f"{f}::test_needs"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "@simdevice.fuzz:" in err[0]
    assert "has a parameter 'n' without a default" in err[0]


def test_a_file_that_calls_os_exit_as_it_is_imported_fails_its_import(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """``os._exit(n)`` at import ended the command at once, with nothing said, under the file's exit code (0: a
    script read it as clean, and ``--json`` printed nothing)."""
    f = tmp_path / "exits.py"
    f.write_text("import os\nos._exit(0)\n\n\ndef f():\n    pass\n")
    for args in (["check", f"{f}::f", "--json"], ["list", str(f)]):
        assert main(args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"simdevice: error: importing '{f}' failed: it called os._exit(0)"]


def test_replay_json_carries_the_trace_it_was_asked_for(capsys: pytest.CaptureFixture[str]) -> None:
    """``replay --trace --json`` dropped the trace: the document has it now, a line each, as the text prints it."""
    assert main(["replay", "examples/offload_plain.py::reload_racy", "--json", "--trace", "--no-fix"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert any("start copy_ (D2H) #0" in line for line in doc["trace"])
    assert main(["replay", "examples/offload_plain.py::reload_racy", "--json", "--no-fix"]) == 1
    assert "trace" not in json.loads(capsys.readouterr().out)


def test_list_keeps_what_the_program_prints_off_its_listing(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """What the file prints as it is imported and probed went into ``list``'s listing on stdout; it goes to stderr."""
    f = tmp_path / "noisy.py"
    f.write_text('import torch\nprint("imported")\n\n\ndef f():\n    print("running")\n'
                 '    torch.ones(3, device="cuda")\n')
    assert main(["list", str(f)]) == 0
    got = capsys.readouterr()
    assert "imported" not in got.out
    assert "running" not in got.out
    assert "operations: default 1" in got.out
    assert "imported" in got.err
    assert "running" in got.err


def test_a_delay_on_an_actor_the_run_never_reached_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    """Under ``--device-memory 1K`` the run stops at its first allocation, before it makes its stream: the delay on
    that stream was refused as naming an actor the function does not have, with nothing said of why."""
    assert main(["replay", "examples/offload_plain.py::reload_racy::d2h_stream#0+1", "--device-memory", "1K"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "names actor 'd2h_stream'" in err[0]
    assert "its run without delays ended early, before it could make one: host error: host raised OutOfMemoryError" \
        in err[0]


def test_a_test_taking_the_simdevice_fixture_is_named_as_one(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    # the fixture is pytest's to give: "give it a default" was the wrong advice for it
    (tmp_path / "test_mine.py").write_text("def test_offload(simdevice):\n    simdevice.explore('x.py::f')\n")
    assert main(["check", f"{tmp_path}/test_mine.py::test_offload"]) == 2
    err = capsys.readouterr().err
    assert "is a test that takes the simdevice fixture" in err, err
    assert "run it with pytest" in err, err
    assert err.count("\n") == 1


_TWO = textwrap.dedent('''
    import torch


    def _reload(wait: bool, n: int) -> None:
        act = torch.arange(n, dtype=torch.float32, device="cuda")
        pinned = torch.empty(n, pin_memory=True)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            pinned.copy_(act, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
        if wait:
            torch.cuda.current_stream().wait_event(done)
        back = torch.empty_like(act).copy_(pinned, non_blocking=True)
        assert torch.equal(back.cpu(), torch.arange(n, dtype=torch.float32))


    def reload_correct(n: int = 256) -> None:
        _reload(True, n)


    def reload_racy(n: int = 256) -> None:
        _reload(False, n)
''')


def test_check_of_a_file_checks_each_of_its_functions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "two.py").write_text(_TWO)
    assert main(["check", "two.py", "--examples", "30", "--no-fix", "-q"]) == 1
    out = capsys.readouterr().out
    assert "two.py::reload_correct: clean over" in out
    assert "two.py::reload_racy: found after" in out
    assert 'replay: simdevice replay "two.py::reload_racy' in out
    assert out.rstrip().splitlines()[-1] == "two.py: 2 of 2 functions checked: 1 failed, 1 clean"
    assert main(["check", "two.py", "--examples", "30", "--no-fix", "-q", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["file"] == "two.py"
    assert doc["ok"] is False
    assert [(r["target"], r["found"]) for r in doc["results"]] == [("two.py::reload_correct", False),
                                                                  ("two.py::reload_racy", True)]
    (tmp_path / "clean.py").write_text(_TWO.split("def reload_racy")[0])
    assert main(["check", "clean.py", "--examples", "30", "-q"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("clean.py: 1 of 1 functions checked: 0 failed, 1 clean")


def test_check_of_a_file_without_a_function_to_check_is_one_line_and_exit_2(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "none.py").write_text("def _private() -> None:\n    pass\n\n\ndef needs(n: int) -> None:\n    pass\n")
    for target, said in (("none.py", "none.py: no function a schedule can target"), ("gone.py", "no file 'gone.py'")):
        assert main(["check", target]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"simdevice: error: {said}"), err
        assert err.count("\n") == 1


_SCRIPT = '''
import argparse
import sys

import torch

def train(steps, racy):
    side = torch.cuda.Stream()
    w = torch.ones(1024, device="cuda")
    host = torch.empty(1024, pin_memory=True)
    for _ in range(steps):
        w.mul_(2.0)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            host.copy_(w, non_blocking=True)
        if not racy:
            side.synchronize()
        assert host[0].item() == w[0].item()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--racy", action="store_true")
    args = p.parse_args()
    train(args.steps, args.racy)
    return list(sys.argv)


def main_exits():
    train(2, False)
    sys.exit()


def main_exits_zero():
    train(2, False)
    raise SystemExit(0)


def main_exits_failing():
    train(2, False)
    sys.exit(3)


def racy_then_exits():
    train(2, True)
    sys.exit(0)


def a_thread_exits():
    import threading

    def work():
        train(1, False)
        sys.exit(1)  # (Python's threads end quietly at any SystemExit)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    train(1, False)
'''


def test_a_script_s_main_sees_its_own_file_as_its_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A ``main()`` that parses its arguments with argparse got the tool's own command line (``check
    script.py::main``): argparse exited 2 ("unrecognized arguments"), and that was reported as a failure found. It
    runs as ``python script.py`` would now, with no arguments (on the GPU too: ``module_state_kept``)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "script.py").write_text(_SCRIPT)
    assert main(["check", "script.py::main", "--examples", "20", "--no-fix", "-q"]) == 0, capsys.readouterr()
    assert "script.py::main: clean over" in capsys.readouterr().out
    target = resolve("script.py::main")
    assert target.run(target.schedule({}, ())).run.result == [str(tmp_path / "script.py")]


def test_sys_exit_with_status_0_ends_a_script_s_main_as_its_success(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """``sys.exit()`` and ``sys.exit(0)`` at the end of a main were a host error ("host raised SystemExit: 0"), a
    failure found in a correct program; another status is still a failure, and a race before the exit is found."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "script.py").write_text(_SCRIPT)
    for fn in ("main_exits", "main_exits_zero", "a_thread_exits"):
        assert main(["check", f"script.py::{fn}", "--examples", "20", "--no-fix", "-q"]) == 0, capsys.readouterr()
    capsys.readouterr()
    assert main(["check", "script.py::main_exits_failing", "--examples", "20", "--no-fix", "-q", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    line = _SCRIPT.splitlines().index("    sys.exit(3)") + 1
    assert doc["reports"] == [f"host error: host raised SystemExit: 3 (script.py:{line})"], doc
    assert main(["check", "script.py::racy_then_exits", "--examples", "20", "--no-fix", "-q", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert any(r.startswith("race: ") for r in doc["reports"]), doc


def test_a_file_that_makes_a_stream_as_it_is_imported_is_told_where_and_why(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A stream made at a module's top level (``COPY_STREAM = torch.cuda.Stream()``) fails as the file is imported,
    outside any run, on the CPU build: the line says where, and to make it inside the function. Before, it gave
    torch's message alone ("torch.cuda.Stream requires CUDA support"), with no line and no way out."""
    f = tmp_path / "streams_at_import.py"
    f.write_text("import torch\n\nCOPY_STREAM = torch.cuda.Stream()\n\n\ndef f():\n    pass\n")
    for args in (["check", f"{f}::f"], ["list", str(f)]):
        assert main(args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
        assert err[0].startswith(f"simdevice: error: importing '{f}' failed: RuntimeError: torch.cuda.Stream "
                                 "requires CUDA support ("), err[0]
        assert "streams_at_import.py:3); a module's top level runs as it is imported, outside the simulated " \
               "device: make its CUDA streams, events and tensors inside the function" in err[0], err[0]
