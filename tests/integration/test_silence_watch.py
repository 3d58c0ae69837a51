"""The silence watch's pace: a look a second while a process of the run waits for its grace to end, longer waits
while every process is judged (each wake that reads /proc costs a virtual machine about half a millisecond)."""

from __future__ import annotations

import subprocess
import sys

from trainmeter_core.run import silence
from trainmeter_core.run.silence import POLL_MAX_S, POLL_S, SilenceWatch


def _watch(root: int) -> SilenceWatch:
    return SilenceWatch(
        root, lambda pid: True, lambda: True, lambda line: None, "/nonexistent", sys.executable
    )


class _Stop:
    """A stop event that records each wait and says stop after ``waits`` of them."""

    def __init__(self, waits: int) -> None:
        self.waits: list[float] = []
        self.limit = waits

    def wait(self, timeout_s: float) -> bool:
        self.waits.append(timeout_s)
        return len(self.waits) > self.limit


def test_the_wait_doubles_while_every_process_is_judged_and_comes_back_to_a_second_for_a_young_one():
    watch = _watch(1)
    young = iter([False, False, False, False, True, False, None, False])

    def check() -> list[str]:
        waiting = next(young)
        if waiting is None:
            raise OSError("a /proc race")
        watch.waiting = waiting
        return []

    watch.check = check
    stop = _Stop(8)
    watch._run(stop)
    assert POLL_S == 1.0 and POLL_MAX_S == 4.0
    # After each look: judged, judged, judged, judged (at most POLL_MAX_S), young, judged, an error, judged
    assert stop.waits == [1.0, 2.0, 4.0, 4.0, 4.0, 1.0, 2.0, 1.0, 2.0]


def test_a_process_within_its_grace_keeps_the_watch_looking_and_a_judged_one_does_not(monkeypatch):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        watch = _watch(child.pid)
        monkeypatch.setattr(silence, "GRACE_S", 3600.0)
        assert watch.check() == [] and watch.waiting  # born just now: its grace runs
        monkeypatch.setattr(silence, "GRACE_S", 0.0)
        # Judged now (it said hello, by this test's word), and once only
        assert watch.check() == [] and not watch.waiting
        assert watch.check() == [] and not watch.waiting
        assert len(watch.done) == 1
    finally:
        child.kill()
        child.wait()
