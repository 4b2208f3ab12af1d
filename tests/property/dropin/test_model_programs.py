"""The simulator's verdicts on the programs ``tests/gpu/test_model_programs_gpu.py`` runs on a GPU
(``tests/model_programs.py``, and torchao's ``CPUOffloadOptimizer`` driver at the GPU test's stalls): what the GPU
is expected to show, checked here on the CPU so a GPU run only has to compare."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import model_programs as programs
import pytest

import simdevice
from reference.schedule import Schedule
from simdevice.search.targets import resolve

ROOT = Path(__file__).resolve().parents[3]
STALL = 10_000_000  # cycles: 14.6 ms on the simulator


def test_a_pause_without_a_wait_races_with_the_stalled_kernel_and_with_one_is_clean() -> None:
    racy = simdevice.cuda().run(programs.pause_while_a_kernel_may_run, STALL, False)
    kinds = {r.kind for r in racy.reports}
    assert "race" in kinds, [str(r) for r in racy.reports]
    assert str(racy.reports[0]).startswith("race: memory_saver.pause('train') on host host ")
    assert not simdevice.cuda().run(programs.pause_while_a_kernel_may_run, STALL, True).reports


def test_nodes_made_under_set_stream_run_their_backward_and_hooks_there() -> None:
    run = simdevice.cuda().run(programs.set_stream_forward)
    assert not run.reports
    assert run.result == ["accumulate@side", "y-hook@side"]


@pytest.mark.parametrize(("forward_on_side", "want"), [(True, ["full@side", "pre@side"]),
                                                       (False, ["full@default", "pre@default"])])
def test_a_module_s_full_backward_hooks_run_on_its_forward_s_stream(forward_on_side: bool, want: list[str]) -> None:
    run = simdevice.cuda().run(programs.module_hooks, forward_on_side, STALL)
    assert not run.reports
    assert run.result == want


def test_grad_s_capture_is_waited_for_by_the_calling_stream_and_not_by_another() -> None:
    run = simdevice.cuda().run(programs.grad_capture, "calling", STALL)
    assert not run.reports
    assert run.result == (True, ["y-hook@side"])
    run = simdevice.cuda().run(programs.grad_capture, "other", STALL)
    assert [r.kind for r in run.reports if r.kind == "race"] == ["race"]
    assert run.result[1] == ["y-hook@side"]


@pytest.mark.parametrize("wait", [True, False])
def test_backward_into_a_non_leaf_is_no_leaf_stream(wait: bool) -> None:
    run = simdevice.cuda().run(programs.backward_into_a_non_leaf, wait, STALL)
    races = [r for r in run.reports if r.kind == "race"]
    assert bool(races) != wait, [str(r) for r in run.reports]
    assert run.result[1] == ["h-node@side"]
    assert run.result[0] == wait  # (stalled, the read gets the block's bytes before the node's write)


@pytest.mark.parametrize("wait", [True, False])
def test_fsdp2_s_unsharded_weight_read_on_a_side_stream_races_without_its_wait(wait: bool) -> None:
    run = simdevice.cuda().run(programs.fsdp2_side_stream, wait, STALL)
    races = [str(r) for r in run.reports if r.kind == "race"]
    assert bool(races) != wait, [str(r) for r in run.reports]
    if not wait:
        assert any("which copy_ on stream default" in r for r in races), races  # (FSDP2's copy-out, one rank)
    assert run.result[0] == wait  # (stalled, the side stream reads the weight before the copy-out lands)


@pytest.mark.parametrize("wait", [True, False])
def test_a_graph_s_static_input_copied_on_a_side_stream_races_with_the_replay_without_a_wait(wait: bool) -> None:
    run = simdevice.cuda().run(programs.graph_copy_in, wait, STALL)
    races = [str(r) for r in run.reports if r.kind == "race"]
    assert bool(races) != wait, [str(r) for r in run.reports]
    if not wait:
        assert any(r.startswith("race: mul (graph1, captured at ") and "copy_ (H2D) on stream" in r
                   for r in races), races
    assert run.result[0] == wait  # (stalled, the replay reads the zeros before the copy lands)


@pytest.mark.parametrize("keep", [True, False])
def test_a_graph_replayed_after_its_input_was_freed_reads_the_block_s_new_owner(keep: bool) -> None:
    run = simdevice.cuda().run(programs.graph_freed_input, keep)
    illegal = [str(r) for r in run.reports if r.kind == "illegal-access"]
    assert bool(illegal) != keep, [str(r) for r in run.reports]
    if not keep:
        assert "freed after graph1 was captured" in illegal[0], illegal
        assert len(run.reports) == 1, [str(r) for r in run.reports]
    assert run.result[0] == keep  # (freed, the replay reads y's sevens: as a GPU's caching allocator hands it on)


@pytest.mark.parametrize("wait", [True, False])
def test_an_asyncio_executor_s_offload_read_by_the_loop_races_without_the_worker_s_sync(wait: bool) -> None:
    run = simdevice.cuda().run(programs.asyncio_offload, wait, STALL)
    races = [str(r) for r in run.reports if r.kind == "race"]
    assert bool(races) != wait, [str(r) for r in run.reports]
    if not wait:
        assert any(r.startswith("race: clone on host") and "which copy_ (D2H) on stream" in r for r in races), races
    assert run.result[0] == wait  # (stalled, the loop reads the zeros before the copy lands)


@pytest.mark.parametrize(("read_on", "keep", "right"), [
    ("current", True, True), ("side", True, False), ("side-recorded", True, False),  # the current stream only
    ("side", False, True), ("side-recorded", False, True),  # the segment's last tensor: every stream
])
def test_a_dropped_received_tensor_s_block_waits_for_the_current_stream_or_for_all(read_on: str, keep: bool,
                                                                                   right: bool) -> None:
    run = simdevice.cuda().run(programs.drop_a_received_tensor, read_on, keep, STALL)
    races = [str(r) for r in run.reports if r.kind == "race"]
    assert bool(races) != right, [str(r) for r in run.reports]
    assert run.result == right  # (stalled, the side stream's read sees the producer's new values)
    if races:
        assert races[0].startswith("race: fill_ on stream producer.default #"), races


def test_a_child_s_write_to_a_received_tensor_is_done_when_it_has_ended() -> None:
    # (the GPU test of the same program: tests/gpu/test_model_programs_gpu.py; a race before the child's arguments
    # were let go as it ended)
    run = simdevice.cuda().run(programs.child_writes_and_ends, STALL)
    assert [str(r) for r in run.reports] == []
    assert run.result


@pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao is not installed")
@pytest.mark.parametrize(("line", "racy"), programs.torchao_lines())
def test_torchao_s_optimizer_and_its_mutants_at_the_gpu_test_s_stalls(line: str, racy: bool,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    s = Schedule.parse(line)
    out = resolve(s.program).run(s)
    assert out.clean != racy, out.verdict()
    if racy:
        assert any(r.kind == "host-error" for r in out.run.reports)  # wrong weights, not only a race
