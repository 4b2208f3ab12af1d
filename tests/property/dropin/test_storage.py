"""Storage-level operations upstream offload code uses, and errors that must surface as the run's own."""

from __future__ import annotations

import torch
from torch.multiprocessing.reductions import StorageWeakRef

import simdevice
from simdevice import IllegalAccess, Race


def test_resize_to_zero_frees_the_storage_and_a_later_read_is_reported() -> None:
    with simdevice.cuda() as sim:
        act = torch.ones(4096, device="cuda")
        view = act[:16]
        act.untyped_storage().resize_(0)  # a forced release, as offload code does once the D2H is queued
        assert act.untyped_storage().nbytes() == 0
        view.sum()  # reads freed memory
    assert any(isinstance(r, IllegalAccess) for r in sim.reports), sim.text()
    assert "resize_(0)" in sim.text()


def test_an_op_on_no_elements_of_a_released_storage_touches_nothing() -> None:
    """A tensor of no elements of a released storage (a freed flat parameter's empty view, one ``cat`` skips) reads
    no byte: no illegal access, as a GPU runs it. Before, each such op was one, reading ``[0:0]``."""
    with simdevice.cuda() as sim:
        flat = torch.ones(64, device="cuda")
        flat.untyped_storage().resize_(0)
        joined = torch.cat([flat[:0], torch.ones(2, device="cuda")])
        total = flat[:0].sum() + joined.sum()
        assert total.item() == 2.0
    sim.assert_clean()


def _offload_then_release(record: bool) -> None:
    """Offload an activation on a side stream and release it at once, as offload code does."""
    d2h = torch.cuda.Stream()
    act = torch.ones(4096, device="cuda")
    pinned = torch.empty(4096, pin_memory=True)
    d2h.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(d2h):
        pinned.copy_(act, non_blocking=True)
    if record:
        act.record_stream(d2h)  # keep: the block must not be reused before the D2H is done with it
    act.untyped_storage().resize_(0)
    torch.full((4096,), 2.0, device="cuda")  # the compute stream's next allocation of that size
    torch.cuda.synchronize()
    assert pinned[:4].tolist() == [1.0] * 4


def test_resize_to_zero_after_record_stream_is_clean() -> None:
    s = simdevice.cuda()
    s.run(_offload_then_release, True)
    s.assert_clean()


def test_resize_to_zero_while_a_side_stream_reads_is_a_race() -> None:
    s = simdevice.cuda()
    s.run(_offload_then_release, False)  # freed on the compute stream while the D2H may still read it
    assert any(isinstance(r, Race) for r in s.reports), s.text()


def _storage_fill() -> None:
    y = torch.zeros(16, device="cuda")
    y.untyped_storage().fill_(1)


def test_a_storage_method_not_simulated_is_no_verdict_not_an_error_of_the_program() -> None:
    """A method of torch's storages the simulated storage lacks (``fill_``) raises ``NotImplementedError`` naming it:
    what the simulator does not run, no verdict (``check`` exits 2), where an ``AttributeError`` of the simulator's
    own class was reported as the program's host error, a finding ("an error of its own"). Its queries answer as a
    CUDA storage's."""
    from simdevice.explain import not_run
    from simdevice.search.explore import explore

    found = explore(_storage_fill, max_examples=1)
    assert found.failure is not None
    unrun = not_run(found.failure)
    assert unrun is not None
    assert unrun.error.startswith("NotImplementedError: untyped_storage().fill_ of a simulated tensor")
    with simdevice.cuda() as sim:
        st = torch.ones(16, device="cuda").untyped_storage()
        answers = (st.element_size(), st.nbytes(), st.is_cuda, st.get_device(), st.is_pinned())
        assert not hasattr(st, "_no_such_name")
    sim.assert_clean()
    assert answers == (1, 64, True, 0, False)


def _use_counts(device: str) -> list[int]:
    """A storage's use count as torch's C side gives it, as it changes: what torchtune's ``OffloadActivations``
    compares before and after a backward node (``torch._C._storage_Use_Count(t.untyped_storage()._cdata)``)."""

    def count(t: torch.Tensor) -> int:
        return int(torch._C._storage_Use_Count(t.untyped_storage()._cdata))

    a = torch.ones(64, device=device)
    other = torch.ones(64, device=device)
    counts = [count(a)]
    a.add_(1)  # an operation queued on it
    counts.append(count(a))
    view = a[2:]
    counts.append(count(a))
    view2 = a.view(8, 8)
    counts.append(count(a))
    del view, view2
    counts.append(count(a))
    counts.append(int(a.untyped_storage()._cdata == other.untyped_storage()._cdata))
    counts.append(int(a.untyped_storage()._cdata == a[1:].untyped_storage()._cdata))
    ref = StorageWeakRef(a.untyped_storage())
    counts.append(int(ref.expired()))
    del a
    counts.append(int(ref.expired()))
    return counts


def test_a_storage_s_use_count_and_weak_reference_are_torch_s() -> None:
    """``untyped_storage()._cdata`` (the handle torch's C functions take) was an ``AttributeError`` of the simulator's
    own class, a host error blamed on the program: torchtune's ``OffloadActivations`` raised it in every backward.
    The handle is shared by the allocation's views and no other allocation; the count and a weak reference change
    as a CPU storage's do."""
    expected = _use_counts("cpu")
    with simdevice.cuda() as sim:
        counts = _use_counts("cuda")
    sim.assert_clean()
    assert counts == expected, (counts, expected)
    assert expected[1:5] == [expected[0], expected[0] + 1, expected[0] + 2, expected[0]]


def test_set_points_a_tensor_at_another_storage() -> None:
    with simdevice.cuda() as sim:
        a = torch.zeros(8, device="cuda")
        b = torch.empty(0, device="cuda")
        b.set_(a.untyped_storage(), 0, (4,), (2,))
        b.add_(1)
        c = torch.empty(0, device="cuda")
        c.set_(a)
        assert (b.shape, b.stride(), b.device.type) == (torch.Size([4]), (2,), "cuda")
        assert c.data_ptr() == a.data_ptr()
        assert c.untyped_storage() == a.untyped_storage()
        assert a.cpu().tolist() == [1.0, 0.0] * 4
    sim.assert_clean()


def test_a_set_alias_is_checked_like_the_tensor_it_aliases() -> None:
    with simdevice.cuda() as sim:
        side = torch.cuda.Stream()
        a = torch.zeros(4096, device="cuda")
        alias = torch.empty(0, device="cuda").set_(a.untyped_storage())
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            alias.add_(1)
        a.add_(1)  # no wait for the side stream's write through the alias
    assert any(isinstance(r, Race) for r in sim.reports), sim.text()


def test_setting_data_points_a_parameter_into_a_flat_buffer() -> None:
    # as sharded optimizers do: each parameter's .data becomes a view of one flat buffer
    with simdevice.cuda() as sim:
        flat = torch.zeros(12, device="cuda")
        params = [torch.nn.Parameter(torch.ones(4, device="cuda")), torch.nn.Parameter(torch.ones(2, 4, device="cuda"))]
        params[0].data = flat[:4]
        params[1].data = flat[4:].view(2, 4)
        with torch.no_grad():
            params[0].add_(1)
            params[1].data.add_(2)
        assert params[1].shape == (2, 4)
        assert params[0].requires_grad
        assert flat.cpu().tolist() == [1.0] * 4 + [2.0] * 8
        assert params[0].data_ptr() == flat.data_ptr()
        host = torch.zeros(4)
        params[0].data = host  # (a host tensor's bytes: test_setting_data_moves_a_tensor_between_host_and_device.py)
        assert not params[0].is_cuda
        assert params[0].data_ptr() == host.data_ptr()
    sim.assert_clean()


def test_a_gather_into_the_flat_buffer_races_with_a_read_through_a_parameter() -> None:
    with simdevice.cuda() as sim:
        flat = torch.zeros(4096, device="cuda")
        p = torch.nn.Parameter(torch.ones(4096, device="cuda"))
        p.data = flat
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            flat.fill_(3.0)  # the gather landing in the buffer
        _ = p * 2  # no wait for the side stream: reads the buffer through the parameter
    races = [r for r in sim.reports if isinstance(r, Race)]
    assert races, sim.text()


class _Pool:
    def __init__(self) -> None:
        self.block = torch.ones(4, device="cuda")

    def __del__(self) -> None:
        self.block.add_(torch.ones(4))  # a host tensor in a device op: an error Python would swallow here


def test_an_error_inside_del_is_a_host_error_of_the_run_not_swallowed() -> None:
    with simdevice.cuda() as sim:
        pool = _Pool()
        del pool
        torch.ones(4, device="cuda")
    assert [r.kind for r in sim.reports] == ["host-error"]
    assert "_Pool.__del__, where Python ignores it" in sim.text()
    assert "test_storage.py:" in sim.text()


def test_an_error_inside_a_stream_op_ends_the_run_as_a_host_error() -> None:
    with simdevice.cuda() as sim:
        a = torch.ones(4, device="cuda")
        b = torch.ones(5, device="cuda")
        a.add_(b)  # the shape check fails on the device side of the simulator too: reported, never a hang
    assert [r.kind for r in sim.reports] == ["host-error"]


def test_an_out_tensor_takes_the_result_s_shape_as_cuda_resizes_it() -> None:
    """An ``out=`` op given a tensor not shaped as its result (``empty(0)``, the usual way to pass one) resizes it
    first, as CUDA does; before, the output kept its old shape while the op ran on bytes that could not grow: a wrong
    shape, or an error raised on the stream, a finding on a correct program."""
    with simdevice.cuda() as sim:
        x = torch.arange(16, dtype=torch.float32, device="cuda")
        added, cat, summed, prod = (torch.empty(0, device="cuda") for _ in range(4))
        torch.add(x, x, out=added)
        torch.cat([x, x], out=cat)
        torch.sum(x.view(4, 4), 1, out=summed)
        torch.mm(x.view(4, 4), x.view(4, 4), out=prod)
        shapes = [tuple(t.shape) for t in (added, cat, summed, prod)]
        values = [t.cpu() for t in (added, cat, summed, prod)]
        nbytes = summed.untyped_storage().nbytes()
    sim.assert_clean()
    h = torch.arange(16, dtype=torch.float32)
    assert shapes == [(16,), (32,), (4,), (4, 4)]
    for got, want in zip(values, (h + h, torch.cat([h, h]), h.view(4, 4).sum(1), h.view(4, 4) @ h.view(4, 4)),
                         strict=True):
        assert torch.equal(got, want), (got, want)
    assert nbytes == 16


def test_resize_within_the_storage_is_metadata_and_no_write() -> None:
    """``resize_`` within the storage's bytes launches nothing on CUDA: the tensor shows its new shape (it kept the
    old one before, while computing on the new), keeps its offset, and races with no other stream's read."""
    with simdevice.cuda() as sim:
        x = torch.arange(100, dtype=torch.float32, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            total = x.sum()
        view = x[10:]
        view.resize_(5, 2)
        torch.cuda.current_stream().wait_stream(side)
        got = (tuple(view.shape), view.storage_offset(), view.cpu().flatten().tolist(), total.item())
        empty = torch.empty(0, device="cuda").resize_(3)  # a storage of no bytes gets memory
        empty.fill_(1)
        assert empty.cpu().tolist() == [1.0] * 3
    sim.assert_clean()
    assert got == ((5, 2), 10, [float(i) for i in range(10, 20)], 4950.0)


def _grow() -> None:
    x = torch.ones(16, device="cuda")
    x.resize_(32)


def test_growing_a_storage_that_holds_bytes_is_no_verdict() -> None:
    from simdevice.explain import not_run
    from simdevice.search.explore import explore

    found = explore(_grow, max_examples=1)
    assert found.failure is not None
    unrun = not_run(found.failure)
    assert unrun is not None
    assert unrun.error.startswith("NotImplementedError: growing a device tensor's storage of 64 bytes to 128")


def _typed_storage_listed() -> None:
    torch.ones(16, device="cuda").storage().tolist()


def test_a_device_tensor_is_shared_and_a_typed_storage_method_not_simulated_is_no_verdict() -> None:
    """``share_memory_`` is a no-op for a CUDA tensor and ``is_shared`` is True, as torch says; ``storage()`` (a
    ``TypedStorage``) answers as a CUDA one (``test_storage_copies_are_the_programs_copies.py``), and a method of it
    not simulated (``tolist``) is no verdict. Each raised torch's TypeError before (the simulated storage is no
    ``UntypedStorage``), reported as the program's host error: a finding on a correct program."""
    from simdevice.explain import not_run
    from simdevice.search.explore import explore

    with simdevice.cuda() as sim:
        x = torch.ones(16, device="cuda")
        got = (x.share_memory_() is x, x.is_shared())
    sim.assert_clean()
    assert got == (True, True)
    found = explore(_typed_storage_listed, max_examples=1)
    assert found.failure is not None
    unrun = not_run(found.failure)
    assert unrun is not None, found.failure.text()
    assert unrun.error.startswith("NotImplementedError: storage().tolist of a simulated tensor is not simulated")
