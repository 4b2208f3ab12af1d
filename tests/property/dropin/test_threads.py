"""Threads the program starts (``threading.Thread``) are host actors of its process: an asynchronous checkpoint
writer that reads a pinned buffer before the copy into it is done is found, and the one that waits is clean; a
thread's current stream is the device's default stream; it shares its process's streams, pinned memory and rank;
``threading``'s and ``queue``'s primitives made by the program are the simulator's, so a wait is a scheduled wait,
and one that can never end is a deadlock, not a hang. Each rule has a program here that a change of it fails.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

import pytest
import torch

import simdevice
from simdevice import Deadlock, HostError, Race, StaleRead
from simdevice.explain import suggest
from simdevice.search.targets import from_function

N = 1024


def _run(fn: Any, schedule: str | None = None) -> Any:
    s = simdevice.cuda(schedule)
    s.run(fn)
    assert s.result is not None
    return s.result


# -- an asynchronous checkpoint writer ------------------------------------------------------------------------------


def _offloaded() -> tuple[torch.Tensor, torch.Tensor, Any]:
    """The trainer's weights, copied to pinned memory on a side stream, and the copy's event, which the current
    stream waits for (the next step waits for the copy's read of the weights)."""
    w = torch.ones(N, device="cuda")
    pinned = torch.empty(N, pin_memory=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        pinned.copy_(w, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record()
    torch.cuda.current_stream().wait_event(copied)
    return w, pinned, copied


def _snapshot(wait: bool) -> None:
    """The trainer copies its weights to pinned memory on a side stream and hands the buffer to a writer thread,
    which saves it while the trainer goes on; ``wait``: the writer synchronizes on the copy's event first."""
    w, pinned, copied = _offloaded()
    saved = []

    def writer() -> None:
        if wait:
            copied.synchronize()
        saved.append(pinned.clone())

    t = threading.Thread(target=writer)
    t.start()
    w.add_(1)  # the next step
    t.join()
    assert torch.equal(saved[0], torch.ones(N)), "the snapshot is not the weights it was taken of"


def _writer_waits() -> None:
    _snapshot(True)


def _writer_races() -> None:
    _snapshot(False)


def test_a_writer_thread_that_waits_for_the_copy_is_clean() -> None:
    found = simdevice.explore(_writer_waits, max_examples=40)
    assert found.failure is None, found.failure.text()


def test_a_writer_thread_that_reads_the_buffer_before_the_copy_is_found_and_its_fix_named() -> None:
    found = simdevice.explore(_writer_races, max_examples=40)
    assert found.failure is not None
    races = [r for r in found.failure.run.reports if isinstance(r, Race)]
    assert any("clone on thread writer" in str(r) and "copy_ (D2H) on stream side" in str(r) for r in races), races
    text = found.failure.text()
    # a GPU replay is not offered for a run with threads
    replay = [line for line in text.splitlines() if "replay:" in line]
    assert replay, text
    assert "--gpu" not in replay[0], replay
    # the thread is its process's: a synchronize in it is the fix (no interprocess event, no handshake), checked
    target = from_function(_writer_races)
    fix = suggest(target, target.run(found.failure.schedule))
    lines = "\n".join(fix.lines())
    assert fix.checked, lines
    assert "synchronize on an event recorded on `side` after `copy_ (D2H)`" in lines, lines
    assert "before `clone` on the host's thread `writer`" in lines, lines
    assert "across processes" not in lines, lines


def test_a_delay_of_the_writer_thread_is_its_own() -> None:
    """The thread is an actor of the schedule, named after its target: a stall of its first step lets the copy
    finish first, so the racy writer reads the weights."""
    run = _run(_writer_races, "writer#0+20")
    assert "writer" in run.op_counts
    assert not any(isinstance(r, StaleRead) for r in run.reports), run.reports
    assert not run.unfired


# -- a thread's streams ---------------------------------------------------------------------------------------------


def _current_stream_in_a_thread() -> None:
    side = torch.cuda.Stream()
    seen = []

    def look() -> None:
        seen.append(torch.cuda.current_stream() == torch.cuda.default_stream())

    with torch.cuda.stream(side):  # (the starting thread's current stream is not the new thread's)
        t = threading.Thread(target=look)
        t.start()
    t.join()
    assert seen == [True], seen


def test_a_new_threads_current_stream_is_the_default_stream() -> None:
    run = _run(_current_stream_in_a_thread)
    assert not run.reports, run.reports


def _synchronize_in_a_thread() -> None:
    """The main thread fills a pinned buffer on a side stream it makes once the reader runs; the reader's
    ``torch.cuda.synchronize()`` waits for every stream of the device, that one included."""
    x = torch.full((N,), 3.0, device="cuda")
    pinned = torch.empty(N, pin_memory=True)
    ready = threading.Event()
    got = []

    def reader() -> None:
        ready.wait()
        torch.cuda.synchronize()
        got.append(pinned.clone())

    t = threading.Thread(target=reader)
    t.start()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        pinned.copy_(x, non_blocking=True)
    ready.set()
    t.join()
    assert torch.equal(got[0], torch.full((N,), 3.0))


def test_a_threads_synchronize_waits_for_its_processs_streams() -> None:
    for schedule in (None, "side#0+20", "reader#0+5"):
        run = _run(_synchronize_in_a_thread, schedule)
        assert not run.reports, (schedule, run.reports)


def _freed_in_a_thread() -> None:
    """A block freed by the thread is its process's allocator's: the main thread's next tensor takes it (one
    caching allocator per process)."""
    box = []

    def make() -> None:
        box.append(torch.empty(N, device="cuda").data_ptr())

    t = threading.Thread(target=make)
    t.start()
    t.join()
    assert torch.empty(N, device="cuda").data_ptr() == box[0]


def test_a_thread_shares_its_processs_allocator() -> None:
    run = _run(_freed_in_a_thread)
    assert not run.reports, run.reports


# -- names ---------------------------------------------------------------------------------------------------------


def _named_threads() -> None:
    def work() -> None:
        torch.ones(4, device="cuda").add_(1)

    ts = [threading.Thread(target=work), threading.Thread(target=work), threading.Thread(target=work, name="saver"),
          threading.Thread(target=lambda: work())]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def test_a_thread_is_named_by_its_name_else_its_target_else_thread() -> None:
    run = _run(_named_threads)
    assert not run.reports, run.reports
    assert {"work", "work-2", "saver", "thread"} <= set(run.op_counts), run.op_counts


# -- primitives ----------------------------------------------------------------------------------------------------


def _queue_handoff(wait: bool) -> None:
    """The main thread hands a pinned buffer and its copy's event to a consumer over a ``queue.Queue``."""
    x = torch.full((N,), 5.0, device="cuda")
    q: queue.Queue[Any] = queue.Queue()
    out = []

    def consumer() -> None:
        buf, ev = q.get()
        if wait:
            ev.synchronize()
        out.append(buf.sum().item())
        q.task_done()

    t = threading.Thread(target=consumer)
    t.start()
    pinned = torch.empty(N, pin_memory=True)
    pinned.copy_(x, non_blocking=True)
    ev = torch.cuda.Event()
    ev.record()
    q.put((pinned, ev))
    q.join()
    t.join()
    assert out == [5.0 * N], out


def _handoff_waits() -> None:
    _queue_handoff(True)


def _handoff_races() -> None:
    _queue_handoff(False)


def test_a_queue_hands_items_over_as_they_are_and_orders_the_getter() -> None:
    assert simdevice.explore(_handoff_waits, max_examples=30).failure is None
    found = simdevice.explore(_handoff_races, max_examples=30)
    assert found.failure is not None
    assert any(isinstance(r, Race) and "on thread consumer" in str(r) for r in found.failure.run.reports)


def _event_and_lock() -> None:
    """Two threads update one device tensor under a lock; the main thread waits on an event the last one sets."""
    total = torch.zeros(1, device="cuda")
    lock = threading.Lock()
    rlock = threading.RLock()
    done = threading.Event()
    left = [2]

    def add() -> None:
        with lock:
            total.add_(1)  # (a device op while holding the lock: the other thread waits its turn)
            torch.cuda.synchronize()
        with rlock, rlock:
            left[0] -= 1
            if left[0] == 0:
                done.set()

    ts = [threading.Thread(target=add, name=f"adder{i}") for i in range(2)]
    for t in ts:
        t.start()
    assert done.wait(timeout=5.0)
    for t in ts:
        t.join()
    assert total.item() == 2.0


def test_a_lock_held_across_a_device_call_and_an_event_are_the_simulators() -> None:
    for schedule in (None, "adder0#0+5", "adder1#1+5,host#2+1"):
        run = _run(_event_and_lock, schedule)
        assert not run.reports, (schedule, run.reports)


def _waits_for_ever() -> None:
    never = threading.Event()

    def waiter() -> None:
        never.wait()

    t = threading.Thread(target=waiter)
    t.start()
    t.join()


def test_a_wait_that_can_never_end_is_a_deadlock_not_a_hang() -> None:
    run = _run(_waits_for_ever)
    assert [type(r) for r in run.reports] == [Deadlock], run.reports


@pytest.mark.parametrize(("module", "name"), [(queue, "LifoQueue"), (queue, "PriorityQueue")])
def test_a_primitive_not_simulated_is_refused_by_name(module: Any, name: str) -> None:
    def program() -> None:
        getattr(module, name)()

    run = _run(program)
    (err,) = run.reports
    assert isinstance(err, HostError)
    assert f"{module.__name__}.{name} made in a run is not simulated" in err.error


def _two_buffers(release: bool) -> None:
    """A producer fills one of two pinned buffers at a time, each taken from a semaphore of 2 and given back by the
    consumer thread once it has read it (``release``); without the give-back the third take waits for good."""
    slots = threading.BoundedSemaphore(2)
    bufs = [torch.empty(N, pin_memory=True) for _ in range(2)]
    q: queue.Queue[Any] = queue.Queue()
    sums = []

    def consumer() -> None:
        for _ in range(4):
            k, ev = q.get()
            ev.synchronize()
            sums.append(bufs[k].sum().item())
            if release:
                slots.release()

    t = threading.Thread(target=consumer)
    t.start()
    for step in range(4):
        slots.acquire()
        k = step % 2
        bufs[k].copy_(torch.full((N,), float(step), device="cuda"), non_blocking=True)
        ev = torch.cuda.Event()
        ev.record()
        q.put((k, ev))
    t.join()
    assert sums == [float(step * N) for step in range(4)], sums
    with pytest.raises(ValueError, match="released too many times"):
        slots.release()


def test_a_semaphore_bounds_the_buffers_in_flight() -> None:
    for schedule in (None, "consumer#1+20", "default#1+5"):
        run = _run(lambda: _two_buffers(True), schedule)
        assert not run.reports, (schedule, run.reports)
    run = _run(lambda: _two_buffers(False))
    assert [type(r) for r in run.reports] == [Deadlock], run.reports


def test_the_standard_librarys_own_primitives_stay_pythons() -> None:
    """A ``threading.Thread`` made in a run makes its own ``Event`` (Python's, as the library calls it), and a
    ``queue.Queue`` made by the program is the simulator's, a ``queue.Queue`` subclass made meanwhile a class."""

    def program() -> None:
        t = threading.Thread(target=lambda: None)
        assert type(t._started).__module__ == "threading"
        assert not isinstance(queue.Queue(), queue.Queue)  # the simulator's, not Python's

        class Mine(queue.Queue):  # type: ignore[type-arg]
            pass

        assert isinstance(Mine(), queue.Queue)

    run = _run(program)
    assert not run.reports, run.reports


# -- what stays refused, and errors ---------------------------------------------------------------------------------


def _pool_snapshot(wait: bool) -> None:
    """The snapshot of ``_snapshot``, saved by a task of a ``ThreadPoolExecutor`` (an asynchronous save)."""
    from concurrent.futures import ThreadPoolExecutor

    w, pinned, copied = _offloaded()

    def save() -> torch.Tensor:
        if wait:
            copied.synchronize()
        return pinned.clone()

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="saver") as pool:
        saved = pool.submit(save)
        w.add_(1)
        assert torch.equal(saved.result(), torch.ones(N)), "the snapshot is not the weights it was taken of"


def _pool_waits() -> None:
    _pool_snapshot(True)


def _pool_races() -> None:
    _pool_snapshot(False)


def test_a_thread_pools_tasks_run_on_its_workers_threads() -> None:
    """A ``ThreadPoolExecutor`` the program makes runs its tasks on workers that are threads of the program's:
    the save that reads the snapshot before the copy is found on ``saver_0``, the one that waits is clean."""
    assert simdevice.explore(_pool_waits, max_examples=30).failure is None
    found = simdevice.explore(_pool_races, max_examples=30)
    assert found.failure is not None
    assert any(isinstance(r, Race) and "clone on thread saver_0" in str(r) for r in found.failure.run.reports), (
        found.failure.run.reports)


def _pool_results_and_errors() -> None:
    from concurrent.futures import ThreadPoolExecutor

    x = torch.arange(4.0, device="cuda")

    def double(k: int) -> float:
        return float((x * k).sum().item())

    def fail() -> None:
        raise KeyError("the task failed")

    with ThreadPoolExecutor(2) as pool:
        assert list(pool.map(double, [1, 2, 3])) == [6.0, 12.0, 18.0]
        bad = pool.submit(fail)
        assert isinstance(bad.exception(), KeyError)
        with pytest.raises(KeyError, match="the task failed"):
            bad.result()
        done = []
        bad.add_done_callback(done.append)
        assert done == [bad]
    with pytest.raises(RuntimeError, match="cannot schedule new futures after shutdown"):
        pool.submit(fail)


def test_a_thread_pools_futures_give_results_and_errors_as_pythons_do() -> None:
    run = _run(_pool_results_and_errors)
    assert not run.reports, run.reports
    assert {"pool_0", "pool_1"} <= set(run.op_counts), run.op_counts


def test_a_pool_the_standard_library_makes_stays_pythons_and_its_device_use_is_refused() -> None:
    """A pool made by library code (here, code of a file in the standard library's folder) is Python's own: its
    workers are no actors of the run, and an op of theirs on a device tensor is refused, naming the thread."""
    import os
    import sysconfig

    library: dict[str, Any] = {}
    here = os.path.join(sysconfig.get_paths()["stdlib"], "concurrent", "futures", "_made_here.py")
    exec(compile("import concurrent.futures\n"
                 "def run_in_pool(fn):\n"
                 "    with concurrent.futures.ThreadPoolExecutor(1) as pool:\n"
                 "        return pool.submit(fn).result()\n", here, "exec"), library)

    def program() -> None:
        x = torch.ones(4, device="cuda")
        library["run_in_pool"](lambda: x * 2)

    run = _run(program)
    errors = [r for r in run.reports if isinstance(r, HostError)]
    assert errors, run.reports
    assert "used from a thread the program started" in errors[0].error, run.reports


def _thread_raises() -> None:
    def fail() -> None:
        torch.ones(4, device="cuda").add_(1)
        raise ValueError("the writer failed")

    t = threading.Thread(target=fail, name="writer")
    t.start()
    t.join()


def test_what_a_thread_raises_is_a_host_error_of_its_actor() -> None:
    run = _run(_thread_raises)
    (err,) = [r for r in run.reports if isinstance(r, HostError)]
    assert err.actor == "writer", err
    assert "the writer failed" in err.error, err


def _join_with_a_timeout() -> None:
    side = torch.cuda.Stream()
    go = threading.Event()
    alive = []

    def slow() -> None:
        go.wait()

    t = threading.Thread(target=slow)
    t.start()
    t.join(timeout=0.01)
    alive.append(t.is_alive())
    go.set()
    t.join()
    alive.append(t.is_alive())
    del side
    assert alive == [True, False], alive


def test_join_with_a_timeout_and_is_alive_answer_for_the_thread() -> None:
    run = _run(_join_with_a_timeout)
    assert not run.reports, run.reports


def test_a_gpu_run_refuses_a_thread_the_program_starts_and_lets_the_librarys_go() -> None:
    """``replay --gpu`` counts one host per process: a thread the program starts is refused there (its steps would
    not mean the same operations), where a thread the standard library starts for itself (a pool's worker) runs."""
    import os
    import sysconfig

    from reference import cuda_plain

    started: list[str] = []
    checked = cuda_plain._no_program_threads(lambda t: started.append(t.name))
    with pytest.raises(NotImplementedError, match="threads a program starts are not replayed on a GPU yet"):
        checked(threading.Thread(name="mine"))
    library: dict[str, Any] = {}
    here = os.path.join(sysconfig.get_paths()["stdlib"], "concurrent", "futures", "thread.py")
    exec(compile("def start(checked, t):\n    checked(t)\n", here, "exec"), library)
    library["start"](checked, threading.Thread(name="worker"))
    assert started == ["worker"]


def _a_process_and_a_thread() -> None:
    import multiprocessing

    x = torch.ones(N, device="cuda")
    torch.cuda.synchronize()
    p = multiprocessing.get_context("spawn").Process(target=_sum_of, args=(x,), name="child")
    p.start()
    p.join()
    assert p.exitcode == 0
    _writer_waits()


def _sum_of(x: torch.Tensor) -> None:
    assert x.sum().item() == N


@pytest.mark.parametrize("actors", ["greenlet", "thread"])
def test_the_simulators_own_primitives_stay_pythons_on_either_kind_of_actor(actors: str) -> None:
    """On threads, the simulator makes a ``threading.Semaphore`` for each actor it starts (a process's, a
    thread's): its own, not the program's, so not refused (it was, for a process started in a run on threads)."""
    from simdevice import SimConfig

    s = simdevice.cuda(config=SimConfig(actors=actors))
    s.run(_a_process_and_a_thread)
    assert s.result is not None
    assert not s.result.reports, s.result.reports
    assert {"child", "writer"} <= set(s.result.op_counts), s.result.op_counts


def _draws_in_a_thread() -> None:
    drawn = []

    def draw() -> None:
        torch.manual_seed(0)
        drawn.append(torch.randn(2))

    t = threading.Thread(target=draw)
    t.start()
    t.join()
    after = torch.randn(2)  # the process's generator, where the thread left it
    torch.manual_seed(0)
    assert torch.equal(torch.cat([drawn[0], after]), torch.randn(4)), "the thread drew from a generator of its own"


def test_a_thread_draws_from_its_processs_cpu_generator() -> None:
    run = _run(_draws_in_a_thread)
    assert not run.reports, run.reports


def _condition_handoff(notify: bool) -> None:
    """A consumer waits on a condition for a buffer the producer fills and announces; ``notify``: the producer
    notifies (else the consumer waits for good: a deadlock)."""
    ready = threading.Condition()
    box: list[Any] = []
    got = []

    def consumer() -> None:
        with ready:
            ready.wait_for(lambda: bool(box))
            buf, ev = box[0]
        ev.synchronize()
        got.append(buf.sum().item())

    t = threading.Thread(target=consumer)
    t.start()
    buf = torch.empty(N, pin_memory=True)
    buf.copy_(torch.full((N,), 2.0, device="cuda"), non_blocking=True)
    ev = torch.cuda.Event()
    ev.record()
    with ready:
        box.append((buf, ev))
        if notify:
            ready.notify()
    t.join()
    assert got == [2.0 * N], got


def test_a_condition_hands_over_as_pythons_does() -> None:
    for schedule in (None, "consumer#0+20", "host#3+5"):
        run = _run(lambda: _condition_handoff(True), schedule)
        assert not run.reports, (schedule, run.reports)
    run = _run(lambda: _condition_handoff(False))
    kinds = [type(r) for r in run.reports]
    # (unless the consumer looked after the producer announced it: then no wait at all)
    assert kinds in ([Deadlock], []), run.reports


def _condition_misuse() -> None:
    c = threading.Condition(threading.Lock())
    with pytest.raises(RuntimeError, match="cannot wait on un-acquired lock"):
        c.wait()
    with c:
        assert c.wait(timeout=0.01) is False  # nobody notifies: the timeout passes in virtual time
        c.notify_all()


def test_a_conditions_wait_needs_its_lock_and_times_out() -> None:
    run = _run(_condition_misuse)
    assert not run.reports, run.reports


def _wait_for_two_notifies() -> list[Any]:
    """A consumer waits, with a timeout, for a predicate a first notify leaves false and a second makes true."""
    cond = threading.Condition()
    items: list[int] = []
    seen: list[Any] = []

    def consumer() -> None:
        with cond:
            seen.append(cond.wait_for(lambda: len(items) == 2 and list(items), timeout=5.0))

    t = threading.Thread(target=consumer)
    t.start()
    for k in range(2):
        torch.ones(4, device="cuda")  # (a host step: the consumer waits meanwhile)
        with cond:
            items.append(k)
            cond.notify_all()
    t.join()
    with cond:
        seen.append(cond.wait_for(lambda: False, timeout=0.01))  # (nobody notifies: the predicate's last answer)
    return seen


def test_a_conditions_wait_for_waits_again_until_its_predicate_holds() -> None:
    """As Python's ``Condition.wait_for``: a notify that leaves the predicate false is waited past (within the
    timeout), and the predicate's value is returned. Mutations: ``wait_for`` returning at the first notify where a
    timeout is given (``or`` for ``and``: ``False``), or not returning the predicate's value (``None``)."""
    for schedule in (None, "consumer#0+3", "host#1+2"):
        run = _run(_wait_for_two_notifies, schedule)
        assert not run.reports, (schedule, run.reports)
        assert run.result == [[0, 1], False], schedule


def _pool_edges() -> list[Any]:
    from concurrent.futures import ThreadPoolExecutor, wait

    with pytest.raises(ValueError, match="max_workers must be greater than 0"):
        ThreadPoolExecutor(max_workers=0)
    with ThreadPoolExecutor(1) as pool:
        f = pool.submit(lambda: torch.ones(4, device="cuda").sum().item())
        first = f.result()
        done, not_done = wait([f], timeout=1.0)  # (already done: it returns at once, the future among the done)
        return [first, done == {f}, not_done == set(), f.done()]


def test_a_pool_refuses_no_workers_and_wait_takes_a_finished_future_as_done() -> None:
    """As Python's pool: ``max_workers=0`` is a ``ValueError``, and ``concurrent.futures.wait`` of a future already
    finished returns it among the done at once (Python's ``wait`` reads the future's state). Mutations: ``0``
    workers taken (``<`` for ``<=``); the finished future's state not set (``wait`` waited its timeout out and
    gave it as not done)."""
    run = _run(_pool_edges)
    assert not run.reports, run.reports
    assert run.result == [4.0, True, True, True]


def _a_daemon_left_running() -> None:
    x = torch.ones(4, device="cuda")
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            x.add_(0)

    threading.Thread(target=spin, daemon=True).start()
    for _ in range(5):
        x.mul_(1)


def test_a_daemon_thread_still_running_ends_with_the_run() -> None:
    """A daemon thread that never stops (it ran into the step bound: a step-limit report) ends as the program's
    last other actor does, as the interpreter's end ends it."""
    run = _run(_a_daemon_left_running)
    assert not run.reports, run.reports
    assert run.op_counts["spin"] >= 1


_MADE: list[Any] = []


def _locks_made_in_the_run() -> None:
    import multiprocessing

    _MADE[:] = [threading.Lock(), threading.RLock(), multiprocessing.Lock(), multiprocessing.RLock(),
                threading.Semaphore(2), threading.BoundedSemaphore(1), multiprocessing.Semaphore(2)]
    with _MADE[0]:
        pass


def test_a_lock_made_in_a_run_is_a_real_lock_after_it() -> None:
    """Rule (``processes.SimLock._outside``, ``threads.SimRLock._outside``, ``SimSemaphore._outside``): a lock or a
    semaphore a module made in a run (a library imported in the program's function: transformers' logging lock) is,
    used after the session, a real one of its own: held against another thread, taken again by its holder where it is
    an ``RLock`` (and free once let go as often), at its first count where it is a semaphore. Before, any use of it
    outside a run raised "torch.cuda is simulated only inside a simdevice.cuda() session" (transformers' logging,
    after the session). Mutations: no real lock outside (that error); an ``RLock``'s release outside a run not
    letting its real lock go (another thread could not take it). (A queue, a pool or a barrier made in a run still
    refuses outside it.)"""
    s = simdevice.cuda()
    s.run(_locks_made_in_the_run)
    assert s.clean, s.text()
    lock, rlock, mp_lock, mp_rlock, semaphore, bounded, mp_semaphore = _MADE
    for each in (lock, mp_lock):
        assert each.acquire()
        assert not each.acquire(False)  # (held)
        got: list[bool] = []
        other = threading.Thread(target=lambda lk=each, out=got: out.append(lk.acquire(True, 0.01)))
        other.start()
        other.join()
        assert got == [False]
        each.release()
    assert not lock.locked()
    for each in (rlock, mp_rlock):
        with each, each:  # (its holder takes it again)
            pass
        freed: list[bool] = []  # (let go as often as taken: another thread takes it)
        other = threading.Thread(target=lambda lk=each, out=freed: out.append(lk.acquire(True, 0.01)))
        other.start()
        other.join()
        assert freed == [True]
    assert semaphore.acquire()
    assert semaphore.acquire()
    assert not semaphore.acquire(False)  # (its first count, 2, taken)
    semaphore.release(2)
    with bounded:
        pass
    with pytest.raises(ValueError, match="released too many times"):
        bounded.release()
    assert mp_semaphore.acquire()
    assert mp_semaphore.get_value() == 1
    mp_semaphore.release()
    assert mp_semaphore.get_value() == 2
