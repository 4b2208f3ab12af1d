"""Rule (Execution._run_greenlets' last ``raise_held``): a Ctrl-C that lands while the run gives torch's per-thread
state back to its caller (a move a stop must not cut, so it is held) is raised there, at the run's end: the run
stops as it would have, and one that met state a greenlet cannot hold (its actors must go on threads) is not
started again first."""

from __future__ import annotations

import signal
from typing import Any

import pytest
import torch

from simdevice import SimConfig, SimDevice, signals
from simdevice.runtime import tls


def test_a_stop_held_while_the_state_goes_back_to_the_caller_ends_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(signals, "_PENDING", [])
    real = tls.back_to_caller
    landed: list[str] = []

    def back_to_caller(*args: Any) -> Any:
        out = real(*args)
        if not landed:
            landed.append("in the last move")
            signals.on_sigint(signal.SIGINT, None)  # held: the move is a section a stop must not cut
        return out

    monkeypatch.setattr(tls, "back_to_caller", back_to_caller)
    started: list[str] = []

    def worker(dev: Any) -> None:
        with torch.inference_mode():  # across a switch: one thread cannot hold it for two greenlet actors
            for _ in range(3):
                dev.sleep(1)

    def host(dev: Any) -> None:
        started.append(dev.config.actors)
        p = dev.Process(worker)
        p.start()
        for _ in range(3):
            dev.sleep(1)
        p.join()

    dev = SimDevice(config=SimConfig(actors="greenlet"))
    with pytest.raises(KeyboardInterrupt):
        dev.run(host)
    assert landed == ["in the last move"]
    assert started == ["greenlet"]  # stopped where the stop was held: the run was not started again on threads
