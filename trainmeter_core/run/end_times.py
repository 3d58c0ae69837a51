"""How long tm's own end took after the command ended, stage by stage: ``summary.json``'s ``tm_end_s``, and one line
naming the stages when the whole took longer than ``SLOW_END_S``. A scheduler that stops a job waits for tm to exit
(SLURM's ``KillWait``, a Kubernetes pod's grace period), so a slow end is time paid for and is said, not left to be
guessed from the outside.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

#: An end that takes longer than this says where its time went (a kill's end takes about 0.35 s on a 2-core machine).
SLOW_END_S = 1.0


class EndTimes:
    """Seconds spent in each stage of the end, in the order the stages first ran; a stage run twice adds up."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def add(self, stage: str, seconds: float) -> None:
        self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start_t = time.monotonic()
        try:
            yield
        finally:
            self.add(name, time.monotonic() - start_t)

    def total_s(self) -> float:
        return sum(self.seconds.values())

    def slow_line(self) -> str | None:
        """One line for an end longer than ``SLOW_END_S``: its stages, longest first; None for a quick one."""
        total_s = self.total_s()
        if total_s <= SLOW_END_S:
            return None
        stages = sorted(self.seconds.items(), key=lambda item: -item[1])
        parts = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in stages if seconds >= 0.01)
        return (
            f"ending the run took {total_s:.2f} s after the command ended: {parts} (summary.json: tm_end_s)"
        )
