"""``torch.load`` puts a checkpoint's tensors on the simulated device where torch puts them on a GPU: with
``map_location="cuda"`` (a device, ``"cuda:0"``, a dict naming one, a function calling ``storage.cuda()``), and
with no ``map_location`` for a checkpoint saved from a GPU (its storages tagged ``cuda:0``). Each storage is copied
to the device once, synchronously, as torch's ``UntypedStorage.cuda()`` copies it, so tensors that shared a storage
in the file share one there; a parameter stays a parameter. Before, every such load raised the CPU build's
``RuntimeError: torch.UntypedStorage(): Storage device not recognized: cuda`` in the run: a host error of a correct
program, reported as found. ``tests/hazards.py::loaded_checkpoint_reload`` is the program
``tests/gpu/test_dropin_gpu.py`` runs on a GPU."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from hazard_checks import races_only_unwaited

import simdevice


def _run(program: Any) -> None:
    s = simdevice.cuda()
    s.run(program)
    assert s.result is not None
    assert not s.result.reports, [str(r) for r in s.result.reports]


@pytest.fixture
def folder() -> Iterator[str]:
    with tempfile.TemporaryDirectory() as d:
        yield d


def _saved(folder: str) -> str:
    base = torch.arange(64, dtype=torch.float32)
    path = os.path.join(folder, "host.pt")
    torch.save({"base": base, "view": base[8:16], "param": torch.nn.Parameter(torch.ones(3)),
                "half": torch.arange(4, dtype=torch.float16)}, path)
    return path


@pytest.mark.parametrize("where", ["cuda", "cuda:0", "device", "dict", "function"])
def test_map_location_puts_each_tensor_on_the_device_sharing_as_saved(folder: str, where: str) -> None:
    path = _saved(folder)

    def program() -> None:
        location = {"cuda": "cuda", "cuda:0": "cuda:0", "device": torch.device("cuda"), "dict": {"cpu": "cuda:0"},
                    "function": lambda storage, loc: storage.cuda()}  # (an older idiom)
        got = torch.load(path, map_location=location[where])
        assert all(t.is_cuda for t in got.values())
        assert torch.equal(got["base"].cpu(), torch.arange(64, dtype=torch.float32))
        assert got["half"].dtype == torch.float16
        assert torch.equal(got["half"].cpu(), torch.arange(4, dtype=torch.float16))
        got["base"][8].fill_(-1.0)  # (one storage on the device, as in the file)
        assert got["view"][0].item() == -1.0
        assert isinstance(got["param"], torch.nn.Parameter)
        assert got["param"].requires_grad

    _run(program)


def test_a_checkpoint_saved_from_a_gpu_loads_onto_the_device(folder: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path = os.path.join(folder, "gpu.pt")
    # the file a GPU writes: its storages tagged with their device (made here from host tensors)
    with monkeypatch.context() as m:
        m.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
        torch.save({"w": torch.arange(8, dtype=torch.float32)}, path)

    def program() -> None:
        got = torch.load(path)
        assert got["w"].is_cuda
        assert torch.equal(got["w"].cpu(), torch.arange(8, dtype=torch.float32))
        assert not torch.load(path, map_location="cpu")["w"].is_cuda

    _run(program)


def test_a_device_the_machine_does_not_have_is_refused_as_torch_refuses_it(folder: str) -> None:
    path = _saved(folder)

    def program() -> None:
        with pytest.raises(RuntimeError, match="device_count"):
            torch.load(path, map_location="cuda:3")

    _run(program)


def test_the_loaded_model_s_output_races_only_unwaited() -> None:
    """``tests/hazards.py::loaded_checkpoint_reload`` (what tests/gpu runs on a GPU)."""
    races_only_unwaited("loaded_checkpoint_reload", "side#0+20")
