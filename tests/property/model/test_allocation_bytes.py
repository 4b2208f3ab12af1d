"""A device tensor's bytes, whatever its dtype and shape: what the program reads back is what plain CPU tensors give.

The allocator makes a tensor's bytes one of two ways (``simdevice.runtime.allocator._typed``): a typed NumPy view
of its segment where the allocation covers its storage in order and NumPy has the dtype, else a byte view of the
block seen as the dtype and strided as asked (``bfloat16``, a strided template). The alias a queued operation holds
is made the same way. Either way the program must see the same numbers, views of other dtypes and shapes included,
and a block must come back when its last tensor goes.
"""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from simdevice import SimDevice, peek
from simdevice.dispatch import data_of

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool, torch.complex64]

shapes = st.lists(st.integers(0, 5), min_size=0, max_size=3).map(tuple)


def _values(shape: tuple[int, ...], dtype: torch.dtype, device: Any) -> torch.Tensor:
    x = torch.arange(int(torch.Size(shape).numel()), device=device).reshape(shape)
    return (x % 2 == 1) if dtype == torch.bool else x.to(dtype)


def _program(shape: tuple[int, ...], dtype: torch.dtype, device: Any) -> list[torch.Tensor]:
    x = _values(shape, dtype, device)
    y = x.clone()
    z = x.permute(*reversed(range(x.dim()))).contiguous() if x.dim() > 1 else x + x
    column_major = [1] * len(shape)
    for i in range(1, len(shape)):
        column_major[i] = column_major[i - 1] * max(shape[i - 1], 1)
    strided = torch.empty_strided(shape, tuple(column_major), dtype=dtype, device=device)  # not in order
    strided.copy_(x)
    flat = y.reshape(-1)
    if flat.numel():
        flat[0] = flat[-1]
    in_memory = strided.as_strided((strided.numel(),), (1,))  # its bytes in the order they lie
    out = [x, y, z, strided, in_memory]
    if dtype.itemsize == 4 and x.numel():  # the same bytes seen as another dtype
        out.append(x.view(torch.int32) if dtype != torch.int32 else x.view(torch.float32))
    return [t.cpu() if device != "cpu" else t for t in out]


def _layout(t: torch.Tensor) -> list[int]:
    """The strides that matter (a dimension of one element has any)."""
    return [stride for stride, n in zip(t.stride(), t.shape, strict=True) if n > 1]


@settings(max_examples=60, deadline=None)
@given(shape=shapes, dtype=st.sampled_from(DTYPES))
@example(shape=(0, 2, 2), dtype=torch.float32)  # no elements, not in order: a copy keeps its strides
def test_device_bytes_read_back_as_on_the_cpu(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    want = _program(shape, dtype, "cpu")
    run = SimDevice().run(lambda dev: _program(shape, dtype, dev.device))
    assert not run.reports, run.reports
    got = run.result
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert (g.dtype, g.shape, _layout(g)) == (w.dtype, w.shape, _layout(w))
        assert torch.equal(g, w), (g, w)


@given(dtype=st.sampled_from(DTYPES), n=st.integers(1, 300))
@settings(max_examples=30, deadline=None)
def test_a_block_comes_back_when_its_last_tensor_goes(dtype: torch.dtype, n: int) -> None:
    def program(dev: Any) -> tuple[bool, bool, torch.Tensor]:
        a = torch.zeros(n, dtype=dtype, device=dev.device)
        at = data_of(a).data_ptr()
        view = a[:]
        del a
        b = torch.ones(n, dtype=dtype, device=dev.device)  # the view still holds a's block
        del view
        c = torch.ones(n, dtype=dtype, device=dev.device)  # a's block again: the best fit
        dev.synchronize()
        return data_of(b).data_ptr() == at, data_of(c).data_ptr() == at, c

    held, back, c = SimDevice().run(program).result
    assert (held, back) == (False, True)
    assert torch.equal(peek(c), torch.ones(n, dtype=dtype))
