"""Hypothesis profiles: ``dev`` (default), ``ci`` (derandomized, no database), ``thorough``.

Select one with ``--hypothesis-profile NAME`` or ``HYPOTHESIS_PROFILE=NAME``.
"""

import os

import torch
from hypothesis import HealthCheck, settings

# the simulated device's tensors are small: one intra-op thread, as the command line runs (two spin against each
# other and against the other pytest-xdist worker on a loaded machine)
torch.set_num_threads(1)

#: pytest's own fixture for running pytest on a user's files (the plugin's tests)
pytest_plugins = ["pytester"]

_common = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large]}

settings.register_profile("dev", max_examples=60, **_common)
settings.register_profile(
    "ci",
    parent=settings.get_profile("ci"),
    max_examples=60,
    print_blob=True,
    database=None,
    derandomize=True,
    **_common,
)
settings.register_profile("thorough", max_examples=2000, **_common)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))
