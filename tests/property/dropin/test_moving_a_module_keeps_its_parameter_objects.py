"""``module.to("cuda")``, ``.cuda()`` and ``.to("cpu")`` keep each ``Parameter`` object, and its ``grad``'s, as torch
keeps them on a GPU (``Module._apply`` sets ``param.data``: a CPU and a CUDA tensor are of compatible shallow-copy
types there). Before, a host tensor and a simulated one were not, so torch made new ``Parameter`` objects: an
optimizer made before ``model.cuda()``, or kept across an actor offload's ``model.to("cpu")`` /
``model.to("cuda")`` round trip (verl's), updated orphaned tensors, and a correct program was reported failing.
The moves are still the program's copies: one not waited for by a side stream that reads the weights races.
A module moved while a forward's graph holds views of its weights (a layer whose input needs a gradient saves its
weight's transpose) moves too, the views keeping the bytes they had as on a GPU: a sequential offload run with
grad enabled, and a frozen model's layers offloaded between forward and backward, were refused before."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from hazard_checks import races_only_unwaited
from torch import nn

import simdevice
from simdevice import Race


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))


def _step(model: nn.Module, opt: torch.optim.Optimizer, device: str = "cuda") -> None:
    opt.zero_grad()
    model(torch.ones(2, 8, device=device)).square().sum().backward()
    opt.step()


def _optimizer_before_cuda() -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    ids = [id(p) for p in model.parameters()]
    before = [p.detach().clone() for p in model.parameters()]
    model.cuda()
    assert [id(p) for p in model.parameters()] == ids, "module.cuda() made new Parameter objects"
    assert all(p.is_cuda and isinstance(p, nn.Parameter) and p.requires_grad for p in model.parameters())
    _step(model, opt)
    after = [p.detach().cpu() for p in model.parameters()]
    assert all(not torch.equal(a, b) for a, b in zip(after, before, strict=True)), "the step left the weights"


def _round_trips() -> None:
    """cpu -> cuda -> cpu -> cuda with an Adam made on the host (its state made on the device), a step on each
    device, and what the program put on a parameter (an attribute, hooks) kept."""
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    w = model[0].weight
    w.tag = "embedding"
    seen: list[str] = []
    w.register_hook(lambda g: seen.append(str(g.device)))
    w.register_post_accumulate_grad_hook(lambda p: seen.append("accumulated"))
    ids = [id(p) for p in model.parameters()]
    model.to("cuda")
    _step(model, opt)
    on_device = [p.detach().cpu() for p in model.parameters()]
    model.to("cpu")  # the actor's offload between phases
    assert [id(p) for p in model.parameters()] == ids, "module.to('cpu') made new Parameter objects"
    assert all(p.device.type == "cpu" and type(p) is nn.Parameter for p in model.parameters())
    assert all(torch.equal(p.detach(), q) for p, q in zip(model.parameters(), on_device, strict=True))
    torch.cuda.empty_cache()
    model.to("cuda")
    assert [id(p) for p in model.parameters()] == ids, "module.to('cuda') made new Parameter objects"
    assert model[0].weight is w
    assert w.tag == "embedding"
    assert set(opt.state) == set(model.parameters()), "the optimizer's state is not the model's parameters'"
    _step(model, opt)
    after = [p.detach().cpu() for p in model.parameters()]
    assert all(not torch.equal(a, b) for a, b in zip(after, on_device, strict=True)), "the step left the weights"
    assert seen == ["cuda:0", "accumulated"] * 2, seen


def _grads_move_with_their_parameters() -> None:
    """A parameter's grad moves with it, its object kept, as ``param.grad.data = ...`` keeps it on a GPU; the next
    backward accumulates into it."""
    model = nn.Linear(4, 2)
    first = model(torch.ones(1, 4)).sum()
    first.backward()  # (its graph kept alive across the move: ``first`` holds the AccumulateGrad nodes)
    grads = [p.grad for p in model.parameters()]
    model.cuda()
    assert all(p.grad is g and g.is_cuda for p, g in zip(model.parameters(), grads, strict=True))
    loss = model(torch.ones(1, 4, device="cuda")).sum()
    loss.backward()
    assert torch.equal(model.weight.grad.cpu(), torch.full((2, 4), 2.0))
    model.cpu()  # after the backward, with ``loss`` (its graph) alive
    assert all(p.grad is g and g.device.type == "cpu" for p, g in zip(model.parameters(), grads, strict=True))
    assert torch.equal(model.bias.grad, torch.full((2,), 2.0))
    del first, loss


def _tied_and_converted() -> None:
    """Weights tied between two modules (or under two names of one) stay tied; a dtype change on the device keeps
    the objects, as set_data does on a GPU (no move between host and device)."""
    emb = nn.Embedding(10, 4)
    head = nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    model = nn.ModuleList([emb, head])
    model.cuda()
    assert head.weight is emb.weight
    assert emb.weight.is_cuda
    twice = nn.Module()  # one parameter under two names of one module
    twice.a = twice.b = shared = nn.Parameter(torch.ones(3))
    twice.cuda()
    assert twice.a is shared
    assert twice.b is shared
    assert shared.is_cuda
    w = emb.weight
    model.half()
    assert emb.weight is w
    assert head.weight is w
    assert w.dtype == torch.float16
    assert w.is_cuda


def _a_copy_in_flight_into_the_parameter() -> None:
    """A D2H into the pinned parameter itself still in flight when the module moves (on the same stream, ordered
    before the move's H2D): it lands in the bytes it was given, which the move then reads, as on a GPU; the
    parameter object, a device tensor by then, is not where it lands."""
    model = nn.Linear(64, 64)
    for p in model.parameters():
        p.data = p.data.pin_memory()
    src = torch.full((64, 64), 3.0, device="cuda")
    torch.cuda._sleep(10**6)  # the D2H waits behind it
    with torch.no_grad():
        model.weight.copy_(src, non_blocking=True)
    model.to("cuda", non_blocking=True)
    assert torch.equal(model.weight.cpu(), src.cpu()), "the moved weight is not what the D2H wrote"


def _sequential_offload_with_grad_enabled() -> None:
    """Each block moved to the device, run and moved back (``accelerate``'s sequential offload), grad enabled: from
    the second block on, the forward's graph holds a view of the weight (its input needs a gradient)."""
    torch.manual_seed(0)
    blocks = [nn.Linear(16, 16) for _ in range(3)]
    x = torch.randn(4, 16, requires_grad=True)
    expected = x
    for b in blocks:
        expected = torch.relu(b(expected))  # (the host graph: saved views of blocks 1 and 2's weights)
    y = x.cuda()
    for b in blocks:
        b.to("cuda", non_blocking=True)
        y = torch.relu(b(y))
        b.to("cpu")
    assert all(b.weight.device.type == "cpu" for b in blocks)
    torch.testing.assert_close(y.cpu(), expected)


def _frozen_layers_offloaded_between_forward_and_backward() -> None:
    """Frozen weights (``requires_grad=False``) moved to the host after the forward and back before the backward,
    which reads the views of them its graph saved: the input's gradient is the host's."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8))
    model.requires_grad_(False)
    x = torch.randn(2, 8, requires_grad=True)
    model(x).square().sum().backward()
    expected, x.grad = x.grad, None
    model.cuda()
    xd = x.detach().cuda().requires_grad_()
    loss = model(xd).square().sum()
    model.cpu()
    torch.cuda.empty_cache()
    model.cuda()
    loss.backward()
    torch.testing.assert_close(xd.grad.cpu(), expected)


@pytest.mark.parametrize(
    "program", [_optimizer_before_cuda, _round_trips, _grads_move_with_their_parameters, _tied_and_converted,
                _a_copy_in_flight_into_the_parameter, _sequential_offload_with_grad_enabled,
                _frozen_layers_offloaded_between_forward_and_backward],
    ids=["optimizer made before .cuda()", "round trips", "grads move", "tied and converted", "a copy in flight",
         "sequential offload with grad", "frozen layers offloaded"],
)
def test_a_moved_module_keeps_its_parameter_objects(program: Callable[[], None]) -> None:
    s = simdevice.cuda()
    s.run(program)
    s.assert_clean()


def test_a_parameter_under_two_names_is_copied_once() -> None:
    """As on a GPU, where the second name finds it on the device already: one H2D, as for one name."""

    def module(names: tuple[str, ...]) -> None:
        m = nn.Module()
        shared = nn.Parameter(torch.ones(3))
        for name in names:
            setattr(m, name, shared)
        m.cuda()

    counts = []
    for names in (("a",), ("a", "b")):
        s = simdevice.cuda()
        s.run(lambda names=names: module(names))
        s.assert_clean()
        assert s.result is not None
        counts.append(s.result.op_counts)
    assert counts[0] == counts[1] == {"host": 1, "default": 1}, counts


def test_the_overwrite_flag_makes_new_objects_as_on_a_gpu() -> None:
    def program() -> None:
        model = nn.Linear(4, 4)
        w = model.weight
        model.cuda()
        assert model.weight is not w
        assert model.weight.is_cuda

    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        s = simdevice.cuda()
        s.run(program)
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(False)
    s.assert_clean()


def _side_stream_forward(wait: bool, pinned: bool) -> None:
    """The weights moved with ``non_blocking=True`` (from pinned memory the copy reads them when it runs, after the
    parameters became device tensors), a side stream's training step reading them."""
    model = _model()
    reference = _model()
    if pinned:
        for p in model.parameters():
            p.data = p.data.pin_memory()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.to("cuda", non_blocking=True)  # the weights' H2D copies, on the default stream
    side = torch.cuda.Stream()
    if wait:
        side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _step(model, opt)  # reads the weights
    torch.cuda.current_stream().wait_stream(side)
    _step(reference, torch.optim.SGD(reference.parameters(), lr=0.1), "cpu")
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.allclose(p.detach().cpu(), q.detach()), "the step's weights differ from the host's"


@pytest.mark.parametrize("pinned", [False, True], ids=["pageable", "pinned"])
@pytest.mark.parametrize("wait", [True, False], ids=["waited", "not waited"])
def test_the_moves_are_the_program_s_copies(wait: bool, pinned: bool) -> None:
    s = simdevice.cuda()
    s.run(lambda: _side_stream_forward(wait, pinned))
    if wait:
        s.assert_clean()
    else:
        assert any(isinstance(r, Race) for r in s.reports), s.text()


@pytest.mark.parametrize("input_grad", [False, True], ids=["input without grad", "input with grad"])
def test_a_move_between_a_forward_and_its_backward_leaves_the_gradient_on_the_device(input_grad: bool) -> None:
    """The backward accumulates into the tensor the parameter had on the device, which the parameter shows as its
    ``grad`` on the host, as torch's ``set_data`` keeps one tensor on a GPU (whether the graph holds the weight
    through its gradient's accumulator alone, or a saved view of it too). Before: no verdict."""
    def program() -> list[str]:
        model = nn.Linear(4, 4).cuda()
        loss = model(torch.ones(1, 4, device="cuda", requires_grad=input_grad)).sum()  # its graph holds the weight
        model.cpu()
        loss.backward()
        assert model.weight.grad is not None
        return [model.weight.device.type, model.weight.grad.device.type, str(model.weight.grad.sum().item())]

    s = simdevice.cuda()
    s.run(program)
    assert s.result is not None
    assert s.result.reports == (), s.result.reports
    assert s.result.result == ["cpu", "cuda", "16.0"]  # (each weight's gradient the input's 1)


def test_a_sequential_offload_with_grad_enabled_races_only_unwaited() -> None:
    """``tests/hazards.py::sequential_offload`` (run on a GPU in ``tests/gpu/test_dropin_gpu.py``): the moves back are
    the program's non-blocking copies, read by the host after ``synchronize()`` or not."""
    races_only_unwaited("sequential_offload", "default#0+20")
