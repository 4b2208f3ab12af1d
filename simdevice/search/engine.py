"""How the tool drives Hypothesis: the settings of a schedule search, and where Hypothesis may write.

A search runs with no deadline and no health checks (a schedule is a small value, a run takes what it takes),
derandomized unless a seed is given, and with no example database unless one is asked for (``--db DIR``, or a
database in the user's own Hypothesis settings). Hypothesis also keeps a cache of the constants it finds in the
modules it runs (``.hypothesis/constants`` in the current directory); :func:`storage` points that at the
user's cache directory while a search runs, so that nothing appears where the user did not ask, unless the
user chose the place (``HYPOTHESIS_STORAGE_DIRECTORY``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from hypothesis import HealthCheck, Phase, settings
from hypothesis import configuration as hypothesis_configuration
from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase


def cache_dir() -> Path:
    """Where the tool keeps what it may keep between runs: ``$XDG_CACHE_HOME/simdevice`` (``~/.cache/simdevice``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "simdevice"


def database(path: str | os.PathLike[str] | None) -> ExampleDatabase | None:
    """The example database at ``path`` (a directory, made when first written), or None: none."""
    return DirectoryBasedExampleDatabase(os.fspath(path)) if path is not None else None


def search_settings(
    max_examples: int = 150,
    shrink: bool = True,
    derandomize: bool = True,
    db: ExampleDatabase | None = None,
) -> settings:
    """The Hypothesis settings of a schedule search: no deadline, no health checks, the database only if given
    (then its saved failures are replayed first)."""
    phases = [Phase.generate, Phase.shrink] if shrink else [Phase.generate]
    if db is not None:
        phases.insert(0, Phase.reuse)
    return settings(
        max_examples=max_examples,
        database=db,
        derandomize=derandomize and db is None,
        deadline=None,
        phases=phases,
        suppress_health_check=list(HealthCheck),
    )


_HOME = "__hypothesis_home_directory"


@contextlib.contextmanager
def storage() -> Iterator[None]:
    """While the block runs, Hypothesis's own files (its constants cache) go under :func:`cache_dir`, not the
    current directory; as the user chose, if ``HYPOTHESIS_STORAGE_DIRECTORY`` is set."""
    if os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
        yield
        return
    previous = vars(hypothesis_configuration).get(_HOME)
    hypothesis_configuration.set_hypothesis_home_dir(cache_dir() / "hypothesis")
    try:
        yield
    finally:
        hypothesis_configuration.set_hypothesis_home_dir(previous)
