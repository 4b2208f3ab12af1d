"""What the twenty-sixth sitting's device-agnostic and CUDA-object rules promise beyond their own tests, each as a
GPU answers it: a generic ``torch.Event(enable_timing=True)`` times (a ``torch.cuda.Event`` made with timing);
``torch.get_device_module(d)`` of another device is that device's module (only ``None`` is the accelerator's);
``torch.accelerator.empty_cache()`` is ``torch.cuda.empty_cache()`` (it gives a segment back with ``cudaFree``,
which waits for the device); ``default_generators[0].seed()`` seeds it (its ``initial_seed()`` is what ``seed()``
answered, as torch's ``Generator.seed``); and ``set_sync_debug_mode`` of the default mode is no note."""

from __future__ import annotations

import torch

import simdevice

N = 1 << 12


def test_a_generic_event_made_with_timing_times() -> None:
    with simdevice.cuda() as sim:
        start, end = torch.Event(enable_timing=True), torch.Event(enable_timing=True)
        start.record()
        torch.ones(N, device="cuda").mul_(2.0)
        end.record()
        end.synchronize()
        assert start.elapsed_time(end) >= 0.0
    sim.assert_clean()


def test_another_device_s_module_is_that_device_s() -> None:
    with simdevice.cuda() as sim:
        assert torch.get_device_module() is torch.cuda
        assert torch.get_device_module("cpu") is torch.cpu
        assert torch.get_device_module(torch.device("cpu")) is torch.cpu
    sim.assert_clean()


def test_the_accelerator_s_empty_cache_that_gives_a_segment_back_waits_for_the_device() -> None:
    """``tests/property/dropin/test_empty_cache_that_gives_a_segment_back_waits_for_the_device.py``'s session, with
    device-agnostic code's spelling of the call."""
    with simdevice.cuda() as sim:
        side = torch.cuda.Stream()
        x = torch.ones(1 << 16, device="cuda")
        scratch = torch.zeros(3 << 18, device="cuda")
        pinned = torch.empty(1 << 16, pin_memory=True)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            pinned.copy_(x, non_blocking=True)
        del scratch
        torch.accelerator.empty_cache()
        assert bool((pinned == 1).all())
    sim.assert_clean()


def test_the_default_generator_s_seed_is_its_initial_seed() -> None:
    with simdevice.cuda() as sim:
        gen = torch.cuda.default_generators[0]
        gen.manual_seed(5)
        assert gen.seed() == gen.initial_seed()
    sim.assert_clean()


def test_setting_the_default_sync_debug_mode_is_no_note() -> None:
    run = simdevice.cuda()

    def program() -> None:
        torch.cuda.set_sync_debug_mode(0)
        torch.cuda.set_sync_debug_mode("default")
        torch.ones(4, device="cuda").sum().item()

    run.run(program)
    run.assert_clean()
    assert not [n for n in run.result.notes if "set_sync_debug_mode" in n], run.result.notes
