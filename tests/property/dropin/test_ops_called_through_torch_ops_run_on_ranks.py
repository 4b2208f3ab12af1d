"""An op called through ``torch.ops`` (``torch.ops.aten.mul.Tensor(x, 2)``, a ``torch.library`` custom op, FSDP2's
``torch.ops.fsdp.*``) on two ranks runs and gets its verdict. Such a call is a pybind11 function, which keeps a
per-thread stack of its calls; the ranks are greenlets of one thread, so a rank that stopped inside one while the
other stopped inside another closed them out of order, and pybind11 aborted the whole process ("loader_life_support:
internal error", no verdict, no report). An actor that would stop inside one now starts the run again on threads."""

from __future__ import annotations

import subprocess
import sys
import textwrap

_PROGRAM = textwrap.dedent('''
    import torch
    import simdevice

    lib = torch.library.Library("simdevice_test_pybind", "DEF")
    lib.define("twice_plus_one(Tensor x, Tensor(a!) out) -> ()")


    @torch.library.impl(lib, "twice_plus_one", "CompositeExplicitAutograd")
    def _twice_plus_one(x, out):
        out.copy_(x * 2)
        out.add_(1)


    def through_aten(wait: bool):
        side = torch.cuda.Stream()
        x = torch.ones(4, device="cuda")
        for _ in range(3):
            y = torch.ops.aten.mul.Tensor(x, 2)
        done = torch.cuda.Event()
        done.record()
        if wait:
            side.wait_event(done)
        with torch.cuda.stream(side):
            z = torch.ops.aten.add.Tensor(y, 1)
        torch.cuda.current_stream().wait_stream(side)
        assert torch.equal(z.cpu(), torch.full((4,), 3.0))


    def through_a_custom_op():
        x = torch.ones(4, device="cuda")
        out = torch.empty(4, device="cuda")
        torch.ops.simdevice_test_pybind.twice_plus_one(x, out)
        assert torch.equal(out.cpu(), torch.full((4,), 3.0))


    for fn, args, clean in ((through_aten, (True,), True), (through_aten, (False,), False),
                            (through_a_custom_op, (), True)):
        s = simdevice.cuda()
        s.run(fn, *args, world_size=2)
        assert s.clean is clean, s.text()
        assert clean or "race" in s.text(), s.text()
    print("verdicts as expected")
''')


def test_ops_called_through_torch_ops_on_two_ranks_get_verdicts() -> None:
    # in a process of its own: before the fix, pybind11 aborted the process
    done = subprocess.run([sys.executable, "-c", _PROGRAM], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "verdicts as expected" in done.stdout, done.stdout + done.stderr
