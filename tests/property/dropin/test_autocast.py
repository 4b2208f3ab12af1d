"""``torch.autocast("cuda")`` is applied to the simulated device's tensors as ATen applies it to CUDA tensors
(``simdevice/dropin/autocast.py``): each op of ATen's CUDA autocast table casts its device arguments before autograd
records it (a matmul's to the lower precision, a softmax's output set to float32, an exponential computed in
float32, several arguments promoted to the widest, ``binary_cross_entropy`` refused), nothing else is cast, and a
float32 weight is cast once within the outermost block (autocast's cache). The casts are operations on the stream,
as on a GPU.

Before, autocast was not applied (the simulated tensors live on the meta device, which carries no autocast key): ops
ran in float32, their sizes float32's, and a program that checked its dtypes raised, reported as no verdict.
``tests/hazards.py``'s ``AUTOCAST_CASES`` and ``amp_reload`` run on a GPU in ``tests/gpu/test_dropin_gpu.py``."""

from __future__ import annotations

import contextlib

import pytest
import torch
from hazard_checks import races_only_unwaited
from hazards import AUTOCAST_CASES, autocast_outcome

import simdevice
from simdevice.dropin import autocast


def test_each_case_gives_what_a_gpu_gives() -> None:
    got: dict[str, str] = {}

    def program() -> None:
        for name in AUTOCAST_CASES:
            got[name] = autocast_outcome(name)

    s = simdevice.cuda()
    s.run(program)
    s.assert_clean()
    differ = {name: (got[name], want) for name, (_, want) in AUTOCAST_CASES.items() if got[name] != want}
    assert not differ, differ


def test_a_bfloat16_activation_offloaded_races_only_unwaited() -> None:
    races_only_unwaited("amp_reload", "side#0+20")


def test_the_table_names_every_op_the_installed_torch_autocasts_for_cuda() -> None:
    """An op of a newer torch's table that this one lacks would keep ATen's kernel, which casts no simulated tensor."""
    assert autocast.registered() <= set(autocast.POLICIES), autocast.registered() - set(autocast.POLICIES)


def _default_ops(uses: int) -> int:
    def program() -> None:
        lin = torch.nn.Linear(8, 8).cuda()
        y = torch.ones(2, 8, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            for _ in range(uses):
                y = lin(y)

    s = simdevice.cuda()
    run = s.run(program)
    s.assert_clean()
    return run.op_counts["default"]


def test_a_weight_is_cast_once_in_a_block() -> None:
    """A linear layer's second use in one block adds its ``addmm`` alone: its weight and bias were cast at the first
    (the input, bfloat16 by then, is not cast again)."""
    assert _default_ops(3) - _default_ops(2) == 1
    assert _default_ops(2) - _default_ops(1) == 1


def test_the_cache_ends_with_the_outermost_block() -> None:
    """Two blocks cast the weight twice; a block nested in another, once."""
    counts = []
    for nested in (False, True):

        def program(nested: bool = nested) -> None:
            lin = torch.nn.Linear(8, 8).cuda()
            x = torch.ones(2, 8, device="cuda")
            # (an outer block, even disabled, keeps the inner ones nested: torch counts every block)
            with torch.autocast("cuda", enabled=False) if nested else contextlib.nullcontext():
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    lin(x)
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    lin(x)

        s = simdevice.cuda()
        counts.append(s.run(program).op_counts["default"])
    assert counts[0] - counts[1] == 2  # the weight and the bias cast again


def test_the_kernels_the_key_and_a_block_left_entered_are_gone_after_the_session() -> None:
    """A program that leaves a block entered (its actors ran on the session's thread): the session's end removes the
    kernels and the key, and puts the thread's autocast state back as it found it (its count of blocks, which
    torch's cache of casts is cleared by, the flag, the dtype). The next session's blocks start afresh: a weight
    cast to bfloat16 in one is not what a float16 block gets."""
    found = autocast._nesting()

    def leaves_a_block() -> None:
        torch.autocast("cuda", dtype=torch.bfloat16).__enter__()
        torch.nn.Linear(4, 4).cuda()(torch.ones(2, 4, device="cuda"))

    s = simdevice.cuda()
    s.run(leaves_a_block)
    assert not torch._C._dispatch_tls_is_dispatch_key_included(torch._C.DispatchKey.AutocastCUDA)
    line = next(x for x in torch._C._dispatch_dump("aten::mm").splitlines() if x.startswith("AutocastCUDA:"))
    assert "autocast_mode.cpp" in line, line
    assert torch.set_autocast_enabled is torch._C.set_autocast_enabled
    assert autocast._nesting() == found
    assert not torch.is_autocast_enabled("cuda")
    assert torch.get_autocast_dtype("cuda") == torch.float16

    def two_blocks() -> tuple[torch.dtype, torch.dtype]:
        lin = torch.nn.Linear(4, 4).cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            a = lin(torch.ones(2, 4, device="cuda"))
        with torch.autocast("cuda"):
            b = lin(torch.ones(2, 4, device="cuda"))
        return a.dtype, b.dtype

    s = simdevice.cuda()
    s.run(two_blocks)
    s.assert_clean()
    assert s.result is not None
    assert s.result.result == (torch.bfloat16, torch.float16)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_gradient_through_a_cast_comes_back_in_the_weight_s_dtype(dtype: torch.dtype) -> None:
    def program() -> tuple[torch.dtype, torch.dtype]:
        lin = torch.nn.Linear(4, 4).cuda()
        with torch.autocast("cuda", dtype=dtype):
            y = lin(torch.ones(2, 4, device="cuda"))
        y.float().sum().backward()
        assert lin.weight.grad is not None
        return y.dtype, lin.weight.grad.dtype

    s = simdevice.cuda()
    s.run(program)
    s.assert_clean()
    assert s.result is not None
    assert s.result.result == (dtype, torch.float32)


def _starts_outside_autocast_and_leaves_a_block(n: int = 0) -> None:
    assert not torch.is_autocast_enabled("cuda"), "the run started inside another run's autocast block"
    assert autocast._nesting() == 0, f"the run started {autocast._nesting()} blocks deep"
    torch.autocast("cuda", dtype=torch.bfloat16).__enter__()
    torch.nn.Linear(4, 4).cuda()(torch.ones(2, 4, device="cuda"))


def test_each_run_of_a_search_starts_outside_the_last_run_s_block() -> None:
    """A search keeps torch patched across its runs: each run still starts with the thread's autocast state as the
    search found it (its count of blocks grew by one a run, so torch's cache of casts was never cleared)."""
    from hypothesis import strategies as st

    found = simdevice.explore(_starts_outside_autocast_and_leaves_a_block,
                              config=st.fixed_dictionaries({"n": st.integers(0, 3)}), max_examples=5)
    assert found.failure is None, found.text()
    assert not torch.is_autocast_enabled("cuda")
