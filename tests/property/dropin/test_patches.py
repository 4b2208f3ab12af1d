"""A session patches torch while it is open, and only then: what it sets comes back exactly as it was."""

from __future__ import annotations

import subprocess
import sys
import warnings
from typing import Any

import pytest
import torch
import torch.distributed as dist

import simdevice
from simdevice.dropin import distributed, facade, imports, memsaver, processes, stores, threads
from simdevice.dropin.patches import Patches, namespaces


def _owners() -> list[Any]:
    return (facade.patched_owners() + distributed.patched_owners() + processes.patched_owners()
            + threads.patched_owners() + memsaver.patched_owners() + stores.patched_owners()
            + imports.patched_owners())


def _same(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> None:
    for b, a in zip(before, after, strict=True):
        assert b.keys() == a.keys()
        changed = [k for k in b if b[k] is not a[k]]
        assert changed == []


def test_a_session_changes_torch_while_open_and_restores_it_exactly() -> None:
    before = namespaces(_owners())
    with simdevice.cuda() as sim:
        inside = namespaces(_owners())
        assert torch.cuda.is_available()
        torch.ones(4, device="cuda").add_(1)
    sim.assert_clean()
    assert any(b[k] is not i.get(k) for b, i in zip(before, inside, strict=True) for k in b)  # it did patch
    _same(before, namespaces(_owners()))
    assert torch.cuda.Stream.__module__ == "torch.cuda.streams"


def test_an_exception_inside_the_block_is_reported_and_torch_still_restored() -> None:
    """The block's error is the run's host error, and a warning says it was not raised on (a test that did not ask
    ``assert_clean()`` would otherwise pass unaware)."""
    before = namespaces(_owners())
    with warnings.catch_warnings(record=True) as caught, simdevice.cuda() as sim:
        warnings.simplefilter("always")
        torch.ones(2, device="cuda")
        raise ValueError("the program's own error")
    (said,) = [str(w.message) for w in caught if w.category is RuntimeWarning]
    assert said.startswith("the simdevice.cuda() block raised ValueError: the program's own error; it is a host error")
    assert [r.kind for r in sim.reports] == ["host-error"]
    assert "ValueError: the program's own error" in sim.text()
    _same(before, namespaces(_owners()))


def _stalled_copy_then_error() -> None:
    side = torch.cuda.Stream()
    x = torch.ones(4, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        x.mul_(2)  # stalled: still queued when the host raises
    raise ValueError("the program's own error")


def test_an_error_in_the_block_ends_the_run_there_as_in_a_function() -> None:
    """What the block raises ends the run as a function's error does: work still queued does not run on."""
    with warnings.catch_warnings(), simdevice.cuda("side#0+5") as block:
        warnings.simplefilter("ignore")
        _stalled_copy_then_error()
    function = simdevice.cuda("side#0+5")
    function.run(_stalled_copy_then_error)
    assert block.result is not None
    assert function.result is not None
    assert [r.kind for r in block.reports] == [r.kind for r in function.reports] == ["host-error"]
    ran = [what for _, actor, what in function.result.trace if actor == "side"]
    assert [what for _, actor, what in block.result.trace if actor == "side"] == ran
    assert not any(what.startswith("done") for what in ran)


def test_run_restores_torch_after_the_function_raised() -> None:
    before = namespaces(_owners())

    def broken() -> None:
        torch.ones(2, device="cuda")
        raise KeyError("k")

    s = simdevice.cuda()
    s.run(broken)
    assert "KeyError" in s.text()
    _same(before, namespaces(_owners()))


def test_one_session_at_a_time_and_the_refusal_restores_nothing_wrongly() -> None:
    before = namespaces(_owners())
    with simdevice.cuda():
        inner = simdevice.cuda()
        with pytest.raises(RuntimeError, match="already open"), inner:
            pass
        assert torch.cuda.Stream is facade.Stream  # the outer session is intact
    _same(before, namespaces(_owners()))


def test_outside_a_session_simulated_names_refuse_plainly() -> None:
    with pytest.raises(RuntimeError, match=r"only inside a simdevice.cuda\(\) session"):
        facade.Stream()


def test_patches_delete_what_was_absent_and_put_back_what_was_there() -> None:
    """Also while lifted (``Patches.lifted``): what was there for the block, the patches again after it."""

    class Owner:
        present = 1

    p = Patches()
    p.set(Owner, "present", 2)
    p.set(Owner, "absent", 3)
    p.set(Owner, "present", 4)
    with p.lifted():
        assert Owner.present == 1
        assert "absent" not in vars(Owner)
    assert (Owner.present, Owner.absent) == (4, 3)  # type: ignore[attr-defined]
    p.restore()
    assert Owner.present == 1
    assert "absent" not in vars(Owner)
    assert len(p) == 0


def test_dynamo_first_imported_in_a_run_keeps_torch_s_own_tensor_attributes() -> None:
    """Rule (``simdevice.dropin.imports._imported_as_outside``): ``torch._dynamo`` imported first during a session
    (here by ``mul.Scalar``'s meta kernel, a Python reference behind ``torch._disable_dynamo``) is imported with the
    patches lifted, as before the session. It keeps ``torch.Tensor``'s attributes as it finds them at import
    (``all_tensor_attrs``): it kept the session's ``Tensor.grad`` and ``Tensor.data`` properties, and a GPU run in the
    same process (``replay --gpu``, the GPU tests) raised ``AttributeError: 'property' object has no attribute
    '__objclass__'`` at its first device op (seventy-second run). A new process: this one has dynamo loaded.
    Mutation: no lift (the properties)."""
    code = (
        "import sys, torch, simdevice\n"
        "assert 'torch._dynamo' not in sys.modules\n"
        "def prog():\n"
        "    return torch.ops.aten.mul.Scalar(torch.ones(4, device='cuda'), 3).sum().item()\n"
        "s = simdevice.cuda()\n"
        "s.run(prog)\n"
        "assert s.clean and s.result.result == 12.0, s.text()\n"
        "assert 'torch._dynamo' in sys.modules\n"
        "from torch._dynamo.variables.tensor import all_tensor_attrs\n"
        "print(type(all_tensor_attrs['grad']).__name__, type(all_tensor_attrs['data']).__name__)\n"
    )
    assert _printed_in_a_new_process(code) == ["getset_descriptor", "getset_descriptor"]


def test_a_module_first_imported_in_a_session_holds_torch_s_functions_after_it() -> None:
    """Rule (``Patches.unbind``, at a session's end): a module first imported while the session's patches are in
    place binds their replacements by name (FSDP's ``from torch.distributed.distributed_c10d import
    _get_default_group``), and holds torch's own again after the session, as a module imported before it does; the
    next session binds them again. Before, 25 of torch's globals (FSDP's, the checkpoint's, DTensor's) kept the
    simulator's functions after a session that imported them: a GPU run in the same process (``replay --gpu``), or
    the program's own code after the session, called them. A new process: this one has imported FSDP. Mutation: no
    unbind at the end (the simulator's function)."""
    code = (
        "import sys, torch, torch.distributed as dist, simdevice\n"
        "assert 'torch.distributed.fsdp' not in sys.modules\n"
        "def prog():\n"
        "    from torch.distributed.fsdp import _init_utils\n"
        "    return _init_utils._get_default_group().size()\n"
        "for _ in range(2):\n"
        "    s = simdevice.cuda()\n"
        "    s.run(prog, world_size=2)\n"
        "    assert s.clean and s.result.result == [2, 2], s.text()\n"
        "    from torch.distributed.fsdp import _init_utils\n"
        "    print(_init_utils._get_default_group is dist.distributed_c10d._get_default_group)\n"
    )
    assert _printed_in_a_new_process(code) == ["True", "True"]


def _printed_in_a_new_process(code: str) -> list[str]:
    """The words ``code`` prints, run in a new interpreter (where it raises, the test fails with its error)."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_nothing_is_patched_at_import() -> None:
    code = (
        "import torch, torch.distributed as dist\n"
        "from simdevice.dropin.patches import namespaces\n"
        "owners = [torch, torch.cuda, torch.cuda.nvtx, torch.Tensor, dist]\n"
        "before = namespaces(owners)\n"
        "import simdevice, simdevice.dropin, simdevice.cli\n"
        "after = namespaces(owners)\n"
        "assert all(b.keys() == a.keys() and all(b[k] is a[k] for k in b) for b, a in zip(before, after))\n"
        "assert not torch.cuda.is_available() and not dist.is_initialized()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_distributed_names_are_the_simulated_group_only_inside() -> None:
    assert dist.is_initialized() is False
    with simdevice.cuda() as sim:
        assert dist.is_initialized()
        assert (dist.get_rank(), dist.get_world_size()) == (0, 1)
    sim.assert_clean()
    assert dist.is_initialized() is False


def test_a_search_holds_the_patches_across_its_runs_and_restores_them() -> None:
    from simdevice.dropin.session import held

    before = namespaces(_owners())
    with held():
        with pytest.raises(RuntimeError, match="only inside"):
            torch.cuda.Stream()  # between runs the names refuse, as outside a session
        with simdevice.cuda() as sim:
            torch.ones(2, device="cuda")
        sim.assert_clean()
        with warnings.catch_warnings(record=True), simdevice.cuda() as again:
            warnings.simplefilter("always")
            raise ValueError("inside a held block")
        assert "ValueError" in again.text()
    _same(before, namespaces(_owners()))

    def racy() -> None:
        side = torch.cuda.Stream()
        x = torch.zeros(1024, device="cuda")
        with torch.cuda.stream(side):
            x.add_(1)  # no wait for the compute stream's fill
        torch.cuda.synchronize()
        assert x.cpu().tolist() == [1.0] * 1024

    found = simdevice.explore(racy, max_examples=20)
    assert found.failure is not None
    _same(before, namespaces(_owners()))
