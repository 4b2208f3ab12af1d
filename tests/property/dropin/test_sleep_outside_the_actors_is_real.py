"""Rule (facade._host_sleep): while torch is patched, ``time.sleep`` outside the run's actors (here: between a
search's runs, where a held block keeps the patches) is a real sleep; only an actor's sleep is virtual time."""

from __future__ import annotations

import time

import simdevice
from simdevice.dropin.session import held


def test_a_sleep_between_runs_sleeps_for_real() -> None:
    real = time.sleep
    clock = time.monotonic  # (Python's: in the actors the session's clocks read host time)
    with held():
        assert time.sleep is not real  # the patched sleep is in place
        t0 = time.monotonic()
        time.sleep(0.05)
        slept = time.monotonic() - t0
        with simdevice.cuda() as sim:
            t1, v1 = clock(), time.monotonic()
            time.sleep(5.0)  # an actor's sleep: virtual host time, no real wait
            virtual, seen = clock() - t1, time.monotonic() - v1
        sim.assert_clean()
    assert time.sleep is real
    assert slept >= 0.05
    assert virtual < 5.0
    assert abs(seen - 5.0) < 1e-6  # what the program's clock read
