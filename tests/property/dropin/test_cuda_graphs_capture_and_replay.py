"""CUDA graphs in plain torch.cuda code (``torch.cuda.CUDAGraph``, ``torch.cuda.graph``, ``make_graphed_callables``):
what a stream issues during a capture is recorded, not run, and each ``replay()`` issues it again on the current
stream, checked and computed as any other work. Before, making a graph raised ``NotImplementedError``: no verdict.

Mutations each fails (tried): a replay whose random ops draw with the capture's seed:
``test_a_random_op_in_a_graph_draws_anew_at_each_replay``; a replay issued on the stream the capture ran on, not the
current one: ``test_inputs_copied_on_another_stream_race_with_the_replay_unless_ordered`` (and seven others);
allocations during a capture from the ordinary pool: ``test_a_graph_s_temporaries_stay_in_its_pool``;
``empty_cache`` giving back a graph's pool, or never letting it go once the graph is reset:
``test_empty_cache_keeps_a_graph_s_pool_until_the_graph_is_reset``; nodes that hold the program's tensors (so that
their blocks are never freed), or no check of them at a replay:
``test_a_replay_that_reads_a_tensor_freed_since_the_capture_is_found``; a replay of every branch on the replay's
stream: ``test_two_branches_of_a_graph_run_side_by_side_at_its_replay``; no waits between the branches at a replay:
``test_a_stream_forked_into_a_capture_and_joined_replays_its_work``; a captured ``_sleep`` run at the capture, or
dropped at a replay, or a graph of one sleep called empty: ``test_a_captured_sleep_stalls_each_replay``; a memory
saver's pause of every region that
unmaps a graph's pool too: ``test_a_memory_saver_s_pause_of_every_region_leaves_a_graph_s_pool``.
"""

from __future__ import annotations

import inspect
import re
import warnings
from collections.abc import Callable

import pytest
import torch

import simdevice

N = 1 << 12


def _once(fn: Callable[[], None]) -> simdevice.DropIn:
    sim = simdevice.cuda()
    sim.run(fn)
    return sim


def _replays() -> None:
    static_in = torch.zeros(N, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_out = static_in * 2 + 1
    seen = []
    for k in range(3):
        static_in.copy_(torch.full((N,), float(k)))
        g.replay()
        seen.append(static_out.clone())
    for k, out in enumerate(seen):
        assert torch.equal(out.cpu(), torch.full((N,), 2.0 * k + 1)), k


def test_each_replay_computes_on_the_inputs_as_they_are_then() -> None:
    run = _once(_replays)
    assert run.clean, run.text()


def _nothing_runs_at_capture() -> None:
    x = torch.ones(N, device="cuda")
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.graph(g, stream=s):
        assert torch.cuda.is_current_stream_capturing()
        x.mul_(3)
    assert not torch.cuda.is_current_stream_capturing()
    assert torch.equal(x.cpu(), torch.ones(N))  # captured, not run
    g.replay()
    g.replay()
    assert torch.equal(x.cpu(), torch.full((N,), 9.0))


def test_a_capture_runs_nothing_and_each_replay_runs_it_once() -> None:
    run = _once(_nothing_runs_at_capture)
    assert run.clean, run.text()


def _random_replays() -> None:
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        r = torch.rand(N, device="cuda")
    g.replay()
    first = r.cpu()
    g.replay()
    assert not torch.equal(first, r.cpu())


def test_a_random_op_in_a_graph_draws_anew_at_each_replay() -> None:
    """torch registers the device generator's state with a graph, and each replay moves its offset on."""
    run = _once(_random_replays)
    assert run.clean, run.text()


def _copied_in(ordered: bool) -> None:
    static_in = torch.zeros(N, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_out = static_in * 2
    copy = torch.cuda.Stream()
    host = torch.ones(N).pin_memory()
    for _ in range(2):
        if ordered:
            copy.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(copy):
            static_in.copy_(host, non_blocking=True)
        if ordered:
            torch.cuda.current_stream().wait_stream(copy)
        g.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_out.cpu(), torch.full((N,), 2.0))


def _copied_in_ordered() -> None:
    _copied_in(True)


def _copied_in_unordered() -> None:
    _copied_in(False)


def test_inputs_copied_on_another_stream_race_with_the_replay_unless_ordered() -> None:
    """The usual pattern (static inputs filled on a copy stream, then a replay) is clean when the current stream waits
    for the copy, and a race at the captured line when it does not: the replay runs on the stream current then."""
    found = simdevice.explore(_copied_in_ordered, max_examples=40)
    assert found.failure is None, found.failure.text()
    found = simdevice.explore(_copied_in_unordered, max_examples=40)
    assert found.failure is not None
    races = [r for r in found.failure.run.reports if r.kind == "race"]
    assert races, found.failure.text()
    # (the replayed op is issued at the replay's line, and named with the line that captured it)
    named = [re.search(r"mul \(graph1, captured at \S+:(\d+)\) on stream default #\d+ \(\S+:(\d+)\)", str(r))
             for r in races if "copy_ (H2D) on stream copy" in str(r)]
    assert named, races
    assert all(m is not None and m[1] != m[2] for m in named), races
    source = inspect.getsource(_copied_in).splitlines()
    first = _copied_in.__code__.co_firstlineno
    assert "static_in * 2" in source[int(named[0][1]) - first]
    assert "g.replay()" in source[int(named[0][2]) - first]


def _temporaries_kept() -> None:
    x = torch.ones(N, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        t = x * 2
        out = t + 1
        del t
    torch.cuda.empty_cache()
    with torch.cuda.stream(s):  # the stream and size the temporary had: an ordinary block of its own
        y = torch.full((N,), 7.0, device="cuda")
    torch.cuda.current_stream().wait_stream(s)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), torch.full((N,), 3.0))
    assert torch.equal(y.cpu(), torch.full((N,), 7.0))


def test_a_graph_s_temporaries_stay_in_its_pool() -> None:
    """A tensor a capture allocated and freed is the graph's block still (its private pool): no allocation outside a
    capture takes it, and ``empty_cache`` keeps it, so each replay's temporary overwrites nothing of the program's."""
    run = _once(_temporaries_kept)
    assert run.clean, run.text()


def _pool_kept() -> None:
    big = 3 << 20  # (12 MiB: past CUDA's 10 MiB, each of these is a segment of its own)
    x = torch.ones(big, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        t = x * 2
        out = t + 1
        del t
    held = torch.cuda.memory_reserved()
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() == held  # the graph's pool: its freed temporary's segment kept
    g.replay()
    assert torch.equal(out.cpu(), torch.full((big,), 3.0))
    g.reset()
    del out
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() == held - 2 * big * 4  # no graph holds the pool: its two segments go


def test_empty_cache_keeps_a_graph_s_pool_until_the_graph_is_reset() -> None:
    """As CUDA's caching allocator keeps a private pool while a graph uses it: the replay's temporaries live in it."""
    run = _once(_pool_kept)
    assert run.clean, run.text()


def _pool_shared() -> None:
    big = 3 << 20
    x = torch.ones(big, device="cuda")
    g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(g1):
        t = x * 2
        out1 = t + 1
        del t
    with torch.cuda.graph(g2, pool=g1.pool()):  # (the same private pool; a small block, not the temporary's)
        out2 = x[:1024] * 4
    held = torch.cuda.memory_reserved()
    g1.reset()  # g2 holds the pool still
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() == held  # the temporary's free segment kept, the pool's
    g2.replay()
    assert torch.equal(out2.cpu(), torch.full((1024,), 4.0))
    g2.reset()
    del out1, out2
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() == big * 4  # none holds the pool: its segments go, x's is left


def test_a_pool_two_graphs_share_is_kept_until_both_are_reset() -> None:
    """Rule (``Graphs.let_go``): a private pool is held while any graph holds it. Mutation: a holder's let-go
    dropping the pool's count whatever holders are left (``empty_cache`` gave the pool's free segment back while
    ``g2`` held it)."""
    run = _once(_pool_shared)
    assert run.clean, run.text()


def _paused_everything() -> None:
    from torch_memory_saver import torch_memory_saver as tms

    with tms.region("weights", enable_cpu_backup=True):
        w = torch.ones(N, device="cuda")
    x = torch.ones(N, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = x * 2
    tms.pause()  # every region of the library's: not the graph's pool
    g.replay()
    torch.cuda.synchronize()
    tms.resume()
    assert torch.equal(out.cpu(), torch.full((N,), 2.0))
    assert torch.equal(w.cpu(), torch.ones(N))


def test_a_memory_saver_s_pause_of_every_region_leaves_a_graph_s_pool() -> None:
    """``torch_memory_saver.pause()`` unmaps the library's own regions; a graph's private pool is the caching
    allocator's, mapped still, and the replay writes its output there."""
    run = _once(_paused_everything)
    assert run.clean, run.text()


def _freed_input() -> None:
    x = torch.ones(N, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = x * 3
    del x  # the graph keeps no reference: its block goes back to the allocator
    y = torch.full((N,), 7.0, device="cuda")
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y.cpu(), torch.full((N,), 7.0))
    assert torch.equal(out.cpu(), torch.full((N,), 3.0))


def test_a_replay_that_reads_a_tensor_freed_since_the_capture_is_found() -> None:
    """On a GPU the replay reads whatever the freed block holds now (here ``y``'s sevens): wrong numbers, silently.
    Here the access is reported, naming the capture, and the numbers come out as a GPU's do."""
    run = _once(_freed_input)
    illegal = [r for r in run.reports if r.kind == "illegal-access"]
    assert illegal, run.text()
    assert "freed after graph1 was captured" in str(illegal[0])
    assert "mul (graph1, captured at " in str(illegal[0])
    host = [r for r in run.reports if r.kind == "host-error"]
    assert len(host) == 1, run.text()
    assert "21." in host[0].error, run.text()  # (y's sevens, times three)


def _fork_join(join: bool) -> None:
    x = torch.ones(N, device="cuda")
    g = torch.cuda.CUDAGraph()
    side, s = torch.cuda.Stream(), torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.graph(g, stream=s):
        side.wait_stream(s)  # side joins the capture
        a = x * 2
        with torch.cuda.stream(side):
            b = x * 3
        if join:
            s.wait_stream(side)
        c = a + b
    g.replay()
    assert torch.equal(c.cpu(), torch.full((N,), 5.0))


def _fork_joined() -> None:
    _fork_join(True)


def test_a_stream_forked_into_a_capture_and_joined_replays_its_work() -> None:
    run = _once(_fork_joined)
    assert run.clean, run.text()


def _fork_race(cycles: int = 10_000_000) -> None:
    x = torch.ones(N, device="cuda")
    g = torch.cuda.CUDAGraph()
    side, s = torch.cuda.Stream(), torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.graph(g, stream=s):
        side.wait_stream(s)
        torch.cuda._sleep(cycles)  # (captured: each replay's s branch stalls here)
        x.mul_(2)  # on s, after the fork: the side branch does not wait for it
        with torch.cuda.stream(side):
            y = x * 3
        s.wait_stream(side)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y.cpu(), torch.full((N,), 6.0))


def test_two_branches_of_a_graph_run_side_by_side_at_its_replay() -> None:
    """A joined stream's work replays on a stream of the graph's own, ordered by the waits the capture made: a read
    in one branch of what the other writes after the fork is a race, as on a GPU, where the graph's nodes on the two
    branches have no edge between them (a captured ``_sleep`` stalls the writing branch at each replay)."""
    run = _once(_fork_race)
    races = [str(r) for r in run.reports if r.kind == "race"]
    assert any("on stream graph1-side" in r and "mul_ (graph1, captured at" in r and "on stream default" in r
               for r in races), run.text()
    host = [r for r in run.reports if r.kind == "host-error"]
    assert len(host) == 1, run.text()  # (stalled, the side branch read x before the other doubled it: threes)
    assert "3." in host[0].error, host[0].error


def _captured_sleep() -> None:
    s = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        torch.cuda._sleep(10_000_000)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    g.replay()
    g.replay()
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) > 2 * 10.0  # (10 million cycles: 14.6 ms of the simulated device's clock)


def test_a_captured_sleep_stalls_each_replay() -> None:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        run = _once(_captured_sleep)
    assert not [w for w in seen if "The CUDA Graph is empty" in str(w.message)]  # one sleep is no empty graph
    assert run.clean, run.text()


def _item_in_capture() -> None:
    x = torch.ones(N, device="cuda")
    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        (x * 2).sum().item()


def _sync_in_capture() -> None:
    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        torch.ones(N, device="cuda")
        torch.cuda.synchronize()


def _fork_unjoined() -> None:
    _fork_join(False)


def _outside_wait() -> None:
    other = torch.cuda.Stream()
    with torch.cuda.stream(other):
        torch.ones(N, device="cuda")
    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        torch.cuda.current_stream().wait_stream(other)


def _captured_event_query() -> None:
    e = torch.cuda.Event()
    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        torch.ones(N, device="cuda")
        e.record()
        e.query()


def _pageable_copy_in_capture() -> None:
    x = torch.empty(N, device="cuda")
    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        x.copy_(torch.ones(N), non_blocking=True)


def _cpu_in_capture() -> None:
    x = torch.ones(N, device="cuda")
    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        (x * 2).cpu()


def _capture_on_the_default_stream() -> None:
    torch.cuda.CUDAGraph().capture_begin()


@pytest.mark.parametrize(("program", "error"), [
    (_item_in_capture, "operation failed due to a previous error during capture (CUDA error: operation not "
                       "permitted when stream is capturing (item on stream"),
    (_sync_in_capture, "(CUDA error: operation not permitted when stream is capturing (the device synchronized"),
    (_fork_unjoined, "CUDA error: capturing stream has unjoined work (stream(s) side"),
    (_outside_wait, "(CUDA error: dependency created on uncaptured work in another stream"),
    (_captured_event_query, "(CUDA error: operation not permitted on an event last recorded in a capturing stream"),
    (_pageable_copy_in_capture, "Cannot copy between CPU and CUDA tensors during CUDA graph capture unless the CPU "
                                "tensor is pinned"),
    (_cpu_in_capture, "Cannot copy between CPU and CUDA tensors during CUDA graph capture unless the CPU tensor is "
                      "pinned"),
    (_capture_on_the_default_stream, "CUDA graphs must be captured on a non-default stream"),
])
def test_what_cuda_refuses_during_a_capture_raises_its_error(program: Callable[[], None], error: str) -> None:
    """As torch raises them (the messages an H100 gave, docs/confirmations.md): a CUDA error at the call, which
    invalidates the capture, so that ``torch.cuda.graph``'s exit raises that the capture failed (the first error named
    in it); or torch's own refusal of a copy with pageable memory, which does not (its exit then warns that the graph
    is empty). A host error of the program's."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # (the empty graph's, where torch refused the one copy)
        run = _once(program)
    host = [r for r in run.reports if r.kind == "host-error"]
    assert len(host) == 1, run.text()
    assert error in host[0].error, host[0].error


def _other_thread_syncs(mode: str) -> None:
    import threading

    x = torch.ones(N, device="cuda")
    got: list[str] = []

    def sync() -> None:
        try:
            torch.cuda.synchronize()
        except RuntimeError as e:
            got.append(str(e).splitlines()[0])

    ended = ""
    try:
        with torch.cuda.graph(torch.cuda.CUDAGraph(), capture_error_mode=mode):
            x.mul_(2)
            t = threading.Thread(target=sync)
            t.start()
            t.join()
    except RuntimeError as e:
        ended = str(e).splitlines()[0]
    assert len(got) == 1, got
    assert got[0].startswith("CUDA error: operation not permitted when stream is capturing"), got
    assert ended.startswith("CUDA error: operation failed due to a previous error during capture"), ended


@pytest.mark.parametrize("mode", ["global", "thread_local", "relaxed"])
def test_another_thread_s_device_sync_during_a_capture_is_refused_in_every_mode(mode: str) -> None:
    """A device synchronization conflicts with any capture of the process, whatever its mode and thread: refused, and
    the capture invalidated (on an H100, in all three modes: docs/confirmations.md)."""
    run = _once(lambda: _other_thread_syncs(mode))
    assert run.clean, run.text()


def _graphed_callables() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 16).cuda()
    graphed = torch.cuda.make_graphed_callables(model, (torch.randn(4, 16, device="cuda", requires_grad=True),))
    for _ in range(2):
        x = torch.randn(4, 16, device="cuda", requires_grad=True)
        out = graphed(x)
        out.sum().backward()
        assert torch.allclose(out, torch.nn.functional.linear(x, model.weight, model.bias))
        assert torch.allclose(x.grad, model.weight.sum(0).expand(4, 16))


def test_torch_s_make_graphed_callables_runs_on_the_simulated_graphs() -> None:
    run = _once(_graphed_callables)
    assert run.clean, run.text()


def test_a_run_that_captures_a_graph_offers_no_gpu_replay() -> None:
    """``replay --gpu`` counts the operations a GPU dispatches, and a graph's replay dispatches none (its launch runs
    what the capture recorded): the run's replay line offers no ``--gpu``, and a counted GPU run refuses a capture."""
    from reference import cuda_plain

    assert _once(_replays).result.gpu is False
    assert _once(lambda: torch.ones(4, device="cuda").sum().item()).result.gpu is True
    with pytest.raises(NotImplementedError, match="CUDA graphs are not replayed on a GPU yet"):
        cuda_plain._no_graphs()
