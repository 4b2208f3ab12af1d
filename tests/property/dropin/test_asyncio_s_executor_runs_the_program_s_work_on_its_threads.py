"""An asyncio event loop in a run: the workers of its default executor (``loop.run_in_executor(None, fn)``,
``asyncio.to_thread``) are threads of the program's (host actors of its process), and the loop's wait on its
selector polls in virtual time, so that those workers, on the run's machine thread, go on meanwhile. Before, the
executor's workers were threads the standard library started, which the simulator does not run: the first device
call in one gave no verdict. An offload whose worker waits for its copy before the loop reads the pinned buffer is
clean under any schedule; one that does not is found. A real child process's output (``subprocess``, which waits on
a selector too) is waited for as Python waits. A mutation that leaves asyncio's executor Python's fails the first
three tests; one that polls every selector's wait in virtual time, the last.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys

import torch

import simdevice

N = 4096


def _offload(wait: bool) -> None:
    pinned = torch.empty(N, pin_memory=True)
    side = torch.cuda.Stream()
    x = torch.arange(N, dtype=torch.float32, device="cuda")

    def offload() -> None:
        side.wait_stream(torch.cuda.default_stream())
        with torch.cuda.stream(side):
            pinned.copy_(x, non_blocking=True)
        if wait:
            side.synchronize()

    async def main() -> float:
        await asyncio.get_running_loop().run_in_executor(None, offload)
        return float(pinned[-1])

    assert asyncio.run(main()) == N - 1


def _offload_waits() -> None:
    _offload(True)


def _offload_reads_early() -> None:
    _offload(False)


def test_an_executor_s_offload_that_waits_is_clean_under_any_schedule() -> None:
    found = simdevice.explore(_offload_waits, max_examples=40)
    assert found.failure is None, found.failure.text()


def test_an_executor_s_offload_the_loop_reads_before_its_copy_lands_is_found() -> None:
    found = simdevice.explore(_offload_reads_early, max_examples=40)
    assert found.failure is not None
    assert any(r.kind == "race" for r in found.failure.run.reports), found.failure.text()


def _to_thread_and_sleep() -> float:
    async def main() -> float:
        x = torch.ones(4, device="cuda")
        await asyncio.sleep(0.5)  # (a timer: the loop's selector waits with a timeout)
        return await asyncio.to_thread(lambda: float((x * 2).sum()))

    return asyncio.run(main())


def test_to_thread_and_a_timer_run_in_the_run() -> None:
    s = simdevice.cuda()
    s.run(_to_thread_and_sleep)
    assert not s.reports, s.text()
    assert s.result.result == 8.0


def _child_output() -> str:
    torch.ones(1, device="cuda")
    return subprocess.run([sys.executable, "-c", "import time; time.sleep(0.2); print('done')"],
                          capture_output=True, text=True, check=True).stdout.strip()


def test_a_child_process_s_output_is_waited_for_as_python_waits() -> None:
    s = simdevice.cuda()
    s.run(_child_output)
    assert not s.reports, s.text()
    assert s.result.result == "done"
