"""``torch.save`` / ``pickle`` / ``copy.deepcopy`` of a device tensor in a simulated run
(``SimTensor.__reduce_ex__``, ``SimTensor.__deepcopy__``).

torch pickles a CUDA tensor by copying its storage to the host (a synchronizing copy on the current stream) and
rebuilds it on its device where it is loaded (``map_location`` moves it); a deep copy clones it on the device, with
the tensor's attributes. Here the simulated storage is no ``UntypedStorage``, and torch's own pickling raised a
TypeError: a host error of the simulator's making on a correct checkpointing program.
"""

from __future__ import annotations

import copy
import io

import torch

import simdevice


def test_a_checkpoint_saves_loads_and_deep_copies_a_module_on_the_device() -> None:
    """Mutations caught: no ``__reduce_ex__`` (TypeError from torch's storage code); a deep copy without the
    attributes the program gave the tensor (the copied weight was no ``Parameter``)."""

    def checkpoint() -> None:
        model = torch.nn.Linear(4, 4).cuda()
        buf = io.BytesIO()
        torch.save({"model": model.state_dict(), "step": 3}, buf)
        buf.seek(0)
        back = torch.load(buf)  # weights_only, torch's default: the rebuild is one it takes
        assert back["step"] == 3
        assert back["model"]["weight"].is_cuda
        assert torch.equal(back["model"]["weight"].cpu(), model.weight.detach().cpu())
        buf.seek(0)
        on_host = torch.load(buf, map_location="cpu")
        assert on_host["model"]["weight"].device.type == "cpu"
        twin = copy.deepcopy(model)
        assert twin.weight.is_cuda
        assert isinstance(twin.weight, torch.nn.Parameter)
        assert twin.weight.requires_grad
        twin.weight.data.zero_()  # a copy: the original keeps its values
        assert torch.equal(model.weight.detach().cpu(), back["model"]["weight"].cpu())

    s = simdevice.cuda()
    s.run(checkpoint)
    s.assert_clean()


def test_saving_a_tensor_a_side_stream_still_writes_is_a_race() -> None:
    """torch.save reads the tensor on the current stream (its copy to the host): a write still running on another
    stream races with it, as on a GPU."""

    def save_too_soon() -> None:
        side = torch.cuda.Stream()
        w = torch.zeros(1024, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            w.add_(1)
        torch.save(w, io.BytesIO())  # no wait for the side stream

    found = simdevice.explore(save_too_soon, max_examples=10)
    assert found.failure is not None
    assert found.failure.races, found.failure
