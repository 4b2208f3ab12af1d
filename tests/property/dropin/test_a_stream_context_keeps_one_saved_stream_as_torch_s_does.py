"""``torch.cuda.stream(s)`` gives a ``torch.cuda.StreamContext``, which torch writes in Python
(``torch/cuda/__init__.py``): entering keeps the current stream in the object (``src_prev_stream``) and calls
``set_stream(s)``; leaving calls ``set_stream`` with the kept stream. One kept stream per object: the same object
entered again inside its own block (a helper that enters the offloader's context, called inside it) leaves ``s``
current after the outer block too, and contexts left in another order than they were entered (a module's pre-hook
enters one, its hook leaves it) each make current what was current as they were entered. The simulator's kept a
stack of blocks, and each leaving popped the actor's innermost stream: after such a block another stream than
torch's was current and the program's next ops ran there, so a race a GPU has (an op on ``s`` that a stream
ordered after the default stream alone reads) was missed."""

from __future__ import annotations

import torch

import simdevice

N = 1024


def offload_after_a_nested_helper(wait_on: str = "current") -> None:
    """An offloader's helper enters its stream context; ``offload_two`` calls it inside the same context. After
    that block ``side`` is still current (torch's StreamContext kept ``side`` as the inner block began), so the last
    ``add_`` runs on ``side``; the D2H stream then waits for the current stream (``current``: ``side``, clean) or for
    the default stream (``default``: not the stream that wrote, a race on a GPU)."""
    side, d2h = torch.cuda.Stream(), torch.cuda.Stream()
    on_side = torch.cuda.stream(side)
    w = torch.zeros(N, device="cuda")
    side.wait_stream(torch.cuda.current_stream())

    def bump() -> None:
        with on_side:
            w.add_(1)

    with on_side:
        bump()
    w.add_(1)  # on side, as on a GPU: torch's StreamContext restored the stream its inner entry kept
    d2h.wait_stream(torch.cuda.current_stream() if wait_on == "current" else torch.cuda.default_stream())
    with torch.cuda.stream(d2h):
        snapshot = w.to("cpu", non_blocking=True)
    d2h.synchronize()
    assert snapshot.sum().item() == 2.0 * N


def test_a_context_entered_again_inside_its_block_leaves_its_stream_current() -> None:
    run = simdevice.cuda()
    run.run(offload_after_a_nested_helper, "current")
    run.assert_clean()
    assert run.result is not None
    assert run.result.op_counts["side"] == 2, run.result.op_counts  # both add_ after the helper's
    assert run.result.op_counts["default"] == 1, run.result.op_counts  # zeros


def test_the_stream_that_did_not_write_is_no_edge() -> None:
    run = simdevice.cuda().run(offload_after_a_nested_helper, "default")
    races = [r for r in run.reports if isinstance(r, simdevice.Race)]
    assert len(races) == 1, run.reports
    text = str(races[0])
    assert text.startswith("race: _to_copy (D2H) on stream d2h #0 ("), text
    assert "which add_ on stream side #1 (" in text, text


def test_contexts_left_out_of_order_each_restore_what_they_kept() -> None:
    """A pre-hook enters ``a``'s context and ``b``'s, the hooks leave ``a``'s first: torch makes the default stream
    current (what ``a``'s kept), then ``a`` (what ``b``'s kept)."""
    with simdevice.cuda() as sim:
        a, b = torch.cuda.Stream(), torch.cuda.Stream()
        on_a, on_b = torch.cuda.stream(a), torch.cuda.stream(b)
        seen = []
        on_a.__enter__()
        on_b.__enter__()
        seen.append(torch.cuda.current_stream())
        on_a.__exit__(None, None, None)
        seen.append(torch.cuda.current_stream())
        on_b.__exit__(None, None, None)
        seen.append(torch.cuda.current_stream())
        assert seen == [b, torch.cuda.default_stream(), a]
        torch.cuda.set_stream(torch.cuda.default_stream())
    sim.assert_clean()


def test_the_gpu_confirmation_s_program_is_clean() -> None:
    """``tests/hazards.py::reentered_stream_context`` (what tests/gpu runs): the context's stream is current after
    the re-entered block, so the fill and the D2H are on one stream, clean under a stall of either."""
    from reference.schedule import Schedule
    from simdevice.search.targets import resolve

    for line in ("tests/hazards.py::reentered_stream_context", "tests/hazards.py::reentered_stream_context::s#0+20",
                 "tests/hazards.py::reentered_stream_context::default#0+20"):
        s = Schedule.parse(line)
        out = resolve(s.program).run(s)
        assert out.clean, (line, out.verdict())
