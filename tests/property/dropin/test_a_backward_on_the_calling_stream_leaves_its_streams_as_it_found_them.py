"""A backward whose every node runs on the calling stream, none a custom Function's, is guarded once as a whole
(CHANGELOG, twenty-sixth sitting: "a hook's ``set_stream`` no longer outlives ``backward()``"): the guard ends with
the backward, and only its own entry goes. Called inside a ``torch.cuda.stream(side)`` block, the block's end makes
the default stream current again; and a hook that sets a stream as its node ends leaves no trace on the nodes the
program makes after it (they are the default stream's, as on a GPU, so their backward runs there)."""

from __future__ import annotations

import torch

import simdevice

N = 1 << 10


def test_a_backward_inside_a_stream_block_leaves_the_default_stream_current_after_it() -> None:
    def program() -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            w = torch.ones(N, device="cuda", requires_grad=True)
            (w * 2.0).sum().backward()
            assert torch.cuda.current_stream() == side
        assert torch.cuda.current_stream() == torch.cuda.default_stream()
        torch.cuda.current_stream().wait_stream(side)
        assert float(w.grad.sum()) == 2.0 * N

    run = simdevice.cuda()
    run.run(program)
    run.assert_clean()


def test_a_hook_s_set_stream_does_not_mark_the_nodes_made_after_the_backward() -> None:
    """A post-accumulate-grad hook (the last thing its node runs) sets a stream and leaves it: on a GPU the node's
    guard ends there, so the next forward's nodes are the default stream's, and so is their backward."""

    def program() -> None:
        side = torch.cuda.Stream()
        w = torch.ones(N, device="cuda", requires_grad=True)
        hook = w.register_post_accumulate_grad_hook(lambda p: torch.cuda.set_stream(side))
        (w * 2.0).sum().backward()
        hook.remove()
        assert torch.cuda.current_stream() == torch.cuda.default_stream()
        (w * 3.0).sum().backward()
        assert float(w.grad.sum()) == 5.0 * N

    run = simdevice.cuda()
    run.run(program)
    run.assert_clean()
    assert not run.result.op_counts.get("side"), run.result.op_counts
