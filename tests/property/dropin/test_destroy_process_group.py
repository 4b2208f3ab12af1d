"""``torch.distributed.destroy_process_group`` in a simulated world (``simdevice.dropin.distributed``).

Each rank's default process group exists from its start (a program need not call ``init_process_group``) until it
destroys it: then ``is_initialized()`` answers False and a collective, ``get_rank`` or ``get_world_size`` raise
torch's ValueError, until ``init_process_group`` makes it again.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import simdevice


def test_a_destroyed_group_is_gone_until_it_is_made_again() -> None:
    """Mutation caught: ``destroy_process_group`` doing nothing (the collective after it ran clean)."""

    def program() -> None:
        assert dist.is_initialized()
        dist.all_reduce(torch.ones(4, device="cuda"))
        dist.destroy_process_group()
        assert not dist.is_initialized()
        with pytest.raises(ValueError, match="Default process group has not been initialized"):
            dist.all_reduce(torch.ones(4, device="cuda"))
        dist.init_process_group("nccl")
        assert dist.get_world_size() == 2
        dist.all_reduce(torch.ones(4, device="cuda"))

    s = simdevice.cuda()
    s.run(program, world_size=2)
    s.assert_clean()
