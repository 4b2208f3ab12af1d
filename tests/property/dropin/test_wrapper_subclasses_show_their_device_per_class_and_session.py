"""How a wrapper tensor subclass made for the simulated device shows its device
(``facade._install_wrapper_subclasses``), beyond the one class and one session
``test_tensor_subclasses_over_device_tensors.py`` makes: each class made for the device is shown, in every session
(the session puts the class back as it ends), a wrapper made on the host or on the meta device stays where it was
made and answers as torch does there, and a class that answers ``device`` itself keeps its answer. Mutations caught
(a sweep of the thirtieth sitting's rules): the first class shown alone, a host wrapper moved to the meta device
too, ``get_device()`` of a meta wrapper 0, a class's own ``device`` overwritten."""

from __future__ import annotations

from typing import Any

import torch
from hazards import ScaledWeight

import simdevice


class _OtherWeight(torch.Tensor):
    """A second wrapper class, not derived from :class:`ScaledWeight` (what is shown of that one is not its)."""

    @staticmethod
    def __new__(cls, data: torch.Tensor, scale: torch.Tensor) -> _OtherWeight:
        return torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined,no-any-return]
            cls, data.shape, dtype=torch.float32, device=data.device)

    def __init__(self, data: torch.Tensor, scale: torch.Tensor) -> None:
        self.low, self.scale = data, scale

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        def wide(t: Any) -> Any:
            return t.low.float() * t.scale if isinstance(t, _OtherWeight) else t

        return func(*[wide(a) for a in args], **{k: wide(v) for k, v in (kwargs or {}).items()})


class _OwnDevice(ScaledWeight):
    """A wrapper class that answers ``device`` itself (the device of the tensor it holds)."""

    asked = 0

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        type(self).asked += 1
        return self.low.device


def _shown(w: torch.Tensor) -> tuple[Any, ...]:
    return w.device, w.is_cuda, w.is_meta, w.get_device()


ON_THE_DEVICE = (torch.device("cuda", 0), True, False, 0)


def _made(cls: type, device: str) -> Any:
    return cls(torch.ones(2, 2, dtype=torch.bfloat16, device=device), torch.tensor(0.5, device=device))


def test_a_class_is_shown_in_each_session_it_is_made_in() -> None:
    """Two sessions in a row, each making a wrapper of the same class for the device: the second shows the device as
    the first did (the first session's end put the class back; the second shows it again)."""
    got: list[tuple[Any, ...]] = []
    for _ in range(2):
        s = simdevice.cuda()
        s.run(lambda: got.append(_shown(_made(ScaledWeight, "cuda"))))
        s.assert_clean()
        assert "device" not in vars(ScaledWeight)
    assert got == [ON_THE_DEVICE, ON_THE_DEVICE]


def test_every_class_made_for_the_device_is_shown() -> None:
    got: list[tuple[Any, ...]] = []

    def program() -> None:
        got.append(_shown(_made(ScaledWeight, "cuda")))
        other = _made(_OtherWeight, "cuda")
        got.append(_shown(other))
        got.append((other * 2).sum().cpu())

    s = simdevice.cuda()
    s.run(program)
    s.assert_clean()
    assert got == [ON_THE_DEVICE, ON_THE_DEVICE, torch.tensor(4.0)]


def test_a_wrapper_made_on_the_host_or_meta_device_stays_there() -> None:
    """Of a class shown in the session (one of its wrappers made for the device), a wrapper made on the host is a
    host tensor (``is_cpu``), and one made on the meta device answers as torch's meta tensors (``get_device()``
    -1)."""
    got: dict[str, Any] = {}

    def program() -> None:
        _made(ScaledWeight, "cuda")
        h = _made(ScaledWeight, "cpu")
        m = _made(ScaledWeight, "meta")
        got["host"] = (*_shown(h), h.is_cpu)
        got["meta"] = (*_shown(m), m.is_cpu)

    s = simdevice.cuda()
    s.run(program)
    s.assert_clean()
    assert got["host"] == (torch.device("cpu"), False, False, -1, True)
    assert got["meta"] == (torch.device("meta"), False, True, -1, False)


def test_a_class_that_answers_its_device_itself_keeps_its_answer() -> None:
    got: list[Any] = []
    _OwnDevice.asked = 0

    def program() -> None:
        w = _made(_OwnDevice, "cuda")
        got.append(w.device)

    s = simdevice.cuda()
    s.run(program)
    s.assert_clean()
    assert got == [torch.device("cuda", 0)]
    assert _OwnDevice.asked == 1
    assert isinstance(vars(_OwnDevice)["device"], property)
