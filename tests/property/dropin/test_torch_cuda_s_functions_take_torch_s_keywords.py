"""The session's ``torch.cuda`` functions take the keywords torch's take: ``torch.cuda.stream(stream=s)``,
``torch.cuda.set_stream(stream=s)``, ``torch.cuda.get_device_name(device=0)``. Before, the simulated ones named their
parameter otherwise (``s``, ``d``), and the call raised ``TypeError``: a host error that reported a correct program as
failing."""

from __future__ import annotations

import inspect

import torch

import simdevice


def _keywords(f: object) -> tuple[list[str], bool]:
    sig = inspect.signature(f)  # type: ignore[arg-type]
    names = [p.name for p in sig.parameters.values() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return names, any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values())


def test_every_replaced_function_takes_torch_s_keywords() -> None:
    owners = (torch.cuda, torch.cuda.memory, torch.cuda.streams, torch.cuda.graphs)
    before = {(id(m), n): getattr(m, n) for m in owners for n in dir(m) if not n.startswith("__")}
    with simdevice.cuda():
        during = {(id(m), m.__name__, n): getattr(m, n) for m in owners for n in dir(m) if not n.startswith("__")}
    missing = {}
    for (key, module, name), now in during.items():
        was = before.get((key, name))
        if was is None or was is now or not inspect.isfunction(was) or not callable(now):
            continue
        wanted, _ = _keywords(was)
        taken, any_keyword = _keywords(now)
        lost = [k for k in wanted if k not in taken]
        if lost and not any_keyword:
            missing[f"{module}.{name}"] = lost
    assert not missing, missing


def stream_by_keyword() -> None:
    s = torch.cuda.Stream()
    x = torch.ones(64, device="cuda")
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream=s):
        y = x * 2
    torch.cuda.set_stream(stream=s)
    y.add_(1)
    torch.cuda.set_stream(stream=torch.cuda.default_stream())
    torch.cuda.current_stream().wait_stream(s)
    assert torch.cuda.get_device_name(device=0)
    assert y.sum().item() == 3 * 64


def test_a_program_that_names_them_by_keyword_runs() -> None:
    run = simdevice.cuda()
    run.run(stream_by_keyword)
    run.assert_clean()
    assert run.result is not None
    assert run.result.op_counts["s"] == 2, run.result.op_counts
