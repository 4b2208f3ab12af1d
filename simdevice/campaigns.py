"""Long campaigns with the engines users already run: pytest-xdist and HypoFuzz (docs/campaigns.md).

``@simdevice.fuzz`` tests are Hypothesis tests, so both run them unchanged. One thing needs smoothing:

- :func:`hypofuzz_compat`: HypoFuzz 25.11 copies ``slice_comments`` (explain-phase comments) off the shrinker's
  result, an attribute Hypothesis no longer has since 6.15x; every shrunk failure then ends the worker with
  ``AttributeError``. Call it from the campaign's ``conftest.py``: it gives the attribute the empty value it had
  (no comments), and does nothing where the attribute exists.
"""

from __future__ import annotations

__all__ = ["hypofuzz_compat"]


def hypofuzz_compat() -> None:
    """Let HypoFuzz 25.11 save shrunk failures under Hypothesis releases without ``slice_comments``."""
    from hypothesis.internal.conjecture.data import ConjectureResult

    if not hasattr(ConjectureResult, "slice_comments"):
        ConjectureResult.slice_comments = {}  # type: ignore[attr-defined]
