"""Rule (allocator: ``History``, ``record_history``, ``snapshot``; facade: ``_record_memory_history``,
``_memory_snapshot``): ``torch.cuda.memory._record_memory_history``, ``_snapshot``, ``_dump_snapshot`` and
``torch.cuda.memory_snapshot`` in a run are the simulated allocator's, in torch's form: each segment of the calling
process with its blocks in address order (``active_allocated``; ``active_pending_free``, freed but held back for a
stream recorded with it; ``inactive``), where the program made each live allocation, and the history of the
allocator's actions (``segment_alloc``, ``alloc``, ``free_requested``, ``free_completed``, ``segment_free``,
``oom``) in a ring of ``max_entries``, with the program's stack as ``context`` asks. Before, a program that recorded
its memory history (torchtitan's and Megatron's memory snapshots) got no verdict: torch's CPU build has no
``_cuda_record_memory_history``."""

from __future__ import annotations

import itertools
import os
import pickle
import tempfile
from typing import Any

import pytest
import torch
import torch.distributed as dist

import simdevice

K = 1 << 10


def _run(fn: Any, *args: Any, world_size: int | None = None) -> Any:
    s = simdevice.cuda()
    s.run(fn, *args, world_size=world_size)
    s.assert_clean()
    return s.result.result


def _line(frames: list[dict[str, Any]]) -> int | None:
    """The line of this file among the frames (the program's)."""
    return next((f["line"] for f in frames if f["filename"] == __file__), None)


def states() -> dict[str, Any]:
    torch.cuda.memory._record_memory_history()
    side = torch.cuda.Stream()
    kept = torch.ones(K, device="cuda")
    kept_line = kept_at = None
    with torch.cuda.stream(side):
        held = torch.empty(64 * K, device="cuda")
        held.fill_(1.0)
    held.record_stream(torch.cuda.current_stream())
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.current_stream().synchronize()  # (the held block's stream is done, but its event is not queried)
    del held
    segments = torch.cuda.memory_snapshot()
    kept_at = [b for s in segments for b in s["blocks"] if b["address"] == kept.data_ptr()]
    kept_line = _line(kept_at[0]["frames"]) if kept_at else None
    return {"segments": segments, "kept_line": kept_line, "allocated": torch.cuda.memory_allocated(),
            "reserved": torch.cuda.memory_reserved(), "side": side.cuda_stream}


def test_a_snapshot_has_each_segment_s_blocks_in_torch_s_form() -> None:
    got = _run(states)
    segments = got["segments"]
    assert got["kept_line"] is not None  # where the live block was made: this file's line
    for seg in segments:
        blocks = seg["blocks"]
        assert sum(b["size"] for b in blocks) == seg["total_size"]
        assert [b["address"] for b in blocks] == sorted(b["address"] for b in blocks)
        assert blocks[0]["address"] == seg["address"]
        assert all(a["address"] + a["size"] == b["address"] for a, b in itertools.pairwise(blocks))
        assert seg["allocated_size"] == sum(b["size"] for b in blocks if b["state"] == "active_allocated")
        assert seg["active_size"] == sum(b["size"] for b in blocks if b["state"] != "inactive")
        assert seg["segment_type"] in ("small", "large")
        assert seg["segment_pool_id"] == (0, 0)
    states_seen = {(seg["stream"], b["state"]) for seg in segments for b in seg["blocks"]}
    assert (0, "active_allocated") in states_seen
    assert (got["side"], "active_pending_free") in states_seen  # held back for the stream recorded with it
    assert sum(seg["allocated_size"] for seg in segments) == got["allocated"]
    assert sum(seg["total_size"] for seg in segments) == got["reserved"]


def history(max_entries: int, context: str | None, enabled: str = "all") -> list[Any]:
    torch.cuda.memory._record_memory_history(enabled, context=context, max_entries=max_entries)
    x = torch.empty(8 * K, device="cuda")
    del x
    torch.cuda.empty_cache()
    snap = torch.cuda.memory._snapshot()
    return [(e["action"], e["size"], _line(e["frames"])) for e in snap["device_traces"][0]]


def test_the_history_has_the_allocator_s_actions_in_order() -> None:
    got = _run(history, 100, "all")
    actions = [a for a, _, _ in got]
    assert actions == ["segment_alloc", "alloc", "free_requested", "free_completed", "segment_free"]
    alloc, requested, completed = got[1], got[2], got[3]
    assert alloc[1] == requested[1] == completed[1] == 32 * K
    assert alloc[2] is not None
    assert requested[2] == alloc[2] + 1  # the program's lines: the empty, the del
    assert completed[2] == requested[2]  # (a free's completion has its request's stack)
    assert got[0][2] is None  # (a segment's actions have no stack)
    assert got[4][2] is None


def test_the_history_keeps_its_last_entries_and_the_stacks_asked_for() -> None:
    assert [a for a, _, _ in _run(history, 2, "all")] == ["free_completed", "segment_free"]
    assert [line for _, _, line in _run(history, 100, None)] == [None] * 5
    alloc_only = _run(history, 100, "alloc")
    assert alloc_only[1][2] is not None
    assert alloc_only[2][2] is None
    assert _run(history, 100, "all", "state") == []  # the state alone: no history


def stopped() -> list[Any]:
    torch.cuda.memory._record_memory_history()
    x = torch.empty(K, device="cuda")
    torch.cuda.memory._record_memory_history(enabled=None)
    del x
    torch.cuda.memory._record_memory_history()
    y = torch.empty(K, device="cuda")
    blocks = [b for s in torch.cuda.memory_snapshot() for b in s["blocks"] if b["state"] == "active_allocated"]
    return [[e["action"] for e in torch.cuda.memory._snapshot()["device_traces"][0]], len(blocks), y.numel()]


def test_stopping_drops_what_was_recorded() -> None:
    assert _run(stopped) == [["alloc"], 1, K]


def dumped() -> bool:
    torch.cuda.memory._record_memory_history(max_entries=10)
    x = torch.ones(K, device="cuda")
    path = os.path.join(tempfile.mkdtemp(), "snapshot.pickle")
    torch.cuda.memory._dump_snapshot(path)
    with open(path, "rb") as f:
        back = pickle.load(f)
    return bool(back == torch.cuda.memory._snapshot() and x.numel() == K)


def test_a_dumped_snapshot_is_the_snapshot_pickled() -> None:
    assert _run(dumped) is True


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"enabled": "some"}, "expected state to be 'state', 'all', or None"),
    ({"context": "never"}, "expected context to be 'state', 'alloc', 'all', or None"),
    ({"stacks": "cpp"}, "expected stacks to be 'python', or 'all'"),
])
def test_an_option_torch_refuses_raises_as_torch_does(kwargs: dict[str, str], says: str) -> None:
    def program() -> None:
        with pytest.raises(RuntimeError, match=says):
            torch.cuda.memory._record_memory_history(**kwargs)

    _run(program)


def per_rank() -> list[Any]:
    dist.init_process_group("nccl")
    torch.cuda.memory._record_memory_history()
    x = torch.empty((dist.get_rank() + 1) * 4 * K, device="cuda")
    dist.barrier()  # (both ranks have allocated)
    snap = torch.cuda.memory._snapshot()
    live = [b["size"] for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
    dist.destroy_process_group()
    return [[e["size"] for e in snap["device_traces"][0] if e["action"] == "alloc"], live, x.numel()]


def test_each_process_records_its_own_allocator() -> None:
    assert _run(per_rank, world_size=2) == [[[16 * K], [16 * K], 4 * K], [[32 * K], [32 * K], 8 * K]]


def offload_recorded() -> float:
    torch.cuda.memory._record_memory_history()
    act = torch.full((K,), 2.0, device="cuda")
    pinned = torch.empty(K, pin_memory=True)
    pinned.copy_(act, non_blocking=True)
    torch.cuda.memory._snapshot()
    return float(pinned.sum())  # the D2H not waited for


def test_a_race_is_found_in_a_program_that_records_its_memory() -> None:
    s = simdevice.cuda()
    s.run(offload_recorded)
    assert {"race", "stale-read"} & {r.kind for r in s.result.reports}, s.text()
