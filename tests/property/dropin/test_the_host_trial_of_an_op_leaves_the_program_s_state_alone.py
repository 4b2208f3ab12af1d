"""The trial on zeros and ones that raises an op's argument errors at the call (``dispatch._on_zeros``) changes
nothing the program sees: a random op's trial draws with the host generator's state kept (a host draw after a
device one gives what it gives on a GPU, whose device draws leave the host generator alone), and an op whose
output's shape its values may decide (``repeat_interleave`` given ``output_size``, which its host kernel checks
against the repeats' sum) is refused at the call for a dtype its kernels lack alone, not for what zeros and ones
sum to. Mutations caught (a sweep of the twenty-ninth sitting's rules): the trial of a random op drawing from the
program's generator, a value-shaped op's other trial errors raised at the call."""

from __future__ import annotations

from typing import Any

import torch

import simdevice


def test_a_random_op_s_trial_keeps_the_host_generator_where_it_was() -> None:
    got: list[torch.Tensor] = []

    def program() -> None:
        torch.manual_seed(0)
        d = torch.empty(4, device="cuda")
        d.uniform_()
        d.normal_()
        d.bernoulli_(0.5)
        got.append(torch.rand(3))

    s = simdevice.cuda()
    s.run(program)
    s.assert_clean()
    torch.manual_seed(0)
    assert torch.equal(got[0], torch.rand(3))


def test_an_op_shaped_by_its_values_runs_where_zeros_and_ones_would_be_refused() -> None:
    got: list[Any] = []

    def program() -> None:
        repeats = torch.tensor([2, 0, 3], device="cuda")
        y = torch.repeat_interleave(torch.arange(3.0, device="cuda"), repeats, output_size=5)
        got.append(y.cpu())

    s = simdevice.cuda()
    s.run(program)
    s.assert_clean()
    assert got[0].tolist() == [0.0, 0.0, 2.0, 2.0, 2.0]
