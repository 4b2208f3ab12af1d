"""Plain torch.cuda programs, unmodified, on a real GPU under the schedule lines the simulator prints.

For each drop-in example (``examples/offload_plain.py``) and Megatron's real offload module
(``tests/upstream/megatron_offload.py``, with the extra ``upstream``): the per-actor operation counts of the GPU
run equal the simulator's, so a line means the same operation on both; a stalled racy line corrupts; the same stall
with the fix does not. Each rate follows one warm-up run of its line (a cold caching allocator's ``cudaMalloc``
synchronizes the device, which hides a race in the first run of a process). Each case prints
``RATE <line> corrupted K/N``; record them in docs/confirmations.md. Run:
``python -m pytest -q -s tests/gpu/test_dropin_gpu.py``.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

from reference.schedule import Schedule
from simdevice.search.targets import resolve

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import hazards  # (tests/, on the path through its conftest)

ROOT = Path(__file__).resolve().parents[2]
TRIALS = int(os.environ.get("DROPIN_GPU_TRIALS", "20"))
HAS_MEGATRON = importlib.util.find_spec("megatron") is not None
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
DECODE = "tests/upstream/transformers_offload.py::decode"
HAS_DIFFUSERS = importlib.util.find_spec("diffusers") is not None and importlib.util.find_spec("accelerate") is not None
GROUPS = "tests/upstream/diffusers_offload.py::offload"
TRAIN = "tests/upstream/megatron_offload.py::train"
#: the stalls that make each racy example corrupt on a GPU (the simulator needs none: it reports the race itself)
STALLED = {
    "reload": "d2h_stream#0+20",
    "freed": "side#0+20",
    "gather": "nccl#0+20",
}
#: lines whose run ends the same way on both machines (a racy program unstalled usually passes its own check on a
#: GPU and fails it on the simulator, and stops there: its later operations are then counted on one side only)
EXAMPLES = [f"examples/offload_plain.py::{p}_{v}::{STALLED[p]}" for p in STALLED for v in ("racy", "correct")] + [
    f"examples/offload_plain.py::{p}_correct" for p in STALLED
]
#: the line the search prints for the inline-reload race (the smallest model, no delay), stalled for the GPU
SHRUNK_STALLED = f"{TRAIN}::d2h_stream#0+20"
MEGATRON = [SHRUNK_STALLED, f"{TRAIN}_fixed::d2h_stream#0+20", f"{TRAIN}:layers=2:d2h_stream#0+20",
            f"{TRAIN}_fixed:layers=2:d2h_stream#0+20", f"{TRAIN}_fixed", f"{TRAIN}_fixed:layers=2,mb=2,iters=2"]


@pytest.fixture(autouse=True)
def _at_the_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


def _counts_match(line: str, world_size: int | None = None) -> None:
    s = Schedule.parse(line)
    t = resolve(s.program, world_size)
    sim = t.run(s)
    t.run(s, "cuda")  # warm-up: a cold caching allocator's cudaMalloc synchronizes the device, hiding the race
    gpu = t.run(s, "cuda")
    want = {k: v for k, v in sim.run.op_counts.items() if v}
    got = {k: v for k, v in gpu.run.op_counts.items() if v}
    print(f"COUNTS {line} sim={sorted(want.items())} {sim.verdict()} gpu={sorted(got.items())} {gpu.verdict()}")
    assert sim.corrupted == gpu.corrupted
    assert got == want


@pytest.mark.parametrize("line", EXAMPLES)
def test_example_operation_counts_are_the_simulators(line: str) -> None:
    _counts_match(line)


def test_backward_runs_on_the_forward_ops_streams_as_the_simulator_runs_it() -> None:
    """A forward on a side stream, ``backward()`` on the default one (``tests/hazards.py``): on both machines each
    backward op is counted on its forward op's stream, and the gradient is right under a stall of either stream."""
    line = "tests/hazards.py::backward_off_its_stream"
    _counts_match(line)
    assert rate(f"{line}::s#0+5") == 0
    assert rate(f"{line}::default#3+5") == 0


@pytest.mark.parametrize(("program", "stall"), [("singleton_stream_reload", "D2H#0+20"),
                                                ("device_block_reload", "side#0+20"),
                                                ("printed_reload", "default#1+20"),
                                                ("streams_module_reload", "prefetch#0+20")])
def test_streams_kept_in_a_module_tensors_made_in_a_device_block_and_prints_run_as_simulated(program: str,
                                                                                           stall: str) -> None:
    """A stream kept in a module global (the simulated runs before the GPU's leave none behind), a tensor made in
    a ``with torch.device("cuda")`` block (a device tensor on both), a print that reads the tensor (and waits for its
    stream, on both): the same counts on both machines (but after a print: a GPU's makes many small reads where the
    simulator makes one copy), and the stalled D2H read at once corrupts where the synchronized one does not."""
    line = f"tests/hazards.py::{program}"
    if program != "printed_reload":
        _counts_match(line)
        _counts_match(f"{line}::{stall}")
    assert rate(f"{line}:wait=0:{stall}") >= TRIALS - 1
    assert rate(f"{line}::{stall}") == 0


def test_weights_prefetched_under_inference_mode_count_as_simulated_and_unwaited_corrupt() -> None:
    """``tests/hazards.py::inference_prefetch``: under ``inference_mode`` torch runs ``to`` whole, below autograd's
    decomposition; the counting mode decomposes it as the simulator does, so both count ``prefetch``'s one copy, and
    the stalled prefetch the current stream does not wait for corrupts where the waited one does not."""
    line = "tests/hazards.py::inference_prefetch"
    _counts_match(line)
    _counts_match(f"{line}::prefetch#0+20")
    assert rate(f"{line}:wait=0:prefetch#0+20") >= TRIALS - 1
    assert rate(f"{line}::prefetch#0+20") == 0


def test_a_stream_a_custom_backward_sets_is_put_back_after_its_node() -> None:
    """``tests/hazards.py::backward_sets_its_stream``: a custom Function's backward leaves ``side`` current
    (``set_stream``); the engine's guard puts the default stream back for the next node and the caller. The same
    counts on both machines, and clean under a stall of either stream (the gradient's writer is ordered before the
    caller's read on both)."""
    line = "tests/hazards.py::backward_sets_its_stream"
    _counts_match(line)
    assert rate(f"{line}::side#0+20") == 0
    assert rate(f"{line}::default#2+20") == 0


@pytest.mark.parametrize(("wait", "corrupts"), [(1, False), (0, True)])
def test_a_function_scripted_in_the_run_counts_and_corrupts_as_simulated(wait: int, corrupts: bool) -> None:
    """``tests/hazards.py::scripted_side_read``: a function TorchScript compiles in the run, called on ``side``, its
    output copied into ``out`` (``side``'s sixth operation, stalled: the host waited for ``side`` at its
    ``torch.tensor``, a blocking copy), read on the default stream with or without a wait. The same counts on both
    machines."""
    line = f"tests/hazards.py::scripted_side_read:wait={wait}:side#5+20"
    _counts_match(line)
    bad = rate(line)
    assert bad >= TRIALS - 1 if corrupts else bad == 0


@pytest.mark.parametrize(("release", "corrupts"), [(1, False), (0, True)])
def test_empty_cache_that_gives_a_segment_back_waits_for_the_device(release: int, corrupts: bool) -> None:
    """``tests/hazards.py::emptied_cache_read``: ``empty_cache`` that calls ``cudaFree`` (a segment entirely free)
    waits for the whole device, so the stalled D2H on ``side`` has landed when the host reads it; one with nothing
    to give back waits for nothing. The same counts on both machines."""
    line = f"tests/hazards.py::emptied_cache_read:release={release}"
    _counts_match(f"{line}:side#0+20")
    bad = rate(f"{line}:side#0+20")
    assert bad >= TRIALS - 1 if corrupts else bad == 0


@pytest.mark.parametrize(("program", "stall"), [("accelerator_reload", "side#0+20"),
                                                ("loader_batch_reused", "default#0+20"),
                                                ("lazy_model_reload", "side#0+20"),
                                                ("legacy_type_reload", "default#0+20"),
                                                ("meta_model_reload", "side#0+20"),
                                                ("device_index_reload", "side#0+20"),
                                                ("loaded_checkpoint_reload", "side#0+20"),
                                                ("compiled_reload", "side#0+20"),
                                                ("inplace_views_reload", "side#0+20"),
                                                ("subclass_reload", "side#0+20"),
                                                ("nested_reload", "side#0+20"),
                                                ("profiled_reload", "side#0+20"),
                                                ("amp_reload", "side#0+20"),
                                                ("registered_reload", "side#0+20"),
                                                ("printed_pinned_reload", "side#0+20"),
                                                ("unwritten_staging_read", "side#0+20"),
                                                ("storage_onload", "side#0+20"),
                                                ("sequential_offload", "default#0+20")])
def test_device_agnostic_code_and_a_loader_s_pinned_batch_run_as_simulated(program: str, stall: str) -> None:
    """``tests/hazards.py::accelerator_reload`` (``torch.accelerator``, generic ``torch.Stream`` and ``torch.Event``)
    and ``loader_batch_reused`` (a ``DataLoader(pin_memory=True)`` batch, pinned on both machines, zeroed by the host
    while its H2D may read it), and ``lazy_model_reload`` (a lazy model moved to the device before its first
    forward, its parameters made there), and ``legacy_type_reload`` (``torch.cuda.FloatTensor``, older code's legacy
    type, made and moved to), and ``meta_model_reload`` (a model built on the meta device, given memory by
    ``to_empty``), and ``device_index_reload`` (the device named by its index), and ``loaded_checkpoint_reload``
    (``torch.load(path, map_location="cuda")``), and ``compiled_reload`` (``torch.compile``, run eagerly on both),
    and ``inplace_views_reload`` (``unsqueeze_``, ``t_``, ``is_same_size``: no operation on either), and
    ``subclass_reload`` and ``nested_reload`` (a wrapper tensor subclass's ops, its backward, a jagged tensor), and
    ``profiled_reload`` (``torch.profiler`` with its CUDA activity, the copy read inside its block), and
    ``amp_reload`` (a bfloat16 activation under ``torch.autocast``, a weight cast once), and ``registered_reload``
    (a host buffer pinned in place by ``cudaHostRegister``), and ``printed_pinned_reload`` (a pinned buffer printed),
    and ``unwritten_staging_read`` (a staging buffer from a host ``empty``, poisoned on both: the waited line's
    check of the poison holds only where the GPU's run poisons host memory too), and ``storage_onload`` (a
    parameter offloaded, released and brought back by its storage), and ``sequential_offload`` (blocks moved to the
    device and back while a forward's graph holds views of their weights):
    the same counts on both, the unwaited line corrupted under the stall, the waited one not."""
    line = f"tests/hazards.py::{program}"
    _counts_match(line)
    _counts_match(f"{line}::{stall}")
    assert rate(f"{line}:wait=0:{stall}") >= TRIALS - 1
    assert rate(f"{line}::{stall}") == 0


def test_python_data_put_on_the_device_is_no_operation_and_its_copy_waits_for_the_stream() -> None:
    """``torch.tensor([...], device="cuda")`` and its kin (``tests/hazards.py::python_data_on_device``): torch copies
    Python data below the dispatch modes, so neither machine counts an operation for it, where a NumPy array's or a
    host tensor's ``.to()`` is one on both; the copy is blocking, so the stalled D2H before it has landed when the
    host reads it (and, without it, does not)."""
    line = "tests/hazards.py::python_data_on_device"
    _counts_match(line)
    _counts_match(f"{line}::default#3+20")
    assert rate(f"{line}::default#3+20") == 0
    assert rate(f"{line}:wait=0:default#3+20") >= TRIALS - 1


@pytest.mark.parametrize(("kind", "waits"), [(0, True), (1, True), (2, False), (3, False)])
def test_a_number_assigned_is_one_operation_and_waits_where_torch_copies_it(kind: int, waits: bool) -> None:
    """``t[0] = 2.0``, ``t[idx] = 1.0``, ``t[2:4] = 3.0``, ``t[mask] = 1.0`` (``tests/hazards.py::assigned_numbers``):
    one operation on both machines, and the host waits for the stalled D2H before it at the first two (a blocking
    copy of the number), not at the others."""
    stalled = f"tests/hazards.py::assigned_numbers:kind={kind}:default#3+20"
    _counts_match(stalled)  # (unstalled, the racy two read early on the simulator and not always on a GPU)
    got = rate(stalled)
    assert (got == 0) if waits else (got >= TRIALS - 1), got


def test_backward_through_a_list_index_waits_for_nothing() -> None:
    """``table[[1, 3]]`` and ``table[np.array(...)]`` (``tests/hazards.py::list_index_backward``): the same counts on
    both machines (the NumPy array's move is one operation, the list's copy none), and backward's ``index_put`` takes
    the saved device indices without waiting for the stream: the host refills the pinned buffer under the stalled
    H2D before it, unless the program synchronizes the stream."""
    line = "tests/hazards.py::list_index_backward"
    _counts_match(f"{line}:wait=1")
    _counts_match(f"{line}:wait=1:default#7+20")
    assert rate(f"{line}::default#7+20") >= TRIALS - 1
    assert rate(f"{line}:wait=1:default#7+20") == 0


def test_a_pinned_snapshot_saved_before_its_copy_landed_is_corrupt_and_after_a_sync_is_not() -> None:
    """``torch.save`` of a pinned snapshot (``tests/hazards.py::pinned_snapshot_saved``) reads its bytes below the
    dispatcher: no operation on either machine; under a stalled D2H it saves what the snapshot held before, unless
    the host synchronizes the stream first."""
    line = "tests/hazards.py::pinned_snapshot_saved"
    _counts_match(f"{line}:wait=1:default#1+20")
    assert rate(f"{line}::default#1+20") >= TRIALS - 1
    assert rate(f"{line}:wait=1:default#1+20") == 0


def test_a_staging_buffer_filled_through_numpy_during_its_copy_is_corrupt_and_after_a_sync_is_not() -> None:
    """``tests/hazards.py::numpy_staging_filled``: the host fills a pinned buffer through a NumPy view (no operation
    on either machine) while the stalled H2D from it has not read it yet: the device gets the next step's values,
    unless the host synchronizes the stream first."""
    line = "tests/hazards.py::numpy_staging_filled"
    _counts_match(f"{line}:wait=1:default#0+20")
    assert rate(f"{line}::default#0+20") >= TRIALS - 1
    assert rate(f"{line}:wait=1:default#0+20") == 0


def test_a_stream_context_entered_again_leaves_its_stream_current() -> None:
    """``tests/hazards.py::reentered_stream_context``: after ``with ctx: with ctx:``, torch leaves the context's
    stream current, as the simulator does (its assertion holds on both machines), and the counts are equal."""
    _counts_match("tests/hazards.py::reentered_stream_context")
    assert rate("tests/hazards.py::reentered_stream_context::s#0+20") == 0


def test_a_stream_made_32_streams_later_is_the_same_stream_as_on_the_simulator() -> None:
    """``tests/hazards.py::pooled_layer_streams``: CUDA's pool hands layer 32 layer 0's stream, so its read is ordered
    after layer 0's stalled write (never corrupt, as the simulator finds it clean), and counted on the same stream
    name on both machines; layer 1's stream is another, and its read races the stalled write."""
    line = "tests/hazards.py::pooled_layer_streams"
    _counts_match(f"{line}::streams#0+20")
    assert rate(f"{line}::streams#0+20") == 0
    assert rate(f"{line}:reader=1:streams#0+20") >= TRIALS - 1


@pytest.mark.skipif(not HAS_MEGATRON, reason="megatron-core is not installed (the extra 'upstream')")
@pytest.mark.parametrize("line", MEGATRON)
def test_megatron_operation_counts_are_the_simulators(line: str) -> None:
    _counts_match(line)


def rate(line: str) -> int:
    s = Schedule.parse(line)
    t = resolve(s.program)
    bad = 0
    first = ""
    t.run(s, "cuda")  # warm-up, not counted
    for _ in range(TRIALS):
        out = t.run(s, "cuda")
        if not out.clean:
            bad += 1
            first = first or out.verdict() + ": " + "; ".join(out.problems)[:200]
    print(f"RATE {line} corrupted {bad}/{TRIALS} (torch {torch.__version__}, {torch.cuda.get_device_name()})"
          + (f" first: {first}" if first else ""))
    return bad


@pytest.mark.parametrize("protocol", sorted(STALLED))
def test_a_stalled_racy_example_corrupts_and_its_fix_does_not(protocol: str) -> None:
    stall = STALLED[protocol]
    assert rate(f"examples/offload_plain.py::{protocol}_racy::{stall}") >= TRIALS - 1
    assert rate(f"examples/offload_plain.py::{protocol}_correct::{stall}") == 0


@pytest.mark.skipif(not HAS_MEGATRON, reason="megatron-core is not installed (the extra 'upstream')")
@pytest.mark.parametrize("tail", ["::d2h_stream#0+20", ":layers=2:d2h_stream#0+20"])
def test_megatrons_inline_reload_corrupts_with_a_stalled_d2h_and_the_fix_does_not(tail: str) -> None:
    assert rate(f"{TRAIN}{tail}") >= TRIALS - 1
    assert rate(f"{TRAIN}_fixed{tail}") == 0


#: a pipeline's hand-off on two ranks (``--world-size 2``), its send stalled on the pair's stream
PIPELINE = [f"examples/pipeline_plain.py::handoff_{v}::rank0.p2p1-nccl#0+20" for v in ("racy", "correct")]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="two ranks need two GPUs")
@pytest.mark.parametrize("line", [*PIPELINE, "examples/pipeline_plain.py::handoff_correct"])
def test_point_to_point_operation_counts_on_two_ranks_are_the_simulators(line: str) -> None:
    # each rank a process and a GPU of its own, as `replay --gpu --world-size 2` runs it
    _counts_match(line, world_size=2)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="two ranks need two GPUs")
@pytest.mark.parametrize("line", PIPELINE)
def test_a_send_buffer_refilled_before_the_wait_corrupts_and_the_fix_does_not(line: str) -> None:
    s = Schedule.parse(line)
    t = resolve(s.program, 2)
    trials = max(1, TRIALS // 4)  # (each run starts two processes and their NCCL communicators)
    bad = sum(t.run(s, "cuda").corrupted for _ in range(trials))
    print(f"RATE {line} corrupted {bad}/{trials}")
    assert bad >= 1 if "racy" in line else bad == 0


@pytest.mark.parametrize("line", [f"examples/offload_plain.py::gather_{v}::rank0.nccl#0+20" for v in ("racy",
                                                                                                 "correct")])
def test_plain_code_on_a_world_of_one_rank_counts_as_simulated(line: str) -> None:
    # `--world-size 1`: actor rank0, in this process, its NCCL group of one made before the program runs
    _counts_match(line, world_size=1)


#: the collectives of tests/collective_programs.py on a world of one, stalled on the collective, read after the wait
#: (wait=1) or not (wait=0)
COLLECTIVES = [f"tests/collective_programs.py::exchange:call={c},wait={w}:rank0.nccl#0+20"
               for c in ("a2a_single", "a2a", "reduce_scatter", "self_batch") for w in (0, 1)] + [
    f"tests/collective_programs.py::torchrun_style:wait={w}:rank0.nccl#0+20" for w in (0, 1)]


@pytest.mark.parametrize("line", COLLECTIVES)
def test_collectives_on_a_world_of_one_count_and_corrupt_as_simulated(line: str) -> None:
    _counts_match(line, world_size=1)
    s = Schedule.parse(line)
    t = resolve(s.program, 1)
    trials = max(1, TRIALS // 4)
    bad = sum(t.run(s, "cuda").corrupted for _ in range(trials))
    print(f"RATE {line} corrupted {bad}/{trials}")
    assert bad >= 1 if "wait=0" in line else bad == 0


#: a future's value dropped under a stalled read on the callback's stream, a stream that waited for the future, or
#: one that waited for the work alone (``tests/collective_programs.py::future_value``)
FUTURES = {"then:rank0.s1#0+20": False, "wait:rank0.side#0+20": False, "work:rank0.side#0+20": True}


@pytest.mark.parametrize("tail", list(FUTURES))
def test_a_future_holds_its_value_for_the_stream_that_reads_it_as_simulated(tail: str) -> None:
    """torch's future records its value on the callback's stream and on the stream that waits for it: the next
    allocation takes another block and the stalled read is right; after the work's own ``wait()`` nothing holds
    it, and the allocation's zeros are read. The same counts on both machines."""
    _on_a_world_of_one(f"tests/collective_programs.py::future_value:via={tail}", FUTURES[tail])


def _on_a_world_of_one(line: str, corrupts: bool) -> None:
    """``line``'s counts equal on both machines, a world of one rank; corrupted in nearly every trial on the GPU
    where ``corrupts``, in none where not."""
    _counts_match(line, world_size=1)
    s = Schedule.parse(line)
    t = resolve(s.program, 1)
    bad = sum(t.run(s, "cuda").corrupted for _ in range(TRIALS))
    print(f"RATE {line} corrupted {bad}/{TRIALS}")
    assert bad >= TRIALS - 1 if corrupts else bad == 0


COLLECTED = {"wait_all": False, "each": False, "collected": True}


@pytest.mark.parametrize("via", list(COLLECTED))
def test_a_collected_future_orders_its_reader_as_simulated(via: str) -> None:
    """``torch.futures.collect_all`` of a work's future: its ``wait()`` alone orders no stream, so the default
    stream's read of the stalled gather's output comes first; ``wait_all`` and each future's ``wait()`` order it.
    The same counts on both machines (``collect_all`` a host step, each ``wait()`` one)."""
    _on_a_world_of_one(f"tests/collective_programs.py::collected_futures:via={via}:rank0.nccl#0+20", COLLECTED[via])


@pytest.mark.parametrize("nprocs", [1, 2])
def test_a_script_written_for_mp_spawn_counts_and_corrupts_as_simulated(nprocs: int) -> None:
    """``tests/collective_programs.py::spawned``: a ``main`` that starts its ranks with ``torch.multiprocessing.spawn``
    (a process and a GPU each, as ``replay --gpu`` starts them; one rank in this process), each gathering: the same
    counts as the simulator's, the read without the wait corrupted under the stall, the waited one not."""
    if nprocs > torch.cuda.device_count():
        pytest.skip(f"{nprocs} ranks need {nprocs} GPUs")
    for wait in (1, 0):
        line = f"tests/collective_programs.py::spawned:nprocs={nprocs},wait={wait}:rank0.nccl#0+20"
        _counts_match(line)
        s = Schedule.parse(line)
        t = resolve(s.program)
        trials = max(1, TRIALS // 4)  # (each run starts its ranks' processes and their NCCL communicators)
        bad = sum(t.run(s, "cuda").corrupted for _ in range(trials))
        print(f"RATE {line} corrupted {bad}/{trials}")
        assert bad >= trials - 1 if not wait else bad == 0


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers is not installed (the extra 'upstream')")
def test_transformers_offloaded_cache_runs_as_simulated() -> None:
    """``tests/upstream/transformers_offload.py``: transformers' real offloaded KV cache. With two offloaded layers and
    the offload's first D2H stalled (``default#5+20``): the counts are equal, the cache is right, and the mutant
    without the prefetch stream's wait for the compute stream reads the pinned buffer before the D2H fills it. With
    one offloaded layer and its first prefetch stalled, upstream's own race: the concatenation reads the keys before
    their H2D lands."""
    stalled = f"{DECODE}:sliding=0:default#5+20"
    mutant = f"{DECODE}_without_prefetch_wait:sliding=0:default#5+20"
    single = f"{DECODE}:full=1,sliding=0:prefetch_stream#0+20"
    single_static = f"{DECODE}:full=1,sliding=0,static=1:prefetch_stream#0+20"  # (a StaticCache: the same race)
    for line in (stalled, mutant, single, single_static):
        _counts_match(line)
    assert rate(stalled) == 0
    assert rate(mutant) >= TRIALS - 1
    assert rate(single) >= TRIALS - 1
    # (15/20 on an H100: the prefetch's fresh block is often the one the keys had before their offload, still
    # holding them, so the attention before the late H2D reads right; the H2D then writes the offloaded copy, without
    # the step's new key, over the cache)
    assert rate(single_static) >= TRIALS // 2


@pytest.mark.skipif(not HAS_DIFFUSERS, reason="diffusers and accelerate are not installed (the extra 'upstream')")
@pytest.mark.parametrize(("mutant", "stall"), [("without_side_sync", "stream#16+20"),
                                               ("without_compute_sync", "default#5+20")])
def test_diffusers_group_offloading_runs_as_simulated(mutant: str, stall: str) -> None:
    """``tests/upstream/diffusers_offload.py``: diffusers' real group offloading on a stream (weights swapped in and
    out with ``param.data = ...``). Under the stall that shows the mutant's race (the second forward's first onload
    H2D late: the first forward onloads with blocking copies, as diffusers' lazy prefetch hook sets them; a compute
    op late while the next onload takes the block it reads): the counts are equal, upstream's code is right, the
    mutant reads wrong weights."""
    for line in (f"{GROUPS}::{stall}", f"{GROUPS}_{mutant}::{stall}"):
        _counts_match(line)
    assert rate(f"{GROUPS}::{stall}") == 0
    assert rate(f"{GROUPS}_{mutant}::{stall}") >= TRIALS - 1


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers is not installed (the extra 'upstream')")
def test_a_one_layer_llama_generates_wrong_tokens_with_the_offloaded_cache() -> None:
    """``tests/upstream/transformers_offload.py::generate``: a tiny Llama's ``generate(cache_implementation=
    "offloaded")``, end to end. With one layer and its first prefetch stalled, other tokens than the host's; with two,
    the host's; the counts equal. (With eager attention: with transformers' default, SDPA, a GPU runs one fused
    kernel where the simulator runs the math path's ops, 25 more on the default stream here; docs/dropin.md.)"""
    one = "tests/upstream/transformers_offload.py::generate:attention=eager,layers=1:prefetch_stream#0+20"
    two = "tests/upstream/transformers_offload.py::generate:attention=eager:prefetch_stream#0+20"
    for line in (one, two):
        _counts_match(line)
    assert rate(one) >= TRIALS - 1
    assert rate(two) == 0


@pytest.mark.parametrize("name", sorted(hazards.PIN_FACTORIES))
def test_a_factory_asked_to_pin_gives_what_the_simulator_gives(name: str) -> None:
    """``tests/hazards.py``'s ``PIN_FACTORIES`` on real CUDA: a device factory asked to pin raises ATen's error, a
    host one pins (the simulator's answers, checked on the CPU by
    ``tests/property/dropin/test_a_device_factory_asked_to_pin_raises_as_on_a_gpu.py``)."""
    got = hazards.pin_factory_outcome(name)
    print(f"PIN {name}: {got!r}", flush=True)
    assert got == hazards.PIN_FACTORIES[name][1]


@pytest.mark.parametrize("name", sorted(hazards.ERRORS_AT_THE_CALL))
def test_a_call_raises_what_the_simulator_raises_when_it_raises_it(name: str) -> None:
    """``tests/hazards.py``'s ``ERRORS_AT_THE_CALL`` on real CUDA: the exception, its message's start, and whether
    the stream behind it had finished when it was raised (checked on the CPU by
    ``tests/property/dropin/test_errors_at_the_call_are_a_gpu_s.py``)."""
    got = hazards.error_at_the_call_outcome(name)
    print(f"ERROR {name}: {got!r}", flush=True)
    assert got == hazards.ERRORS_AT_THE_CALL[name][1]


@pytest.mark.parametrize("name", sorted(hazards.AUTOCAST_CASES))
def test_autocast_casts_what_the_simulator_casts(name: str) -> None:
    """``tests/hazards.py``'s ``AUTOCAST_CASES`` under real CUDA autocast: each result's dtype (or the error) as the
    simulator gives it (``tests/property/dropin/test_autocast.py``)."""
    got = hazards.autocast_outcome(name)
    print(f"AUTOCAST {name}: {got}", flush=True)
    assert got == hazards.AUTOCAST_CASES[name][1]


@pytest.mark.parametrize("mode", ["warn", "error"])
@pytest.mark.parametrize("name", sorted(hazards.SYNC_DEBUG_CASES))
def test_the_sync_debug_mode_flags_what_the_simulator_flags(name: str, mode: str) -> None:
    """``tests/hazards.py``'s ``SYNC_DEBUG_CASES`` under real ``torch.cuda.set_sync_debug_mode``: each call flagged
    as synchronizing, or not, as the simulator flags it (``tests/property/dropin/test_sync_debug_mode.py``)."""
    got = hazards.sync_debug_outcome(name, mode)
    print(f"SYNC_DEBUG {mode} {name}: {got}", flush=True)
    assert got == ("flagged" if hazards.SYNC_DEBUG_CASES[name][1] else "not flagged")


@pytest.mark.parametrize("name", sorted(hazards.MODULE_PROGRAMS))
def test_a_module_computes_on_the_gpu_what_it_computes_on_the_host(name: str) -> None:
    """``tests/hazards.py``'s ``MODULE_PROGRAMS`` on real CUDA give the host's results, as the simulator's do
    (``tests/property/dropin/test_common_modules_run_as_on_a_gpu.py``): a packed sequence's batch sizes and lengths
    host tensors on both."""
    want = {k: hazards.module_on_the_host(v) for k, v in hazards.MODULE_PROGRAMS[name]("cpu").items()}
    got = {k: hazards.module_on_the_host(v) for k, v in hazards.MODULE_PROGRAMS[name]("cuda").items()}
    differ = [key for key in want if not hazards.same_module_results(want[key], got[key])]
    print(f"MODULE {name}: {len(want) - len(differ)}/{len(want)} results as on the host; differ: {differ}", flush=True)
    assert not differ


@pytest.mark.parametrize("name", ["round_trip", "grad_left_behind", "freed_on_the_host", "backward_on_the_host",
                                  "version_of_its_own"])
def test_a_parameter_moved_and_back_is_one_tensor_as_simulated(name: str) -> None:
    """``tests/moved_parameters.py``: what the program returns on the GPU (plain torch.cuda, ``set_data`` keeping one
    tensor) is what the simulator returns: the graph's accumulations, a new node after the round trip, the
    gradient left on its side, the device bytes freed by the move, a backward on the host's side, its own version
    counter."""
    import moved_parameters

    import simdevice

    fn = getattr(moved_parameters, name)
    s = simdevice.cuda()
    s.run(fn)
    assert s.result is not None
    gpu = fn()
    print(f"RATE moved_parameters.{name}: gpu {gpu} sim {s.result.result} (torch {torch.__version__})")
    assert gpu == s.result.result
