"""The simulated memory saver's pausable pools over the caching allocator, on small programs.

Reuse within a pool, pause and resume (addresses kept, contents only with a
backup), an access while paused, an allocation served from a paused segment,
free while paused (each physical handle released once, or the library bug),
and a property over random programs: live allocations never overlap, keep
their address and (backed-up) values, and every handle is released once.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from reference.naming import short_path
from simdevice import LibraryFixes, Options, SimDevice, peek
from simdevice.dispatch import data_of
from simdevice.runtime.reports import HostError, IllegalAccess

#: how reports name this file (relative to the working directory when under it)
HERE = short_path(__file__)


def sim(body: Any, options: Options | None = None) -> tuple[SimDevice, Any]:
    dev = SimDevice(options=options)
    run = dev.run(body)
    return dev, run


def test_freed_block_is_reused_in_its_pool_only() -> None:
    def body(dev: Any) -> Any:
        ms = dev.memory_saver
        with ms.region("train"):
            a = torch.zeros(1024, device=dev.device)
            a_at = data_of(a).data_ptr()
            del a
            b = torch.zeros(1024, device=dev.device)
            with ms.disable():
                c = torch.zeros(1024, device=dev.device)
        return a_at, data_of(b).data_ptr(), data_of(c).data_ptr(), b, c

    dev, run = sim(body)
    a_at, b_at, c_at, _, _ = run.result
    alloc = dev.runtime.memsaver.allocator
    assert (a_at, alloc.reused) == (b_at, 1)
    assert c_at != b_at
    assert [s.pool for s in alloc.pools[None]] == [None]


@pytest.mark.parametrize("backup", [False, True])
def test_pause_keeps_addresses_and_contents_only_with_backup(backup: bool) -> None:
    def body(dev: Any) -> Any:
        ms = dev.memory_saver
        with ms.region("train", enable_cpu_backup=backup):
            w = torch.full((256,), 3.0, device=dev.device)
        dev.synchronize()
        at = data_of(w).data_ptr()
        ms.pause("train")
        ms.resume("train")
        return at, data_of(w).data_ptr(), w.cpu(), w

    _, run = sim(body)
    before, after, values, w = run.result
    assert before == after
    assert not run.reports
    assert torch.equal(values, torch.full((256,), 3.0)) == backup
    assert backup or bool(torch.isnan(peek(w)).all())


def test_backup_is_the_allocating_region_s_not_the_tag_s_last() -> None:
    """torch_memory_saver keeps ``enable_cpu_backup`` per allocation, in a ``MemPool`` per tag and setting: a later
    region of the same tag without a backup neither drops the earlier allocation's backup nor takes its cached
    blocks (nor the other way round)."""

    def body(dev: Any) -> Any:
        ms = dev.memory_saver
        with ms.region("train", enable_cpu_backup=True):
            w = torch.full((256,), 3.0, device=dev.device)
            gone = torch.zeros(256, device=dev.device)
            gone_at = data_of(gone).data_ptr()
            del gone
        with ms.region("train"):
            scratch = torch.full((256,), 5.0, device=dev.device)
        dev.synchronize()
        ms.pause("train")
        ms.resume("train")
        return w.cpu(), gone_at, data_of(scratch).data_ptr(), w, scratch

    dev, run = sim(body)
    values, gone_at, scratch_at, _, scratch = run.result
    assert not run.reports
    assert torch.equal(values, torch.full((256,), 3.0))
    assert scratch_at != gone_at
    assert bool(torch.isnan(peek(scratch)).all())
    segs = dev.runtime.memsaver.allocator.segments("train")
    assert sorted(s.backup for s in segs) == [False, True]


def test_access_while_paused_names_allocation_pause_and_access() -> None:
    def body(dev: Any) -> Any:
        ms = dev.memory_saver
        with ms.region("train"):
            w = torch.zeros(256, device=dev.device)
        dev.synchronize()
        ms.pause("train")
        w.add_(1)
        return w

    _, run = sim(body)
    line = inspect.getsourcelines(body)[1] + 6
    assert [str(r) for r in run.reports] == [
        f"illegal access: add_ on stream default #1 ({HERE}:{line}) {verb} "
        "device#1[0:1024] of device#1, which memory_saver.pause('train') at t=0.010 unmapped (block seg#1+0)"
        for verb in ("reads", "writes")
    ]


def test_allocation_in_paused_region_comes_from_cache_or_fresh_segment() -> None:
    def body(dev: Any) -> Any:
        ms = dev.memory_saver
        with ms.region("train"):
            keep = torch.zeros(1024, device=dev.device)  # 4 KiB in a 20 KiB segment: 16 KiB stay cached
            dev.synchronize()
            ms.pause("train")
            cached = torch.empty(512, device=dev.device)  # fits the cached rest: unmapped from birth
            fresh = torch.empty(64 * 1024, device=dev.device)  # fits nothing: a fresh, mapped segment
            cached.fill_(1)
            fresh.fill_(1)
            with ms.disable():
                ordinary = torch.ones(512, device=dev.device)
            ms.resume("train")
        return keep, cached, fresh, ordinary

    dev, run = sim(body)
    # the fresh segment is active, not paused, when the region resumes: the library refuses it and exits
    assert [type(r) for r in run.reports] == [IllegalAccess, HostError]
    assert "device#2" in str(run.reports[0])
    assert "resume('train') meets seg#2 of region 'train', not paused" in str(run.reports[1])
    assert len(dev.runtime.memsaver.allocator.served_paused) == 1


def _paused_then(dev: Any, then: str) -> Any:
    """A region paused, then: ``fresh`` (a segment made while paused, outside disable(), kept or only cached),
    ``disabled`` (the same inside disable()), ``twice`` (paused again), ``unpaused`` (resumed twice), ``fits``
    (an allocation a cached block of the paused segment serves: no segment made). Then resume."""
    ms = dev.memory_saver
    with ms.region("train"):
        keep = torch.zeros(1024, device=dev.device)
        dev.synchronize()
        ms.pause("train")
        if then in ("fresh", "fresh-freed"):
            x = torch.empty(64 * 1024, device=dev.device)
            if then == "fresh-freed":
                del x
        elif then == "disabled":
            with ms.disable():
                x = torch.ones(64 * 1024, device=dev.device)
                del x
        elif then == "twice":
            ms.pause("train")
        elif then == "fits":
            x = torch.empty(512, device=dev.device)  # the cached rest of keep's segment: paused, no new segment
            del x
        ms.resume("train")
        if then == "unpaused":
            ms.resume("train")
    return keep


@pytest.mark.parametrize(
    ("then", "refused"),
    [
        ("fresh", "memory_saver.resume('train') meets seg#2 of region 'train', not paused: made while the region was "
         "paused, outside disable(), and still alive"),
        ("fresh-freed", "memory_saver.resume('train') meets seg#2 of region 'train', not paused: made while the "
         "region was paused, outside disable(), and still cached"),
        ("twice", "memory_saver.pause('train') meets seg#1 of region 'train', already paused"),
        ("unpaused", "memory_saver.resume('train') meets seg#1 of region 'train', not paused (the region is not "
         "paused)"),
        ("disabled", None),
        ("fits", None),
    ],
)
def test_the_library_pauses_only_active_and_resumes_only_paused_allocations(then: str, refused: str | None) -> None:
    """torch_memory_saver's pause and resume exit the process on an allocation of the tag in the other state."""
    _, run = sim(lambda dev: _paused_then(dev, then))
    if refused is None:
        assert run.reports == ()
    else:
        assert [type(r) for r in run.reports] == [HostError]
        assert refused in str(run.reports[0])
        assert "refuses" in str(run.reports[0])
        assert "exits the process" in str(run.reports[0])


def test_the_refusal_is_per_tag() -> None:
    """A segment made while another region is paused is that region's business: resuming "train" ignores it."""
    def body(dev: Any) -> Any:
        ms = dev.memory_saver
        with ms.region("train"):
            keep = torch.zeros(1024, device=dev.device)
        dev.synchronize()
        ms.pause("train")
        with ms.region("other"):
            other = torch.zeros(64 * 1024, device=dev.device)
        ms.resume("train")
        return keep, other

    _, run = sim(body)
    assert run.reports == ()


@pytest.mark.parametrize("fixed", [True, False])
def test_free_while_paused_releases_each_handle_once(fixed: bool) -> None:
    def body(dev: Any) -> Any:
        ms = dev.memory_saver
        with ms.region("train"):
            x = torch.zeros(64 * 1024, device=dev.device)
        dev.synchronize()
        ms.pause("train")
        del x
        dev.empty_cache()
        return sorted(dev.runtime.memsaver.released.values())

    _, run = sim(body, Options(library=LibraryFixes(release_paused_once=fixed)))
    if fixed:
        assert (run.reports, run.result) == ((), ["pause of seg#1"])
    else:
        assert [type(r) for r in run.reports] == [HostError]


# -- the pool under random programs ---------------------------------------------------------------

_OP = st.one_of(
    st.tuples(st.just("alloc"), st.sampled_from([256, 1024, 4096, 16384]), st.booleans()),
    st.tuples(st.just("free"), st.integers(0, 7)),
    st.tuples(st.just("write"), st.integers(0, 7)),
    st.tuples(st.sampled_from(["pause", "resume", "empty_cache"])),
)


def pool_program(ops: list[tuple[Any, ...]], pick: int, fixes: LibraryFixes) -> list[str]:
    """Run a random program on the pool; what it finds wrong (an empty list when all holds)."""

    made_while_paused = []

    def body(dev: Any) -> list[str]:
        ms, live, bad = dev.memory_saver, [], []  # live: [tensor, in_region, value, address]
        paused = False
        with ms.region("train", enable_cpu_backup=True):
            for op in ops:
                if op[0] == "alloc":
                    if op[2] and paused:
                        made_while_paused.append(op)
                    with contextlib.nullcontext() if op[2] else ms.disable():
                        # empty: in a paused region the block may be unmapped, so no write yet
                        live.append([torch.empty(op[1], device=dev.device), op[2], 0.0, 0])
                    live[-1][3] = data_of(live[-1][0]).data_ptr()
                elif op[0] == "free" and live:
                    del live[op[1] % len(live)]  # the last reference: the block goes back to the cache
                elif op[0] == "write" and live and not (paused and live[op[1] % len(live)][1]):
                    live[op[1] % len(live)][2] += 1
                    live[op[1] % len(live)][0].fill_(live[op[1] % len(live)][2])
                elif op[0] == "pause" and not paused:
                    dev.synchronize()
                    ms.pause("train")
                    paused = True
                elif op[0] == "resume" and paused:
                    ms.resume("train")
                    paused = False
                elif op[0] == "empty_cache":
                    dev.empty_cache()
            if paused:
                ms.resume("train")
            spans = sorted((data_of(e[0]).data_ptr(), data_of(e[0]).data_ptr() + 4 * e[0].numel()) for e in live)
            bad += [f"overlap at {a}" for (_, a), (b, _) in itertools.pairwise(spans) if b < a]
            for t, _, value, at in live:
                if data_of(t).data_ptr() != at:
                    bad.append("an allocation moved")
                # a tensor made while its region was paused, and never written, holds poison
                if value and not torch.equal(t.cpu(), torch.full((t.numel(),), value)):
                    bad.append(f"an allocation lost its value {value}")
        return bad

    dev = SimDevice(options=Options(library=fixes, alloc_pick=pick))
    run = dev.run(body)
    released = list(dev.runtime.memsaver.released)
    reports = [str(r) for r in run.reports]
    # an allocation in the paused region that no cached block fitted got a fresh, active segment: the library's
    # resume refuses it and the process ends there (the rule has its own tests above); the run stops at that resume,
    # so only what happened before it is checked
    if made_while_paused and len(reports) == 1 and "not paused: made while the region was paused" in reports[0]:
        reports = []
    return reports + (run.result or []) + (
        ["a handle released twice"] if len(set(released)) != len(released) else []
    )


@given(st.lists(_OP, max_size=24), st.integers(0, 2))
def test_pool_keeps_addresses_values_and_handles(ops: list[tuple[Any, ...]], pick: int) -> None:
    """Live allocations never overlap, keep their address and (backed up) values; each handle is released once."""
    assert pool_program(ops, pick, LibraryFixes()) == []


def test_pool_property_catches_free_while_paused_twice() -> None:
    ops = [("alloc", 16384, True), ("write", 0), ("pause",), ("free", 0), ("empty_cache",)]
    assert pool_program(ops, 0, LibraryFixes()) == []
    assert "released handle h1 of seg#1 twice" in pool_program(ops, 0, LibraryFixes(release_paused_once=False))[0]


def test_pick_chooses_among_fitting_blocks() -> None:
    def body(dev: Any) -> Any:
        a = torch.zeros(16 * 1024, device=dev.device)  # 64 KiB segment
        b = torch.zeros(8 * 1024, device=dev.device)  # 32 KiB segment
        at = {"a": data_of(a).data_ptr(), "b": data_of(b).data_ptr()}
        dev.synchronize()  # queued work holds its tensors: only then are both blocks free
        del a, b
        c = torch.zeros(1024, device=dev.device)
        return next(k for k, v in at.items() if v == data_of(c).data_ptr()), c

    chosen = {pick: SimDevice(options=Options(alloc_pick=pick)).run(body).result[0] for pick in (0, 1)}
    assert chosen == {0: "b", 1: "a"}  # best fit first; the schedule may choose the other


@pytest.mark.parametrize(
    "kwargs", [{"enable_disk_backup": True}, {"enable_cpu_backup": True, "cpu_backup_backend": "pinned"},
               {"enable_cpu_backup": True, "cpu_backup_backend": "mmap"}],
)
def test_the_library_s_other_backups_keep_the_contents(kwargs: dict[str, Any]) -> None:
    """``region()`` takes the library's ``enable_disk_backup`` and ``cpu_backup_backend``: each keeps the contents
    across a pause, as ``enable_cpu_backup`` does (they were refused with a TypeError, a host error blamed on the
    program)."""

    def body(dev: Any) -> Any:
        ms = dev.memory_saver
        with ms.region("train", **kwargs):
            w = torch.full((256,), 3.0, device=dev.device)
        dev.synchronize()
        ms.pause(tag="train")
        ms.resume(tag="train")
        return w.cpu(), w

    _, run = sim(body)
    assert not run.reports
    assert torch.equal(run.result[0], torch.full((256,), 3.0))


@pytest.mark.parametrize(
    ("kwargs", "error"), [({"cpu_backup_backend": "pinned"}, "ValueError: cpu_backup_backend requires"),
                          ({"enable_cpu_backup": True, "enable_disk_backup": True}, "AssertionError: enable_cpu")],
)
def test_region_refuses_what_the_library_refuses(kwargs: dict[str, Any], error: str) -> None:
    def body(dev: Any) -> None:
        with dev.memory_saver.region("train", **kwargs):
            torch.zeros(16, device=dev.device)

    _, run = sim(body)
    assert len(run.reports) == 1
    assert isinstance(run.reports[0], HostError)
    assert error in str(run.reports[0])


def test_the_library_s_unsimulated_calls_give_no_verdict() -> None:
    """What the simulated library does not model raises NotImplementedError (no verdict), not AttributeError (a
    host error blamed on the program)."""
    ms = SimDevice().memory_saver
    assert ms.enabled
    ms.set_disk_backup_dir("/tmp")
    with pytest.raises(NotImplementedError, match="cuda_graph"):
        ms.cuda_graph(None)
    with pytest.raises(NotImplementedError, match="get_cpu_backup"):
        ms.get_cpu_backup(torch.zeros(1))
    with pytest.raises(NotImplementedError, match="memory_margin_bytes"):
        ms.memory_margin_bytes = 1 << 30
    with pytest.raises(NotImplementedError, match="retain_cpu_backup"):
        ms.retain_cpu_backup = True


def test_each_process_pauses_its_own_memory() -> None:
    """Each process has its own torch_memory_saver: a child's pause of a tag unmaps the child's segments of it, never
    the parent's (which kept computing in its own region of that tag, and was reported as an illegal access)."""

    def child(dev: Any) -> None:
        ms = dev.memory_saver
        with ms.region("train"):
            c = torch.ones(1024, device=dev.device)
        dev.synchronize()
        ms.pause("train")
        ms.resume("train")
        c.fill_(2.0)
        dev.synchronize()

    def body(dev: Any) -> Any:
        ms = dev.memory_saver
        with ms.region("train"):
            w = torch.full((1024,), 2.0, device=dev.device)
        dev.synchronize()
        p = dev.Process(child, name="worker")
        p.start()
        for _ in range(8):
            w.mul_(1.0)
        p.join()
        dev.synchronize()
        return w.cpu(), w

    dev, run = sim(body)
    assert not run.reports
    assert torch.equal(run.result[0], torch.full((1024,), 2.0))
    released = dev.runtime.memsaver.released
    assert sorted(released.values()) == ["pause of seg#2"]
