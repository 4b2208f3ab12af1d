"""Campaign throughput: schedules per second of ``@simdevice.fuzz`` tests under pytest-xdist and HypoFuzz, for 1
and 2 workers, measured side by side in one run (docs/campaigns.md quotes it).

- pytest-xdist: ``TESTS`` tests (the correct reload protocol of examples/offload_plain.py, so that none stops
  early), ``--examples`` schedules each, run with ``-p no:xdist`` (one process) and ``-n 2``;
- HypoFuzz: the same tests fuzzed for ``--seconds`` with ``-n 1`` and ``-n 2``.

Schedules/s: the runs of the fuzzed function (each test counts them; its probe and default run are two of them)
over the wall time of the command, process start-up and imports included.

Run: ``PYTHONPATH=. python benchmarks/bench_campaigns.py [--repeat 3] [--examples 1000] [--seconds 30]``.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = 4


def _folder(base: Path, examples: int, database: bool) -> Path:
    here = base / f"campaign-{examples}-{int(database)}"
    here.mkdir()
    (here / "offload_plain.py").write_text((ROOT / "examples" / "offload_plain.py").read_text())
    conftest = "from simdevice.campaigns import hypofuzz_compat\n\nhypofuzz_compat()\n"
    if database:
        conftest += textwrap.dedent("""
            import os
            from hypothesis import settings
            from hypothesis.database import DirectoryBasedExampleDatabase

            settings.register_profile("campaign", database=DirectoryBasedExampleDatabase(os.environ["CAMPAIGN_DB"]))
            settings.load_profile("campaign")
        """)
    (here / "conftest.py").write_text(conftest)
    (here / "test_campaign.py").write_text(textwrap.dedent("""
        import os

        import simdevice
        from offload_plain import reload_correct

        # one byte per schedule run, one file per process: the count every rate below is made of
        _runs = open(os.path.join(os.environ["RUNS_DIR"], str(os.getpid())), "ab", buffering=0)


        def counted() -> None:
            _runs.write(b".")
            reload_correct()
    """) + "".join(f"\ntest_{i} = simdevice.fuzz(counted, max_examples={examples})" for i in range(TESTS)) + "\n")
    return here


def _env(here: Path, runs: Path, db: Path | None = None) -> dict[str, str]:
    env = dict(os.environ, XDG_CACHE_HOME=str(here / "cache"), PYTHONPATH=os.pathsep.join([str(here), str(ROOT)]),
               RUNS_DIR=str(runs))
    env.pop("HYPOTHESIS_PROFILE", None)
    if db is not None:
        env["CAMPAIGN_DB"] = str(db)
    return env


def _counted(runs: Path) -> int:
    return sum(f.stat().st_size for f in runs.iterdir())


def xdist(here: Path, workers: int) -> float:
    """Schedules per second of one pytest run over the tests (``workers`` 0: no xdist)."""
    runs = Path(tempfile.mkdtemp(dir=here))
    spread = ["-p", "no:xdist"] if workers == 0 else ["-n", str(workers)]
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *spread, "test_campaign.py"],
                          cwd=here, env=_env(here, runs), capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"pytest failed:\n{proc.stdout}\n{proc.stderr}")
    return _counted(runs) / wall


def hypofuzz(here: Path, workers: int, seconds: float) -> float:
    """Schedules per second over ``seconds`` of HypoFuzz with ``workers`` processes."""
    db, runs = Path(tempfile.mkdtemp(dir=here)), Path(tempfile.mkdtemp(dir=here))
    proc = subprocess.Popen(
        [sys.executable, "-c", "from hypothesis.extra.cli import main; main()", "fuzz", "--no-dashboard", "-n",
         str(workers), "--", "test_campaign.py"],
        cwd=here, env=_env(here, runs, db), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    time.sleep(seconds)
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return _counted(runs) / seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--examples", type=int, default=1000, help="schedules per test under pytest")
    p.add_argument("--seconds", type=float, default=30, help="seconds per HypoFuzz campaign")
    p.add_argument("--no-hypofuzz", action="store_true")
    args = p.parse_args()
    print(f"{os.cpu_count()} cores; {TESTS} tests of examples/offload_plain.py::reload_correct", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        here = _folder(base, args.examples, database=False)
        runs: dict[str, list[float]] = {"pytest, 1 process": [], "pytest -n 2": []}
        for _ in range(args.repeat):  # interleaved: 1 and 2 workers side by side
            runs["pytest, 1 process"].append(xdist(here, 0))
            runs["pytest -n 2"].append(xdist(here, 2))
        if not args.no_hypofuzz:
            fuzz_here = _folder(base, 10**9, database=True)
            runs["hypothesis fuzz -n 1"], runs["hypothesis fuzz -n 2"] = [], []
            for _ in range(args.repeat):
                runs["hypothesis fuzz -n 1"].append(hypofuzz(fuzz_here, 1, args.seconds))
                runs["hypothesis fuzz -n 2"].append(hypofuzz(fuzz_here, 2, args.seconds))
        for what, rates in runs.items():
            print(f"{what:22} median {statistics.median(rates):6.1f} schedules/s  "
                  f"({', '.join(f'{r:.1f}' for r in rates)})", flush=True)
        for one, two in (("pytest, 1 process", "pytest -n 2"), ("hypothesis fuzz -n 1", "hypothesis fuzz -n 2")):
            if runs.get(one) and runs.get(two):
                ratio = statistics.median(b / a for a, b in zip(runs[one], runs[two], strict=True))
                print(f"{two} over {one}: median ratio {ratio:.2f}")


if __name__ == "__main__":
    main()
