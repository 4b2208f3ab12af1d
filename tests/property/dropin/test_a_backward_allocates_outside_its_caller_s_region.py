"""On CUDA, autograd's engine runs a device's nodes on its own device thread, and a ``torch_memory_saver`` region
routes only the allocations of the thread that entered it (torch's ``use_mem_pool``: "If a new thread is spawned
inside the context manager (e.g. by calling backward) the allocations in that thread will not route to the given
pool"; the library's region configuration is ``thread_local``). So a trainer that runs forward and backward inside
``region("train")`` gets its forward's tensors in the region and its gradients outside it: a pause leaves the
gradients mapped, and without a backup they keep their values. The simulator ran the backward's allocations in the
caller's region: reading a gradient while the region slept was reported as an illegal access no GPU makes, and
after the wake it held the pause's garbage."""

from __future__ import annotations

import torch

import simdevice

N = 1 << 12


def step_in_a_region(read: str = "grad", backup: bool = False) -> float:
    """A training step inside ``region("train")``; then the region sleeps and wakes. ``read``: what the program
    reads while asleep (``grad``: the weight's gradient, made by the backward; ``act``: the forward's activation,
    the region's, the bug); or ``after``: the gradient after the wake."""
    from torch_memory_saver import torch_memory_saver as tms

    with tms.region(tag="train", enable_cpu_backup=backup):
        w = torch.ones(N, device="cuda", requires_grad=True)
        act = w * 2.0  # the forward's activation: made by this thread, in the region
        loss = (act * 3.0).sum()
        loss.backward()  # the gradient: made by autograd's device thread, outside the region
    torch.cuda.synchronize()  # wait: the step is done before the pause unmaps its memory
    tms.pause("train")
    out = 0.0
    if read == "grad":
        out = w.grad.sum().item()  # type: ignore[union-attr]
    elif read == "act":
        out = act.sum().item()
    tms.resume("train")
    if read == "after":
        out = w.grad.sum().item()  # type: ignore[union-attr]
    return out


def test_a_gradient_is_readable_while_the_region_sleeps() -> None:
    run = simdevice.cuda().run(step_in_a_region)
    assert not run.reports, [str(r) for r in run.reports]
    assert run.result == 6.0 * N


def test_a_gradient_keeps_its_values_across_a_pause_without_backup() -> None:
    run = simdevice.cuda().run(step_in_a_region, read="after")
    assert not run.reports, [str(r) for r in run.reports]
    assert run.result == 6.0 * N


def test_the_forward_s_activation_is_the_region_s_and_sleeps() -> None:
    run = simdevice.cuda().run(step_in_a_region, read="act", backup=True)
    assert run.reports, "the activation was made in the region: reading it asleep is an illegal access"
    assert {r.kind for r in run.reports} <= {"illegal-access", "host-error"}
    assert any(r.kind == "illegal-access" and "memory_saver.pause('train')" in str(r) for r in run.reports)


def grad_after_wake() -> None:
    assert step_in_a_region(read="after") == 6.0 * N


def test_no_schedule_finds_a_bug_in_the_correct_program() -> None:
    assert simdevice.explore(grad_after_wake, max_examples=20).failure is None
