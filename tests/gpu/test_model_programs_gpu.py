"""Models that had no GPU case, on a real GPU, each compared with the simulator's verdict on the same program
(``tests/model_programs.py``; the verdicts are also checked on the CPU by
``tests/property/dropin/test_model_programs.py``):

- a ``torch_memory_saver`` pause (the real library, 0.0.10, preload hook) with a kernel on the region's memory
  stalled on a side stream and no wait before the pause: ``cuMemUnmap`` does not wait for it, so the kernel faults
  (an illegal memory access: each trial in a process of its own); with ``torch.cuda.synchronize()`` before the
  pause, none does;
- backward's streams for nodes made under ``torch.cuda.set_stream(s)`` and for a module's full backward hook and
  pre-hook: the streams the hooks ran on;
- ``loss.backward(inputs=[h])`` of a non-leaf ``h`` made on a side stream: ``h``'s node runs there and is no leaf
  stream, so the calling stream's read of ``h.grad`` is right only after a wait for the side stream;
- ``torch.autograd.grad(loss, [w])``: the calling stream's read of the captured gradient is right (the engine waits
  for the capture's stream at the end), another stream's, which waits for nothing, is not;
- a consumer process that reads a received device tensor behind a stall, drops it and lets the producer reuse its
  block (``torch.cuda.ipc_collect()``): read right on the consumer's current stream (torch's deleter synchronizes
  it), wrong on a side stream, with ``record_stream`` or without, while the consumer holds another tensor of the
  producer's segment; right on any stream where it holds none (the deleter unmaps the segment, which waits);
- torch's FSDP2 (``fully_shard``, one rank) on a layer computing on a side stream: the unsharded weight, copied out
  of the all-gather on the stalled calling stream, read right by the side stream only after its wait for that stream;
- asyncio's default executor offloading to pinned memory on a stalled side stream: the event loop's read of the
  pinned buffer right only where the worker synchronized the side stream;
- a CUDA graph's static input copied in on a stalled side stream: the replay's output right only where the current
  stream waited for the copy; a graph replayed after the program dropped its input and made a tensor of its size:
  the output wrong every time (the freed block's new owner is read), right where the input is kept;
- torchao's ``CPUOffloadOptimizer`` (0.18.0) unmodified and its four mutants, each at a stall that exposes it; the
  unmodified optimizer under torch's ``GradScaler("cuda")``, its first gradient D2H stalled (upstream's race).

Run: ``NCCL_NVLS_ENABLE=0 PYTHONPATH=/tmp/site:. python -m pytest -q -s tests/gpu/test_model_programs_gpu.py`` (the
wheels installed into /tmp/site as docs/memsaver.md says). Each case prints ``RATE``; ``MODEL_PROGRAMS_GPU_TRIALS`` sets
the trials (default 5).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

import model_programs as programs  # noqa: E402

import simdevice  # noqa: E402
from reference.cuda import calibrate_sleep_cycles_per_ms  # noqa: E402
from reference.schedule import Schedule  # noqa: E402
from simdevice.search.targets import resolve  # noqa: E402

pytestmark = pytest.mark.gpu

TRIALS = int(os.environ.get("MODEL_PROGRAMS_GPU_TRIALS", "5"))
STALL_MS = 100
ILLEGAL = re.compile(r"illegal (memory access|address)", re.IGNORECASE)


def _where() -> str:
    return f"(torch {torch.__version__}, {torch.cuda.get_device_name()})"


@pytest.fixture(scope="module")
def cycles() -> int:
    return int(STALL_MS * calibrate_sleep_cycles_per_ms())


# -- a memory-saver pause -----------------------------------------------------------------------------------------

needs_saver = pytest.mark.skipif(importlib.util.find_spec("torch_memory_saver") is None,
                                 reason="torch_memory_saver not installed (extra 'gpu')")


def _pause_child(wait: bool, trials: int) -> tuple[str, str]:
    """Run ``pause_while_a_kernel_may_run`` ``trials`` times in a child with the preload hook; return (its last
    ``RESULT``, or ``faulted`` where its output names an illegal memory access; the output's tail)."""
    from reference.cuda import cuda_runtime_dirs, memory_saver_preload

    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    for key in ("TMS_INIT_ENABLE", "TMS_INIT_ENABLE_CPU_BACKUP"):
        env.pop(key, None)
    env["LD_PRELOAD"] = memory_saver_preload()
    env["LD_LIBRARY_PATH"] = os.pathsep.join([*cuda_runtime_dirs(), env.get("LD_LIBRARY_PATH", "")])
    try:
        p = subprocess.run([sys.executable, __file__, "pause", str(int(wait)), str(trials)], env=env,
                           capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "timeout", ""
    out = p.stdout + p.stderr
    results = [line[7:] for line in p.stdout.splitlines() if line.startswith("RESULT ")]
    if results and not results[-1].startswith("faulted"):
        return results[-1], out[-1500:]
    if ILLEGAL.search(out):
        return "faulted", next(line for line in out.splitlines() if ILLEGAL.search(line))[:300]
    return (results[-1] if results else f"crash rc={p.returncode}"), out[-1500:]


@needs_saver
def test_a_pause_without_a_wait_faults_the_kernel_in_flight_and_with_one_does_not() -> None:
    sim_racy = simdevice.cuda().run(programs.pause_while_a_kernel_may_run, 10_000_000, False)
    sim_fixed = simdevice.cuda().run(programs.pause_while_a_kernel_may_run, 10_000_000, True)
    faulted = 0
    for _ in range(TRIALS):  # a fault is sticky: a process a trial
        outcome, tail = _pause_child(False, 1)
        faulted += outcome == "faulted"
        print(f"  no wait: {outcome}: {tail.splitlines()[-1] if tail else ''}")
    fixed, tail = _pause_child(True, TRIALS)  # one process: nothing should fault
    print(f"RATE memory-saver pause with a stalled kernel in flight: no wait faulted {faulted}/{TRIALS} "
          f"(simulator: {sim_racy.reports[0].kind if sim_racy.reports else 'clean'}); synchronize() before the "
          f"pause: {fixed} (simulator: {'clean' if not sim_fixed.reports else 'racy'}) {_where()}", flush=True)
    if fixed != f"clean {TRIALS}/{TRIALS}":
        print(tail)
    assert sim_racy.reports
    assert not sim_fixed.reports
    assert faulted == TRIALS, "the pause waited for the kernel (the simulator calls it a race)"
    assert fixed == f"clean {TRIALS}/{TRIALS}"


def _pause_main(wait: bool, trials: int) -> None:
    import torch_memory_saver
    from torch_memory_saver import torch_memory_saver as tms

    torch_memory_saver.torch_memory_saver.hook_mode = "preload"
    torch.cuda.set_device(0)
    cycles = int(STALL_MS * calibrate_sleep_cycles_per_ms())
    # the hook is in place: a pause gives a region's memory back (else nothing is unmapped and nothing can fault)
    with tms.region("check"):
        held = torch.ones(1 << 30, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    free0, _ = torch.cuda.mem_get_info()
    tms.pause("check")
    free1, _ = torch.cuda.mem_get_info()
    tms.resume("check")
    del held
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    if free1 - free0 < 1 << 29:
        print(f"RESULT saver-inactive (a pause of 1 GiB released {(free1 - free0) >> 20} MiB)")
        return
    # the program once with its wait first: a kernel's first launch in a process loads its module (CUDA's lazy
    # loading), which waits for the device, so a first ``w.add_(1)`` launched behind the stall returned only once
    # the stall was over, and the pause met no kernel in flight (an H100, the twenty-seventh run)
    programs.pause_while_a_kernel_may_run(cycles, True)
    done = 0
    for _ in range(trials):
        try:
            programs.pause_while_a_kernel_may_run(cycles, wait)
        except RuntimeError as e:
            print(f"RESULT faulted {str(e).splitlines()[0]}")
            return
        done += 1
    print(f"RESULT clean {done}/{trials}")


# -- backward's streams -------------------------------------------------------------------------------------------


def test_nodes_made_under_set_stream_run_their_hooks_on_that_stream() -> None:
    sim = simdevice.cuda().run(programs.set_stream_forward)
    side = torch.cuda.Stream()
    seen = {s for _ in range(TRIALS) for s in programs.set_stream_forward((side,))}
    print(f"RATE ops under torch.cuda.set_stream(side), backward() on the default stream: hooks ran on "
          f"{sorted(seen)} over {TRIALS} trials (simulator: {sim.result}) {_where()}", flush=True)
    assert not sim.reports
    assert sorted(seen) == sim.result


@pytest.mark.parametrize("forward_on_side", [True, False])
def test_a_module_s_full_backward_hooks_run_on_its_forward_s_stream(forward_on_side: bool, cycles: int) -> None:
    sim = simdevice.cuda().run(programs.module_hooks, forward_on_side, 10_000_000)
    side = torch.cuda.Stream()
    seen = {s for _ in range(TRIALS) for s in programs.module_hooks(forward_on_side, cycles // 10, (side,))}
    where = "forward in a side stream's block" if forward_on_side else "backward() in a side stream's block"
    print(f"RATE a module's full backward hook and pre-hook, {where}: ran on {sorted(seen)} over {TRIALS} trials "
          f"(simulator: {sim.result}) {_where()}", flush=True)
    assert not sim.reports
    assert sorted(seen) == sim.result


def _read_rate(program: Any, case: Any, cycles: int, n_streams: int) -> tuple[Any, str, int, set[str]]:
    """A read-right program (it returns whether its read was right and the streams its hooks ran on) on the
    simulator, then ``TRIALS`` times on the GPU after a warm-up (which fills the caching allocator's blocks), each
    trial with its own seed and the same streams: (the simulator's run, its verdict, the right reads, the streams)."""
    sim = simdevice.cuda().run(program, case, 10_000_000)
    streams = tuple(torch.cuda.Stream() for _ in range(n_streams))
    program(case, cycles, 0, streams)  # warm-up, not counted
    right = 0
    seen: set[str] = set()
    for trial in range(TRIALS):
        r, s = program(case, cycles, trial + 1, streams)
        right += r
        seen.update(s)
    verdict = "race" if any(r.kind == "race" for r in sim.reports) else "clean" if not sim.reports else "other"
    return sim, verdict, right, seen


def _agree(ordered: bool, sim_verdict: str, right: int) -> None:
    """The simulator clean and every read right where the read is ordered; a race and some read wrong where not."""
    if ordered:
        assert sim_verdict == "clean"
        assert right == TRIALS
    else:
        assert sim_verdict == "race"
        assert right < TRIALS


@pytest.mark.parametrize("read_on", ["calling", "other"])
def test_grad_s_capture_is_waited_for_by_the_calling_stream(read_on: str, cycles: int) -> None:
    sim, sim_verdict, right, seen = _read_rate(programs.grad_capture, read_on, cycles, 2)
    print(f"RATE torch.autograd.grad(loss, [w]) with w * x on a side stream, the gradient read on the {read_on} "
          f"stream: right {right}/{TRIALS}, y's hook ran on {sorted(seen)} (simulator: {sim_verdict}, "
          f"{sim.result[1]}) {_where()}", flush=True)
    assert sorted(seen) == sim.result[1]
    _agree(read_on == "calling", sim_verdict, right)


@pytest.mark.parametrize("wait", [True, False])
def test_backward_into_a_non_leaf_is_no_leaf_stream(wait: bool, cycles: int) -> None:
    sim, sim_verdict, right, seen = _read_rate(programs.backward_into_a_non_leaf, wait, cycles, 1)
    print(f"RATE loss.backward(inputs=[h]), h = w * x on a side stream, h.grad read on the calling stream "
          f"{'after' if wait else 'without'} a wait for it: right {right}/{TRIALS}, h's node ran on {sorted(seen)} "
          f"(simulator: {sim_verdict}, {sim.result[1]}) {_where()}", flush=True)
    assert sorted(seen) == sim.result[1]
    _agree(wait, sim_verdict, right)


@pytest.mark.parametrize("wait", [True, False])
def test_fsdp2_s_unsharded_weight_read_on_a_side_stream(wait: bool, cycles: int) -> None:
    _, sim_verdict, right, _ = _read_rate(programs.fsdp2_side_stream, wait, cycles, 1)
    print(f"RATE FSDP2 (fully_shard, one rank) on a layer computing on a side stream, the calling stream stalled, "
          f"{'after' if wait else 'without'} the side stream's wait for it: right {right}/{TRIALS} (simulator: "
          f"{sim_verdict}) {_where()}", flush=True)
    _agree(wait, sim_verdict, right)


@pytest.mark.parametrize("wait", [True, False])
def test_an_asyncio_executor_s_offload_read_by_the_loop(wait: bool, cycles: int) -> None:
    _, sim_verdict, right, _ = _read_rate(programs.asyncio_offload, wait, cycles, 1)
    print(f"RATE asyncio's default executor offloads to pinned memory on a stalled side stream, the loop reading it "
          f"{'after' if wait else 'without'} the worker's sync: right {right}/{TRIALS} (simulator: {sim_verdict}) "
          f"{_where()}", flush=True)
    _agree(wait, sim_verdict, right)


@pytest.mark.parametrize("wait", [True, False])
def test_a_graph_s_static_input_copied_on_a_stalled_side_stream(wait: bool, cycles: int) -> None:
    _, sim_verdict, right, _ = _read_rate(programs.graph_copy_in, wait, cycles, 1)
    print(f"RATE a CUDA graph's static input copied from pinned memory on a stalled side stream, then replayed "
          f"{'after' if wait else 'without'} the current stream's wait for the copy: right {right}/{TRIALS} "
          f"(simulator: {sim_verdict}) {_where()}", flush=True)
    _agree(wait, sim_verdict, right)


@pytest.mark.parametrize("keep", [True, False])
def test_a_graph_replayed_after_its_input_was_freed(keep: bool) -> None:
    sim = simdevice.cuda().run(programs.graph_freed_input, keep)
    kinds = sorted({r.kind for r in sim.reports})
    programs.graph_freed_input(keep, 0, 0)  # warm-up, not counted
    right = sum(programs.graph_freed_input(keep, 0, trial + 1)[0] for trial in range(TRIALS))
    print(f"RATE a CUDA graph replayed after the program {'kept' if keep else 'dropped'} its input and made a tensor "
          f"of its size: right {right}/{TRIALS} (simulator: {kinds or 'clean'}, right {sim.result[0]}) {_where()}",
          flush=True)
    assert kinds == ([] if keep else ["illegal-access"])
    assert sim.result[0] == keep
    assert right == (TRIALS if keep else 0)


# -- CUDA IPC: a received tensor dropped ---------------------------------------------------------------------------


@pytest.mark.parametrize(("read_on", "keep", "right"), [
    ("current", True, True), ("side", True, False), ("side-recorded", True, False),
    ("side", False, True), ("side-recorded", False, True),
])
def test_a_dropped_received_tensor_s_block_waits_for_the_current_stream_or_for_all(read_on: str, keep: bool,
                                                                                   right: bool, cycles: int) -> None:
    sim = simdevice.cuda().run(programs.drop_a_received_tensor, read_on, keep, 10_000_000)
    streams = (torch.cuda.Stream(),)
    programs.drop_a_received_tensor("current", True, cycles, streams)  # warm-up: the kernels loaded, blocks cached
    got = [programs.drop_a_received_tensor(read_on, keep, cycles, streams) for _ in range(TRIALS)]
    print(f"RATE a received tensor dropped, read on the {read_on} stream, {'another' if keep else 'no other'} "
          f"tensor of its segment held: right {sum(got)}/{TRIALS} (simulator: {'right' if sim.result else 'wrong'}, "
          f"{'race' if sim.reports else 'clean'}) {_where()}", flush=True)
    assert sim.result == right
    assert sum(got) == (TRIALS if right else 0)


def test_a_child_s_write_to_a_received_tensor_is_done_when_it_has_ended(cycles: int) -> None:
    sim = simdevice.cuda().run(programs.child_writes_and_ends, 10_000_000)
    programs.child_writes_and_ends(cycles)  # warm-up
    got = [programs.child_writes_and_ends(cycles) for _ in range(TRIALS)]
    print(f"RATE a child's write to a received tensor, read after join: right {sum(got)}/{TRIALS} (simulator: "
          f"{'right' if sim.result else 'wrong'}, {'race' if sim.reports else 'clean'}) {_where()}", flush=True)
    assert sim.result
    assert sim.reports == ()
    assert sum(got) == TRIALS


# -- torchao's CPUOffloadOptimizer --------------------------------------------------------------------------------


@pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao is not installed")
@pytest.mark.parametrize(("line", "racy"), programs.torchao_lines() + programs.TORCHAO_SCALED_LINES)
def test_torchao_s_optimizer_and_its_mutants(line: str, racy: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    s = Schedule.parse(line)
    t = resolve(s.program)
    sim = t.run(s)
    t.run(s, "cuda")  # warm-up, not counted
    bad = 0
    first = ""
    for _ in range(TRIALS):
        out = t.run(s, "cuda")
        if not out.clean:
            bad += 1
            first = first or out.verdict() + ": " + "; ".join(out.problems)[:200]
    print(f"RATE {line} wrong {bad}/{TRIALS} (simulator: {sim.verdict()}) {_where()}"
          + (f" first: {first}" if first else ""), flush=True)
    assert sim.clean != racy
    if racy:
        assert bad >= 1, "the stalled racy run's weights came out right on the GPU"
    else:
        assert bad == 0


if __name__ == "__main__":
    if sys.argv[1] == "pause":
        _pause_main(sys.argv[2] == "1", int(sys.argv[3]))
    sys.stdout.flush()
    os._exit(0)
