"""Rule (dropin.distributed._Pickled): ``all_gather_object`` and ``broadcast_object_list`` send each object pickled at
the call, as torch does (``_object_to_tensor``), and each receiver unpickles a copy of its own. Before, every rank
got the sender's very objects: what a rank changed afterwards (its own object, or one it received) changed its
peers' too, so a correct program failed here (and a program that relied on the sharing passed here and failed on a
GPU). A device tensor in an object is a copy on the receiver's device, not the sender's tensor: reading it raced
with the sender's stream before."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

import simdevice


def test_what_a_rank_changes_after_the_exchange_does_not_reach_its_peers() -> None:
    got: dict[int, list[Any]] = {}

    def program() -> None:
        r, w = dist.get_rank(), dist.get_world_size()
        mine = {"rank": r, "seen": []}
        gathered: list[Any] = [None] * w
        dist.all_gather_object(gathered, mine)
        mine["rank"] = -1  # the sender changes its object after sending it
        gathered[(r + 1) % w]["seen"].append(r)  # a receiver changes what it received
        config: list[Any] = [{"lr": 0.1}] if r == 0 else [None]
        dist.broadcast_object_list(config, src=0)
        if r == 1:
            config[0]["lr"] = 5.0  # a receiver changes the root's object
        dist.barrier()
        got[r] = [gathered, mine, config]

    s = simdevice.cuda()
    s.run(program, world_size=2)
    s.assert_clean()
    assert got[0] == [[{"rank": 0, "seen": []}, {"rank": 1, "seen": [0]}], {"rank": -1, "seen": []}, [{"lr": 0.1}]]
    assert got[1] == [[{"rank": 0, "seen": [1]}, {"rank": 1, "seen": []}], {"rank": -1, "seen": []}, [{"lr": 5.0}]]


def test_a_device_tensor_in_an_object_arrives_as_a_copy_of_its_own() -> None:
    got: dict[int, list[list[float]]] = {}

    def program() -> None:
        r, w = dist.get_rank(), dist.get_world_size()
        t = torch.full((4,), float(r), device="cuda")
        gathered: list[Any] = [None] * w
        dist.all_gather_object(gathered, {"t": t})
        t.fill_(-1.0)  # the sender's tensor changes afterwards: not what was sent
        assert all(o["t"].is_cuda for o in gathered)
        got[r] = [o["t"].cpu().tolist() for o in gathered]

    s = simdevice.cuda()
    s.run(program, world_size=2)
    s.assert_clean()
    assert got == {r: [[0.0] * 4, [1.0] * 4] for r in (0, 1)}


def test_an_object_that_does_not_pickle_here_is_shared_as_it_is() -> None:
    """An object that does not pickle in the simulator's process (a local function in it, as a test's program has)
    is handed to the receivers as it is, not refused: what the sender put in is what each rank gets."""
    got: dict[int, list[Any]] = {}

    def program() -> None:
        r = dist.get_rank()
        local = {"rank": r, "fn": lambda: r}  # a local function: no pickling it
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, local)
        got[r] = [g["rank"] for g in gathered] + [g["fn"]() for g in gathered]

    s = simdevice.cuda()
    s.run(program, world_size=2)
    s.assert_clean()
    assert got == {0: [0, 1, 0, 1], 1: [0, 1, 0, 1]}
