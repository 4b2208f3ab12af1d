"""Rule (reference.cuda_plain.torchrun_environment): a rank's process of a GPU run (``replay --gpu --world-size N``)
has the variables torchrun sets, the rank's own, for the program's run, as the simulator's ranks read them
(``simdevice.dropin.distributed.RankEnviron``); the environment is put back after, a variable the process had
anew and one it had not removed."""

from __future__ import annotations

import os

import pytest

from reference.cuda_plain import torchrun_environment

SET = {"RANK": "2", "LOCAL_RANK": "2", "WORLD_SIZE": "3", "LOCAL_WORLD_SIZE": "3", "GROUP_RANK": "0",
       "ROLE_RANK": "2", "ROLE_WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def test_a_rank_s_variables_are_set_for_the_run_and_put_back_after(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in SET:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("MASTER_PORT", "1111")
    with torchrun_environment(2, 3):
        assert {k: os.environ.get(k) for k in SET} == SET
    assert os.environ["MASTER_PORT"] == "1111"
    assert not any(k in os.environ for k in SET if k != "MASTER_PORT")


def test_the_environment_is_put_back_when_the_run_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(ValueError, match="the program's"), torchrun_environment(0, 1):
        raise ValueError("the program's")
    assert "RANK" not in os.environ
