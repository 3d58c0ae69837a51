"""How often a sampler samples, read from the environment (``TM_GPU_INTERVAL_S``, ``TM_HOST_INTERVAL_S``: the
launcher passes its flags to components that way).

A bad value never stops a sampler: it keeps its default and says, in one line, which variable and what is accepted.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping


def interval_from_env(
    name: str, default_s: float, environ: Mapping[str, str] | None = None
) -> tuple[float, str | None]:
    """A sampling interval in seconds from ``name``, and the one-line warning when its value was refused."""
    env = os.environ if environ is None else environ
    text = env.get(name, "").strip()
    if not text:
        return default_s, None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not 0.05 <= value <= 3600:
        return (
            default_s,
            f"{name}={text!r} is not a number of seconds from 0.05 to 3600: using {default_s:g} s",
        )
    return value, None
