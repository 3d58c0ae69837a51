"""The fake NVML's clock, moved by hand: a test says when each sample is taken (the ``clock`` fixture installs one)."""

from __future__ import annotations


class ManualClock:
    """The fake NVML's clock, moved by hand: a test says when each sample is taken."""

    def __init__(self, now_s: float = 1000.0):
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s
