"""``replay --gpu``'s counting of device-agnostic code and of ``inference_mode`` (CHANGELOG, twenty-sixth sitting),
the parts that run without a GPU (``reference/cuda_plain.py`` and ``reference/cuda.py`` otherwise run on one, in
tests/gpu): the generic ``torch.Stream`` / ``torch.Event`` stand-ins decide by their ``device`` argument (None, an
index, ``"cuda"`` are CUDA's; another device's is torch's own class), ``torch.accelerator.synchronize()`` and
``empty_cache()`` are one host step each, as ``torch.cuda``'s, and the counting mode decomposes an op that reaches
it whole under ``inference_mode`` (``to``), as autograd would have, so that its parts are what it counts."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hazards import ScaledWeight

import reference.cuda
import reference.cuda_plain as plain


@pytest.mark.parametrize("device", [None, 0, "cuda", "cuda:0", torch.device("cuda", 0)])
def test_the_accelerator_s_device_arguments_are_cuda_s(device: Any) -> None:
    assert plain._on_cuda(device)


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu")])
def test_another_device_s_argument_is_not(device: Any) -> None:
    assert not plain._on_cuda(device)


def test_another_device_s_generic_stream_and_event_are_torch_s_own() -> None:
    s = plain.GenericStream("cpu")
    assert type(s) is torch._C.Stream
    assert isinstance(s, plain.GenericStream)
    e = plain.GenericEvent("cpu")
    assert type(e) is torch._C.Event
    assert isinstance(e, plain.GenericEvent)


class _Steps:
    def __init__(self) -> None:
        self.n = 0

    def host_step(self, **kwargs: Any) -> None:
        self.n += 1


@pytest.mark.parametrize("call", ["synchronize", "empty_cache"])
def test_the_accelerator_s_waits_are_one_host_step_each(monkeypatch: pytest.MonkeyPatch, call: str) -> None:
    steps = _Steps()
    monkeypatch.setattr(plain, "_DEV", [steps])
    monkeypatch.setitem(plain._ORIGINAL, f"accelerator_{call}", lambda *args: None)
    getattr(plain, f"accelerator_{call}")()
    assert steps.n == 1


def _seen(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ops the counting mode is asked about from now on (``op_kind`` recorded)."""
    seen: list[str] = []
    kind = reference.cuda.op_kind

    def recorded(func: Any) -> Any:
        seen.append(str(func))
        return kind(func)

    monkeypatch.setattr(reference.cuda, "op_kind", recorded)
    return seen


def test_an_op_torch_runs_whole_under_inference_mode_is_counted_by_its_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _seen(monkeypatch)
    x = torch.ones(8)
    with torch.inference_mode(), reference.cuda._CountingMode(dev=None):  # type: ignore[arg-type]
        y = x.to(torch.float16)
    assert y.dtype == torch.float16
    assert "aten._to_copy.default" in seen, seen
    assert not [f for f in seen if f.startswith("aten.to.")], seen


def test_a_wrapper_subclass_s_op_is_counted_by_the_kernels_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The subclass's op is the subclass's to run: the counting mode declines it, and the ops the subclass runs on
    the tensors it wraps (a widening copy, a multiplication, the op itself), each a kernel on a GPU, are what it
    counts, as the simulator counts them (it had counted the one op and run the kernels unseen)."""
    seen = _seen(monkeypatch)
    x, w = torch.ones(2, 4), ScaledWeight(torch.ones(4, 4, dtype=torch.bfloat16), torch.tensor(0.5))
    with reference.cuda._CountingMode(dev=None):  # type: ignore[arg-type]
        y = x @ w
    assert torch.equal(y, torch.full((2, 4), 2.0))
    assert seen == ["aten._to_copy.default", "aten.mul.Tensor", "aten.mm.default"], seen


def test_plain_code_outside_a_counted_run_finds_uninitialized_memory_poisoned() -> None:
    """``reference.cuda.poisoned()`` (``scripts/hazard-syncs`` on a GPU): an allocation nobody wrote is poisoned as
    in a counted run, a written one is not, and torch's storage ``resize_`` is its own again after it."""
    resize = torch.UntypedStorage.resize_
    with reference.cuda.poisoned():
        empty, ints, zeros = torch.empty(4), torch.empty(3, dtype=torch.int32), torch.zeros(2)
        assert torch.UntypedStorage.resize_ is not resize
    assert bool(empty.isnan().all())
    assert ints.tolist() == [torch.iinfo(torch.int32).max] * 3
    assert zeros.tolist() == [0.0, 0.0]
    assert torch.UntypedStorage.resize_ is resize

