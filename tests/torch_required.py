"""torch for the tests that need it: a failure where CI installed it (``TM_REQUIRE_TORCH=1``), else a skip saying
why. Importing this module does not import torch."""

from __future__ import annotations

import os

import pytest


def require_torch():
    """torch, or a failure when CI installed it (TM_REQUIRE_TORCH=1), or a skip that says why."""
    try:
        import torch
    except ImportError as exc:
        if os.environ.get("TM_REQUIRE_TORCH") == "1":
            pytest.fail(f"torch is required here (TM_REQUIRE_TORCH=1) but does not import: {exc}")
        pytest.skip(f"torch is not installed ({exc}); .ci/run installs it")
    return torch
