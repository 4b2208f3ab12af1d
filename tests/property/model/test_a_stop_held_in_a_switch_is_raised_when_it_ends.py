"""Rule (Execution._switch's ``raise_held``): a Ctrl-C that lands while torch's per-thread state is put back for
the greenlet actor whose turn came (a move a stop must not cut, so it is held) is raised as soon as that move is
whole, in that actor, before it runs another step: the run stops there, as a Ctrl-C stops a program at once; it
does not run on to its end first."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from simdevice import SimConfig, SimDevice, signals
from simdevice.runtime import tls

STEPS = 10


def test_a_stop_held_while_an_actor_s_state_is_put_back_stops_the_run_there(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(signals, "_PENDING", [])
    monkeypatch.setattr(signals, "_HELD", [])
    real = tls.put
    log: list[str] = []
    puts = [0]

    def put(state: Any) -> Any:
        out = real(state)
        puts[0] += 1
        if puts[0] == 3:  # a switch in the middle of the run
            log.append("stop")
            signals.on_sigint(signal.SIGINT, None)  # held: putting the state back is a section a stop must not cut
        return out

    monkeypatch.setattr(tls, "put", put)

    def worker(dev: Any) -> None:
        for i in range(STEPS):
            log.append(f"worker {i}")
            dev.sleep(1)

    def host(dev: Any) -> None:
        p = dev.Process(worker)
        p.start()
        for i in range(STEPS):
            log.append(f"host {i}")
            dev.sleep(1)
        p.join()

    dev = SimDevice(config=SimConfig(actors="greenlet"))
    with pytest.raises(KeyboardInterrupt):
        dev.run(host)
    assert "stop" in log, "no switch put an actor's state back three times: the stop never came"
    after = log[log.index("stop") + 1:]
    assert after == [], f"the run went on after the stop: {after}"
