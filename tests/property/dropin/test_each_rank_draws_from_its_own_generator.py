"""Rule (runtime.Runtime.next_seed): each rank (and each process) draws device random numbers from a generator of
its own, as each process of a real world has its own CUDA generator: ranks seeded alike draw alike (a
data-parallel program that seeds every rank to draw the same dropout mask or initial weights), and what one rank
draws never moves another's numbers, whatever the schedule. Before, the run had one generator for every actor:
the ranks' draws interleaved in it, so ranks seeded alike drew different masks (a correct program failed at every
schedule), and which numbers a rank got depended on how the schedule interleaved the ranks."""

from __future__ import annotations

import torch
import torch.distributed as dist

import simdevice


def _seeded_masks(n: int = 64) -> None:
    torch.cuda.manual_seed(1234)
    x = torch.ones(n, device="cuda")
    masks = torch.cat([torch.nn.functional.dropout(x, 0.5), torch.nn.functional.dropout(x, 0.5)])
    if dist.get_rank() == 1:
        torch.randn(8, device="cuda")  # a draw of this rank's alone, after the masks
    out = torch.empty(2 * masks.numel(), device="cuda")
    dist.all_gather_into_tensor(out, masks)
    o = out.cpu()
    assert torch.equal(o[:2 * n], o[2 * n:]), "ranks seeded alike drew different masks"


def test_ranks_seeded_alike_draw_alike_under_every_schedule() -> None:
    for schedule in (None, "rank0#0+1", "rank1#0+1", "rank0#1+2", "rank1#2+1"):
        s = simdevice.cuda(schedule)
        s.run(_seeded_masks, world_size=2)
        assert s.clean, f"{schedule}: {s.text()}"


def test_a_rank_s_numbers_do_not_depend_on_its_peers_draws() -> None:
    got: dict[tuple[int, int], list[float]] = {}

    def program(peer_draws: int) -> None:
        r = dist.get_rank()
        if r == 1:
            for _ in range(peer_draws):
                torch.rand(4, device="cuda")
        got[(peer_draws, r)] = torch.rand(4, device="cuda").cpu().tolist()

    for peer_draws in (0, 3):
        s = simdevice.cuda()
        s.run(program, peer_draws, world_size=2)
        s.assert_clean()
    assert got[(0, 0)] == got[(3, 0)], "rank 0's numbers moved with rank 1's draws"
    assert got[(0, 0)] == got[(0, 1)], "unseeded ranks drew differently (each process starts at the default seed)"
