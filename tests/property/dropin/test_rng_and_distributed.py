"""The device RNG (deterministic, seeded by the run, never by global state) and torch.distributed's default
process group on the simulator's ranks."""

from __future__ import annotations

import torch
import torch.distributed as dist

import simdevice
from simdevice import Race, StaleRead


def _draw(seed: int | None = None) -> list[float]:
    if seed is not None:
        torch.cuda.manual_seed(seed)
    a = torch.randn(8, device="cuda")
    b = torch.rand(8, device="cuda")
    c = torch.empty(8, device="cuda").uniform_()
    d = torch.nn.functional.dropout(torch.ones(64, device="cuda"), 0.5)
    return (a.cpu().tolist() + b.cpu().tolist() + c.cpu().tolist() + d.cpu().tolist())


def _session_draw(seed: int | None = None) -> list[float]:
    got: list[float] = []
    s = simdevice.cuda()
    s.run(lambda: got.extend(_draw(seed)))
    s.assert_clean()
    return got


def test_device_random_numbers_repeat_run_to_run_whatever_the_global_state() -> None:
    torch.manual_seed(1)
    first = _session_draw()
    torch.manual_seed(2)
    random_state = torch.rand(3)  # the global generator moved on
    second = _session_draw()
    assert first == second
    assert len(set(first[:24])) == 24  # they are random numbers, not a constant
    assert random_state.numel() == 3


def test_manual_seed_chooses_the_stream_of_numbers() -> None:
    assert _session_draw(7) == _session_draw(7)
    assert _session_draw(7) != _session_draw(8)


def _replayed_draws() -> tuple[list[float], list[float], list[float], int]:
    state = torch.cuda.get_rng_state()
    first = torch.rand(4, device="cuda").cpu().tolist()
    torch.cuda.set_rng_state(state)
    again = torch.rand(4, device="cuda").cpu().tolist()
    with torch.random.fork_rng(devices=[0]):
        torch.rand(4, device="cuda")  # drawn inside the fork: the numbers after it are as if it never were
    after = torch.rand(4, device="cuda").cpu().tolist()
    torch.cuda.set_rng_state(state)
    torch.rand(4, device="cuda")
    return first, again, after, int(torch.cuda.initial_seed())


def test_the_device_generator_s_state_is_kept_and_put_back() -> None:
    """``torch.cuda.get_rng_state`` / ``set_rng_state`` (and ``torch.random.fork_rng`` over the device, which uses
    them) put the generator back where it was: the same numbers are drawn again."""
    got: list[tuple[list[float], list[float], list[float], int]] = []
    s = simdevice.cuda()
    s.run(lambda: got.append(_replayed_draws()))
    s.assert_clean()
    (first, again, after, seed) = got[0]
    assert first == again
    assert after not in (first, [])  # the fork's draw left the generator where it was: the next four are new
    assert len(set(first)) == 4
    assert seed == 0


def _checkpointed_dropout(reentrant: bool) -> bool:
    import torch.utils.checkpoint as cp

    x = torch.ones(256, device="cuda", requires_grad=True)
    y = cp.checkpoint(lambda t: torch.nn.functional.dropout(t, 0.5), x, use_reentrant=reentrant)
    y.sum().backward()
    assert x.grad is not None
    return torch.equal((x.grad != 0).cpu(), (y.detach() != 0).cpu())


def test_a_checkpointed_dropout_recomputes_the_forward_s_mask() -> None:
    """``torch.utils.checkpoint`` keeps the device generator's state for its recomputation (as it does where CUDA is
    in use): the recomputed dropout draws the forward's mask, so the gradient flows where the output did. (It drew a
    new mask, and the gradient disagreed with the output.)"""
    for reentrant in (False, True):
        s = simdevice.cuda()
        s.run(_checkpointed_dropout, reentrant)
        s.assert_clean()
        assert s.result is not None
        assert s.result.result is True


def _gather_and_reduce(wait: bool) -> None:
    r, w = dist.get_rank(), dist.get_world_size()
    full = torch.zeros(4 * w, device="cuda")
    work = dist.all_gather_into_tensor(full, torch.full((4,), float(r), device="cuda"), async_op=True)
    if wait:
        work.wait()
    seen = full.cpu().tolist()
    t = torch.ones(2, device="cuda")
    dist.all_reduce(t)
    dist.barrier()
    work.wait()
    assert t.cpu().tolist() == [float(w)] * 2
    assert seen == [float(q) for q in range(w) for _ in range(4)], f"rank {r} read the bucket early"


def test_collectives_meet_across_ranks_and_a_waited_gather_is_clean() -> None:
    s = simdevice.cuda()
    s.run(_gather_and_reduce, True, world_size=2)
    s.assert_clean()
    assert s.result is not None
    assert {"rank0.nccl", "rank1.nccl"} <= set(s.result.op_counts)


def test_reading_the_bucket_without_waiting_the_work_is_found() -> None:
    s = simdevice.cuda()
    s.run(_gather_and_reduce, False, world_size=2)
    assert any(isinstance(r, (Race, StaleRead)) for r in s.reports), s.text()


def test_a_tensor_a_collective_reads_is_kept_until_it_is_done_though_the_program_drops_it() -> None:
    """As ProcessGroupNCCL keeps it (the temporary shard below dies as the call returns; its block is then
    handed to the next allocation, which the compute stream overwrites while NCCL may still be sending it)."""

    def program() -> None:
        full = torch.zeros(4 * dist.get_world_size(), device="cuda")
        work = dist.all_gather_into_tensor(full, torch.full((4,), 5.0, device="cuda"), async_op=True)
        torch.full((4,), 9.0, device="cuda")  # the next allocation of that size
        work.wait()
        assert full.cpu().tolist() == [5.0] * 4 * dist.get_world_size()

    s = simdevice.cuda()
    s.run(program, world_size=2)
    s.assert_clean()


def _broadcast(root_waits: bool, others_wait: bool) -> None:
    """Rank 0 broadcasts; it reads its buffer while the broadcast is in flight unless ``root_waits``."""
    n = 64
    r = dist.get_rank()
    p = torch.arange(n, dtype=torch.float32, device="cuda") if r == 0 else torch.empty(n, device="cuda")
    work = dist.broadcast(p, src=0, async_op=True)
    if (r == 0 and root_waits) or (r != 0 and others_wait):
        work.wait()
    y = p * 2.0
    assert torch.equal(y.cpu(), 2.0 * torch.arange(n, dtype=torch.float32)), f"rank {r} read the buffer early"
    work.wait()


def test_broadcast_only_sends_from_the_root_and_only_writes_the_others() -> None:
    """NCCL's in-place broadcast reads the root's buffer and writes the other ranks': the root may read its own
    buffer while it is in flight (read after read), a receiving rank may not."""
    for world in (1, 2, 3):
        s = simdevice.cuda()
        s.run(_broadcast, False, True, world_size=world)
        s.assert_clean()
    s = simdevice.cuda()
    s.run(_broadcast, True, False, world_size=2)
    races = [str(r) for r in s.reports if isinstance(r, Race)]
    assert races
    assert all("rank1.default" in r and "broadcast (receive) on stream rank1.nccl" in r for r in races)


def _reduce_and_all_to_all(wait: bool) -> None:
    r, w = dist.get_rank(), dist.get_world_size()
    t = torch.full((4,), float(r + 1), device="cuda")
    work = dist.reduce(t, dst=0, async_op=True)
    if wait:
        work.wait()
    if r == 0:
        assert t.cpu().tolist() == [float(w * (w + 1) // 2)] * 4, "rank 0 read the reduction early"
    work.wait()
    inp = torch.arange(2 * w, dtype=torch.float32, device="cuda") + 100 * r
    out = torch.empty_like(inp)
    dist.all_to_all_single(out, inp)
    assert out.cpu().tolist() == [float(2 * r + k + 100 * q) for q in range(w) for k in range(2)]
    work = dist.all_reduce(inp, async_op=True)
    work.synchronize()  # as NCCL's: the current stream waits
    assert inp.cpu().tolist() == [float(w * k + 100 * w * (w - 1) // 2) for k in range(2 * w)]


def test_reduce_all_to_all_and_work_synchronize() -> None:
    for world in (1, 2, 3):
        s = simdevice.cuda()
        s.run(_reduce_and_all_to_all, True, world_size=world)
        s.assert_clean()
    s = simdevice.cuda()
    s.run(_reduce_and_all_to_all, False, world_size=2)
    assert any(isinstance(r, Race) and "rank0.default" in str(r) for r in s.reports), s.text()


def _hook_reduces_async(returned: bool) -> None:
    p = torch.ones(1024, device="cuda", requires_grad=True)
    works = []

    def hook(g: torch.Tensor) -> torch.Tensor:
        works.append(dist.all_reduce(g, async_op=True))
        # returned, the gradient the work holds goes into p.grad as a copy made now, while the reduction runs
        return g if returned else g.new_zeros(g.shape)

    p.register_hook(hook)
    (p * float(dist.get_rank() + 1)).sum().backward()
    for w in works:
        w.wait()
    if returned:
        want = float(sum(range(1, dist.get_world_size() + 1)))
        assert torch.equal(p.grad.cpu(), torch.full((1024,), want)), "p.grad holds the un-reduced gradient"


def _hook_returns_the_gradient() -> None:
    _hook_reduces_async(True)


def _zero2(d: int = 8) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(d, d, bias=False), torch.nn.Tanh(),
                                torch.nn.Linear(d, d, bias=False)).cuda()
    w = dist.get_world_size()
    outs = {id(p): torch.empty(p.numel() // w, device="cuda") for p in model.parameters()}
    works = []

    def hook(p: torch.Tensor) -> None:
        works.append(dist.reduce_scatter_tensor(outs[id(p)], p.grad.reshape(-1), async_op=True))
        p.grad = None  # dropped while the collective reads it: its work keeps it

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)
    model(torch.ones(4, d, device="cuda")).sum().backward()
    for work in works:
        work.wait()


def test_an_async_collective_s_work_holds_its_tensors_as_nccl_s_does() -> None:
    """A gradient a tensor hook hands to an async all-reduce and returns has a second reference (the work's), so
    autograd copies it into ``.grad`` at once, while the reduction runs: a race, found (the simulator let autograd
    take the tensor itself, and the run was clean). A ZeRO-2 hook that drops the gradient it reduce-scatters is
    clean: the work keeps it until it is waited (it was reported racing with the block's next owner)."""
    found = simdevice.explore(_hook_returns_the_gradient, world_size=2, max_examples=20)
    assert found.failure is not None
    assert found.failure.run.reports
    s = simdevice.cuda()
    s.run(_hook_reduces_async, False, world_size=2)
    s.assert_clean()
    for line in ("rank0#11+5", "rank1#7+3", ""):
        s = simdevice.cuda(line or None)
        s.run(_zero2, world_size=2)
        s.assert_clean()


def test_torch_distributed_calls_not_simulated_raise_naming_themselves() -> None:
    def program() -> None:
        torch.zeros(4, device="cuda")
        dist.monitored_barrier()

    s = simdevice.cuda()
    s.run(program, world_size=2)
    errors = [str(r) for r in s.reports]
    assert errors
    assert all("NotImplementedError: torch.distributed." in e for e in errors), errors
    assert "is not simulated (simulated: all_gather, " in errors[0]


def test_rank_world_and_object_collectives() -> None:
    got: dict[int, list[object]] = {}

    def program() -> None:
        objs: list[object] = [None] * dist.get_world_size()
        dist.all_gather_object(objs, {"rank": dist.get_rank()})
        listed: list[object] = [f"from {dist.get_rank()}"]
        dist.broadcast_object_list(listed, src=1)
        got[dist.get_rank()] = [*objs, *listed]
        assert dist.new_group(list(range(dist.get_world_size()))).size() == dist.get_world_size()

    s = simdevice.cuda()
    s.run(program, world_size=3)
    s.assert_clean()
    assert got[2] == [{"rank": 0}, {"rank": 1}, {"rank": 2}, "from 1"]


def _two_streams() -> list[float]:
    torch.cuda.manual_seed(3)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        a = torch.randn(8, device="cuda")  # issued first: the first numbers, however late it runs
    b = torch.randn(8, device="cuda")
    torch.cuda.synchronize()
    return a.cpu().tolist() + b.cpu().tolist()


def test_a_random_op_that_runs_late_leaves_the_numbers_of_later_ones_as_they_were() -> None:
    """As on a GPU (a generator's offset is taken when the host issues the op), the numbers follow the order the host
    issues random ops in, not the order they run: a stall of the side stream changes nothing."""
    got = []
    for schedule in (None, "side#0+5"):
        s = simdevice.cuda(schedule)
        s.run(lambda: got.append(_two_streams()))
        s.assert_clean()
    assert got[0] == got[1]
    assert len(set(got[0])) == 16


def _reduce_under_a_side_stream() -> None:
    g = torch.ones(8, device="cuda")
    comm = torch.cuda.Stream()
    comm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(comm):
        dist.all_reduce(g)  # NCCL's stream waits for comm: comm ordered it, though nothing ran on comm itself
    torch.cuda.current_stream().wait_stream(comm)
    assert g.cpu().tolist() == [float(dist.get_world_size())] * 8


def test_a_stream_a_collective_was_called_under_is_no_unused_stream() -> None:
    s = simdevice.cuda()
    s.run(_reduce_under_a_side_stream, world_size=2)
    s.assert_clean()
    assert s.result is not None
    assert not [n for n in s.result.notes if "got no operation" in n], s.result.notes


def _sizes_differ() -> None:
    t = torch.ones(4 + dist.get_rank(), device="cuda")
    dist.all_reduce(t)


def test_ranks_passing_tensors_of_different_sizes_are_told_so_at_their_call() -> None:
    """A collective whose ranks pass tensors of different sizes: the run's error says so and names the program's
    call (it was torch.stack's message, at the simulator's own line)."""
    s = simdevice.cuda()
    s.run(_sizes_differ, world_size=2)
    text = s.text()
    assert "the ranks passed tensors of different sizes (4, 5 elements, by rank)" in text
    assert "test_rng_and_distributed.py:" in text.split("every rank must pass tensors of the same size")[1]


def _host_draws() -> tuple[int, float, list[float]]:
    """Unseeded draws from Python's and NumPy's global generators, as a program's random step count or test data, and
    from two NumPy generators made unseeded (NumPy seeds them from the OS's entropy; a run, the k-th with k)."""
    import random

    import numpy as np

    steps = random.randint(1, 1000)
    scale = float(np.random.rand()) + float(np.random.default_rng().random()) + float(np.random.default_rng().random())
    x = torch.full((4,), scale, device="cuda") * steps
    return steps, scale, x.cpu().tolist()


def test_a_run_draws_the_same_host_random_numbers_whatever_came_before() -> None:
    """Each run starts Python's ``random`` and NumPy's global generator from seed 0, as Hypothesis does for each
    example, and puts the caller's back after: the same schedule gives the same run, in a search and in a replay in a
    new process (where the generators start from the OS's entropy). Before, each run drew on from wherever the
    generators stood, and a replay could take another path than the run it replays."""
    import random

    import numpy as np

    random.seed(123)
    np.random.seed(123)
    first = simdevice.cuda().run(_host_draws).result
    after = (random.random(), float(np.random.rand()))
    random.seed(7)
    np.random.seed(7)
    assert simdevice.cuda().run(_host_draws).result == first
    random.seed(123)
    np.random.seed(123)
    assert (random.random(), float(np.random.rand())) == after  # the caller's generators as they were


def seeds_python_s_random() -> None:
    """A program that seeds and draws from Python's ``random`` itself (as a ``DataLoader``'s workers do)."""
    import random

    random.seed(3)
    x = torch.ones(4, device="cuda") * random.random()
    assert x.sum().item() > 0


def test_a_program_that_uses_python_s_random_brings_no_warning_from_the_search() -> None:
    """The search's probe runs the program inside Hypothesis's draw of a schedule, and Hypothesis warns where the
    global ``random`` changed there ("Do not use the `random` module inside strategies", printed amid the
    program's output, and to become an error): the probe puts it back."""
    import warnings

    from hypothesis.errors import HypothesisDeprecationWarning

    from simdevice.search.explore import explore

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert explore(seeds_python_s_random, max_examples=20).failure is None
    assert not [w for w in caught if issubclass(w.category, HypothesisDeprecationWarning)], [
        str(w.message) for w in caught]
