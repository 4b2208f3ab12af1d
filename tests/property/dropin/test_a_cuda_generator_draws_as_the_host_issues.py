"""``torch.Generator(device="cuda")`` (diffusers' ``torch.Generator("cuda").manual_seed(0)``, a sampler's own
generator), which failed on the CPU build (``Cannot get CUDA generator without ATen_cuda library``: no verdict for
any program that made one). In a session it is a generator of the simulated device: a random op on the device given
it draws from it as the host issues the op, so generators seeded alike draw alike whatever the schedule; its state
is its own; a host op given it, and a device op given a CPU generator, raise as CUDA's kernels do; and
``torch.cuda.default_generators[0]`` given as ``generator=`` draws as no generator does."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import pytest
import torch

import simdevice


def _noise_on_two_streams() -> tuple[list[float], list[float]]:
    """The same generator drawn on two streams, one of them stalled by the schedule: its numbers go by the order
    the host issued the draws, as CUDA's philox offset moves on the host."""
    g = torch.Generator(device="cuda").manual_seed(11)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        first = torch.randn(64, device="cuda", generator=g)
    second = torch.rand(64, device="cuda", generator=g)
    torch.cuda.synchronize()
    return first.cpu().tolist(), second.cpu().tolist()


def _run(fn: Any, schedule: str | None = None) -> Any:
    s = simdevice.cuda(schedule)
    s.run(fn)
    s.assert_clean()
    return s.result.result


@pytest.mark.parametrize("schedule", [None, "side#0+20", "default#0+20"])
def test_generators_seeded_alike_draw_alike_whatever_the_schedule(schedule: str | None) -> None:
    def program() -> tuple[list[float], list[float], list[float], list[float]]:
        first, second = _noise_on_two_streams()
        again = torch.Generator("cuda").manual_seed(11)
        return first, second, torch.randn(64, device="cuda", generator=again).cpu().tolist(), \
            torch.rand(64, device="cuda", generator=again).cpu().tolist()

    first, second, first_again, second_again = _run(program, schedule)
    assert first == first_again
    assert second == second_again
    assert first != second
    assert len(set(first)) == 64
    assert (first, second) == _run(_noise_on_two_streams)  # (and the same in every schedule)


def test_a_generator_s_draws_are_its_own() -> None:
    def program() -> list[list[float]]:
        g = torch.Generator("cuda").manual_seed(3)
        assert isinstance(g, torch.Generator)
        assert g.device == torch.device("cuda", 0)
        assert g.initial_seed() == 3
        state = g.get_state()
        a = torch.rand(8, device="cuda", generator=g)
        torch.rand(8, device="cuda")  # the device's own generator: this one's next draw does not move
        b = torch.rand(8, device="cuda", generator=g)
        g.set_state(state)
        a2 = torch.rand(8, device="cuda", generator=g)
        copied = copy.deepcopy(g)
        c = torch.rand(8, device="cuda", generator=g)
        c2 = torch.rand(8, device="cuda", generator=copied)
        assert pickle.loads(pickle.dumps(copied)).get_state().tolist() == copied.get_state().tolist()
        other = torch.rand(8, device="cuda", generator=torch.Generator("cuda").manual_seed(4))
        return [t.cpu().tolist() for t in (a, b, a2, c, c2, other)]

    a, b, a2, c, c2, other = _run(program)
    assert a == a2
    assert c == c2 == b
    assert len({tuple(x) for x in (a, b, other)}) == 3


def test_the_device_s_default_generator_draws_as_no_generator() -> None:
    def program() -> tuple[list[float], list[float]]:
        torch.cuda.manual_seed(7)
        plain = torch.rand(8, device="cuda")
        dg = torch.cuda.default_generators[0]
        dg.manual_seed(7)
        given = torch.rand(8, device="cuda", generator=dg)
        return plain.cpu().tolist(), given.cpu().tolist()

    plain, given = _run(program)
    assert plain == given


def test_a_generator_of_the_other_device_is_refused_as_on_a_gpu() -> None:
    def program() -> None:
        g = torch.Generator("cuda")
        with pytest.raises(RuntimeError, match="Expected a 'cpu' device type for generator but found 'cuda'"):
            torch.randn(3, generator=g)
        cpu = torch.Generator().manual_seed(1)  # (torch's own class, as outside a session)
        assert type(cpu) is torch._C.Generator
        assert cpu.device.type == "cpu"
        with pytest.raises(RuntimeError, match="Expected a 'cuda' device type for generator but found 'cpu'"):
            torch.randn(3, device="cuda", generator=cpu)
        torch.randn(3, generator=cpu)

    _run(program)
    assert torch.Generator is torch._C.Generator  # (torch's own again after the session)
