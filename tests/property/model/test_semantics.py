"""The simulated device's own semantics: each synchronization primitive, copies, views, deadlocks, determinism."""

import os
import re
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from reference.naming import short_path
from reference.schedule import Delay, Schedule
from simdevice import UNIT_NS, Deadlock, HostError, Race, SimDevice, StaleRead, peek

#: how reports name this file (relative to the working directory when under it)
HERE = short_path(__file__)

N = 1024  # float32 elements: 4 KiB simulated, 4 MiB modelled


def run(program: Any, *args: Any, delays: tuple[Delay, ...] = ()) -> tuple[Any, tuple[Any, ...], SimDevice]:
    dev = SimDevice(Schedule("test", "t", (), delays))
    r = dev.run(program, *args)
    return r.result, r.reports, dev


def kinds(reports: tuple[Any, ...]) -> list[str]:
    return sorted({r.kind for r in reports})


# -- streams and events ---------------------------------------------------------------------------


def offload(dev: Any, sync: str) -> torch.Tensor:
    """D2H on a side stream into pinned memory, then an H2D reload on the compute stream."""
    x = torch.arange(N, dtype=torch.float32, device=dev.device)
    pinned = torch.empty(N, pin_memory=True)
    side = dev.Stream(name="side")
    side.wait_stream(dev.current_stream())
    ev = dev.Event()
    with dev.stream(side):
        pinned.copy_(x, non_blocking=True)
        ev.record()
    if sync == "wait_event":
        dev.current_stream().wait_event(ev)
    elif sync == "wait_stream":
        dev.current_stream().wait_stream(side)
    elif sync == "event.synchronize":
        ev.synchronize()
    elif sync == "stream.synchronize":
        side.synchronize()
    elif sync == "device.synchronize":
        dev.synchronize()
    y = torch.empty_like(x)
    y.copy_(pinned, non_blocking=True)
    return y.cpu()


@pytest.mark.parametrize(
    "sync", ["wait_event", "wait_stream", "event.synchronize", "stream.synchronize", "device.synchronize"]
)
def test_each_synchronization_orders_the_reload(sync: str) -> None:
    out, reports, _ = run(offload, sync)
    assert reports == ()
    assert torch.equal(out, torch.arange(N, dtype=torch.float32))


def test_without_synchronization_the_reload_races_and_reads_stale_data() -> None:
    # the D2H a unit late: the reload runs ahead of it (right behind it, it would trail it and read its bytes,
    # still racing: tests/property/model/test_copy_sweeps.py)
    out, reports, _ = run(offload, "none", delays=(Delay("side", 0, 1),))
    assert kinds(reports) == ["race", "stale-read"]
    assert torch.isnan(out).all()  # the pinned buffer was still uninitialized (poisoned)
    out, reports, _ = run(offload, "none")
    assert kinds(reports) == ["race"]


@given(st.lists(st.tuples(st.sampled_from(["host", "default", "side"]), st.integers(0, 5), st.integers(1, 20)),
                max_size=3, unique_by=lambda t: t[:2]))
def test_a_synchronized_program_is_clean_under_every_schedule(raw: list[tuple[str, int, int]]) -> None:
    delays = tuple(Delay(a, k, u) for a, k, u in raw)
    out, reports, _ = run(offload, "wait_event", delays=delays)
    assert reports == ()
    assert torch.equal(out, torch.arange(N, dtype=torch.float32))


def test_a_never_recorded_event_is_no_edge_and_no_wait() -> None:
    def program(dev: Any) -> bool:
        ev = dev.Event()
        dev.current_stream().wait_event(ev)
        ev.synchronize()
        return bool(ev.query())

    out, reports, _ = run(program)
    assert out is True
    assert reports == ()


def test_event_query_is_false_in_flight_and_orders_once_true() -> None:
    def program(dev: Any) -> tuple[bool, list[float]]:
        x = torch.ones(N, device=dev.device)
        pinned = torch.empty(N, pin_memory=True)
        ev = dev.Event()
        pinned.copy_(x, non_blocking=True)
        ev.record()
        first = ev.query()
        while not ev.query():
            dev.sleep(0.1)
        return first, pinned[:2].tolist()

    (first, values), reports, _ = run(program)
    assert first is False
    assert values == [1.0, 1.0]
    assert reports == ()


def test_stream_query_is_false_while_its_work_runs_and_orders_once_true() -> None:
    """Rule (``SimStream.idle``, read by ``Runtime.stream_query``): a stream's ``query()`` is True once it has done
    all it was given, and the host that saw it so is ordered after that work. Mutation: ``idle`` never true (the
    loop never ends: a step limit)."""

    def program(dev: Any) -> tuple[bool, list[float]]:
        side = dev.Stream(name="side")
        x = torch.ones(N, device=dev.device)
        pinned = torch.empty(N, pin_memory=True)
        side.wait_stream(dev.current_stream())
        with dev.stream(side):
            pinned.copy_(x, non_blocking=True)
        first = side.query()
        while not side.query():
            dev.sleep(0.1)
        return first, pinned[:2].tolist()

    (first, values), reports, _ = run(program, delays=(Delay("side", 0, 5),))
    assert first is False
    assert values == [1.0, 1.0]
    assert reports == ()


# -- copies to and from host memory ---------------------------------------------------------------


def test_copy_to_pageable_memory_is_synchronous() -> None:
    def program(dev: Any) -> torch.Tensor:
        x = torch.full((N,), 3.0, device=dev.device)
        host = torch.empty(N)
        host.copy_(x, non_blocking=True)  # pageable destination: CUDA waits, and so do we
        return host.clone()

    out, reports, _ = run(program)
    assert reports == ()
    assert torch.equal(out, torch.full((N,), 3.0))


def test_host_read_of_pinned_memory_before_the_copy_landed_is_stale() -> None:
    def program(dev: Any) -> torch.Tensor:
        x = torch.full((N,), 3.0, device=dev.device)
        pinned = torch.empty(N, pin_memory=True)
        pinned.copy_(x, non_blocking=True)
        return pinned.clone()  # a host read, unordered with the D2H

    out, reports, _ = run(program)
    assert kinds(reports) == ["race", "stale-read"]
    stale = next(r for r in reports if isinstance(r, StaleRead))
    assert stale.read.on == "host"
    assert stale.stale_by == 1
    assert torch.isnan(out).all()


@pytest.mark.parametrize("how", ["d2h", "d2h positional", "h2d"])
def test_a_pinned_copy_without_non_blocking_is_synchronous(how: str) -> None:
    # CUDA synchronizes the stream after a copy to or from host memory unless non_blocking=True
    def program(dev: Any) -> torch.Tensor:
        x = torch.full((N,), 3.0, device=dev.device)
        pinned = torch.empty(N, pin_memory=True)
        if how == "h2d":
            pinned.fill_(3.0)
            x.copy_(pinned)
            pinned.fill_(5.0)  # the host may reuse the buffer at once
            return x.cpu()
        if how == "d2h":
            pinned.copy_(x)
        else:
            pinned.copy_(x, False)
        return pinned.clone()

    out, reports, _ = run(program)
    assert reports == ()
    assert torch.equal(out, torch.full((N,), 3.0))


def test_copy_from_pageable_memory_reads_the_source_at_issue() -> None:
    def program(dev: Any) -> torch.Tensor:
        src = torch.full((N,), 1.0)
        y = torch.empty(N, device=dev.device)
        y.copy_(src, non_blocking=True)
        src.fill_(2.0)  # pageable: CUDA staged the bytes already
        return y.cpu()

    out, reports, _ = run(program)
    assert reports == ()
    assert torch.equal(out, torch.full((N,), 1.0))


def test_item_and_cpu_wait_for_the_stream() -> None:
    def program(dev: Any) -> tuple[float, float, list[float], bool]:
        x = torch.arange(N, dtype=torch.float32, device=dev.device)
        return (x * 2).sum().item(), float(x[5:6].cpu()[0]), x[:3].tolist(), bool((x > N - 2).any())

    (total, five, head, big), reports, _ = run(program)
    assert reports == ()
    assert total == float(sum(range(N)) * 2)
    assert five == 5.0
    assert head == [0.0, 1.0, 2.0]
    assert big is True


# -- views alias ----------------------------------------------------------------------------------


def test_views_alias_their_base() -> None:
    def program(dev: Any) -> torch.Tensor:
        flat = torch.zeros(2 * N, device=dev.device)
        a, b = flat[:N], flat[N:].view(2, N // 2)
        a.add_(1.0)
        b.fill_(7.0)
        return flat.cpu()

    out, reports, _ = run(program)
    assert reports == ()
    assert torch.equal(out, torch.cat([torch.ones(N), torch.full((N,), 7.0)]))


@pytest.mark.parametrize(("other", "racy"), [(slice(N, 2 * N), False), (slice(N // 2, N + N // 2), True)])
def test_unordered_accesses_race_only_where_the_bytes_overlap(other: slice, racy: bool) -> None:
    def program(dev: Any) -> None:
        flat = torch.zeros(2 * N, device=dev.device)
        side = dev.Stream(name="side")
        side.wait_stream(dev.current_stream())
        flat[:N].fill_(1.0)
        with dev.stream(side):
            flat[other].fill_(2.0)
        dev.synchronize()

    _, reports, _ = run(program)
    assert (kinds(reports) == ["race"]) is racy
    if racy:
        assert reports[0].current.storage == reports[0].previous.storage == "device#1"


#: (a view of a [16, 8] float matrix, another, whether their bytes overlap): strided views with gaps between their
#: bytes interleave without sharing one (columns, column blocks, every other element)
STRIDED = [
    (lambda m: m[:, 0], lambda m: m[:, 1], False),
    (lambda m: m[:, :4], lambda m: m[:, 4:], False),
    (lambda m: m.view(-1)[::2], lambda m: m.view(-1)[1::2], False),
    (lambda m: m[:, 1:3].t(), lambda m: m[:, 3], False),
    (lambda m: m[:, 0], lambda m: m[5], True),  # the column and a row meet at one element
    (lambda m: m[:, :4], lambda m: m[:, 3:5], True),
    (lambda m: m.view(-1)[::2], lambda m: m.view(-1)[2::4], True),
    (lambda m: m.t(), lambda m: m[:, 7], True),  # a transpose covers every byte
]


@pytest.mark.parametrize(("view_a", "view_b", "racy"), STRIDED)
def test_strided_views_race_only_where_their_own_bytes_meet(view_a: Any, view_b: Any, racy: bool) -> None:
    """Two streams write two views of one matrix unordered: a race, and under a stall wrong values, only where some
    element lies in both; a strided view's bytes are its elements', not the span from its first to its last (a
    column's span holds every other column). A race names the views' spans."""

    def program(dev: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        m = torch.zeros(16, 8, device=dev.device)
        side = dev.Stream(name="side")
        side.wait_stream(dev.current_stream())
        view_a(m).fill_(1.0)
        with dev.stream(side):
            view_b(m).fill_(2.0)
        dev.current_stream().wait_stream(side)
        return m.cpu(), view_a(m).cpu(), view_b(m).cpu()

    for delays in ((), (Delay("side", 0, 1),), (Delay("default", 1, 1),)):
        (m, a, b), reports, _ = run(program, delays=delays)
        assert ("race" in kinds(reports)) is racy
        if not racy:
            assert reports == ()
            assert torch.equal(a, torch.ones_like(a))
            assert torch.equal(b, torch.full_like(b, 2.0))
            assert int((m == 0).sum()) == m.numel() - a.numel() - b.numel()
        else:
            race = next(r for r in reports if r.kind == "race")
            assert race.current.hi - race.current.lo >= 4 * b.numel()  # its span


def test_a_strided_view_of_many_pieces_is_checked_at_its_span() -> None:
    """Past MAX_PIECES pieces a view is checked at its span (the cost of a piece each is then not paid): a race
    between its pieces may be reported, none missed."""
    from simdevice.runtime.memory import MAX_PIECES, pieces

    assert pieces((MAX_PIECES,), (2,), 4, 0) == tuple((8 * k, 8 * k + 4) for k in range(MAX_PIECES))
    assert pieces((MAX_PIECES + 1,), (2,), 4, 0) is None
    assert pieces((3, 4), (1, 3), 4, 8) is None  # a transpose: one range
    assert pieces((2, 3), (0, 2), 4, 0) == ((0, 4), (8, 12), (16, 20))  # expanded: the same bytes twice
    assert pieces((2, 2), (3, 2), 4, 0) == ((0, 4), (8, 16), (20, 24))  # pieces that touch merge


# -- host actors, shared values, queues -----------------------------------------------------------


def worker(dev: Any, buf: torch.Tensor, ready: Any, out: Any) -> None:
    pinned = torch.empty(N, pin_memory=True)
    pinned.copy_(buf, non_blocking=True)
    dev.synchronize()  # wait: the D2H must land before the host reads the mirror
    ready.value = 1
    out.put(float(pinned.sum()))


def test_a_worker_process_shares_device_memory_and_hands_back_values() -> None:
    def program(dev: Any) -> float:
        buf = torch.full((N,), 2.0, device=dev.device)
        ready, out = dev.Value("i", 0), dev.Queue()
        p = dev.Process(worker, (buf, ready, out), name="worker0")
        p.start()
        while ready.value != 1:
            dev.sleep(0.05)
        got = out.get()
        p.join()
        return got

    _, reports, dev = run(program)
    # the worker's stream is not ordered after the trainer's fill: a cross-process race, as on CUDA IPC
    assert kinds(reports) == ["race"]
    assert {"host", "worker0", "default", "worker0.default"} <= set(dev.runtime.op_counts())


def test_a_worker_ordered_by_a_handshake_is_clean() -> None:
    def program(dev: Any) -> float:
        buf = torch.full((N,), 2.0, device=dev.device)
        dev.synchronize()  # wait: the buffer is written before the worker may copy it
        ready, out = dev.Value("i", 0), dev.Queue()
        p = dev.Process(worker, (buf, ready, out), name="worker0")
        p.start()
        got = out.get()
        p.join()
        return got

    out, reports, _ = run(program)
    assert reports == ()
    assert out == 2.0 * N


# -- what ends a run early ------------------------------------------------------------------------


def test_a_queue_nobody_fills_is_a_deadlock_not_a_hang() -> None:
    def program(dev: Any) -> None:
        dev.Queue().get()

    out, reports, _ = run(program)
    assert out is None
    assert len(reports) == 1
    assert isinstance(reports[0], Deadlock)
    assert str(reports[0]) == "deadlock at t=0.000: host waits for an item on a queue"


def test_polling_a_value_nobody_writes_is_a_deadlock() -> None:
    def program(dev: Any) -> None:
        v = dev.Value("i", 0)
        while v.value == 0:
            dev.sleep(1)

    _, reports, _ = run(program)
    assert [r.kind for r in reports] == ["deadlock"]
    assert "host waits for nothing it can see change (polling; last step: " in str(reports[0])


def test_a_join_on_a_blocked_worker_names_both_waits() -> None:
    def stuck(dev: Any, q: Any) -> None:
        q.get()

    def program(dev: Any) -> None:
        q = dev.Queue()
        p = dev.Process(stuck, (q,), name="worker0")
        p.start()
        p.join()

    _, reports, _ = run(program)
    assert str(reports[0]) == (
        "deadlock at t=0.005: host waits for process worker0 to exit; worker0 waits for an item on a queue"
    )


def test_an_exception_in_host_code_is_reported_with_its_line() -> None:
    def program(dev: Any) -> None:
        torch.zeros(4, device=dev.device)
        raise AssertionError("Chunk mismatch")

    _, reports, _ = run(program)
    assert len(reports) == 1
    assert isinstance(reports[0], HostError)
    assert reports[0].error == "AssertionError: Chunk mismatch"
    assert reports[0].source.startswith(f"{HERE}:")


def test_random_ops_depend_on_the_seed_and_the_program_never_on_timing() -> None:
    def program(dev: Any) -> torch.Tensor:
        side = dev.Stream(name="side")
        a = torch.randn(64, device=dev.device)
        with dev.stream(side):
            b = torch.rand(64, device=dev.device)
        dev.synchronize()
        return torch.cat([a.cpu(), b.cpu()])

    def values(schedule: str, seed: int = 0) -> torch.Tensor:
        from simdevice import Options

        return SimDevice(Schedule.parse(schedule), options=Options(seed=seed)).run(program).result

    first = values("t/t")
    assert torch.equal(first, values("t/t"))
    assert torch.equal(first, values("t/t::side#0+5,default#0+1"))  # another interleaving, the same values
    assert not torch.equal(first, values("t/t", seed=1))
    state = torch.get_rng_state()
    values("t/t")
    assert torch.equal(state, torch.get_rng_state())  # the global generator is left alone


def test_simulated_tensors_are_unusable_outside_a_run_but_can_be_peeked() -> None:
    def program(dev: Any) -> torch.Tensor:
        t = torch.full((4,), 5.0, device=dev.device)
        dev.synchronize()
        return t

    t, _, _ = run(program)
    assert torch.equal(peek(t), torch.full((4,), 5.0))
    with pytest.raises(RuntimeError, match=r"outside SimDevice\.run"):
        t + 1


def test_fresh_device_memory_is_poisoned() -> None:
    def program(dev: Any) -> tuple[torch.Tensor, torch.Tensor]:
        f, i = torch.empty(4, device=dev.device), torch.empty(4, dtype=torch.int32, device=dev.device)
        return f.cpu(), i.cpu()

    (f, i), _, _ = run(program)
    assert torch.isnan(f).all()
    assert (i == torch.iinfo(torch.int32).max).all()


def test_a_reused_block_keeps_its_last_owners_bytes() -> None:
    # as on a GPU: the caching allocator hands the block out again as it is (fresh memory is what is poisoned)
    def program(dev: Any) -> torch.Tensor:
        torch.full((4,), 7.0, device=dev.device).cpu()  # the temporary dies: its block is free on default
        return torch.empty(4, device=dev.device).cpu()

    out, reports, _ = run(program)
    assert reports == ()
    assert torch.equal(out, torch.full((4,), 7.0))


# -- schedules: delays and determinism --------------------------------------------------------------


def test_a_stream_delay_postpones_that_operation_by_its_units() -> None:
    _, _, plain = run(offload, "wait_event")
    _, _, delayed = run(offload, "wait_event", delays=(Delay("side", 0, 3),))

    def start(dev: SimDevice) -> int:
        return next(t for t, actor, what in dev.trace if actor == "side" and what.startswith("start"))

    assert start(delayed) - start(plain) == 3 * UNIT_NS


def test_a_host_delay_postpones_that_host_step() -> None:
    _, _, plain = run(offload, "wait_event")
    _, _, delayed = run(offload, "wait_event", delays=(Delay("host", 1, 2),))
    host = [t for t, a, w in plain.trace if a == "host" and not w.startswith("stall")]
    host_delayed = [t for t, a, w in delayed.trace if a == "host" and not w.startswith("stall")]
    assert host_delayed[0] == host[0]
    assert host_delayed[1] - host[1] == 2 * UNIT_NS


def test_delays_that_never_fire_are_listed() -> None:
    dev = SimDevice(Schedule("t", "t", (), [Delay("side", 99, 1)]))
    r = dev.run(offload, "wait_event")
    assert r.unfired == ("side#99+1",)


@given(st.lists(st.tuples(st.sampled_from(["host", "default", "side"]), st.integers(0, 5), st.integers(1, 20)),
                max_size=3, unique_by=lambda t: t[:2]))
def test_one_schedule_gives_one_run(raw: list[tuple[str, int, int]]) -> None:
    delays = tuple(Delay(a, k, u) for a, k, u in raw)
    out1, rep1, dev1 = run(offload, "none", delays=delays)
    out2, rep2, dev2 = run(offload, "none", delays=delays)
    assert dev1.trace == dev2.trace
    assert rep1 == rep2
    assert torch.equal(out1, out2) or (torch.isnan(out1).all() and torch.isnan(out2).all())


def test_race_report_text() -> None:
    _, reports, _ = run(offload, "none")
    race = next(r for r in reports if isinstance(r, Race))
    line = re.sub(r"test_semantics.py:\d+", "test_semantics.py:N", str(race))
    assert line == (
        f"race: copy_ (H2D) on stream default #1 ({HERE}:N) reads pinned#2[0:4096], "
        f"which copy_ (D2H) on stream side #0 ({HERE}:N) wrote; no happens-before edge orders them"
    )


def test_report_lines_name_files_relative_to_the_working_directory_of_each_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The names are kept from run to run (a line is named once), but a run started in another working directory
    names its lines relative to that one."""
    here = os.path.dirname(os.path.abspath(__file__))
    name = os.path.basename(__file__)
    sources = []
    for cwd in (here, os.path.dirname(here), here):
        monkeypatch.chdir(cwd)
        _, reports, _ = run(offload, "none")
        sources.append(next(r for r in reports if isinstance(r, Race)).current.source.split(":")[0])
    assert sources == [name, f"{os.path.basename(here)}/{name}", name]


def test_stale_read_report_text() -> None:
    _, reports, _ = run(offload, "none", delays=(Delay("side", 0, 1),))  # the reload ahead of the D2H
    stale = next(r for r in reports if isinstance(r, StaleRead))
    line = re.sub(r"test_semantics.py:\d+", "test_semantics.py:N", str(stale))
    assert line == (
        f"stale read: copy_ (H2D) on stream default #1 ({HERE}:N) read pinned#2[0:4096] "
        "at t=0.020; it saw uninitialized memory; stale by 1 write: expected the data of copy_ (D2H) on stream "
        f"side #0 ({HERE}:N)"
    )


def test_a_stale_read_counts_the_writes_it_missed_where_it_missed_them() -> None:
    """A read of two slices, the first landed and the second not: stale by one write (the second), counted over
    the bytes where the read saw old data, not over all it read."""

    def program(dev: Any) -> None:
        flat = torch.empty(2 * N, pin_memory=True)
        flat[:N].copy_(torch.full((N,), 1.0, device=dev.device), non_blocking=True)
        dev.current_stream().synchronize()
        flat[N:].copy_(torch.full((N,), 2.0, device=dev.device), non_blocking=True)
        float(flat.sum())  # the host reads both halves before the second landed

    _, reports, _ = run(program)
    (stale,) = [r for r in reports if isinstance(r, StaleRead)]
    assert stale.stale_by == 1
    assert stale.read.lo == 0
    assert stale.read.hi == 8 * N


@pytest.mark.parametrize("cut_before", [False, True])
def test_a_read_whose_bytes_were_split_after_its_issue_is_checked_at_each_part(cut_before: bool) -> None:
    """A read of all of ``x`` waits on its stream while another stream, unordered, writes the second half: that write
    cuts the shadow's cell under the read after the read was issued. When the read starts, the half written since is
    a write issued after it (a stale read of that half), whatever the cells were when it was issued. ``cut_before``:
    a read of the second half cut the cell first, so the whole read's expectation is one piece over two cells."""

    def program(dev: Any) -> None:
        x = torch.zeros(2 * N, device=dev.device)
        if cut_before:
            x[N:].sum()
        dev.synchronize()
        a, b = dev.Stream(name="a"), dev.Stream(name="b")
        with dev.stream(a):
            x.sum()  # a#0, stalled until b's write has landed
        with dev.stream(b):
            x[N:].fill_(1.0)
        dev.synchronize()

    _, reports, _ = run(program, delays=(Delay("a", 0, 5),))
    (stale,) = [r for r in reports if isinstance(r, StaleRead)]
    assert stale.stale_by == -1  # it saw a write issued after it
    assert "a write issued after it" in str(stale)
    assert [r.current.op for r in reports if isinstance(r, Race)] == ["fill_"]


def test_a_write_whose_bytes_were_split_before_it_landed_lands_on_each_part() -> None:
    """An op on the same stream touches the second half of what a fill in flight writes: its issue cuts the shadow's
    cell under the fill before the fill lands. The fill lands on both halves, so what follows it in stream order
    reads what it expects: no report."""

    def program(dev: Any) -> torch.Tensor:
        x = torch.zeros(2 * N, device=dev.device)
        x.fill_(1.0)  # default#1, stalled: in flight when the next op is issued
        x[N:].add_(1.0)
        return x.cpu()

    out, reports, _ = run(program, delays=(Delay("default", 1, 5),))
    assert reports == ()
    assert torch.equal(out, torch.cat([torch.ones(N), torch.full((N,), 2.0)]))


def test_a_device_takes_its_schedule_as_a_line_as_a_session_does() -> None:
    """``SimDevice("side#0+1")`` (delays alone) and ``SimDevice("test/t::side#0+1")`` are that schedule; what is
    neither is a one-line error."""
    plain = SimDevice(Schedule("test", "t", (), (Delay("side", 0, 1),))).run(offload, "none")
    for line in ("side#0+1", "test/t::side#0+1"):
        r = SimDevice(line).run(offload, "none")
        assert r.reports == plain.reports
    with pytest.raises(TypeError, match="a schedule is a Schedule or its line"):
        SimDevice(42)  # type: ignore[arg-type]


@pytest.mark.parametrize(("make", "before"), [
    (lambda: torch.zeros(N, pin_memory=True), "the values the host made it with"),
    (lambda: torch.arange(float(N)).pin_memory(), "the values the host made it with"),
    (lambda: torch.empty(N, pin_memory=True), "uninitialized memory"),
])
def test_a_stale_read_names_what_a_pinned_buffer_held_before_any_write(make: Any, before: str) -> None:
    """Pinned memory the host made with values held them before any write (not uninitialized memory, as an empty
    buffer's bytes are)."""

    def program(dev: Any) -> None:
        pinned = make()
        pinned.copy_(torch.ones(N, device=dev.device), non_blocking=True)
        float(pinned.sum())  # the host reads before the copy landed

    _, reports, _ = run(program)
    (stale,) = [r for r in reports if isinstance(r, StaleRead)]
    assert f"it saw {before}; stale by 1 write" in str(stale)
