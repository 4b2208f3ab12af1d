"""Rule (execution: ``_switch``): a greenlet run that meets torch state one thread cannot hold for two actors (two
ranks inside autograd's backward at once) starts again on threads, whatever the program does with the error on its
way out; and what the first attempt made and kept (a library's module-level lock, made at its import in the run) is
in the second attempt as a new process would make it.

Found running DeepSpeed's ZeRO: its backward takes a module-level lock in a hook and again in a ``finally``. The
error that sends the run to threads was replaced by what the program's handler raised (a host error, or a deadlock
where the handler waited for the rank whose turn the error took: a false verdict), and the lock the first attempt
held when it stopped was still held in the second (its ranks deadlocked). Each mutation fails one test here: the
error not recorded where it is raised (the wrapped error is the verdict), and a kept lock keyed on the session's
device rather than the run's (the second attempt deadlocks).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
import torch.distributed as dist

import simdevice

#: what the program keeps across its runs (a library's module global, made at its import in the first run)
_KEPT: list[Any] = []


def _backward_in_both_ranks() -> torch.Tensor:
    w = torch.ones(4, device="cuda", requires_grad=True)

    def hook(g: torch.Tensor) -> torch.Tensor:
        torch.ones(1, device="cuda")  # (a host step inside the backward: the other rank runs)
        return g

    y = w * 2
    y.register_hook(hook)
    y.sum().backward()
    assert w.grad is not None
    return w.grad


def _wraps_what_its_backward_raises() -> float:
    try:
        grad = _backward_in_both_ranks()
    except BaseException as e:  # (a library that wraps any failure of its backward in its own error)
        raise RuntimeError("the backward failed") from e
    return float(grad.sum())


def _holds_a_kept_lock_across_its_backward() -> float:
    if not _KEPT:
        _KEPT.append(threading.Lock())
    lock = _KEPT[0]
    if dist.get_rank() == 0:
        with lock:
            grad = _backward_in_both_ranks()
    else:
        grad = _backward_in_both_ranks()
        with lock:
            pass
    return float(grad.sum())


@pytest.mark.parametrize("program", [_wraps_what_its_backward_raises, _holds_a_kept_lock_across_its_backward])
def test_a_run_of_two_backwards_at_once_starts_again_on_threads(program: Any) -> None:
    _KEPT.clear()
    s = simdevice.cuda()
    s.run(program, world_size=2)
    assert s.device.config.actors == "thread"  # (the default schedule takes the ranks into their backwards at once)
    assert not s.reports, s.text()
    assert s.result.result == [8.0, 8.0]


def _hooks_disabled_on_one_rank() -> float:
    w = torch.ones(4, device="cuda", requires_grad=True)
    if dist.get_rank() == 0:
        with torch.autograd.graph.disable_saved_tensors_hooks("rank 0 saves as it is"):
            y = (w * 2).sum()  # (host steps inside the block: the other rank runs)
            torch.ones(1, device="cuda")
    else:
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t.clone(), lambda t: t):
            y = (w * w).sum()
    y.backward()
    assert w.grad is not None
    return float(w.grad.sum())


def test_saved_tensor_hooks_disabled_on_one_rank_are_that_rank_s_alone() -> None:
    """Rule (``tls.movable``): disabled saved-tensor hooks are a thread's state that no greenlet switch can move, so
    the run starts again on threads, where each rank has its own: rank 1 registers its hooks while rank 0 is inside
    its block. Mutation: the disabled hooks not named (the run stays on greenlets, and rank 1's registration raises
    rank 0's message)."""
    s = simdevice.cuda()
    s.run(_hooks_disabled_on_one_rank, world_size=2)
    assert not s.reports, s.text()
    assert s.device.config.actors == "thread"
    assert s.result.result == [8.0, 8.0]
