"""Host copies to and from pageable memory at their own rate (``SimConfig.pageable_h2d_bytes_per_us``,
``pageable_d2h_bytes_per_us``; 0, the default: the pinned rate). On the H200 a copy from a program's own CPU tensor
and a ``.cpu()`` into a fresh one ran 5-40x below the pinned rate (docs/fidelity.md); a profile says so."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from simdevice import SimConfig, SimDevice

N = 4096  # floats: 16 KiB, 16 MiB on the GPU's scale


def _copies(dev: Any) -> None:
    pageable = torch.ones(N)
    pinned = torch.ones(N, pin_memory=True)
    x = torch.empty(N, device=dev.device)
    x.copy_(pageable, non_blocking=True)
    x.copy_(pinned, non_blocking=True)
    x.cpu()
    back = torch.empty(N, pin_memory=True)
    back.copy_(x, non_blocking=True)
    dev.synchronize()


def _durations(config: SimConfig) -> list[tuple[str, int]]:
    run = SimDevice(config=config).run(_copies)
    assert run.reports == ()
    starts: dict[str, int] = {}
    out = []
    for t, actor, what in run.trace:
        if actor != "default":
            continue
        kind, name = what.split(" ", 1)
        if kind == "start":
            starts[name] = t
        elif kind == "done" and ("(H2D)" in name or "(D2H)" in name):
            out.append((name, t - starts[name]))
    return out


@pytest.mark.parametrize(("h2d", "d2h"), [(0, 0), (6391, 1296), (1296, 6391)])
def test_a_host_copy_takes_its_memorys_rate(h2d: int, d2h: int) -> None:
    config = SimConfig(pageable_h2d_bytes_per_us=h2d, pageable_d2h_bytes_per_us=d2h)
    nbytes = N * 4
    pinned = config.copy_ns(nbytes)
    want = [
        ("copy_ (H2D) #0", config.copy_ns(nbytes, "h2d") if h2d else pinned),  # from the pageable tensor
        ("copy_ (H2D) #1", pinned),
        ("_to_copy (D2H) #2", config.copy_ns(nbytes, "d2h") if d2h else pinned),  # .cpu(): a fresh pageable one
        ("copy_ (D2H) #3", pinned),
    ]
    assert _durations(config) == want
    if h2d:
        assert config.copy_ns(nbytes, "h2d") == nbytes * config.byte_scale * 1000 // h2d
        assert config.copy_ns(nbytes, "h2d") > pinned


def test_the_shipped_h200_profile_has_the_measured_pageable_rates() -> None:
    from simdevice.runtime.profiles import load

    profile = load("h200-torch2.11")
    cfg = profile.config()
    assert (cfg.pageable_h2d_bytes_per_us, cfg.pageable_d2h_bytes_per_us) == (6391, 1296)
    assert profile.measured["pageable"]["h2d_bytes_per_us"] == 6391
