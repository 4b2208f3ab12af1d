"""Code under ``torch.inference_mode()`` (vLLM's and SGLang's forward, a KV-cache swap, weights brought from pinned
memory with ``.to("cuda", non_blocking=True)``) runs as torch runs it: ``to`` (which reaches the dispatch mode
whole there, autograd being skipped) is the copy it is, not a view of its input; a view of a normal tensor made there
is a normal tensor; a kernel the stream runs after the block writes its output; and an inference tensor updated in
place outside the mode raises torch's own error. Before, the H2D raised an internal AssertionError (a host error
blamed on the program), ``d.to(torch.float16)`` was taken for a view of ``d``, a view raised "Cannot set
version_counter", and a kernel run after the block raised "Inplace update to inference tensor"."""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call

import simdevice
from simdevice import Race

N = 64


def _offload(side: bool, wait: bool) -> None:
    """vLLM's CPU weight offload: the weights in pinned memory, moved to the device inside the forward (on a
    prefetch stream, ``side``; the compute stream waits for it, ``wait``)."""
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(N, N), torch.nn.GELU(), torch.nn.Linear(N, N))
    dev = torch.nn.Sequential(torch.nn.Linear(N, N), torch.nn.GELU(), torch.nn.Linear(N, N))
    dev.load_state_dict(ref.state_dict())
    dev.cuda()
    host = {k: v.detach().cpu().pin_memory() for k, v in dev.state_dict().items()}
    s = torch.cuda.Stream()
    hx = torch.randn(4, N)
    with torch.inference_mode():
        x = hx.cuda()
        if side:
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                w = {k: v.to("cuda", non_blocking=True) for k, v in host.items()}
            if wait:
                torch.cuda.current_stream().wait_stream(s)
            for v in w.values():
                v.record_stream(torch.cuda.current_stream())
        else:
            w = {k: v.to("cuda", non_blocking=True) for k, v in host.items()}
        y = functional_call(dev, w, (x,)).view(4 * N)  # a view of an inference tensor
    got = y.cpu()  # the stream may run the forward's kernels after the block
    with torch.no_grad():
        assert torch.allclose(got, ref(hx).view(4 * N), rtol=1e-4, atol=1e-5), "the output differs"


@pytest.mark.parametrize("side", [False, True])
def test_weights_moved_to_the_device_under_inference_mode_are_clean(side: bool) -> None:
    r = simdevice.cuda()
    r.run(_offload, side, True)
    r.assert_clean()


def test_a_prefetch_the_forward_does_not_wait_for_races_under_inference_mode() -> None:
    r = simdevice.cuda()
    r.run(_offload, True, False)
    races = [x for x in r.reports if isinstance(x, Race)]
    assert races, r.text()
    assert all("(H2D)" in str(x) for x in races), r.text()


def _conversions() -> tuple[bool, bool, bool]:
    d = torch.arange(8.0, device="cuda").mul(2.0)
    with torch.inference_mode():
        half = d.to(torch.float16)  # a copy into a new tensor, as _to_copy makes it
        same = d.to(torch.float32)  # the tensor itself
        view = d.view(2, 4)  # a view of a normal tensor: a normal tensor
        made = torch.ones(4, device="cuda")  # an inference tensor
    assert torch.equal(half.cpu(), torch.arange(8.0, dtype=torch.float16) * 2), "the converted tensor differs"
    view.add_(1.0)  # allowed: a normal tensor
    assert torch.equal(d.cpu(), torch.arange(8.0) * 2 + 1), "the view's update is not its base's"
    return half.data_ptr() != d.data_ptr(), same is d, made.is_inference() and not view.is_inference()


def test_to_is_a_copy_and_a_view_of_a_normal_tensor_is_normal() -> None:
    r = simdevice.cuda()
    r.run(_conversions)
    r.assert_clean()
    assert r.result is not None
    assert r.result.result == (True, True, True)


def _inplace_outside() -> None:
    with torch.inference_mode():
        t = torch.ones(4, device="cuda")
    t.add_(1.0)


def test_an_inference_tensor_updated_outside_the_mode_raises_torch_s_error() -> None:
    r = simdevice.cuda()
    r.run(_inplace_outside)
    assert "Inplace update to inference tensor outside InferenceMode" in r.text(), r.text()
    assert "host raised RuntimeError" in r.text(), r.text()  # the host's, not a stream's


def test_the_hazard_tests_gpu_runs_counts_to_as_one_copy_on_its_stream() -> None:
    """``tests/hazards.py::inference_prefetch`` (what tests/gpu counts on a GPU, where ``reference/cuda.py``'s
    counting mode decomposes a composite op as autograd would have): ``to`` under inference mode is ``prefetch``'s
    one operation, and the unwaited read is found under the stall."""
    from reference.schedule import Schedule
    from simdevice.search.targets import resolve

    line = "tests/hazards.py::inference_prefetch"
    target = resolve(line)
    out = target.run(Schedule.parse(f"{line}::prefetch#0+20"))
    assert not out.corrupted, out.text()
    assert out.run.op_counts["prefetch"] == 1, out.run.op_counts
    assert target.run(Schedule.parse(f"{line}:wait=0:prefetch#0+20")).corrupted
