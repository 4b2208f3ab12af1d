"""The GPU timeline's form (``reference.cuda.timeline_entries``): the simulator's trace format, in time order; and
``replay --trace --gpu`` without a GPU is one line and exit 2. The events themselves are tested on a GPU
(tests/gpu/test_timeline_gpu.py)."""

from __future__ import annotations

import torch

from reference.cuda import _copy_kind, timeline_entries
from simdevice.search.execute import Outcome


def test_entries_are_the_simulators_trace_format_in_time_order() -> None:
    host = [(0, "host", "copy_"), (2_000_000, "host", "synchronize")]
    ops = [("d2h", 0, "copy_ (D2H)", 0.5, 1.75), ("default", 0, "mul_", 0.0, 0.5)]
    assert timeline_entries(host, ops) == (
        (0, "host", "copy_"),
        (0, "default", "start mul_ #0"),
        (500_000, "d2h", "start copy_ (D2H) #0"),
        (500_000, "default", "done mul_ #0"),
        (1_750_000, "d2h", "done copy_ (D2H) #0"),
        (2_000_000, "host", "synchronize"),
    )


def test_a_start_sorts_before_a_done_at_the_same_instant_and_host_steps_first() -> None:
    entries = timeline_entries([(1_000_000, "host", "record")], [("s", 3, "add", 1.0, 1.0)])
    assert [w for _, _, w in entries] == ["record", "start add #3", "done add #3"]


def test_a_streams_next_operation_starting_as_the_last_ends_comes_after_its_done() -> None:
    entries = timeline_entries([], [("d2h", 1, "copy_ (D2H)", 1.0, 2.0), ("d2h", 0, "copy_ (D2H)", 0.0, 1.0)])
    assert [w for _, _, w in entries] == ["start copy_ (D2H) #0", "done copy_ (D2H) #0", "start copy_ (D2H) #1",
                                          "done copy_ (D2H) #1"]


def test_an_op_between_host_tensors_keeps_its_name() -> None:
    a, b = torch.zeros(2), torch.ones(2)
    assert _copy_kind(torch.ops.aten.copy_.default, (a, b)) == "copy_"
    assert _copy_kind(torch.ops.aten.mul_.Tensor, (a, b)) == "mul_"
    assert _copy_kind(torch.ops.aten._to_copy.default, (a,), {"dtype": torch.float16}) == "_to_copy"
    # a copy that stays on the host keeps its plain name
    assert _copy_kind(torch.ops.aten._to_copy.default, (a,), {"device": torch.device("cpu")}) == "_to_copy"


def test_trace_text_prints_a_gpu_runs_trace_as_the_simulators() -> None:
    from reference.contract import Run
    from reference.schedule import Schedule

    run = Run(result=None, trace=((1_234_000, "d2h", "start copy_ (D2H) #0"),))
    text = Outcome(Schedule.parse("offload_reload/racy"), run, (), backend="cuda").trace_text()
    assert text == "     1.234  d2h              start copy_ (D2H) #0\n"
