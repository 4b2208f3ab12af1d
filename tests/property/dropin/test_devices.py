"""Under a session, "cuda" in every spelling makes simulated tensors, and they show cuda:0 to Python code
everywhere it looks: in the program, in saved-tensor hooks, in backward (where no TorchFunctionMode reaches)."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import torch

import simdevice
from simdevice import HostError
from simdevice.dispatch import SimTensor
from simdevice.explain import not_run
from simdevice.runtime.config import SimConfig
from simdevice.search.explore import explore

SPELLINGS: list[Any] = ["cuda", "cuda:0", torch.device("cuda"), torch.device("cuda", 0), 0]


@pytest.mark.parametrize("d", SPELLINGS, ids=str)
def test_every_spelling_of_the_device_makes_a_simulated_tensor(d: Any) -> None:
    made: list[torch.Tensor] = []
    with simdevice.cuda() as sim:
        made.append(torch.ones(3, device=d))
        made.append(torch.zeros(3).to(d))
        made.append(torch.zeros(3).to(d, torch.float64))
        made.append(torch.tensor([1.0, 2.0], device=d))
        made.append(torch.as_tensor([1.0], device=d))
        made.append(torch.zeros(2).new_ones(3, device=d))
        made.append(torch.empty(2, 2, device=d))
        made.append(torch.ones(2).cuda())
        made.append(torch.ones(2).cuda(0, non_blocking=True))
    sim.assert_clean()
    assert all(isinstance(t, SimTensor) for t in made)
    assert {str(t.device) for t in made} == {"cuda:0"}
    assert all(t.is_cuda and t.get_device() == 0 and not t.is_meta for t in made)
    assert {t.type() for t in made} >= {"torch.cuda.FloatTensor", "torch.cuda.DoubleTensor"}
    assert {t.type().split(".")[1] for t in made} == {"cuda"}


def test_a_device_block_and_the_default_device_make_simulated_tensors() -> None:
    """``with torch.device("cuda")`` and ``torch.set_default_device("cuda")`` (model-init code) give CUDA to the
    factories called without a device, as on a GPU; ``*_like`` keep their input's device, and a block naming the
    CPU makes host tensors."""
    with simdevice.cuda() as sim:
        cpu = torch.ones(2)
        with torch.device("cuda"):
            in_block = [torch.arange(4.0), torch.zeros(2), torch.tensor([1.0]), torch.as_tensor([2.0]),
                        torch.empty(3), torch.full((2,), 7.0)]
            like = torch.zeros_like(cpu)
        with torch.device("cpu"):
            host = torch.ones(2)
        torch.set_default_device("cuda")
        try:
            by_default = torch.ones(2)
        finally:
            torch.set_default_device(None)
        after = torch.ones(2)
        values = [t.cpu().tolist() for t in in_block]
    sim.assert_clean()
    assert all(isinstance(t, SimTensor) and t.device.type == "cuda" for t in [*in_block, by_default])
    assert values == [[0.0, 1.0, 2.0, 3.0], [0.0, 0.0], [1.0], [2.0], values[4], [7.0, 7.0]]
    assert not any(isinstance(t, SimTensor) for t in (like, host, after))


def test_a_device_block_after_a_session_gives_its_device_to_torch_s_own_factories() -> None:
    """torch caches the factories its device block acts on when it first needs them: found during a session, they
    were the session's, and a block after it (on a GPU, a replay's) gave its device to none. (``meta`` stands in
    for a GPU here.)"""
    with simdevice.cuda() as sim, torch.device("cuda"):
        torch.zeros(1)
    sim.assert_clean()
    with torch.device("meta"):
        assert torch.zeros(1).device.type == "meta"
        assert torch.arange(3).device.type == "meta"


def test_a_race_on_a_tensor_made_in_a_device_block_is_found() -> None:
    """A D2H of a tensor made in ``with torch.device("cuda")``, read on the host without waiting: found (it was a
    host tensor, and the run clean)."""

    def racy() -> None:
        with torch.device("cuda"):
            act = torch.arange(1024, dtype=torch.float32)
        pinned = torch.empty(1024, pin_memory=True)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            pinned.copy_(act, non_blocking=True)
        pinned.sum()  # no side.synchronize()

    found = simdevice.explore(racy, max_examples=20)
    assert found.failure is not None
    assert found.failure.run.reports


def test_new_tensor_is_made_on_its_tensor_s_device_and_data_made_with_requires_grad_is_a_leaf() -> None:
    """``t.new_tensor(data)`` takes ``t``'s device and dtype (it was a meta shell: torch builds it below the
    dispatcher); ``torch.tensor(..., device="cuda", requires_grad=True)`` and ``new_tensor(..., requires_grad=True)``
    are leaves, as on a GPU (the first was the result of a copy)."""
    with simdevice.cuda() as sim:
        x = torch.ones(2, device="cuda")
        made = [x.new_tensor([2.0]), x.new_tensor([1, 2], dtype=torch.int64), torch.ones(2).new_tensor([3.0], device=0)]
        host = x.new_tensor([1.0], device="cpu")
        leaves = [torch.tensor([1.0], device="cuda", requires_grad=True), x.new_tensor([1.0], requires_grad=True)]
        product = (x * x.new_tensor([2.0])).cpu().tolist()
    sim.assert_clean()
    assert all(isinstance(t, SimTensor) and t.device.type == "cuda" for t in [*made, *leaves])
    assert [t.dtype for t in made] == [torch.float32, torch.int64, torch.float32]
    assert not isinstance(host, SimTensor)
    assert all(t.is_leaf and t.requires_grad for t in leaves)
    assert product == [2.0, 2.0]


def test_the_legacy_new_given_data_makes_it_on_its_tensor_s_device() -> None:
    """``t.new([1.0, 2.0])`` (torch's legacy constructor, given data) is a tensor of that data on ``t``'s device with
    ``t``'s dtype, as ``new_tensor`` is; sizes and a ``torch.Size`` stay a shape. Before, torch built it below the
    dispatcher on the meta shell: a plain meta tensor reached the program, its values lost."""
    with simdevice.cuda() as sim:
        x = torch.ones(2, device="cuda", dtype=torch.float16)
        made = [x.new([1.0, 2.0]), x.new((3, 4)), x.new(np.array([5, 6]))]
        values = [t.cpu().tolist() for t in made]
        shapes = [tuple(x.new(3).shape), tuple(x.new(torch.Size([2, 3])).shape)]
    sim.assert_clean()
    assert all(isinstance(t, SimTensor) and t.dtype == torch.float16 for t in made)
    assert values == [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]
    assert shapes == [(3,), (2, 3)]


def test_current_device_is_an_index_factories_accept() -> None:
    with simdevice.cuda() as sim:
        i = torch.cuda.current_device()
        t = torch.full((2,), 5.0, device=i)
        assert isinstance(i, int)
        assert t.device.type == "cuda"
        assert t.cpu().tolist() == [5.0, 5.0]
    sim.assert_clean()


def test_host_tensors_stay_host_tensors() -> None:
    with simdevice.cuda() as sim:
        h = torch.ones(2)
        back = torch.ones(2, device="cuda").cpu()
        assert (h.device.type, back.device.type) == ("cpu", "cpu")
        assert not isinstance(h, SimTensor)
        assert not isinstance(back, SimTensor)
    sim.assert_clean()


#: copies across devices of a slice (not dense: laid out anew, contiguous) and of a transpose (dense: its strides
#: kept), as ATen's ``_to_copy`` lays them out
COPIES_ACROSS = {
    "to cuda": lambda h, d: h.to("cuda"),
    "cuda()": lambda h, d: h.cuda(non_blocking=True),
    "cpu()": lambda h, d: d.cpu(),
    "to cpu non_blocking": lambda h, d: d.to("cpu", non_blocking=True),
    "to dtype": lambda h, d: d.to(torch.float64),
}


@pytest.mark.parametrize("copy", COPIES_ACROSS.values(), ids=list(COPIES_ACROSS))
def test_a_copy_of_a_slice_is_contiguous_and_of_a_dense_tensor_keeps_its_strides(copy: Any) -> None:
    """``x[:, :16].cuda()`` (or ``.cpu()``, ``.to(dtype)``) is contiguous, as torch lays out a copy of a tensor that
    is not dense, so ``.view(-1)`` of it works; a transpose's copy keeps its strides. (The copy took the slice's
    strides, (32, 1): ``view`` raised and ``is_contiguous()`` was False where a GPU says True.)"""
    with simdevice.cuda() as sim:
        h = torch.arange(256, dtype=torch.float32).view(8, 32)
        d = torch.arange(256, dtype=torch.float32, device="cuda").view(8, 32)
        sliced = copy(h[:, :16], d[:, :16])
        flat = sliced.view(-1)
        transposed = copy(h.t(), d.t())
        torch.cuda.synchronize()
        values = flat.cpu().tolist()
    sim.assert_clean()
    assert sliced.stride() == (16, 1)
    assert transposed.stride() == (1, 32)
    assert values == h[:, :16].reshape(-1).tolist()


HOST_FROM_DEVICE = {
    "empty_like": lambda t: torch.empty_like(t, device="cpu"),
    "zeros_like": lambda t: torch.zeros_like(t, device="cpu"),
    "ones_like": lambda t: torch.ones_like(t, device="cpu"),
    "full_like": lambda t: torch.full_like(t, 7.0, device="cpu"),
    "rand_like": lambda t: torch.rand_like(t, device="cpu"),
    "randn_like": lambda t: torch.randn_like(t, device="cpu"),
    "new_empty": lambda t: t.new_empty((2, 3), device="cpu"),
    "new_zeros": lambda t: t.new_zeros((2, 3), device="cpu"),
    "new_ones": lambda t: t.new_ones((2, 3), device="cpu"),
    "new_full": lambda t: t.new_full((2, 3), 7.0, device="cpu"),
}


@pytest.mark.parametrize("make", HOST_FROM_DEVICE.values(), ids=list(HOST_FROM_DEVICE))
def test_a_device_tensors_shape_on_a_host_device_is_a_host_tensor(make: Any) -> None:
    with simdevice.cuda() as sim:
        t = torch.ones(2, 3, device="cuda")
        h = make(t)
        assert h.device.type == "cpu"
        assert not isinstance(h, SimTensor)
        assert (h.shape, h.dtype) == (t.shape, t.dtype)
        assert not h.is_pinned()
        assert make(t.cpu()).device.type == "cpu"
        on_device = torch.empty_like(h, device="cuda")
        assert isinstance(on_device, SimTensor)
    sim.assert_clean()


def test_a_pinned_buffer_shaped_like_a_device_tensor_is_host_memory_the_d2h_lands_in() -> None:
    with simdevice.cuda() as sim:
        act = torch.arange(6, dtype=torch.float32, device="cuda").view(2, 3)
        buf = torch.empty_like(act, device="cpu", pin_memory=True)
        full = torch.full_like(act, 5.0, device="cpu", pin_memory=True)
        assert buf.is_pinned()
        assert full.is_pinned()
        assert full.tolist() == [[5.0] * 3] * 2
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            buf.copy_(act, non_blocking=True)
        seen = buf.clone()  # the host reads it before the D2H is known done: a race on host memory
        torch.cuda.synchronize()
        assert buf.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    races = [r for r in sim.reports if isinstance(r, simdevice.Race)]
    assert len(races) == 1, sim.text()
    assert races[0].current.actor == "host"  # the clone's read, of pinned memory
    assert races[0].previous.op.startswith("copy_ (D2H)"), sim.text()
    del seen


def test_the_device_shows_cuda_inside_autograd_hooks_and_backward() -> None:
    seen: list[str] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen.append(f"pack {t.device} {t.is_cuda} {t.device.type == 'cuda'}")
        return t

    def unpack(t: torch.Tensor) -> torch.Tensor:
        seen.append(f"unpack {t.device}")
        return t

    with simdevice.cuda() as sim:
        x = torch.ones(8, device="cuda").requires_grad_(True)
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            y = (x * x).sum()
        x.register_hook(lambda g: seen.append(f"grad {g.device}"))
        y.backward()
        assert x.grad is not None
        seen.append(f"x.grad {x.grad.device}")
        assert x.grad.cpu().tolist() == [2.0] * 8
    sim.assert_clean()
    assert seen == ["pack cuda:0 True True"] * 2 + ["unpack cuda:0"] * 2 + ["grad cuda:0", "x.grad cuda:0"]


def _rank_on_its_device() -> None:
    import torch.distributed as dist

    assert torch.cuda.device_count() == dist.get_world_size()  # the common guard of DDP code
    torch.cuda.set_device(dist.get_rank())
    x = torch.ones(4, device=f"cuda:{dist.get_rank()}")
    dist.all_reduce(x)
    assert x.cpu().tolist() == [2.0] * 4


def test_a_device_per_rank_and_an_index_past_them_fails_as_cuda_does() -> None:
    """``device_count()`` is the world size (a machine of N GPUs runs N ranks), so ``set_device(rank)`` and
    ``cuda:{rank}`` run (its tensors on the one simulated device); an index past the count is CUDA's "invalid
    device ordinal", as on a machine with that many GPUs (it ran, and showed ``cuda:0``)."""
    s = simdevice.cuda()
    s.run(_rank_on_its_device, world_size=2)
    s.assert_clean()
    for bad in (lambda: torch.ones(2, device="cuda:1"), lambda: torch.cuda.set_device(1),
                lambda: torch.ones(2).to(torch.device("cuda", 3))):
        one = simdevice.cuda()
        one.run(bad)
        assert [r.kind for r in one.reports] == ["host-error"]
        assert "CUDA error: invalid device ordinal (device " in str(one.reports[0])


def _streams_on_the_current_device_by_minus_one() -> None:
    """A copy stream made where a tensor's ``get_device()`` or a config's ``-1`` names the device: torch's stream
    calls take -1 for the current device (CUDA's "none given"), as ``torch.cuda.device(-1)`` does."""
    torch.cuda.set_device(-1)
    copy = torch.cuda.Stream(device=-1)
    x = torch.ones(4, device="cuda")
    copy.wait_stream(torch.cuda.current_stream(-1))
    with torch.cuda.stream(copy):
        y = x * 2
    torch.cuda.default_stream(-1).wait_stream(copy)
    torch.cuda.synchronize(-1)
    assert y.sum().item() == 8


def test_minus_one_is_the_current_device_in_the_stream_calls() -> None:
    """Before, each raised "invalid device ordinal (device -1 ...)": a host error that reported the correct program
    as failing. A factory still refuses -1, as torch does."""
    run = simdevice.cuda()
    run.run(_streams_on_the_current_device_by_minus_one)
    run.assert_clean()
    one = simdevice.cuda()
    one.run(lambda: torch.ones(2, device=-1))
    assert [r.kind for r in one.reports] == ["host-error"], one.reports


def test_the_torch_cuda_namespace_is_the_simulated_device() -> None:
    with simdevice.cuda() as sim:
        assert torch.cuda.is_available()
        assert torch.cuda.is_initialized()
        assert torch.cuda.device_count() == 1
        torch.cuda.set_device(0)
        with torch.cuda.device(0):
            props = torch.cuda.get_device_properties(0)
        assert props.total_memory > 0
        torch.cuda.nvtx.range_push("x")
        torch.cuda.nvtx.range_pop()
        with torch.cuda.nvtx.range("y"):
            a = torch.ones(1 << 16, device="cuda")
        assert torch.cuda.memory_allocated() >= a.numel() * 4
        assert torch.cuda.memory_reserved() >= torch.cuda.memory_allocated()
        stats = torch.cuda.memory_stats()
        assert stats["allocated_bytes.all.current"] == torch.cuda.memory_allocated()
        assert stats["allocated_bytes.all.peak"] == torch.cuda.max_memory_allocated()
        assert stats["reserved_bytes.all.current"] == torch.cuda.memory_reserved()
        torch.cuda.ipc_collect()  # (the CPU build has no _cuda_ipc_collect for torch's own to call)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        with pytest.raises(NotImplementedError, match="ExternalStream"):
            torch.cuda.ExternalStream(1234)
    sim.assert_clean()


def test_data_pointers_are_distinct_and_nonzero_and_views_share_their_storage() -> None:
    with simdevice.cuda() as sim:
        a = torch.ones(64, device="cuda")
        b = torch.ones(64, device="cuda")
        v = a[8:]
        ptrs = (a.data_ptr(), b.data_ptr(), v.data_ptr())
        same = v.untyped_storage() == a.untyped_storage()
        other = b.untyped_storage() == a.untyped_storage()
        base = (a.untyped_storage().data_ptr(), a.untyped_storage().nbytes())
    sim.assert_clean()
    assert 0 not in ptrs
    assert len(set(ptrs)) == 3
    assert ptrs[2] == ptrs[0] + 8 * 4
    assert same
    assert not other
    assert base == (ptrs[0], 64 * 4)


def test_memory_statistics_count_the_programs_own_bytes_as_torch_does() -> None:
    """``memory_allocated`` as the same code sees it on a GPU: its tensors' own bytes (the cost model's byte_scale
    is not in them), less a block at once when its last tensor dies, also one ``record_stream`` holds back from
    reuse (torch counts a block allocated until its free, not until its reuse)."""
    with simdevice.cuda() as sim:
        base = torch.cuda.memory_allocated()
        a = torch.empty(1 << 16, device="cuda")  # 256 KiB, a multiple of the allocator's rounding
        assert torch.cuda.memory_allocated() - base == a.numel() * 4
        free, total = torch.cuda.mem_get_info()
        assert total - free == torch.cuda.memory_reserved() < 64 << 20
        del a
        assert torch.cuda.memory_allocated() == base
        side = torch.cuda.Stream()
        b = torch.ones(1 << 16, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            b.mul_(2.0)
        b.record_stream(side)
        del b
        assert torch.cuda.memory_allocated() == base
        torch.cuda.synchronize()
    sim.assert_clean()


def test_peaks_count_from_the_runs_start_and_reset_and_the_device_is_as_large_as_its_memory() -> None:
    """``max_memory_allocated`` holds a peak reached before any statistics call (a tensor made and dropped);
    ``reset_peak_memory_stats`` starts the peaks again; ``max_memory_reserved`` keeps the reserved peak past
    ``empty_cache``; the device's memory is the run's ``device_memory``."""
    n = 1 << 20
    with simdevice.cuda(config=SimConfig(device_memory=64 << 20)) as sim:
        x = torch.ones(n, device="cuda")
        del x
        assert torch.cuda.max_memory_allocated() >= 4 * n
        torch.cuda.reset_peak_memory_stats()
        assert torch.cuda.max_memory_allocated() == torch.cuda.memory_allocated()
        y = torch.empty(n // 2, device="cuda")
        assert torch.cuda.max_memory_allocated() >= 2 * n
        del y
        torch.cuda.empty_cache()
        assert torch.cuda.memory_reserved() == 0
        assert torch.cuda.max_memory_reserved() >= 2 * n
        stats = torch.cuda.memory_stats()
        assert stats["reserved_bytes.all.peak"] == torch.cuda.max_memory_reserved()
        assert torch.cuda.mem_get_info() == (64 << 20, 64 << 20)
        assert torch.cuda.get_device_properties(0).total_memory == 64 << 20
    sim.assert_clean()


def test_memory_stats_has_torch_s_common_keys_and_the_memory_module_is_the_device_s() -> None:
    """``memory_stats()`` counts, for all pools: active bytes (allocated, and a freed block held for a recorded
    stream), live allocations and segments, retries and out-of-memory errors; ``torch.cuda.memory``'s own functions
    and torch's deprecated ``memory_cached`` name answer for the simulated device (they asked the CPU build's C
    side, which has no CUDA)."""
    n = 1 << 20  # 4 MiB of float32: a 20 MiB segment each, as CUDA's allocator makes
    with simdevice.cuda(config=SimConfig(device_memory=64 << 20)) as sim:
        side = torch.cuda.Stream()
        x = torch.ones(n, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            y = x * 2
        x.record_stream(side)
        del x  # freed, held for side: no longer allocated, still active
        stats = torch.cuda.memory_stats()
        assert stats["active_bytes.all.current"] == stats["allocated_bytes.all.current"] + 4 * n
        assert stats["active_bytes.all.peak"] >= 8 * n
        assert stats["allocation.all.current"] == 1  # y
        assert stats["segment.all.current"] >= 1
        assert (stats["num_ooms"], stats["num_alloc_retries"]) == (0, 0)
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(12 * n, device="cuda")  # 48 MiB more than y's 20 MiB segment, of 64
        stats = torch.cuda.memory_stats()
        assert (stats["num_ooms"], stats["num_alloc_retries"]) == (1, 1)
        assert torch.cuda.memory.memory_stats() == stats
        assert torch.cuda.memory.memory_allocated() == torch.cuda.memory_allocated() == 4 * n
        assert torch.cuda.memory_cached() == torch.cuda.memory_reserved()
        del y
    sim.assert_clean()


def test_a_memory_fraction_bounds_the_allocator_after_it_releases_the_cache() -> None:
    """``set_per_process_memory_fraction(f)``: segments together may take ``f`` of the device's memory; past it
    the cached segments are released and the allocation tried again, then ``torch.OutOfMemoryError``; torch's
    checks of the fraction's type and range."""
    n = 1 << 20  # 4 MiB of float32
    with simdevice.cuda(config=SimConfig(device_memory=128 << 20)) as sim:
        assert torch.cuda.get_per_process_memory_fraction() == 1.0
        torch.cuda.set_per_process_memory_fraction(0.5)  # 64 MiB
        assert torch.cuda.get_per_process_memory_fraction() == 0.5
        x = torch.empty(8 * n, device="cuda")  # 32 MiB
        del x  # cached
        y = torch.empty(12 * n, device="cuda")  # 48 MiB: fits once the cache is released
        assert torch.cuda.memory_stats()["num_alloc_retries"] == 1
        with pytest.raises(torch.OutOfMemoryError, match=r"set_per_process_memory_fraction\(0.5\)"):
            torch.empty(8 * n, device="cuda")  # 32 more of 64
        assert torch.cuda.memory_stats()["num_ooms"] == 1
        with pytest.raises(TypeError, match="must be `float`"):
            torch.cuda.set_per_process_memory_fraction(1)
        with pytest.raises(ValueError, match="Allowed range"):
            torch.cuda.set_per_process_memory_fraction(1.5)
        torch.cuda.set_per_process_memory_fraction(1.0)  # (the range's ends are in it)
        assert torch.cuda.get_per_process_memory_fraction() == 1.0
        torch.cuda.set_per_process_memory_fraction(0.5)
        with pytest.raises(RuntimeError, match="invalid device ordinal"):
            torch.cuda.set_per_process_memory_fraction(0.5, 1)
        del y
    sim.assert_clean()


def _scaled_step(device: str) -> list[float]:
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 4).to(device)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(device)
    loss = lin(torch.ones(2, 4, device=device)).pow(2).mean()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()  # _amp_update_scale_: writes the scale and the growth tracker, returns the scale
    assert scaler.get_scale() == 65536.0
    return lin.weight.detach().cpu().flatten().tolist()


def test_a_grad_scaler_step_runs_as_on_the_cpu() -> None:
    """An op whose return aliases one of the arguments it writes returns that argument, not every written one
    (``_amp_update_scale_`` writes two and returns the first: a list of both broke ``GradScaler.update()``)."""
    s = simdevice.cuda()
    s.run(_scaled_step, "cuda")
    s.assert_clean()
    assert s.result is not None
    assert s.result.result == _scaled_step("cpu")


def _under_autocast() -> tuple[str, str, str]:
    lin = torch.nn.Linear(4, 4).cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = lin(torch.ones(2, 4, device="cuda"))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the host's autocast: torch's own, on host tensors
        host = torch.ones(2, 2) @ torch.ones(2, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (its deprecation)
        with torch.cuda.amp.autocast():  # the older spelling: float16, CUDA autocast's default
            old = lin(torch.ones(2, 4, device="cuda"))
    return str(out.dtype), str(host.dtype), str(old.dtype)


def test_cuda_autocast_is_applied_and_the_host_s_too() -> None:
    """Ops under ``autocast("cuda")`` run in its dtype, as on a GPU (they ran in float32, noted:
    ``tests/property/dropin/test_autocast.py`` has the rest)."""
    s = simdevice.cuda()
    s.run(_under_autocast)
    s.assert_clean()
    assert s.result is not None
    assert s.result.result == ("torch.bfloat16", "torch.bfloat16", "torch.float16")
    assert not [n for n in s.result.notes if "autocast" in n]


def test_autocast_turned_off_applies_nothing() -> None:
    """``autocast("cuda", enabled=False)`` (what ``torch.utils.checkpoint`` enters to recompute a forward that ran
    without autocast) casts nothing."""

    def program() -> str:
        with torch.autocast("cuda", enabled=False), torch.autocast(device_type="cuda", dtype=torch.float16,
                                                                    enabled=False):
            y = torch.ones(2, 2, device="cuda") @ torch.ones(2, 2, device="cuda")
            y.sum().item()
        return str(y.dtype)

    s = simdevice.cuda()
    s.run(program)
    s.assert_clean()
    assert s.result is not None
    assert s.result.result == "torch.float32"


def _deepcopies() -> tuple[bool, bool, bool, list[float]]:
    import copy

    model = torch.nn.Linear(4, 4).cuda()
    model(torch.ones(1, 4, device="cuda")).sum().backward()
    ema = copy.deepcopy(model)  # an EMA model, as training code makes one
    t = torch.ones(4, device="cuda", requires_grad=True)
    u = copy.deepcopy(t)
    with torch.no_grad():
        model.weight.add_(1.0)  # the copy is its own
    same = torch.equal(ema.weight.cpu() + 1.0, model.weight.cpu())
    grads = torch.equal(ema.weight.grad.cpu(), model.weight.grad.cpu())
    return type(ema.weight) is type(model.weight) and ema.weight.requires_grad, same, grads and u.requires_grad, (
        u.detach().cpu().tolist())


def test_deepcopy_of_a_device_module_or_tensor_copies_its_bytes() -> None:
    """``copy.deepcopy`` of a device tensor is a clone on the current stream with its ``requires_grad`` and grad
    (torch's own copy goes through a typed storage, which raised TypeError on the simulated one)."""
    s = simdevice.cuda()
    s.run(_deepcopies)
    s.assert_clean()
    assert s.result is not None
    assert s.result.result == (True, True, True, [1.0] * 4)


def _prints() -> tuple[str, str, str]:
    x = torch.arange(4, dtype=torch.float32, device="cuda")
    pinned = torch.empty(4, pin_memory=True)
    pinned.copy_(x, non_blocking=True)
    shown = repr(x)  # printing reads the values: the host waits for the stream, as on a GPU
    total = f"{x.sum():.1f}"
    formatted = f"{x[:2]}"
    assert torch.equal(pinned, torch.arange(4, dtype=torch.float32))  # landed: no race after the print
    return shown, total, formatted


def test_printing_a_device_tensor_in_the_program_reads_its_values_and_waits_for_them() -> None:
    """``repr``, ``print`` and f-strings of a device tensor in the program read its values as on a GPU (a
    synchronizing copy: a host read of pinned memory after it is no race), in torch's text; ``f"{loss:.4f}"`` of a
    0-d tensor is its value. Outside the run (a test, a debugger) the text reads nothing."""
    s = simdevice.cuda()
    s.run(_prints)
    s.assert_clean()
    assert s.result is not None
    assert s.result.result == ("tensor([0., 1., 2., 3.], device='cuda:0')", "6.0", "tensor([0., 1.], device='cuda:0')")
    kept: list[torch.Tensor] = []
    s = simdevice.cuda()
    s.run(lambda: kept.append(torch.ones(2, device="cuda")))
    assert repr(kept[0]).startswith("SimTensor((2,), torch.float32")


def _prints_a_parameter() -> tuple[str, str]:
    p = torch.nn.Parameter(torch.ones(2, device="cuda"))
    return repr(p), f"{torch.nn.Linear(1, 1, bias=False).cuda().weight.data}"


def test_a_device_parameter_prints_as_torch_prints_one() -> None:
    """A parameter on the device prints as nn.Parameter's text of a CUDA one; it printed as torch prints a tensor
    subclass's parameter, ``tensor(SimTensor([1., 1.], ...))``."""
    s = simdevice.cuda()
    s.run(_prints_a_parameter)
    s.assert_clean()
    assert s.result is not None
    shown, data = s.result.result
    assert shown == "Parameter containing:\ntensor([1., 1.], device='cuda:0', requires_grad=True)", shown
    assert data.startswith("tensor([["), data
    assert data.endswith("]], device='cuda:0')"), data


def test_torch_tensor_made_pinned_is_pinned_memory() -> None:
    """``torch.tensor(data, pin_memory=True)``: the CPU build has no pinned allocator, and raised."""
    with simdevice.cuda() as sim:
        p = torch.tensor([1.0, 2.0], pin_memory=True, requires_grad=True)
        assert p.is_pinned()
        assert p.is_leaf
        assert p.requires_grad
        d = p.detach().to("cuda", non_blocking=True)
        assert torch.equal(d.cpu(), torch.tensor([1.0, 2.0]))
    sim.assert_clean()


def test_nvtx_marks_nothing_in_each_of_its_forms() -> None:
    """``nvtx.range`` as a decorator (torch's is a context manager function), ``range_start`` / ``range_end``."""
    with simdevice.cuda() as sim:

        @torch.cuda.nvtx.range("layer")
        def layer(x: torch.Tensor) -> torch.Tensor:
            return x * 2

        assert torch.equal(layer(torch.ones(4, device="cuda")).cpu(), torch.full((4,), 2.0))
        with torch.cuda.nvtx.range("block"):
            pass
        torch.cuda.nvtx.range_end(torch.cuda.nvtx.range_start("step"))
    sim.assert_clean()


def _pins_a_device_tensor() -> None:
    torch.ones(4, device="cuda", dtype=torch.bfloat16).pin_memory()


def test_pinning_a_device_tensor_is_the_program_s_error_as_on_a_gpu() -> None:
    """torch refuses to pin a CUDA tensor ("cannot pin 'CUDABFloat16Type' ..."): an error of the program, found.
    Before, torch's CPU build asked for an accelerator first, an error read as what the simulator does not run."""
    found = explore(_pins_a_device_tensor, max_examples=1)
    assert found.failure is not None
    assert not_run(found.failure) is None
    assert [r.error for r in found.failure.run.reports if isinstance(r, HostError)] == [
        "RuntimeError: cannot pin 'CUDABFloat16Type' only dense CPU tensors can be pinned"]


def test_a_device_tensor_to_numpy_fails_as_on_a_gpu_unless_forced() -> None:
    """``t.numpy()`` and ``np.asarray(t)`` of a device tensor raise torch's TypeError for a CUDA tensor (torch's own
    said "not supported for tensor subclasses", which reads as the simulator's limit); ``numpy(force=True)`` copies
    it to the host."""
    with simdevice.cuda() as sim:
        t = torch.ones(2, device="cuda", requires_grad=True)
        errors = []
        for convert in (t.numpy, lambda: np.asarray(t)):
            with pytest.raises(TypeError) as e:
                convert()
            errors.append(str(e.value))
        forced = t.numpy(force=True).tolist()
    sim.assert_clean()
    assert errors == ["can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor to host "
                      "memory first."] * 2
    assert forced == [1.0, 1.0]


def _profiled() -> None:
    with torch.cuda.profiler.profile():
        x = torch.ones(4, device="cuda")
    torch.cuda.profiler.start()
    assert (x * 2).sum().item() == 8.0
    torch.cuda.profiler.stop()


def test_the_cuda_profiler_s_start_and_stop_do_nothing_and_its_init_is_not_simulated() -> None:
    """``torch.cuda.profiler.profile()``, ``start()`` and ``stop()`` only tell an external profiler where to capture:
    no-ops. Before, they called the CUDA runtime torch's CPU build has not, through the ``cudart`` their module bound
    at import (an AttributeError on None): a host error, found, of a program a GPU runs."""
    s = simdevice.cuda()
    s.run(_profiled)
    s.assert_clean()
    with simdevice.cuda(), pytest.raises(NotImplementedError, match=r"torch\.cuda\.profiler\.init is not "):
        torch.cuda.profiler.init("out.txt")


def test_a_stream_context_is_a_class_entered_again_and_set_stream_none_does_nothing() -> None:
    with simdevice.cuda() as sim:
        s = torch.cuda.Stream()
        ctx = torch.cuda.StreamContext(s)
        assert isinstance(ctx, torch.cuda.StreamContext)
        assert isinstance(torch.cuda.stream(s), torch.cuda.StreamContext)
        x = torch.ones(16, device="cuda")
        s.wait_stream(torch.cuda.current_stream())
        with ctx:
            assert torch.cuda.current_stream() == s
            y = x + 1
        assert torch.cuda.current_stream() == torch.cuda.default_stream()
        with ctx:
            z = y + 1
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.set_stream(None)
        assert torch.cuda.current_stream() == torch.cuda.default_stream()
        assert torch.equal(z.cpu(), torch.full((16,), 3.0))
    sim.assert_clean()


@pytest.mark.parametrize("call", [
    lambda: torch.cuda.device(1).__enter__(), lambda: torch.cuda.get_device_name(1),
    lambda: torch.cuda.get_device_capability("cuda:1"), lambda: torch.cuda.Stream(device=1),
    lambda: torch.cuda.synchronize(1), lambda: torch.cuda.current_stream(torch.device("cuda", 1)),
    lambda: torch.cuda.default_stream(1), lambda: torch.cuda.memory_allocated(1), lambda: torch.cuda.memory_stats(1),
    lambda: torch.cuda.mem_get_info(1), lambda: torch.cuda.reset_peak_memory_stats(1),
    lambda: torch.ones(2).cuda(1), lambda: torch.ones(2, device="cuda").cuda("cuda:1"),
], ids=["device", "get_device_name", "get_device_capability", "Stream", "synchronize", "current_stream",
        "default_stream", "memory_allocated", "memory_stats", "mem_get_info", "reset_peak_memory_stats",
        "Tensor.cuda", "Tensor.cuda of a device tensor"])
def test_every_device_argument_past_the_count_is_an_invalid_ordinal(call: Any) -> None:
    with simdevice.cuda() as sim:
        with pytest.raises(RuntimeError, match="invalid device ordinal"):
            call()
        with torch.cuda.device(0), torch.cuda.device(-1):
            torch.cuda.synchronize(0)
        assert torch.cuda.get_device_capability(0) == (9, 0)
    sim.assert_clean()


def test_device_of_a_tensor_is_a_block_on_its_device() -> None:
    """``with torch.cuda.device_of(t):`` runs for a device tensor, its storage and a host tensor (nothing), as on a
    GPU. (torch's own ``device_of`` subclasses torch's ``device``, not the session's, and its ``__enter__`` raised
    "PyTorch was compiled without CUDA support": a host error where the program is correct.)"""
    with simdevice.cuda() as sim:
        t = torch.ones(4, device="cuda")
        with torch.cuda.device_of(t):
            t.add_(1)
        with torch.cuda.device_of(t.untyped_storage()), torch.cuda.device_of(torch.ones(2)):
            t.add_(1)
        total = float(t.sum())
    sim.assert_clean()
    assert total == 12.0


def test_memory_summary_gives_the_statistics_kept() -> None:
    """A program that logs ``torch.cuda.memory_summary()`` runs: the statistics the simulated allocator keeps, in
    torch's table (before: ``NotImplementedError``, no verdict for the whole program; earlier, a ``KeyError``)."""
    s = simdevice.cuda()
    got: list[str] = []

    def program() -> None:
        keep = torch.ones(1 << 20, device="cuda")
        got.append(torch.cuda.memory_summary())
        got.append(torch.cuda.memory.memory_summary(abbreviated=True))
        del keep

    s.run(program)
    s.assert_clean()
    summary = got[0]
    assert got[1] == summary
    assert "|   4096 KiB |   4096 KiB |" in summary  # (4 MiB, as torch writes it)
    assert "CUDA OOMs: 0" in summary
    assert "Allocations           |          1 |" in summary
    assert {len(line) for line in summary.splitlines()} == {77}


def test_the_default_device_set_before_the_first_allocation_makes_device_tensors() -> None:
    """``torch.set_default_device("cuda")`` first thing in a run: the simulator's own host tensors (a segment's
    bytes, made at the run's first allocation) were made on the default device, and the run failed."""

    def program() -> None:
        torch.set_default_device("cuda")
        try:
            lin = torch.nn.Linear(4, 4)
            y = lin(torch.zeros(4))
            assert y.is_cuda
            assert torch.equal(y.cpu(), lin.bias.detach().cpu())
        finally:
            torch.set_default_device(None)

    s = simdevice.cuda()
    s.run(program)
    assert s.result is not None
    assert s.result.reports == ()


def _pool_statistic() -> None:
    torch.empty(100, device="cuda")
    assert torch.cuda.memory_stats()["allocated_bytes.small_pool.current"] == 512


def test_a_memory_statistic_not_counted_is_no_verdict() -> None:
    """A key of a GPU's ``memory_stats()`` the simulated allocator does not count (per pool) raises
    ``NotImplementedError``: no verdict, where a ``KeyError`` was blamed on the program, a finding."""
    from simdevice.explain import not_run
    from simdevice.search.explore import explore

    found = explore(_pool_statistic, max_examples=1)
    assert found.failure is not None
    unrun = not_run(found.failure)
    assert unrun is not None, found.failure.text()
    assert unrun.error.startswith(
        "NotImplementedError: torch.cuda.memory_stats()['allocated_bytes.small_pool.current'] is not simulated")


def _each_rank_counts_its_own(out: dict[int, tuple[int, int, int, int]]) -> None:
    import torch.distributed as dist

    rank = dist.get_rank()
    x = torch.empty((rank + 1) << 20, dtype=torch.uint8, device="cuda")
    dist.barrier()
    free, total = torch.cuda.mem_get_info()
    out[rank] = (torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated(), torch.cuda.memory_reserved(),
                 total - free)
    dist.barrier()
    del x


def test_each_rank_counts_its_own_allocations_and_the_device_s_free_memory_counts_all() -> None:
    """Each process of a GPU has its own caching allocator and statistics: a rank's ``memory_allocated`` is its own
    tensors' (it counted every rank's before, a finding where a rank checked its own); ``mem_get_info`` is the
    device's, every process's segments taken from it."""
    out: dict[int, tuple[int, int, int, int]] = {}
    s = simdevice.cuda()
    s.run(_each_rank_counts_its_own, out, world_size=2)
    s.assert_clean()
    mib = 1 << 20
    assert out[0] == (mib, mib, 2 * mib, 2 * mib + 20 * mib)  # 1 MiB: a small segment; 2 MiB: a 20 MiB one
    assert out[1] == (2 * mib, 2 * mib, 20 * mib, 2 * mib + 20 * mib)


def _each_rank_takes_its_fraction(out: dict[int, float]) -> None:
    import torch.distributed as dist

    rank = dist.get_rank()
    if rank == 0:
        torch.cuda.set_per_process_memory_fraction(0.5)
    dist.barrier()
    out[rank] = torch.cuda.get_per_process_memory_fraction()
    torch.cuda.set_per_process_memory_fraction(0.5)
    x = torch.empty(40 << 20, dtype=torch.uint8, device="cuda")  # 40 MiB of each rank's 50
    dist.barrier()
    del x


def test_a_memory_fraction_is_the_process_s_own() -> None:
    """``set_per_process_memory_fraction`` bounds the calling process's own segments, as on a GPU: two ranks of half
    the device each may take 40 % each (the fraction bounded every rank's segments together before: the second
    rank's allocation ran out of memory, a finding on a correct program), and one rank's setting is not another's."""
    out: dict[int, float] = {}
    s = simdevice.cuda(config=SimConfig(device_memory=100 << 20))
    s.run(_each_rank_takes_its_fraction, out, world_size=2)
    s.assert_clean()
    assert out == {0: 0.5, 1: 1.0}
