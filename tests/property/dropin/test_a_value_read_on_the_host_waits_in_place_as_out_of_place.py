"""``masked_fill_`` and ``index_fill_``, in place, wait for the stream where their value is a 0-d device tensor and
not where it is a host tensor or a number, as their out-of-place forms (ATen reads a device value with
``value.item()``; ``test_an_op_that_reads_on_the_host_on_a_gpu_makes_the_host_wait.py`` holds what an H100
measured). Each op's value has its own place among its arguments (``masked_fill_``'s third, ``index_fill_``'s
fourth): the mask or the index, device tensors both, is not the value. Mutation caught (a sweep of the twenty-ninth
sitting's rules): ``masked_fill_``'s value looked for in its mask's place, so it waited for a host value (a wait no
GPU makes, which could hide a race)."""

from __future__ import annotations

from script_modules import load_script

SWEEP = load_script("api-sweep")

IN_PLACE = {"t.masked_fill_(m, h)": "no wait", "t.masked_fill_(m, 1.0)": "no wait", "t.masked_fill_(m, c)": "waits",
            "t.index_fill_(0, i, h)": "no wait", "t.index_fill_(0, i, c)": "waits"}


def test_an_in_place_fill_waits_for_a_device_value_alone() -> None:
    got = SWEEP.run_sim([SWEEP.EXPR + e for e in IN_PLACE], False, SWEEP.waits)
    assert {e: got[SWEEP.EXPR + e] for e in IN_PLACE} == IN_PLACE
