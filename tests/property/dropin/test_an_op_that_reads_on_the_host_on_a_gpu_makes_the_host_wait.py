"""Whether an op makes the host wait for the stream is what an H100 measured (``scripts/api-sweep run --waits``, a
stall of 20 ms on the current stream before each call: docs/confirmations.md, fifty-first run), for the ops whose
CUDA kernels read a value on the host as they run (``torch.inverse``'s and ``linalg``'s error checks, ``svd``,
``matrix_exp``, ``histc`` with no range, ``normal`` with a tensor of deviations, ``isin`` where it sorts,
``t.copy_(number)``), for the ops with no meta kernel whose output shape no value decides (``geqrf``,
``dequantize`` of a float tensor, ``binomial``: they waited here as if it did, a wait a GPU does not make, which can
hide a race), for ops that copy a host argument in themselves (``slice_scatter``'s ``src``, ``bernoulli_``'s ``p``:
refused here before), and for ops that wait, or not, as before (``nonzero``, ``equal``, ``abs``, ``add``). The
simulator's answers here are measured in virtual time by the same script."""

from __future__ import annotations

from typing import Any

import pytest
from script_modules import load_script

SWEEP = load_script("api-sweep")
MAKERS = SWEEP.makers

#: what the GPU measured, per call (a second argument: ``dev`` another device tensor, ``float`` a number)
ON_A_GPU = {
    "device.inverse": "waits",
    "device.svd": "waits",
    "device.matrix_exp": "waits",
    "device.histc": "waits",
    "device.torch.linalg.pinv": "waits",
    "device.torch.linalg.eigh": "waits",
    "device.torch.linalg.eig": "waits",
    "device.torch.linalg.ldl_factor_ex": "waits",
    "device.nonzero": "waits",
    "device.geqrf": "no wait",
    "device.dequantize": "no wait",
    "device.abs": "no wait",
}
ON_A_GPU_BINARY = {
    "device.torch.normal(dev)": "waits",
    "device.torch.normal(float)": "no wait",
    "device.torch.isin(dev)": "waits",
    "device.torch.binomial(dev)": "no wait",
    "device.copy_(float)": "waits",
    "device.copy_(cpu0d)": "waits",
    "device.copy_(dev)": "no wait",
    "device.add(float)": "no wait",
    "device.equal(dev)": "waits",
    # a host ``src`` or ``p`` the op copies to the device itself, blocking (taken, where it was refused)
    "device.slice_scatter(cpu)": "waits",
    "device.slice_scatter(pinned)": "waits",
    "device.slice_scatter(dev)": "no wait",
    "device.bernoulli_(cpu)": "waits",
    "device.bernoulli_(cpu0d)": "waits",
    "device.bernoulli_(dev)": "no wait",
}


def _names(keys: list[str]) -> list[str]:
    return sorted({k.split(".", 1)[1].split("(")[0] for k in keys})


def _invertible() -> dict[str, Any]:
    """The sweep's tensors with the device one invertible. The sweep's own, ``(arange(16).reshape(4, 4) + 1) / 32``,
    is singular (rank 2), and whether LU finds an exact zero pivot in it depends on the host's CPU: on an AMD EPYC
    (MKL) it does, and ``inverse`` raised ``_LinAlgError`` here, where the H100's did not (a CPU of the earlier
    sittings' did not either). Whether the call waits for the stream does not depend on the values (the error
    check reads the result on the host either way)."""
    import torch

    made = MAKERS()
    made["device"] = lambda: torch.eye(4, device="cuda") + torch.arange(16, dtype=torch.float32,
                                                                          device="cuda").reshape(4, 4) / 64
    return made


def test_a_call_waits_here_where_it_waits_on_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SWEEP, "makers", _invertible)
    got = SWEEP.run_sim(_names(list(ON_A_GPU)), False, SWEEP.waits)
    assert {k: got[k] for k in ON_A_GPU} == ON_A_GPU


def test_a_call_with_a_second_argument_waits_here_where_it_waits_on_a_gpu() -> None:
    got = SWEEP.run_sim(_names(list(ON_A_GPU_BINARY)), True, SWEEP.waits)
    assert {k: got[k] for k in ON_A_GPU_BINARY} == ON_A_GPU_BINARY


@pytest.mark.parametrize(("call", "waits"), [("histc_ranged", "no wait"), ("isin_small", "no wait"),
                                             ("isin_unique", "no wait")])
def test_where_the_arguments_decide_whether_cuda_reads_on_the_host(call: str, waits: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """``histc`` given a range reads nothing on the host; ``isin`` with few test elements takes its loop, not the
    sort, and a sort of elements assumed unique needs no ``unique``: neither waits."""
    import torch

    calls = {"histc_ranged": lambda t: torch.histc(t, bins=4, min=0.0, max=1.0),
             "isin_small": lambda t: torch.isin(t, t[0, :2]),
             "isin_unique": lambda t: torch.isin(t, t, assume_unique=True)}
    monkeypatch.setattr(SWEEP, "_function", calls.__getitem__)
    assert SWEEP.run_sim([call], False, SWEEP.waits)[f"device.{call}"] == waits


def test_a_scatter_of_a_host_source_gives_the_host_s_values() -> None:
    """``slice_scatter`` with a host ``src`` (pinned or not), which CUDA's implementation copies in: the values of the
    same call on the host (before, the simulator refused the host tensor: a correct program's host error)."""
    import torch

    import simdevice

    got: list[torch.Tensor] = []

    def program() -> None:
        base = torch.zeros(4, 4, device="cuda")
        src = torch.arange(8.0).reshape(2, 4)
        got.append(base.slice_scatter(src, 0, 1, 3).cpu())
        got.append(base.slice_scatter(src.pin_memory(), 0, 0, 2).cpu())

    s = simdevice.cuda()
    s.run(program)
    assert s.result is not None
    assert not s.result.reports, s.result.reports
    src = torch.arange(8.0).reshape(2, 4)
    assert torch.equal(got[0], torch.zeros(4, 4).slice_scatter(src, 0, 1, 3))
    assert torch.equal(got[1], torch.zeros(4, 4).slice_scatter(src, 0, 0, 2))


def test_the_ops_without_a_meta_kernel_give_their_values() -> None:
    """``geqrf``, ``dequantize`` and ``binomial``, shaped by a trial on zeros and computed on the stream: the same
    values as on the host."""
    import torch

    import simdevice

    got: dict[str, torch.Tensor] = {}

    def program() -> None:
        a = torch.tensor([[4.0, 1.0], [2.0, 3.0]], device="cuda")
        got["geqrf"] = torch.geqrf(a)[0].cpu()
        got["dequantize"] = a.dequantize().cpu()
        got["binomial"] = torch.binomial(torch.full((2, 2), 5.0, device="cuda"), torch.ones(2, 2, device="cuda")).cpu()

    s = simdevice.cuda()
    s.run(program)
    assert s.result is not None
    assert not s.result.reports, s.result.reports
    host = torch.tensor([[4.0, 1.0], [2.0, 3.0]])
    assert torch.allclose(got["geqrf"], torch.geqrf(host)[0])
    assert torch.equal(got["dequantize"], host)
    assert torch.equal(got["binomial"], torch.full((2, 2), 5.0))


#: ``masked_fill`` and ``index_fill`` given their value as a 0-d tensor: ATen's CUDA ``masked_fill__cuda`` and the
#: composite ``index_fill_`` call ``value.item()``, a read on the host that waits for the stream where the value is a
#: device tensor (``c``), and none where it is a host one (``h``); a number waits for nothing (ATen's source, and an
#: H100's answer for each: docs/confirmations.md, fifty-fifth run)
VALUE_READ = {"t.masked_fill(m, c)": "waits", "t.masked_fill_(m, c)": "waits", "t.index_fill(0, i, c)": "waits",
              "t.masked_fill(m, h)": "no wait", "t.index_fill(0, i, h)": "no wait", "t.masked_fill(m, 1.0)": "no wait",
              "t.fill_(c)": "no wait"}


#: ``where`` given a 0-d host tensor among device ones: ATen's ``where_self_out`` moves it to the device with a blocking
#: copy (an H100 waited, and did not for a 0-d device tensor or a number: docs/confirmations.md, fifty-fifth run)
WHERE = {"torch.where(h > 0, t, t)": "waits", "torch.where(m, t, h)": "waits", "torch.where(c > 0, t, t)": "no wait",
         "torch.where(m, t, c)": "no wait", "torch.where(m, t, 0.0)": "no wait"}


def test_where_waits_for_a_host_scalar_tensor_it_moves() -> None:
    got = SWEEP.run_sim([SWEEP.EXPR + e for e in WHERE], False, SWEEP.waits)
    assert {e: got[SWEEP.EXPR + e] for e in WHERE} == WHERE


def test_a_value_read_on_the_host_waits_where_it_is_on_the_device() -> None:
    got = SWEEP.run_sim([SWEEP.EXPR + e for e in VALUE_READ], False, SWEEP.waits)
    assert {e: got[SWEEP.EXPR + e] for e in VALUE_READ} == VALUE_READ
