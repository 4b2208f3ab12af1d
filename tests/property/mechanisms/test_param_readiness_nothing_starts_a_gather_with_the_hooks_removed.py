"""Parameter readiness: with the forward pre-hooks removed, nothing starts an all-gather.

``test_param_readiness.py`` checks that the readiness callback starts no gather with the hooks removed. Two other
paths start gathers and must not either: the pre-hook itself (``hooks_installed`` is the hooks' registration: a
removed hook does not run), and ``disable_forward_pre_hook``'s drain, which only waits the gather in flight
(``skip_next``: without hooks nobody owns the chain). Either, mutated, gathers every remaining bucket group while
the wrapper is asleep: each gather waited at once (a hook or the drain's loop reaches the chained group next), so
no race and no stale weight shows it, only collectives nobody asked for. On the host-only stand-in device of
``test_param_readiness.py`` (a gather lands when its handle is waited), under the same random driver.
"""

from __future__ import annotations

import pytest
from hypothesis import find, given, settings
from test_param_readiness import _ACTIONS, _wrap

import reference.param_readiness as pr
from simdevice.search import search_settings

_FIND = search_settings()


def nothing_gathers_with_the_hooks_removed(fixes: pr.Fixes, actions: list[tuple[str, int]]) -> None:
    """After every action of a random driver: the hook ran with the hooks removed, or a disable without a param
    sync, started no gather (raises AssertionError)."""
    dev, params, ddp = _wrap(fixes, bucket=1)
    for act, i in actions:
        removed = not ddp.hooks_installed
        before = dev.gathers
        if act == "hook":
            ddp.forward_pre_hook(params[i])
            if removed:
                assert dev.gathers == before, "a removed forward pre-hook started a gather"
        elif act == "disable":
            ddp.disable_forward_pre_hook(param_sync=False)
            assert dev.gathers == before, "disable_forward_pre_hook(param_sync=False) started a gather"
            assert all(g.state != pr.IN_FLIGHT for g in ddp.groups)
        elif act == "ensure":
            pr.ensure_params_ready([params[i]])
        elif act == "capture":
            with ddp.graph_capture():
                pr.ensure_params_ready([params[i]])
        elif act == "enable":
            ddp.enable_forward_pre_hook()
        elif act == "step" and not any(g.state == pr.IN_FLIGHT for g in ddp.groups):
            ddp.finish_grad_sync()
            ddp.optimizer_step()
        elif act == "eager" and ddp.hooks_installed:
            ddp.start_param_sync()


@settings(max_examples=150, deadline=None, database=None)
@given(_ACTIONS)
def test_fixed_starts_no_gather_with_the_hooks_removed(actions: list[tuple[str, int]]) -> None:
    nothing_gathers_with_the_hooks_removed(pr.FIXED, actions)


def test_fixed_drain_waits_the_gather_in_flight_and_starts_none() -> None:
    """Not vacuous: the drain has a chained gather to finish, and a hook run with the hooks installed does gather."""
    dev, params, ddp = _wrap()
    ddp.forward_pre_hook(params[0])  # gathers group 0 and chains group 1
    assert (dev.gathers, [g.state for g in ddp.groups]) == (2, [pr.PUBLISHED, pr.IN_FLIGHT] + [pr.UNDISPATCHED] * 2)
    ddp.disable_forward_pre_hook(param_sync=False)
    assert (dev.gathers, [g.state for g in ddp.groups]) == (2, [pr.PUBLISHED] * 2 + [pr.UNDISPATCHED] * 2)
    ddp.forward_pre_hook(params[2])
    assert dev.gathers == 2


def _hook_ignores_removal(self: pr.DistributedDataParallel, layer: pr.Param) -> None:
    """A mutant of ``forward_pre_hook``: no ``if self.hooks_installed``, so a removed hook still gathers."""
    self.group_of[id(layer)].finish_param_sync()


def _drain_chains(self: pr.DistributedDataParallel, param_sync: bool = True) -> None:
    """A mutant of ``disable_forward_pre_hook``: the drain finishes the gather in flight without ``skip_next``, so it
    starts the next group's, which the loop then finishes and chains on, to the last group."""
    self.hooks_installed = False
    for g in self.groups:
        if g.param_gather_handle is not None:
            g.finish_param_sync()
    if param_sync:
        self.start_param_sync(force_sync=True)


@pytest.mark.parametrize(
    ("name", "mutant", "shrunk"),
    [
        ("forward_pre_hook", _hook_ignores_removal, [("disable", 0), ("hook", 0)]),
        ("disable_forward_pre_hook", _drain_chains, [("eager", 0), ("disable", 0)]),  # group 0 in flight
    ],
)
def test_the_property_catches_a_gather_started_with_the_hooks_removed(
    name: str, mutant: object, shrunk: list[tuple[str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    def breaks(actions: list[tuple[str, int]]) -> bool:
        try:
            nothing_gathers_with_the_hooks_removed(pr.FIXED, actions)
        except AssertionError:
            return True
        return False

    monkeypatch.setattr(pr.DistributedDataParallel, name, mutant)
    assert find(_ACTIONS, breaks, settings=_FIND) == shrunk
    monkeypatch.undo()
    nothing_gathers_with_the_hooks_removed(pr.FIXED, shrunk)  # FIXED starts nothing there
