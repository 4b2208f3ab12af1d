"""Conformance with PyTorch's CUDA sanitizer: every scenario of its tests that has a verdict, on the simulator.

The scenarios are those of ``test/test_cuda_sanitizer.py`` in pytorch/pytorch (``TestEventHandler``,
``TestArgumentHandler``), translated to the device contract with real tensors: "a kernel on stream s that
reads ``read_only`` and writes ``read_write``" is one op on s, :func:`kernel` below, a library op whose schema
marks ``read_write`` as written and returns nothing (so the translation also checks that such ops are seen);
an event record and wait are ``e.record(s)`` and ``s.wait_event(e)``. CSAN's verdict for a launch (no error /
an error) is whether that launch added a race report.

For the argument handler, which tensors an op reads and writes is asked the way a race would: a write of a
tensor on another stream just before the op races with it iff the op reads or writes the tensor, and a read on
another stream just after the op races iff the op wrote it (CSAN counts a tensor both read and written as
written only, and so does this translation). Probing before the op also covers ops that make the host wait,
such as ``nonzero``.

Where the simulator deliberately differs from CSAN, a test says which is right and why (``split``: CSAN treats
the views it returns as written; the op launches no kernel and touches no byte). Left out: ``test_tensor_names``
(argument names, no verdict; reports here name the op and its source line) and ``TestMessages`` (CSAN's log
texts).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from reference.contract import op_kind
from simdevice import SimDevice
from simdevice.runtime.reports import Race

_LIB = torch.library.Library("simdevice_csan", "DEF")
_LIB.define("kernel(Tensor[] read_only, Tensor(a!)[] read_write) -> ()")


def _kernel_impl(read_only: list[torch.Tensor], read_write: list[torch.Tensor]) -> None:
    for t in read_write:
        t.add_(1)


_LIB.impl("kernel", _kernel_impl, "CPU")
_LIB.impl("kernel", lambda read_only, read_write: None, "Meta")

kernel = torch.ops.simdevice_csan.kernel.default


class Handler:
    """CSAN's ``EventHandler`` calls on a simulated device: streams and tensors by number, made on first use."""

    def __init__(self, dev: Any) -> None:
        self.dev = dev
        self.streams: dict[int, Any] = {}
        # every tensor exists (and is ordered before everything) from the start, as CSAN's do
        self.tensors = {i: torch.zeros(16, device=dev.device) for i in range(11)}
        dev.synchronize()
        self.events: dict[int, Any] = {}

    def stream(self, i: int) -> Any:
        if i not in self.streams:
            self.streams[i] = self.dev.Stream(name=f"c{i}")
        return self.streams[i]

    def tensor(self, i: int) -> torch.Tensor:
        return self.tensors[i]

    def launch(self, stream: int, read_only: list[int] = (), read_write: list[int] = ()) -> int:  # type: ignore[assignment]
        """One kernel; how many race reports it added."""
        ro, rw = [self.tensor(i) for i in read_only], [self.tensor(i) for i in read_write]
        s = self.stream(stream)
        before = len(self.dev.runtime.reports)
        with self.dev.stream(s):
            # a kernel that touches no tensor: a scratch one of its own (torch routes no call without a tensor)
            kernel(ro, rw or [torch.empty(1, device=self.dev.device)] if not ro else rw)
        return sum(isinstance(r, Race) for r in self.dev.runtime.reports.items[before:])

    def good(self, stream: int, read_only: list[int] = (), read_write: list[int] = ()) -> None:  # type: ignore[assignment]
        assert self.launch(stream, read_only, read_write) == 0

    def bad(self, stream: int, read_only: list[int] = (), read_write: list[int] = ()) -> None:  # type: ignore[assignment]
        assert self.launch(stream, read_only, read_write) > 0

    def record(self, event: int, stream: int) -> None:
        if event not in self.events:
            self.events[event] = self.dev.Event()
        self.events[event].record(self.stream(stream))

    def wait(self, event: int, stream: int) -> None:
        if event in self.events:  # a deleted event is waited by nobody: the stream waits nothing
            self.stream(stream).wait_event(self.events[event])

    def delete(self, event: int) -> None:
        del self.events[event]

    def create(self, event: int) -> None:
        self.events[event] = self.dev.Event()  # never recorded: waiting on it orders nothing


def scenario(body: Callable[[Handler], None]) -> None:
    """Run a scenario on a fresh simulated device; its assertions fail the run as a host error."""

    def program(dev: Any) -> bool:
        body(Handler(dev))
        return True

    run = SimDevice().run(program)
    errors = [str(r) for r in run.reports if not isinstance(r, Race)]
    assert run.result is True, errors


# -- TestEventHandler --------------------------------------------------------------------------------


def test_empty_kernel_launch() -> None:
    scenario(lambda h: h.good(0))


def test_simple_passing() -> None:
    def body(h: Handler) -> None:
        h.good(1, read_only=[1])
        h.good(2, read_only=[1])

    scenario(body)


def test_simple_error() -> None:
    def body(h: Handler) -> None:
        h.good(1, read_only=[1])
        h.bad(2, read_write=[1])

    scenario(body)


def test_simple_sync() -> None:
    def body(h: Handler) -> None:
        h.good(1, read_only=[1])
        h.record(0, 1)
        h.wait(0, 2)
        h.good(2, read_write=[1])

    scenario(body)


def test_reads_check_last_write() -> None:
    # not only the first read after a write is checked against it: every read is
    def body(h: Handler) -> None:
        h.good(1, read_write=[1])
        h.record(0, 1)
        h.wait(0, 2)
        h.good(2, read_only=[1])
        h.bad(3, read_only=[1])

    scenario(body)


def test_branch_sync() -> None:
    # two streams may read after both waited for a third, but not write without more synchronization
    def body(h: Handler) -> None:
        h.good(1, read_write=[1])
        h.record(0, 1)
        h.wait(0, 2)
        h.wait(0, 3)
        h.good(2, read_only=[1])
        h.good(3, read_only=[1])
        h.bad(2, read_write=[1])

    scenario(body)


def test_chain_sync() -> None:
    def body(h: Handler) -> None:
        h.good(0, read_only=[1])
        for i in range(10):
            h.record(i, i)
            h.wait(i, i + 1)
        h.good(10, read_write=[1])

    scenario(body)


def test_expired_record() -> None:
    def body(h: Handler) -> None:
        h.good(1, read_only=[1])
        h.record(0, 1)
        h.good(1, read_only=[1])
        h.wait(0, 2)
        h.bad(2, read_write=[1])

    scenario(body)


@pytest.mark.parametrize(("should_delete", "should_create"), [(True, True), (True, False), (False, True)])
def test_deleted_record(should_delete: bool, should_create: bool) -> None:
    def body(h: Handler) -> None:
        h.good(1, read_only=[1])
        h.record(0, 1)
        if should_delete:
            h.delete(0)
        if should_create:
            h.create(0)
        h.wait(0, 2)
        h.bad(2, read_write=[1])

    scenario(body)


def test_all_reads_checked_failing() -> None:
    def body(h: Handler) -> None:
        for i in range(1, 11):
            h.good(i, read_only=[1])
            h.record(i, i)
        for i in range(1, 10):
            h.wait(i, 0)
        h.bad(0, read_write=[1])

    scenario(body)


def test_all_reads_checked_passing() -> None:
    def body(h: Handler) -> None:
        for i in range(1, 10):
            h.good(i, read_only=[1])
            h.record(i, i)
        for i in range(1, 10):
            h.wait(i, 0)
        h.good(0, read_write=[1])

    scenario(body)


def test_multiple_errors() -> None:
    def body(h: Handler) -> None:
        h.good(0, read_write=list(range(10)))
        assert h.launch(1, read_write=list(range(10))) == 10

    scenario(body)


def test_multiple_errors_as_one_foreach_add() -> None:
    # the same scenario with a real op that returns nothing and writes its arguments
    def program(dev: Any) -> int:
        xs = [torch.zeros(16, device=dev.device) for _ in range(10)]
        dev.synchronize()
        torch._foreach_add_(xs, 1.0)
        before = len(dev.runtime.reports)
        with dev.stream(dev.Stream(name="c1")):
            torch._foreach_add_(xs, 1.0)
        return len(dev.runtime.reports) - before

    run = SimDevice().run(program)
    assert run.result == 10
    assert all(isinstance(r, Race) for r in run.reports)


def test_correct_state_merging() -> None:
    # after a wait, a stream's state is the pointwise maximum of its old state and the recorded one
    def body(h: Handler) -> None:
        h.good(1, read_write=[1])
        h.good(2, read_write=[2])
        h.record(1, 1)
        h.record(2, 2)
        h.good(1, read_write=[1])
        h.good(2, read_write=[2])
        h.wait(1, 2)
        h.wait(2, 1)
        h.record(3, 2)
        h.wait(3, 1)
        h.good(1, read_write=[1, 2])

    scenario(body)


def test_record_override() -> None:
    def body(h: Handler) -> None:
        h.good(1, read_only=[1])
        h.good(2, read_only=[2])
        h.record(1, 1)
        h.record(1, 2)
        h.wait(1, 3)
        h.bad(3, read_write=[1])

    scenario(body)


def test_multiple_wait() -> None:
    # a wait may be made several times on the same event by different streams
    def body(h: Handler) -> None:
        h.good(1, read_write=[1])
        h.record(1, 1)
        h.wait(1, 2)
        h.wait(1, 3)
        h.good(2, read_only=[1])
        h.good(3, read_only=[1])

    scenario(body)


# -- TestArgumentHandler: what one op reads and writes, asked as races --------------------------------


def accesses(make: Callable[[Any], dict[str, torch.Tensor]], op: Callable[[dict[str, torch.Tensor]], Any],
             names: list[str]) -> tuple[set[str], set[str]]:
    """(read, written) among ``names`` (the inputs ``make`` builds and the outputs ``op`` returns): each tensor
    probed in a run of its own: a write on another stream before ``op`` (inputs), a read after it (all)."""

    def probe(name: str, before_op: bool) -> bool:
        def program(dev: Any) -> int:
            tensors = make(dev)
            dev.synchronize()
            probe, on_op = dev.Stream(name="probe"), dev.Stream(name="op")
            if before_op:
                with dev.stream(probe):
                    kernel([], [tensors[name]])
            start = len(dev.runtime.reports)
            with dev.stream(on_op):
                tensors.update(op(tensors))
            if not before_op:
                start = len(dev.runtime.reports)
                with dev.stream(probe):
                    kernel([tensors[name]], [])
            return sum(isinstance(r, Race) for r in dev.runtime.reports.items[start:])

        run = SimDevice().run(program)
        assert isinstance(run.result, int), [str(r) for r in run.reports]
        return run.result > 0

    inputs = set(make(_NoDevice()))
    written = {n for n in names if probe(n, before_op=False)}
    read = {n for n in names if n in inputs and probe(n, before_op=True)} - written
    return read, written


class _NoDevice:
    """Enough of a device for ``make`` to say which names it builds (on the CPU, nothing simulated)."""

    device = torch.device("cpu")


def test_add() -> None:
    def make(dev: Any) -> dict[str, torch.Tensor]:
        return {"a": torch.ones(5, 3, device=dev.device), "b": torch.full((5, 3), 2.0, device=dev.device)}

    assert accesses(make, lambda t: {"c": torch.add(t["a"], t["b"])}, ["a", "b", "c"]) == ({"a", "b"}, {"c"})


def test_cat() -> None:
    def make(dev: Any) -> dict[str, torch.Tensor]:
        return {"a": torch.ones(2, 4, 5, device=dev.device), "b": torch.zeros(2, 1, 5, device=dev.device),
                "c": torch.full((2, 7, 5), 3.0, device=dev.device)}

    got = accesses(make, lambda t: {"d": torch.cat((t["a"], t["b"], t["c"]), dim=1)}, ["a", "b", "c", "d"])
    assert got == ({"a", "b", "c"}, {"d"})


def test_inplace() -> None:
    def make(dev: Any) -> dict[str, torch.Tensor]:
        return {"a": torch.ones(4, 2, device=dev.device)}

    def op(t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        t["a"].add_(5)
        return {}

    assert accesses(make, op, ["a"]) == (set(), {"a"})


def test_out() -> None:
    def make(dev: Any) -> dict[str, torch.Tensor]:
        return {"a": torch.arange(8, dtype=torch.float32, device=dev.device), "b": torch.empty(8, device=dev.device)}

    def op(t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        torch.mul(t["a"], 3, out=t["b"])
        return {}

    assert accesses(make, op, ["a", "b"]) == ({"a"}, {"b"})


def test_nonzero() -> None:
    # a data-dependent shape: the host waits for the count, then the outputs are written on the stream
    def make(dev: Any) -> dict[str, torch.Tensor]:
        return {"a": torch.ones(5, 3, 2, device=dev.device)}

    def op(t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = torch.nonzero(t["a"], as_tuple=True)
        return {f"out{i}": o for i, o in enumerate(out)}

    assert accesses(make, op, ["a", "out0", "out1", "out2"]) == ({"a"}, {"out0", "out1", "out2"})


def test_split_differs_from_csan_and_touches_no_byte() -> None:
    """CSAN counts ``split``'s outputs as written (their data pointers, one of them ``a``'s own). ``split``
    returns views: it launches no kernel on either backend (``op_kind`` says so, and both count operations with
    it), so no byte is read or written and a concurrent write of ``a`` elsewhere cannot conflict with it."""

    def make(dev: Any) -> dict[str, torch.Tensor]:
        return {"a": torch.arange(10, dtype=torch.float32, device=dev.device).reshape(5, 2)}

    def op(t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {f"out{i}": o for i, o in enumerate(torch.split(t["a"], 2))}

    assert op_kind(torch.ops.aten.split.Tensor) == "view"
    assert accesses(make, op, ["a", "out0", "out1", "out2"]) == (set(), set())


def test_overlapping_views_at_different_pointers_race_here_not_in_csan() -> None:
    """CSAN keys accesses by ``data_ptr``: two views of one buffer that start at different addresses but share
    bytes are two unrelated tensors to it. Here accesses are byte ranges of the storage, and they conflict."""

    def program(dev: Any) -> int:
        flat = torch.zeros(64, device=dev.device)
        dev.synchronize()
        with dev.stream(dev.Stream(name="c1")):
            kernel([], [flat[0:48]])
        with dev.stream(dev.Stream(name="c2")):
            kernel([], [flat[16:64]])  # another data_ptr, 32 shared floats
        return sum(isinstance(r, Race) for r in dev.runtime.reports.items)

    assert SimDevice().run(program).result == 1


def test_a_write_ordered_only_after_an_intervening_racy_read_still_races() -> None:
    """c1 writes t; c2 reads t unordered (a race: both tools flag it); c3 waits for c2 and writes t. CSAN
    checks c3's write against the reads since the last write (c2's, which c3 waited for) and lets it pass;
    but c3 is not ordered after c1's write either, and on a GPU the two writes can land in either order."""

    def body(h: Handler) -> None:
        h.good(1, read_write=[1])
        h.bad(2, read_only=[1])
        h.record(0, 2)
        h.wait(0, 3)
        h.bad(3, read_write=[1])

    scenario(body)
