"""Rule (dropin.distributed.RankEnviron): each rank of a simulated world reads the variables torchrun sets in the
environment of each process it starts (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ...) as its own,
as a script launched with ``torchrun --nproc-per-node N`` does. Before, every rank shared the command's environment:
``int(os.environ["LOCAL_RANK"])``, the first line of most training scripts, raised KeyError, which ``check`` reported
as the program's own error (exit 1, as if a bug were found). A rank's own write of one stays its own; other variables
are the process's, as before; outside a rank (a run without ``world_size``) none is set, as under plain ``python``."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
import torch.distributed as dist

import simdevice

SEEN: dict[int, Any] = {}


def torchrun_script() -> None:
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    x = torch.full((8,), float(int(os.environ["RANK"]) + 1), device=f"cuda:{local_rank}")
    dist.all_reduce(x)
    os.environ["MASTER_PORT"] = str(30000 + dist.get_rank())  # (a rank's own)
    SEEN[dist.get_rank()] = (os.environ["RANK"], os.environ["WORLD_SIZE"], os.getenv("LOCAL_WORLD_SIZE"),
                             os.environ["MASTER_PORT"], x[0].item(), "RANK" in os.environ,
                             dict(os.environ)["ROLE_RANK"])
    dist.destroy_process_group()


@pytest.mark.parametrize("world", [1, 3])
def test_each_rank_reads_its_own_torchrun_variables(world: int) -> None:
    SEEN.clear()
    s = simdevice.cuda("rank0.nccl#0+5")
    s.run(torchrun_script, world_size=world)
    s.assert_clean()
    total = world * (world + 1) / 2
    assert {r: (str(r), str(world), str(world), str(30000 + r), total, True, str(r)) for r in range(world)} == SEEN
    assert os.environ.get("MASTER_PORT") != "30000"  # (the ranks' writes stayed theirs)


def test_outside_ranks_the_environment_is_the_process_s() -> None:
    seen: list[Any] = []

    def program() -> None:
        os.environ["SIMDEVICE_TEST_VARIABLE"] = "1"
        seen.append((os.environ.get("LOCAL_RANK"), os.environ["SIMDEVICE_TEST_VARIABLE"]))

    had = os.environ.get("LOCAL_RANK")
    s = simdevice.cuda()
    s.run(program)
    s.assert_clean()
    assert seen == [(had, "1")]
    assert os.environ.pop("SIMDEVICE_TEST_VARIABLE") == "1"  # (a program's write of its own goes to the process)
    assert type(os.environ) is os._Environ  # (put back after the session)


def test_a_rank_reads_its_own_variables_where_the_process_has_them_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """The command itself run under torchrun, or from a shell that exported ``MASTER_PORT``: each rank still reads
    its own (a mutant that let the process's value win gave every rank ``RANK=5``; one that gave every rank
    ``LOCAL_RANK=0`` put them all on one device). A value that is not a str is refused, as ``os.environ`` does."""
    for key, value in (("RANK", "5"), ("LOCAL_RANK", "5"), ("WORLD_SIZE", "8"), ("MASTER_PORT", "1234")):
        monkeypatch.setenv(key, value)
    got: dict[int, tuple[str, ...]] = {}

    def program() -> None:
        r = dist.get_rank()
        seen = (os.environ["RANK"], os.environ["LOCAL_RANK"], os.environ["WORLD_SIZE"], os.environ["MASTER_PORT"])
        try:
            os.environ["RANK"] = 1  # type: ignore[assignment]
        except TypeError as e:
            seen += (str(e),)
        got[r] = seen

    s = simdevice.cuda()
    s.run(program, world_size=2)
    s.assert_clean()
    assert got == {r: (str(r), str(r), "2", "29500", "str expected, not int") for r in range(2)}
    assert (os.environ["RANK"], os.environ["MASTER_PORT"]) == ("5", "1234")


def test_a_rank_s_deletion_of_a_variable_is_its_own() -> None:
    # as in a process torchrun started: deleted, the variable is gone for that rank (a read raises, a listing lacks
    # it), a second deletion raises, a write brings it back; the other ranks keep theirs
    got: dict[int, Any] = {}

    def program() -> None:
        r = dist.get_rank()
        if r == 0:
            del os.environ["MASTER_PORT"]
            gone = ("MASTER_PORT" not in os.environ, os.environ.get("MASTER_PORT"), "MASTER_PORT" in dict(os.environ))
            with pytest.raises(KeyError):
                del os.environ["MASTER_PORT"]
            os.environ["MASTER_PORT"] = "1234"
            got[r] = (*gone, os.environ["MASTER_PORT"])
        else:
            got[r] = os.environ["MASTER_PORT"]

    s = simdevice.cuda()
    s.run(program, world_size=2)
    s.assert_clean()
    assert got == {0: (True, None, False, "1234"), 1: "29500"}
