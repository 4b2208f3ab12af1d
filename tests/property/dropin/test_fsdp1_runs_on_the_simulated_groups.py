"""torch's FSDP1 (``FullyShardedDataParallel``) runs unmodified on the simulated groups: its flat parameter made and
freed through the simulated storage, its streams recorded (``record_stream`` inside ``no_dispatch()``, the
simulator's now), its all-gathers and reduce-scatters on its own streams. Training with the flat parameter or the
original ones, ``SHARD_GRAD_OP``, an auto-wrap policy gives a plain model's numbers; a side stream of the program's
that reads the unsharded weight without waiting races. Before, wrapping a model was refused (no verdict). With
``CPUOffload(offload_params=True)`` too (before, no verdict: ``test_a_parameter_moved_and_back_keeps_its_graph_and_
gradient.py``), and its post-backward callback's wait for the gradients' D2H copies left out, the CPU optimizer's
read of the pinned gradient before they land is found."""

from __future__ import annotations

import functools
from typing import Any

import model_programs as programs
import pytest
import torch

import simdevice
from simdevice.search.explore import explore


def _trained(**options: Any) -> None:
    from torch.distributed.fsdp import FullyShardedDataParallel

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).cuda()
    wrapped, ref = programs.trained_beside_a_plain_copy(model, lambda m: FullyShardedDataParallel(m, **options))
    with FullyShardedDataParallel.summon_full_params(wrapped):
        for p, q in zip(wrapped.parameters(), ref.parameters(), strict=True):
            assert torch.allclose(p, q, atol=1e-5), (p - q).abs().max().item()
    torch.cuda.synchronize()


def _wrap_policy() -> Any:
    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy

    return functools.partial(size_based_auto_wrap_policy, min_num_params=10)


@pytest.mark.parametrize("options", [
    {}, {"use_orig_params": True}, {"sharding_strategy": "SHARD_GRAD_OP"}, {"auto_wrap_policy": "size"},
    {"cpu_offload": True}, {"cpu_offload": True, "use_orig_params": True},
], ids=["flat", "orig-params", "shard-grad-op", "auto-wrap", "cpu-offload", "cpu-offload-orig-params"])
def test_fsdp1_training_gives_a_plain_model_s_numbers(options: dict[str, Any]) -> None:
    from torch.distributed.fsdp import ShardingStrategy

    given = dict(options)
    if "sharding_strategy" in given:
        given["sharding_strategy"] = ShardingStrategy[given["sharding_strategy"]]
    if "auto_wrap_policy" in given:
        given["auto_wrap_policy"] = _wrap_policy()
    if "cpu_offload" in given:
        from torch.distributed.fsdp import CPUOffload

        given["cpu_offload"] = CPUOffload(offload_params=True)
    s = simdevice.cuda()
    s.run(_trained, world_size=2, **given)
    assert not s.reports, s.text()


def _side(wait: bool) -> Any:
    def program() -> None:
        from torch.distributed.fsdp import FullyShardedDataParallel

        torch.manual_seed(0)
        model = FullyShardedDataParallel(programs.SideLinear(32, torch.cuda.Stream(), wait).cuda(),
                                         use_orig_params=True)
        with torch.no_grad():
            model(torch.randn(4, 32, device="cuda"))
        torch.cuda.synchronize()

    return program


def _found_where_racy_alone(racy: Any, correct: Any, *said: str, correct_examples: int = 30) -> None:
    """A search of two ranks finds ``racy``, its report saying each of ``said``, and none of ``correct``."""
    found = explore(racy, max_examples=30, world_size=2)
    assert found.failure is not None
    text = found.failure.text()
    for words in said:
        assert words in text, text
    clean = explore(correct, max_examples=correct_examples, world_size=2)
    assert clean.failure is None, clean.failure.text()


def test_a_side_stream_reading_fsdp1_s_unsharded_weight_unordered_races() -> None:
    _found_where_racy_alone(_side(wait=False), _side(wait=True), "which all_gather (receive) on stream")


def _offloaded(sync: bool) -> Any:
    def program() -> None:
        from torch.distributed.fsdp import CPUOffload, FullyShardedDataParallel

        torch.manual_seed(0)
        model = FullyShardedDataParallel(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                                             torch.nn.Linear(16, 4)),
                                         cpu_offload=CPUOffload(offload_params=True))
        if not sync:  # (read after the set-up by the post-backward callback alone: its synchronize() goes)
            model.cpu_offload = CPUOffload(offload_params=False)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            model(torch.ones(4, 8, device="cuda")).square().mean().backward()
            opt.step()  # (on the host: the flat parameter and its gradient are pinned host memory)
            opt.zero_grad()
        torch.cuda.synchronize()

    return program


def test_fsdp1_cpu_offload_without_its_wait_for_the_gradient_copies_is_found() -> None:
    _found_where_racy_alone(_offloaded(sync=False), _offloaded(sync=True), "on host rank", "(D2H) on stream",
                            correct_examples=20)


def _mixed(offload: bool) -> list[float]:
    import torch.distributed as dist
    from torch.distributed.fsdp import CPUOffload, FullyShardedDataParallel, MixedPrecision

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    model = FullyShardedDataParallel(model if offload else model.cuda(),
                                     cpu_offload=CPUOffload(offload_params=offload),
                                     mixed_precision=MixedPrecision(param_dtype=torch.float16))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for i in range(2):
        loss = model(torch.full((4, 8), 0.5 + dist.get_rank() + i, device="cuda")).float().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def test_fsdp1_cpu_offload_with_low_precision_parameters_gives_the_numbers_it_gives_without() -> None:
    """(before: the program's error "Output 0 of T is a view ... modified inplace", as a verdict:
    ``test_a_parameter_given_another_tensor_s_bytes_keeps_its_own_version_counter``)"""
    results = []
    for offload in (True, False):
        s = simdevice.cuda()
        s.run(_mixed, offload, world_size=2)
        assert s.result is not None
        assert s.result.reports == (), s.result.reports
        results.append(s.result.result)
    assert results[0] == results[1], results
