"""Processes a plain torch.cuda program starts (``multiprocessing`` / ``torch.multiprocessing``) are host actors of
the run, and a device tensor sent to one is CUDA IPC as torch does it.

Rules, each with a test a mutation of it fails:

- ``Process.start`` in a run makes a host actor (its own streams), named as the program named it, else
  ``SpawnProcess-1``, ... counted in the run; ``join`` waits for it, ``exitcode`` is 0 when the target returns and
  ``n`` for ``sys.exit(n)`` or ``os._exit(n)``; what else it raises is a host error; a daemonic one still waiting
  when every other actor is done ends with the run (its parent's exit terminates it), where any other is a deadlock;
- ``Queue``, ``SimpleQueue``, ``Event``, ``Value`` and ``Lock`` order the receiver after the sender; a wait that
  can never end is a deadlock; a ``Lock`` excludes; timed waits give up after their virtual time;
- a device tensor sent (a process's arguments, a queue's item) records an IPC event on the sender's stream: its
  current stream, or for a ``Queue`` (pickled by its feeder thread) the default stream; the receiver's current
  stream waits for it where it maps the storage for the first time, and not while it still holds a tensor of it;
- what a run does not simulate (``Pool``, ``Condition``, ``terminate``, ...) raises ``NotImplementedError``: no verdict
  (``Pipe``: ``test_a_pipe_connects_two_processes.py``);
- outside a run, ``multiprocessing`` is itself.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

import simdevice
from simdevice import Deadlock, Race, StaleRead
from simdevice.dropin import session

N = 256


def _run(fn: Any, schedule: str | None = None) -> Any:
    s = simdevice.cuda(schedule)
    s.run(fn)
    assert s.result is not None
    return s.result


def _kinds(run: Any) -> list[str]:
    return [r.kind for r in run.reports]


# -- a snapshot worker, as a zero-cost checkpoint writes one ---------------------------------------------------------


def _snapshot_worker(buf: torch.Tensor, tasks: Any, done: Any) -> None:
    side = torch.cuda.Stream()
    mirror = torch.empty(N, pin_memory=True)
    while True:
        step = tasks.get()
        if step is None:
            return
        with torch.cuda.stream(side):
            mirror.copy_(buf, non_blocking=True)
        side.synchronize()
        done.put((step, mirror.clone()))


def _trainer(wait_for_echo: bool) -> None:
    ctx = mp.get_context("spawn")
    buf = torch.zeros(N, device="cuda")
    tasks, done = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_snapshot_worker, args=(buf, tasks, done))
    p.start()
    pending = 0
    for step in range(1, 4):
        buf.fill_(float(step))
        torch.cuda.synchronize()
        tasks.put(step)
        pending += 1
        if wait_for_echo:  # the step's snapshot is taken before the next step writes the buffer
            s, snap = done.get()
            pending -= 1
            assert torch.equal(snap, torch.full((N,), float(s)))
    for _ in range(pending):
        s, snap = done.get()
        assert torch.equal(snap, torch.full((N,), float(s)))
    tasks.put(None)
    p.join()
    assert p.exitcode == 0


def _trainer_waits() -> None:
    _trainer(True)


def _trainer_races() -> None:
    _trainer(False)


def test_a_trainer_that_waits_for_the_snapshot_is_clean() -> None:
    found = simdevice.explore(_trainer_waits, max_examples=30)
    assert found.failure is None


def test_a_trainer_that_writes_the_buffer_under_the_workers_copy_is_found() -> None:
    found = simdevice.explore(_trainer_races, max_examples=30)
    assert found.failure is not None
    races = [r for r in found.failure.run.reports if isinstance(r, Race)]
    assert races, found.failure.run.reports
    assert any("SpawnProcess-1.side" in str(r) and "copy_ (D2H)" in str(r) for r in races)
    # a GPU replay refuses a program that starts processes: its replay line offers none
    replay = [line for line in found.failure.text().splitlines() if "replay:" in line]
    assert replay
    assert "--gpu" not in replay[0], replay


def _fill_on_a_side_stream_racy() -> None:
    x = torch.zeros(N, device="cuda")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x.fill_(1.0)
    assert torch.equal(x.cpu(), torch.ones(N))


def test_a_replay_line_offers_the_gpu_where_no_process_was_started() -> None:
    found = simdevice.explore(_fill_on_a_side_stream_racy, max_examples=5)
    assert found.failure is not None
    assert found.failure.text().splitlines()[-1].endswith("[--gpu]"), found.failure.text()


# -- CUDA IPC ------------------------------------------------------------------------------------------------------


def _consumer_holds(q: Any, out: Any) -> None:
    first = q.get()
    out.put(first.sum().item())
    again = q.get()  # the same storage, still held here: mapped already, no wait
    out.put(again.sum().item())


def _consumer_drops(q: Any, out: Any) -> None:
    first = q.get()
    out.put(first.sum().item())
    del first  # the mapping goes with the last tensor of it
    again = q.get()  # mapped again: waits for the new event
    out.put(again.sum().item())


def _producer(target: Any, sync_second: bool) -> None:
    ctx = mp.get_context("spawn")
    q, out = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=target, args=(q, out))
    p.start()
    x = torch.empty(N, device="cuda")
    x.fill_(1.0)  # no synchronize: the IPC event the receiver waits for orders it
    q.put(x)
    assert out.get() == N
    x.fill_(2.0)
    if sync_second:
        torch.cuda.synchronize()
    q.put(x)
    assert out.get() == 2 * N
    p.join()


def _dropped_and_sent_again() -> None:
    _producer(_consumer_drops, False)


def _held_and_sent_again() -> None:
    _producer(_consumer_holds, False)


def _held_and_sent_again_after_a_sync() -> None:
    _producer(_consumer_holds, True)


def test_the_first_receipt_of_a_device_tensor_waits_for_the_senders_event() -> None:
    found = simdevice.explore(_dropped_and_sent_again, max_examples=40)
    assert found.failure is None


def test_a_tensor_received_again_while_held_waits_for_nothing() -> None:
    found = simdevice.explore(_held_and_sent_again, max_examples=40)
    assert found.failure is not None
    assert any(isinstance(r, (Race, StaleRead)) for r in found.failure.run.reports)
    assert simdevice.explore(_held_and_sent_again_after_a_sync, max_examples=40).failure is None


def _consumer_keeps_a_tensor_of_it(q: Any, out: Any) -> None:
    first = q.get()
    out.put(first.sum().item())
    kept = [first.detach(), torch.nn.Parameter(first, requires_grad=False), first[: N // 2]][KEEP[0]]
    del first  # a tensor of its storage is left: still mapped
    again = q.get()  # no wait
    out.put(again.sum().item())
    del kept


#: which of a detached tensor, a Parameter and a view of the first receipt the consumer keeps
KEEP = [0]


@pytest.mark.parametrize("keep", [0, 1, 2], ids=["detach", "Parameter", "view"])
def test_a_mapping_lives_while_any_tensor_of_its_storage_does(keep: int) -> None:
    """torch keeps a received storage mapped while a tensor of it lives in the receiver, whichever: one made from the
    received tensor by ``detach()``, ``Parameter`` or a view keeps it too (only the received tensor itself did)."""
    KEEP[0] = keep

    def program() -> None:
        _producer(_consumer_keeps_a_tensor_of_it, False)

    found = simdevice.explore(program, max_examples=40)
    assert found.failure is not None
    assert any(isinstance(r, (Race, StaleRead)) for r in found.failure.run.reports)


def _reader(q: Any, out: Any) -> None:
    out.put(q.get().sum().item())


def _sent_from_a_side_stream(simple: bool) -> None:
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue() if simple else ctx.Queue()
    out = ctx.Queue()
    p = ctx.Process(target=_reader, args=(q, out))
    p.start()
    side = torch.cuda.Stream()
    x = torch.empty(N, device="cuda")
    with torch.cuda.stream(side):
        x.fill_(1.0)
        q.put(x)  # SimpleQueue: pickled here, on side; Queue: by its feeder thread, on the default stream
    assert out.get() == N
    p.join()


def test_a_simple_queue_records_the_event_on_the_current_stream() -> None:
    r = _run(lambda: _sent_from_a_side_stream(True))
    assert r.reports == ()


def test_a_queue_records_the_event_on_the_default_stream() -> None:
    r = _run(lambda: _sent_from_a_side_stream(False))
    assert any(isinstance(x, Race) and "fill_" in str(x) for x in r.reports), r.reports


def test_a_tensor_in_a_processs_arguments_is_sent_on_the_current_stream() -> None:
    def program() -> None:
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        x = torch.empty(N, device="cuda")
        x.fill_(3.0)
        p = ctx.Process(target=_reader_of, args=(x, out))
        p.start()
        assert out.get() == 3 * N
        p.join()

    assert _run(program).reports == ()


def _reader_of(x: torch.Tensor, out: Any) -> None:
    out.put(x.sum().item())


def test_a_received_tensor_cannot_be_sent_on() -> None:
    def relay(q: Any, back: Any) -> None:
        back.put(q.get())

    def program() -> None:
        ctx = mp.get_context("spawn")
        q, back = ctx.Queue(), ctx.Queue()
        p = ctx.Process(target=relay, args=(q, back), name="relay")
        p.start()
        q.put(torch.ones(N, device="cuda"))
        p.join()

    r = _run(program)
    assert _kinds(r) == ["host-error"]
    assert "Attempted to send CUDA tensor received from another process" in str(r.reports[0])
    assert r.reports[0].actor == "relay"


# -- processes -------------------------------------------------------------------------------------------------------


def _returns() -> None:
    torch.ones(4, device="cuda").add_(1)


def _exits(code: int) -> None:
    torch.ones(4, device="cuda")
    sys.exit(code)


def _os_exits(code: int) -> None:
    torch.ones(4, device="cuda")
    os._exit(code)
    raise AssertionError("os._exit returned")


def test_exit_codes_as_multiprocessing_gives_them() -> None:
    got: dict[str, Any] = {}

    def program() -> None:
        ctx = mp.get_context("spawn")
        procs = {"ret": ctx.Process(target=_returns), "exit3": ctx.Process(target=_exits, args=(3,)),
                 "exit0": ctx.Process(target=_exits, args=(0,)), "os4": ctx.Process(target=_os_exits, args=(4,)),
                 # (the low byte, as the operating system reports a status)
                 "exit-1": ctx.Process(target=_exits, args=(-1,)), "exit256": ctx.Process(target=_exits, args=(256,)),
                 "exitTrue": ctx.Process(target=_exits, args=(True,)), "os300": ctx.Process(target=_os_exits,
                                                                                              args=(300,))}
        for k, p in procs.items():
            got[k + ".before"] = (p.is_alive(), p.exitcode)
            p.start()
        for k, p in procs.items():
            p.join()
            got[k] = (p.is_alive(), p.exitcode, p.pid is not None)

    r = _run(program)
    assert r.reports == ()
    assert {k: v for k, v in got.items() if not k.endswith(".before")} == {
        "ret": (False, 0, True), "exit3": (False, 3, True), "exit0": (False, 0, True), "os4": (False, 4, True),
        "exit-1": (False, 255, True), "exit256": (False, 0, True), "exitTrue": (False, 1, True),
        "os300": (False, 44, True)}
    assert {v for k, v in got.items() if k.endswith(".before")} == {(False, None)}


def test_a_worker_that_raises_is_a_host_error_of_that_worker() -> None:
    def boom() -> None:
        raise ValueError("no checkpoint dir")

    def program() -> None:
        p = multiprocessing.Process(target=boom, name="ckpt")
        p.start()
        p.join()

    r = _run(program)
    assert _kinds(r) == ["host-error"]
    assert r.reports[0].actor == "ckpt"
    assert "ValueError: no checkpoint dir" in str(r.reports[0])


def test_a_subclass_with_its_own_run_runs_as_a_process() -> None:
    got: list[Any] = []

    class Saver(mp.Process):
        def __init__(self, q: Any) -> None:
            super().__init__(name="saver")
            self.q = q

        def run(self) -> None:
            self.q.put(torch.ones(4, device="cuda").sum().item())

    def program() -> None:
        q = mp.Queue()
        s = Saver(q)
        s.start()
        got.append(q.get())
        s.join()
        got.append(s.exitcode)

    r = _run(program)
    assert r.reports == ()
    assert got == [4.0, 0]
    assert "saver.default" in r.op_counts


def test_process_names_are_the_same_in_every_run() -> None:
    def program() -> None:
        for _ in range(2):
            p = mp.get_context("spawn").Process(target=_returns)
            p.start()
            p.join()

    first, second = _run(program), _run(program)
    assert {"SpawnProcess-1", "SpawnProcess-2"} <= set(first.op_counts)
    assert first.op_counts == second.op_counts


def test_a_delay_on_a_named_process_applies() -> None:
    def worker(v: Any) -> None:
        v.value = 1

    def program() -> None:
        v = mp.Value("i", 0)
        p = mp.Process(target=worker, args=(v,), name="w")
        p.start()
        p.join()

    r = _run(program, "x.py::f::w#0+5")
    assert r.unfired == ()
    assert any(actor == "w" and what == "stall 5 units before #0" for _, actor, what in r.trace), r.trace


# -- queues, events, values, locks ----------------------------------------------------------------------------------


def test_a_lock_s_and_a_value_s_acquire_answer_as_python_s() -> None:
    """In a run, a ``multiprocessing.Lock`` answers ``acquire`` as Python's: ``True`` where it took the lock,
    ``False`` for a non-blocking or timed try at a lock held (by its holder too: it is not re-entrant); a ``Value``'s
    own ``acquire`` and ``release`` take and let go of its lock. Mutations: a blocking ``acquire`` answering
    ``None``; a try that takes a free lock answering ``False`` (its test inverted); a ``Value``'s ``release`` not
    letting its lock go (the next ``with`` waited for ever: a deadlock)."""
    got: list[Any] = []

    def program() -> None:
        lock = mp.Lock()
        got.append(lock.acquire())
        got.append(lock.acquire(False))
        got.append(lock.acquire(True, 0.01))
        lock.release()
        got.append(lock.acquire(False))
        lock.release()
        v = mp.Value("i", 0)
        v.acquire()
        v.value += 1
        v.release()
        with v.get_lock():
            v.value += 1
        got.append(v.value)

    r = _run(program)
    assert r.reports == (), r.reports
    assert got == [True, False, False, True, 2]


def test_a_value_made_without_a_lock_has_none() -> None:
    """``Value(..., lock=False)`` is a raw shared value, as ``multiprocessing``'s: asking it for its lock raises
    (``AttributeError``), where one made with a lock gives it. Mutation caught: ``get_lock`` answering None."""
    got: list[str] = []

    def program() -> None:
        raw, locked = mp.Value("i", 0, lock=False), mp.Value("i", 0)
        try:
            raw.get_lock()
            got.append("a lock")
        except AttributeError:
            got.append("no lock")
        with locked.get_lock():
            locked.value += 1
        got.append(str(locked.value))

    r = _run(program)
    assert r.reports == ()
    assert got == ["no lock", "1"]


def test_an_event_orders_what_the_setter_did_before_it() -> None:
    got: list[float] = []

    def worker(ev: Any, pinned: torch.Tensor) -> None:
        pinned.fill_(7.0)
        ev.set()

    def program() -> None:
        ev = mp.Event()
        pinned = torch.zeros(N, pin_memory=True)
        p = mp.Process(target=worker, args=(ev, pinned))
        p.start()
        assert ev.wait() is True
        got.append(float(pinned.sum()))
        p.join()

    found = simdevice.explore(program, max_examples=20)
    assert found.failure is None
    assert got
    assert set(got) == {7.0 * N}


def test_an_event_nobody_sets_is_a_deadlock_and_a_timed_wait_gives_up() -> None:
    def forever() -> None:
        mp.Event().wait()

    r = _run(forever)
    assert [type(x) for x in r.reports] == [Deadlock]
    assert "an event another process sets" in str(r.reports[0])
    got: list[bool] = []
    r = _run(lambda: got.append(mp.Event().wait(timeout=0.05)))
    assert r.reports == ()
    assert got == [False]


def _count(v: Any, n: int, locked: bool) -> None:
    for _ in range(n):
        if locked:
            with v.get_lock():
                v.value += 1
        else:
            v.value += 1


def _counters(locked: bool) -> None:
    v = mp.Value("i", 0)
    ps = [mp.Process(target=_count, args=(v, 3, locked), name=f"c{i}") for i in range(2)]
    for p in ps:
        p.start()
    for p in ps:
        p.join()
    assert v.value == 6, v.value


def _locked_counters() -> None:
    _counters(True)


def _unlocked_counters() -> None:
    _counters(False)


def test_a_lock_excludes_and_without_it_an_update_is_lost() -> None:
    assert simdevice.explore(_locked_counters, max_examples=40).failure is None
    found = simdevice.explore(_unlocked_counters, max_examples=40)
    assert found.failure is not None
    assert [r.kind for r in found.failure.run.reports] == ["host-error"]


def test_a_get_with_a_timeout_raises_empty() -> None:
    import queue

    got: list[str] = []

    def program() -> None:
        try:
            mp.Queue().get(timeout=0.01)
        except queue.Empty:
            got.append("empty")

    assert _run(program).reports == ()
    assert got == ["empty"]


# -- what a run does not simulate; outside a run ----------------------------------------------------------------------


@pytest.mark.parametrize("make", [lambda: mp.Manager(), lambda: mp.get_context("spawn").Pool(2),
                                  lambda: multiprocessing.Condition()])
def test_what_is_not_simulated_raises_not_implemented(make: Any) -> None:
    r = _run(make)
    assert _kinds(r) == ["host-error"]
    assert "NotImplementedError: multiprocessing." in str(r.reports[0])
    assert "is not simulated" in str(r.reports[0])


def test_terminate_of_a_simulated_process_is_not_simulated() -> None:
    def program() -> None:
        p = mp.Process(target=_returns)
        p.start()
        p.terminate()

    r = _run(program)
    assert "NotImplementedError: Process.terminate() of a simulated process" in str(r.reports[0])


def test_outside_a_run_multiprocessing_is_itself() -> None:
    with session.held():
        q = mp.get_context("spawn").Queue()
        assert type(q).__module__ == "multiprocessing.queues"
        assert type(multiprocessing.Queue()).__module__ == "multiprocessing.queues"
        assert type(multiprocessing.Event()).__module__ == "multiprocessing.synchronize"
        q.close()


def test_the_gpu_replay_refuses_a_process_it_would_not_count() -> None:
    """``replay --gpu`` counts the program's steps as the simulator does; a child's would go uncounted, so starting
    one there refuses (patching only: no GPU needed to check it)."""
    from reference.cuda_plain import counting_torch_cuda

    class Dev:
        cycles_per_ms = 1.0

    with counting_torch_cuda(Dev()), pytest.raises(NotImplementedError, match="not replayed on a GPU"):  # type: ignore[arg-type]
        mp.get_context("spawn").Process(target=_returns).start()
    assert multiprocessing.process.BaseProcess.start.__module__ == "multiprocessing.process"


def _serve_forever(q: Any) -> None:
    while True:
        q.get()


def _leaves_a_server(daemon: bool) -> None:
    q = mp.Queue()
    mp.Process(target=_serve_forever, args=(q,), daemon=daemon).start()
    q.put(1)


def test_a_daemon_left_waiting_ends_with_the_run_and_a_plain_child_is_a_deadlock() -> None:
    """At its exit a parent terminates its daemonic children and joins the others (which then never exit)."""
    assert _run(lambda: _leaves_a_server(True)).reports == ()
    r = _run(lambda: _leaves_a_server(False))
    assert [type(x) for x in r.reports] == [Deadlock]
    assert "Process-1 waits for an item on a queue" in str(r.reports[0])


class _Batch:
    """An object holding a device tensor (pickling reaches its attributes)."""

    def __init__(self, x: torch.Tensor) -> None:
        self.x = x


def _reads_the_batch(q: Any, out: Any) -> None:
    item = q.get()
    out.put((item["batch"].x.sum().item(), item["shape"], item["pair"]))


def test_tensors_inside_objects_and_tuples_of_any_kind_are_received() -> None:
    import collections

    pair_t = collections.namedtuple("pair_t", "a b")
    got: list[Any] = []

    def program() -> None:
        q, out = mp.Queue(), mp.Queue()
        p = mp.Process(target=_reads_the_batch, args=(q, out))
        p.start()
        x = torch.empty(N, device="cuda")
        x.fill_(1.0)  # ordered by the IPC event, though it sits in an object's attribute
        q.put({"batch": _Batch(x), "shape": x.shape, "pair": pair_t(1, 2)})
        got.append(out.get())
        p.join()

    r = _run(program)
    assert r.reports == ()
    assert got == [(float(N), torch.Size([N]), pair_t(1, 2))]


class _Progress:
    """A plain object in an item (module level: it pickles)."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.seen: list[int] = []


def _reads_what_was_put_and_changes_its_arguments(q: Any, out: Any, config: dict[str, int], t: torch.Tensor) -> None:
    first = q.get()
    again = q.get()
    config["lr"] = 0  # its own copy
    t.add_(1.0)  # a tensor's memory is shared (torch's shared memory), as on a real child
    first.seen.append(1)
    out.put((first.step, again.step, first is again, list(first.seen)))


def test_what_crosses_to_another_process_is_a_copy_taken_when_sent_but_tensors_are_shared() -> None:
    """As pickling gives it: an item changed after ``put`` reaches the receiver as it was put, and each receipt is
    an object of its own; a child's arguments are its copy (what it changes, its parent does not see), while a
    tensor's memory is shared."""
    got: list[Any] = []

    def program() -> None:
        q, out = mp.Queue(), mp.Queue()
        config = {"lr": 3}
        t = torch.zeros(4)
        p = mp.Process(target=_reads_what_was_put_and_changes_its_arguments, args=(q, out, config, t))
        p.start()
        item = _Progress(1)
        q.put(item)
        item.step = 2  # after the put: the receiver has step 1
        q.put(item)
        got.append(out.get())
        p.join()
        got.append((config["lr"], item.seen, t.tolist()))

    r = _run(program)
    assert r.reports == ()
    assert got == [(1, 2, False, [1]), (3, [], [1.0] * 4)]


_MADE_BEFORE_THE_RUN = multiprocessing.get_context("spawn").Queue()


class _Holder:
    def __init__(self, q: Any) -> None:
        self.q = q


@pytest.mark.parametrize("how", ["argument", "in a dict", "in an object", "through a queue"])
def test_a_real_queue_given_to_a_simulated_process_is_refused(how: str) -> None:
    """A queue made before the run is a real one: a child's blocking get on it would block the whole run. Refused
    (no verdict) wherever it is in what is sent (only an argument itself was: in a dict it was a host error)."""

    def program() -> None:
        real = _MADE_BEFORE_THE_RUN
        if how == "through a queue":
            q = mp.Queue()
            p = mp.Process(target=_serve_forever, args=(q,))
            p.start()
            q.put([real])
        else:
            arg = real if how == "argument" else {"q": real} if how == "in a dict" else _Holder(real)
            p = mp.Process(target=_serve_forever, args=(arg,))
            p.start()
        p.join()

    r = _run(program)
    assert _kinds(r) == ["host-error"]
    assert "NotImplementedError: a real multiprocessing.queues.Queue given to a simulated process" in str(r.reports[0])


def _per_rank_saver() -> None:
    q = mp.Queue()
    p = mp.Process(target=_reader_of_one, args=(q,), name="saver")
    p.start()
    q.put(1)
    p.join()


def _reader_of_one(q: Any) -> None:
    q.get()


def test_processes_of_the_same_name_are_named_apart_whatever_starts_first() -> None:
    """``multiprocessing`` allows one name twice: each rank's ``saver`` is named after its rank (as its streams
    are), and a second ``saver`` of one process ``saver-2``, so a schedule line names the same process whichever
    rank starts first."""
    found = simdevice.explore(_per_rank_saver, world_size=2, max_examples=30)
    assert found.failure is None
    s = simdevice.cuda()
    run = s.run(_per_rank_saver, world_size=2)
    assert {"rank0.saver", "rank1.saver"} <= set(run.op_counts)

    def twice() -> None:
        for _ in range(2):
            _per_rank_saver()

    assert {"saver", "saver-2"} <= set(_run(twice).op_counts)


def _writes_pinned(pinned: torch.Tensor) -> None:
    pinned.fill_(5.0)


def test_a_join_with_a_timeout_that_sees_the_child_done_orders_after_it() -> None:
    """``join(timeout)`` that returns with the child done orders what follows after the child, as ``join()`` does
    (the timed wait's polls alone did not: a read of what the child wrote was reported as a race)."""
    got: list[float] = []

    def program() -> None:
        pinned = torch.zeros(N, pin_memory=True)
        p = mp.Process(target=_writes_pinned, args=(pinned,))
        p.start()
        p.join(timeout=5.0)
        assert not p.is_alive()
        got.append(float(pinned.sum()))

    r = _run(program)
    assert r.reports == ()
    assert got == [5.0 * N]


# -- several waiters, long timed waits, polling a process ------------------------------------------------------------


def _bump(counter: Any) -> None:
    with counter.get_lock():
        v = counter.value
        counter.value = v + 1


def _serve(tasks: Any, results: Any) -> None:
    while (t := tasks.get()) is not None:
        results.put(t * 10)


def test_of_several_waiters_one_takes_the_lock_and_one_the_item() -> None:
    """Woken together when the lock is released or an item comes, each waiter asks again: one holds the lock, one
    gets the item (two held the lock at once, and a second getter popped an empty queue)."""

    def program() -> None:
        counter = mp.Value("i", 0)
        workers = [mp.Process(target=_bump, args=(counter,)) for _ in range(3)]
        for p in workers:
            p.start()
        for p in workers:
            p.join()
        assert counter.value == 3, counter.value
        tasks, results = mp.Queue(), mp.Queue()
        servers = [mp.Process(target=_serve, args=(tasks, results)) for _ in range(2)]
        for p in servers:
            p.start()
        for t in range(4):
            tasks.put(t)
        assert sorted(results.get() for _ in range(4)) == [0, 10, 20, 30]
        for _ in servers:
            tasks.put(None)
        for p in servers:
            p.join()

    for schedule in (None, "Process-1#0+1", "Process-4#0+2"):
        assert _run(program, schedule).reports == (), schedule


def test_a_timed_wait_longer_than_the_stall_horizon_gives_up_where_nothing_comes() -> None:
    """A ``get(timeout=1.5)`` that nothing answers (its worker waits for the next task) gives up after 1.5 s; it was
    polled every unit, past the stall horizon (1,000 units), and called a deadlock. A loop of such waits for what
    can never come is still one."""
    import queue

    def drain() -> None:
        tasks, results = mp.Queue(), mp.Queue()
        p = mp.Process(target=_serve, args=(tasks, results), name="worker")
        p.start()
        tasks.put(1)
        got = []
        while True:
            try:
                got.append(results.get(timeout=1.5))
            except queue.Empty:
                break
        tasks.put(None)
        p.join()
        assert got == [10], got

    def forever() -> None:
        q = mp.Queue()
        p = mp.Process(target=_serve, args=(mp.Queue(), q), name="worker")
        p.start()
        while True:
            try:
                q.get(timeout=1.0)
            except queue.Empty:
                continue

    assert _run(drain).reports == ()
    assert _run(drain, "worker#2+31").reports == ()
    assert _kinds(_run(forever)) == ["deadlock"]


def _save(q: Any) -> None:
    q.put("saved")


def test_polling_a_process_lets_it_run() -> None:
    """``while p.is_alive(): time.sleep(...)`` (or ``exitcode is None``): each poll is a host step, so the child
    runs and the loop ends; polling a child that can never end is a deadlock (it looped forever, the command hung)."""
    import time

    def poll() -> None:
        q = mp.Queue()
        p = mp.Process(target=_save, args=(q,), name="saver")
        p.start()
        while p.is_alive():
            time.sleep(0.1)
        assert p.exitcode == 0
        assert q.get() == "saved"

    def poll_stuck() -> None:
        p = mp.Process(target=_serve, args=(mp.Queue(), mp.Queue()), name="stuck")
        p.start()
        while p.exitcode is None:
            time.sleep(0.1)

    assert _run(poll).reports == ()
    assert _kinds(_run(poll_stuck)) == ["deadlock"]


def _put_one(q: Any) -> None:
    q.put(1)


def test_a_stream_named_as_a_started_process_is_named_apart() -> None:
    """A stream whose variable has a started process's name is ``snapshot-2``, as any clash is (it raised)."""

    def program() -> None:
        q = mp.Queue()
        p = mp.Process(target=_put_one, args=(q,), name="snapshot")
        p.start()
        snapshot = torch.cuda.Stream()
        with torch.cuda.stream(snapshot):
            x = torch.ones(4, device="cuda")
        snapshot.synchronize()
        assert q.get() == 1
        p.join()
        assert x.sum().item() == 4

    r = _run(program)
    assert r.reports == ()
    assert {"snapshot", "snapshot-2"} <= set(r.op_counts)


def _reports_itself(out: Any) -> None:
    out.put((mp.current_process().name, mp.parent_process().name, os.getpid()))


def _fills_its_shard(out: torch.Tensor, k: int) -> None:
    out[k * N:(k + 1) * N].fill_(float(k + 1))
    torch.cuda.synchronize()


def test_a_process_knows_itself_and_its_parent_knows_its_children() -> None:
    """In a child, ``current_process()``, ``parent_process()`` and ``os.getpid()`` are the child's (they were the
    main process's: a ``current_process().name == "MainProcess"`` guard was taken in every worker); in the parent,
    ``active_children()`` lists the children still running (it was empty: joining them joined nothing)."""
    got: list[Any] = []

    def program() -> None:
        out = mp.Queue()
        p = mp.Process(target=_reports_itself, args=(out,), name="saver")
        p.start()
        got.append(out.get())
        p.join()
        got.append((mp.current_process().name, os.getpid(), p.pid))
        shards = torch.zeros(2 * N, device="cuda")
        torch.cuda.synchronize()
        for k in range(2):
            mp.Process(target=_fills_its_shard, args=(shards, k), name=f"worker{k}").start()
        for child in mp.active_children():
            child.join()
        assert mp.active_children() == []
        assert shards.sum().item() == 3 * N

    for schedule in (None, "worker1#0+2"):
        got.clear()
        assert _run(program, schedule).reports == (), schedule
        (name, parent, pid), (main, main_pid, p_pid) = got
        assert (name, parent, main) == ("saver", "MainProcess", "MainProcess")
        assert pid == p_pid
        assert pid != main_pid


def _reads_ring(ring: torch.Tensor, q: Any, out: Any) -> None:
    total = 0.0
    while (i := q.get()) is not None:
        snap = ring[i % 3].clone()
        assert torch.equal(snap, torch.full((N,), float(i))), f"the slot of item {i} was overwritten"
        total += float(snap[0])
    out.put(total)


def _bounded_ring(maxsize: int) -> None:
    """A producer fills a ring of three pinned slots and hands each to a consumer through a queue of ``maxsize``:
    with 1, a put returns once the item before was taken, so the slot it writes is free (back-pressure)."""
    ring = torch.zeros(3, N).pin_memory()
    q, out = mp.Queue(maxsize=maxsize), mp.Queue()
    p = mp.Process(target=_reads_ring, args=(ring, q, out), name="consumer")
    p.start()
    w = torch.zeros(N, device="cuda")
    for i in range(6):
        w.fill_(float(i))
        ring[i % 3].copy_(w)
        q.put(i)
    q.put(None)
    assert out.get() == 15.0
    p.join()


def _bounded_by_one() -> None:
    _bounded_ring(1)


def _unbounded() -> None:
    _bounded_ring(0)


def test_a_bounded_queue_makes_a_put_wait_for_room_and_orders_it_after_the_get() -> None:
    """``Queue(maxsize)`` was unbounded: ``full()`` never held, ``put(timeout=)`` never raised ``queue.Full``, and a
    ring that relies on the back-pressure raced."""
    import queue

    assert simdevice.explore(_bounded_by_one, max_examples=40).failure is None
    assert simdevice.explore(_unbounded, max_examples=40).failure is not None

    def full() -> None:
        q = mp.Queue(maxsize=1)
        q.put(1)
        assert q.full()
        with pytest.raises(queue.Full):
            q.put(2, timeout=0.1)
        with pytest.raises(queue.Full):
            q.put_nowait(2)
        assert q.get() == 1
        assert not q.full()

    assert _run(full).reports == ()


def _waits_for_the_event(q: Any, out: Any) -> None:
    t, ready = q.get()
    torch.cuda.current_stream().wait_event(ready)
    out.put(t.sum().item())


@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "not recorded"])
def test_a_plain_cuda_event_sent_to_another_process_is_an_error(recorded: bool) -> None:
    """torch sends an event by its IPC handle, which only an interprocess event has: a plain one, recorded or not
    (torch creates its CUDA event with the flags it was made with), gets CUDA's error. An interprocess one crosses:
    test_interprocess_events_order_processes.py."""

    def program() -> None:
        q, out = mp.SimpleQueue(), mp.Queue()
        p = mp.Process(target=_waits_for_the_event, args=(q, out), daemon=True)
        p.start()
        t = torch.ones(N, device="cuda")
        ready = torch.cuda.Event()
        if recorded:
            ready.record()
        q.put((t, ready))
        assert out.get() == N

    r = _run(program)
    assert _kinds(r) == ["host-error"]
    assert "RuntimeError: CUDA error: invalid resource handle" in str(r.reports[0])


def _sums(x: torch.Tensor, out: Any) -> None:
    out.put(x.sum().item())


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_process_forked_after_cuda_was_in_use_is_noted(method: str) -> None:
    """On a GPU, a child forked once the parent used CUDA fails at its first CUDA call; the simulator runs it as
    spawned, and says so (it said nothing: clean, where the GPU run crashes)."""

    def program() -> None:
        ctx = mp.get_context(method)
        x = torch.ones(N, device="cuda")
        out = ctx.Queue()
        p = ctx.Process(target=_sums, args=(x, out))
        p.start()
        assert out.get() == N
        p.join()

    r = _run(program)
    assert r.reports == ()
    noted = [n for n in r.notes if "Cannot re-initialize CUDA in forked subprocess" in n]
    assert len(noted) == (method == "fork"), r.notes


def _host_sums(x: torch.Tensor, out: Any) -> None:
    out.put(float(x.sum()))


def test_a_forked_process_that_never_uses_cuda_is_not_noted() -> None:
    """A worker forked after the parent used CUDA that works on host tensors alone (a ``DataLoader``'s) runs on a
    GPU: no note (one was given for every fork, whatever the child did)."""

    def program() -> None:
        ctx = mp.get_context("fork")
        torch.ones(N, device="cuda")
        out = ctx.Queue()
        p = ctx.Process(target=_host_sums, args=(torch.ones(N), out))
        p.start()
        assert out.get() == N
        p.join()

    r = _run(program)
    assert r.reports == ()
    assert not [n for n in r.notes if "fork method" in n], r.notes


def _sets_its_environment(q: Any) -> None:
    os.environ["SIMDEVICE_TEST_CHILD_VAR"] = "child"
    os.environ.pop("SIMDEVICE_TEST_PARENT_VAR", None)
    q.put((os.environ.get("SIMDEVICE_TEST_CHILD_VAR"), "SIMDEVICE_TEST_PARENT_VAR" in os.environ,
           "SIMDEVICE_TEST_CHILD_VAR" in dict(os.environ)))


def _child_environment() -> None:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_sets_its_environment, args=(q,))
    p.start()
    assert q.get() == ("child", False, True)  # its own writes and deletions, as it sees them
    p.join()
    assert "SIMDEVICE_TEST_CHILD_VAR" not in os.environ  # not the parent's
    assert os.environ["SIMDEVICE_TEST_PARENT_VAR"] == "parent"


def test_a_started_process_s_environment_is_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a process the program starts writes into ``os.environ`` stays its own: before, it reached the parent and
    the interpreter's environment, for every later run and test (torch's Distributed Checkpoint's saving process sets
    ``RANK`` and ``LOCAL_RANK``: a later test's model loaded onto device 1)."""
    monkeypatch.setenv("SIMDEVICE_TEST_PARENT_VAR", "parent")
    monkeypatch.delenv("SIMDEVICE_TEST_CHILD_VAR", raising=False)
    assert _run(_child_environment).reports == ()
    assert "SIMDEVICE_TEST_CHILD_VAR" not in os.environ
    assert os.environ["SIMDEVICE_TEST_PARENT_VAR"] == "parent"
