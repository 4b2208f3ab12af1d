"""What a GPU build of torch has and the simulated device does not model gives no verdict (``NotImplementedError``,
or an error the CPU build raises for a CUDA-only part, which ``check`` reads as such: exit 2), never a host error
reported as a finding of a correct program."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from simdevice.explain import not_run
from simdevice.search.explore import explore


def _mem_pool() -> None:
    pool = torch.cuda.MemPool(no_split=True)  # (a MemPool of the caching allocator's own is simulated)
    with torch.cuda.use_mem_pool(pool):
        torch.ones(4, device="cuda")


def _cudart_call() -> None:
    torch.cuda.cudart().cudaMemGetInfo(0)


def _comm_broadcast() -> None:
    import torch.cuda.comm

    torch.cuda.comm.broadcast(torch.ones(4, device="cuda"), devices=[0])


def _sparse_to_device() -> None:
    s = torch.sparse_coo_tensor(torch.tensor([[0, 1], [1, 0]]), torch.tensor([1.0, 2.0]), (2, 2))
    assert s.cuda().to_dense().sum().item() == 3


def _work_exception() -> None:
    import torch.distributed as dist

    t = torch.ones(4, device="cuda")
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    assert work.exception() is None


class _Prefetcher:
    stream_class = torch.cuda.Stream  # bound as the module is imported: torch's own class, not the session's

    def __init__(self) -> None:
        self.stream = self.stream_class()


def _stream_class_held_before_the_session() -> None:
    """torch's own ``Stream`` refuses on the CPU build ("torch.cuda.Stream requires CUDA support"): before, that
    was a host error of the program, and its correct code was reported as failing (exit 1)."""
    x = torch.ones(4, device="cuda")
    with torch.cuda.stream(_Prefetcher().stream):
        y = x * 2
    torch.cuda.synchronize()
    assert y.sum().item() == 8


def _cuda_storage() -> None:
    torch.UntypedStorage(16, device="cuda")


def _storage_to_cuda() -> None:
    torch.ones(4).untyped_storage().cuda()


def _legacy_cuda_storage() -> None:
    torch.cuda.FloatStorage(4)


def _to_dlpack() -> None:
    torch.utils.dlpack.to_dlpack(torch.ones(4, device="cuda"))


def _from_dlpack() -> None:
    torch.from_dlpack(torch.ones(4, device="cuda"))


def _functional_mode() -> None:
    from torch._subclasses.functional_tensor import FunctionalTensorMode

    torch.ones(4, device="cuda")
    with FunctionalTensorMode():  # (AOTAutograd's tracing enters it: the simulator's mode sits above it)
        torch.ones(4).add_(1)


def _make_fx() -> None:
    from torch.fx.experimental.proxy_tensor import make_fx

    x = torch.ones(4, device="cuda")
    make_fx(lambda t: t * 2 + 1)(x)  # (its proxy mode is an infra mode, below the simulator's)


def _export_device_module() -> None:
    """(Before: the process aborted in C++, ``getDeviceGuardImpl``, as export traced its fake CUDA tensors.)"""
    m = torch.nn.Linear(4, 4).cuda()
    torch.export.export(m, (torch.ones(2, 4, device="cuda"),))


_NO_DLPACK = ("BufferError: Cannot pack tensors on meta (DLPack of a simulated device tensor, to_dlpack, __dlpack__ or "
              "from_dlpack of one, is not simulated: its bytes are no device memory another library could read)")
_NO_CUDA_STORAGE = ("RuntimeError: torch.UntypedStorage(): Storage device not recognized: cuda (a CUDA storage made "
                    "directly, torch.UntypedStorage(n, device=\"cuda\"), storage.cuda() or a torch.cuda.*Storage, is "
                    "not simulated: make a device tensor instead)")


@pytest.mark.parametrize(("program", "error"), [
    (_stream_class_held_before_the_session, "RuntimeError: torch.cuda.Stream requires CUDA support"),
    # (before, the CPU build's error was a host error of the program: a correct program reported as found)
    (_cuda_storage, _NO_CUDA_STORAGE),
    (_storage_to_cuda, _NO_CUDA_STORAGE),
    (_legacy_cuda_storage, _NO_CUDA_STORAGE),
    (_to_dlpack, _NO_DLPACK),
    (_from_dlpack, _NO_DLPACK),
    (_mem_pool, "NotImplementedError: torch.cuda.MemPool(no_split=True) is not simulated"),
    (_cudart_call, "NotImplementedError: torch.cuda.cudart().cudaMemGetInfo is not simulated"),
    (_comm_broadcast, "AttributeError: module 'torch._C' has no attribute '_broadcast'"),
    (_sparse_to_device, "NotImplementedError: a torch.sparse_coo tensor on the simulated device is not simulated"),
    (_work_exception, "NotImplementedError: Work.exception is not simulated"),
    (_export_device_module, "NotImplementedError: torch.export.export of the simulated device's tensors is not "
                            "simulated"),
    (_functional_mode, "NotImplementedError: torch's functional tensor mode (FunctionalTensorMode"),
    (_make_fx, "NotImplementedError: torch's proxy tensor mode (make_fx"),
])
def test_a_cuda_only_api_is_no_verdict(program: Callable[[], None], error: str) -> None:
    found = explore(program, max_examples=1)
    assert found.failure is not None
    unrun = not_run(found.failure)
    assert unrun is not None, found.failure.text()
    assert unrun.error.startswith(error), unrun.error


def _export_host_module() -> float:
    m = torch.nn.Linear(4, 4)
    exported = torch.export.export(m, (torch.ones(2, 4),))
    return exported.module()(torch.ones(2, 4)).sum().item()


def test_a_host_module_is_exported_in_a_run_as_torch_exports_it() -> None:
    found = explore(_export_host_module, max_examples=1)
    assert found.failure is None, found.failure.text()


def _host_memory_stats() -> None:
    torch.ones(4).pin_memory()
    assert torch.cuda.host_memory_stats()["allocations.current"] >= 1


def _nested_stats() -> None:
    torch.ones(4, device="cuda")
    assert torch.cuda.memory_stats_as_nested_dict()["allocation"]["all"]["current"] == 1


def _reset_accumulated() -> None:
    torch.cuda.reset_accumulated_memory_stats()


@pytest.mark.parametrize(("program", "called"), [
    (_host_memory_stats, "torch.cuda.memory.host_memory_stats"),
    (_nested_stats, "torch.cuda.memory.memory_stats_as_nested_dict"),
    (_reset_accumulated, "torch.cuda.memory.reset_accumulated_memory_stats"),
    (_comm_broadcast, "torch.nn.parallel.comm.broadcast"),  # (torch.cuda.comm.broadcast, where torch defines it)
])
def test_a_torch_function_that_reaches_cuda_s_c_api_is_named(program: Callable[[], None], called: str) -> None:
    """The CPU build's error names a private C function (``torch._C._cuda_hostMemoryStats``): the no-verdict line
    names the torch function the program called as well. Before, it named the C function alone."""
    found = explore(program, max_examples=1)
    assert found.failure is not None
    unrun = not_run(found.failure)
    assert unrun is not None, found.failure.text()
    assert f"({called} reaches CUDA's own C API, which the simulator does not run)" in unrun.error, unrun.error


def _capturing_guard() -> None:
    x = torch.ones(4, device="cuda")
    if not torch.cuda.graphs.is_current_stream_capturing():  # where torch defines it
        x.mul_(2)
    assert torch.equal(x.cpu(), torch.full((4,), 2.0))


def test_the_capture_question_is_answered_where_torch_defines_it() -> None:
    """``torch.cuda.graphs.is_current_stream_capturing()`` answers as ``torch.cuda``'s name does (no capture is
    under way: the simulator runs none). Before, the CPU build's dummy class raised there: no verdict for a correct
    program."""
    assert explore(_capturing_guard, max_examples=5).failure is None


def _graph_through_graphs_module() -> None:
    g = torch.cuda.graphs.CUDAGraph()
    with torch.cuda.graphs.graph(g):
        out = torch.ones(4, device="cuda") * 2
    g.replay()
    assert torch.equal(out.cpu(), torch.full((4,), 2.0))


def test_a_graph_made_where_torch_defines_it_is_the_simulated_one() -> None:
    """``torch.cuda.graphs.CUDAGraph`` and ``torch.cuda.graphs.graph`` are the simulated ones, as ``torch.cuda``'s
    names are. Before, the CPU build's "Tried to instantiate dummy base class CUDAGraph" was the line (and later, a
    refusal naming CUDA graphs)."""
    assert explore(_graph_through_graphs_module, max_examples=3).failure is None


def _allocator_backend() -> None:
    assert torch.cuda.get_allocator_backend() == "native"
    assert torch.cuda.memory.get_allocator_backend() == "native"


def test_the_allocator_backend_is_the_native_one() -> None:
    """The simulated allocator is CUDA's native caching allocator (its block sizes, its reuse across streams), so
    ``get_allocator_backend()`` answers ``"native"``. Before, it reached ``torch._C``: no verdict."""
    assert explore(_allocator_backend, max_examples=1).failure is None


def _asks_isinstance_of_refused_classes() -> None:
    """A runner that asks whether its model is a captured graph, a stream wrapper that asks whether a stream is
    external: nothing of those classes is made, so nothing is refused."""
    model = torch.nn.Linear(4, 4).cuda()
    assert not isinstance(model, torch.cuda.CUDAGraph)
    assert not isinstance(model, (torch.cuda.graph, torch.cuda.graphs.CUDAGraph, torch.cuda.MemPool))
    assert not isinstance(torch.cuda.current_stream(), torch.cuda.ExternalStream)
    assert model(torch.ones(2, 4, device="cuda")).shape == (2, 4)


def test_isinstance_against_a_refused_class_answers_false() -> None:
    """Before, the refused names were functions: ``isinstance`` raised ``TypeError`` ("isinstance() arg 2 must be a
    type"), a host error that reported the correct program as failing."""
    assert explore(_asks_isinstance_of_refused_classes, max_examples=5).failure is None


def _python_data_on_the_device() -> None:
    assert torch.tensor([1.0, 2.0], device="cuda").sum().item() == 3.0


def test_a_failed_assert_of_the_simulator_s_own_is_no_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    """An ``assert`` statement of the simulator's own code that fails under a program's call (one did under
    ``torch.inference_mode()``: ``.to("cuda")`` of a host tensor) is the simulator's bug: no verdict. It was reported
    as the program's host error, ``AssertionError at `<the program's line>```, and ``check`` said found (exit 1).
    A library's own ``AssertionError`` the simulator raises for the program (torch_memory_saver's) stays a finding."""
    import simdevice.dispatch
    from simdevice.runtime.runtime import Runtime

    path = simdevice.dispatch.__file__
    with open(path, encoding="utf-8") as f:
        at = next(i for i, line in enumerate(f, 1) if i > 2 and line.strip().startswith("assert "))
    # a function whose failing assert is that line of the simulator's (its code compiled as that file's)
    scope: dict[str, object] = {}
    exec(compile("\n" * (at - 2) + "def broken(*args, **kwargs):\n    assert False\n", path, "exec"), scope)
    monkeypatch.setattr(Runtime, "unseen_copy", scope["broken"])
    found = explore(_python_data_on_the_device, max_examples=1)
    assert found.failure is not None
    unrun = not_run(found.failure)
    assert unrun is not None, found.failure.text()
    assert unrun.error.startswith("AssertionError: simdevice: the simulator's own check failed at "), unrun.error


def _both_backups() -> None:
    from torch_memory_saver import torch_memory_saver

    with torch_memory_saver.region(enable_cpu_backup=True, enable_disk_backup=True):
        torch.ones(4, device="cuda")


def test_a_library_s_own_assertion_stays_the_program_s_error() -> None:
    found = explore(_both_backups, max_examples=1)
    assert found.failure is not None
    assert not_run(found.failure) is None, found.failure.text()
    assert "mutually exclusive" in found.failure.text()
