"""``torch.cuda.default_generators[0]``, CUDA's generator object, which code keeps and calls directly (Megatron's RNG
tracker sets and reads its state so, where torch has no ``_cuda_setRNGState``; torch's own ``torch.cuda.random``
functions call it too): in a session it is the simulated device's generator, whose state is
``torch.cuda.get_rng_state()``'s. Before, the CPU build's empty tuple stood: ``IndexError``, a host error of a
correct program ("found"); ``torch.cuda.random.get_rng_state`` raised as well. And ``set_sync_debug_mode``, another
of CUDA's C calls training scripts make, is kept (what it flags: ``test_sync_debug_mode.py``)."""

from __future__ import annotations

import pytest
import torch

import simdevice


def test_the_default_generator_is_the_simulated_device_s() -> None:
    with simdevice.cuda() as sim:
        gen = torch.cuda.default_generators[0]
        assert gen.device == torch.device("cuda", 0)
        assert gen.manual_seed(5) is gen
        assert gen.initial_seed() == torch.cuda.initial_seed() == 5
        state = gen.get_state()
        assert torch.equal(state, torch.cuda.get_rng_state())
        first = torch.rand(16, device="cuda")
        gen.set_state(state)
        assert torch.equal(torch.rand(16, device="cuda"), first)  # the same draws again
        torch.cuda.random.set_rng_state(state)  # torch's own module's functions are the simulated ones too
        assert torch.equal(torch.cuda.random.get_rng_state(), state)
        assert torch.equal(torch.rand(16, device="cuda"), first)
        with pytest.raises(NotImplementedError, match="graph-safe state"):
            gen.graphsafe_get_state()
    sim.assert_clean()
    assert torch.cuda.default_generators == ()  # (the CPU build's again)


def test_the_sync_debug_mode_is_kept() -> None:
    """``torch.cuda.set_sync_debug_mode`` (training scripts set it to catch hidden synchronizations) raised here
    (CUDA's C call, no verdict): the mode is kept, its names taken as torch takes them."""
    run = simdevice.cuda()

    def program() -> None:
        assert torch.cuda.get_sync_debug_mode() == 0
        torch.cuda.set_sync_debug_mode("warn")
        assert torch.cuda.get_sync_debug_mode() == 1
        with pytest.raises(RuntimeError, match="invalid value of debug_mode"):
            torch.cuda.set_sync_debug_mode("loud")
        torch.cuda.set_sync_debug_mode(0)
        torch.ones(4, device="cuda").sum().item()

    run.run(program)
    run.assert_clean()
    assert not run.result.notes
