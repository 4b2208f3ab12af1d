"""In a session torch answers as its CUDA build does: ``torch.version.cuda`` is the CUDA version of the GPU runs'
build (torch 2.11 with CUDA 13.0, docs/confirmations.md), ``torch.cuda.get_arch_list()`` that build's
architectures. The CPU build answers None and []: a program that checks the CUDA version before it takes a path
(``torch.version.cuda >= "12.1"``, a library's feature check) failed on its own comparison ("found") or took the
path it takes without CUDA. (``torch.backends.cuda.is_built()`` stays the CPU build's False: torch's own code asks
it before it calls CUDA's C API.)"""

from __future__ import annotations

import torch

import simdevice
from simdevice.dropin import facade


def _takes_the_cuda_path() -> None:
    major, minor = (int(x) for x in torch.version.cuda.split("."))
    assert (major, minor) >= (12, 1), torch.version.cuda
    assert "sm_90" in torch.cuda.get_arch_list()
    assert torch.ones(4, device="cuda").sum().item() == 4.0


def test_a_program_that_checks_the_cuda_version_takes_its_cuda_path() -> None:
    run = simdevice.cuda()
    run.run(_takes_the_cuda_path)
    run.assert_clean()
    assert (torch.version.cuda, torch.cuda.get_arch_list()) == (None, [])
    assert facade.CUDA_VERSION == "13.0"
