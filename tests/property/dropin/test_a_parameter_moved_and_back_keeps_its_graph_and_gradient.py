"""Rule (``simdevice.dispatch.move_in_place``, the session's ``Tensor.grad``): a parameter moved between the host and
the device with ``p.data =`` is, as on a GPU, where ``set_data`` keeps one tensor throughout, the tensor its graphs
accumulate into and the holder of its gradient on either side (``tests/moved_parameters.py``, run on a GPU by
``tests/gpu/test_dropin_gpu.py``). A graph made before a round trip accumulates into it, a new forward gets a new
``AccumulateGrad`` node; a device gradient stays shown on the host until cleared, and a backward run while the
parameter is on the host gives it one. Before, a backward through a graph made before the moves raised
``NotImplementedError`` and the move of a parameter with a gradient did: FSDP1's ``CPUOffload``, which does both every
step, gave no verdict (``test_fsdp1_runs_on_the_simulated_groups.py`` now trains with it). Mutations: the tensor of
the other side not taken back (the graph's gradient goes to a tensor the parameter no longer is), the accumulator not
reset (the old node reused), the gradient on the other side not shown, ``grad = None`` not clearing it, the kept
tensor keeping its bytes (the device's memory not freed by the move, as it is on a GPU)."""

from __future__ import annotations

import moved_parameters

import simdevice


def test_a_graph_made_before_a_round_trip_accumulates_into_the_parameter() -> None:
    s = simdevice.cuda()
    s.run(moved_parameters.round_trip)
    assert s.result is not None
    assert s.result.reports == (), s.result.reports
    assert s.result.result == (False, [5.0] * 4, "cuda", "cuda")


def test_a_gradient_stays_on_its_side_until_cleared() -> None:
    s = simdevice.cuda()
    s.run(moved_parameters.grad_left_behind)
    assert s.result is not None
    assert s.result.reports == (), s.result.reports
    assert s.result.result == [["cpu", "cuda", [3.0] * 4], True, "cuda", "cpu", [7.0] * 4]


def test_the_bytes_a_parameter_had_on_the_device_are_freed_when_it_moves() -> None:
    """(the tensor kept for its gradient and node holds no bytes)"""
    s = simdevice.cuda()
    s.run(moved_parameters.freed_on_the_host)
    assert s.result is not None
    assert s.result.reports == (), s.result.reports
    assert s.result.result == 4 << 20


def test_a_backward_while_the_parameter_is_on_the_other_side_gives_it_the_gradient() -> None:
    s = simdevice.cuda()
    s.run(moved_parameters.backward_on_the_host)
    assert s.result is not None
    assert s.result.reports == (), s.result.reports
    assert s.result.result == ["cpu", "cuda", [2.0] * 4]


def test_a_parameter_given_another_tensor_s_bytes_keeps_its_own_version_counter() -> None:
    """``set_data`` keeps the parameter's version counter: an in-place change of the tensor whose bytes it took does
    not make its graph's saved views stale (FSDP1's copy into its low-precision shard before a backward, with
    ``CPUOffload`` and a ``MixedPrecision`` ``param_dtype``, raised "Output 0 of T is a view ... modified inplace"
    as the program's error). Mutation: the alias ``value.detach()`` (sharing the value's counter): the same error."""
    s = simdevice.cuda()
    s.run(moved_parameters.version_of_its_own)
    assert s.result is not None
    assert s.result.reports == (), s.result.reports
    assert s.result.result == [0, 1, [4.0, 4.0, 0.0, 0.0]]


def test_a_moved_parameter_s_copies_hold_nothing_of_the_simulator_s() -> None:
    """(what is kept of the other side is kept beside the object, not in its ``__dict__``: a deep copy of a parameter
    whose device tensor was kept copied that tensor, bytes let go, and raised)"""
    s = simdevice.cuda()
    s.run(moved_parameters.copied_and_saved)
    assert s.result is not None
    assert s.result.reports == (), s.result.reports
    # (torch's Parameter.__deepcopy__ copies the values and requires_grad alone; a pickle its attributes too)
    assert s.result.result == [[], [1.0] * 4, ["tag"], [1.0] * 4]
