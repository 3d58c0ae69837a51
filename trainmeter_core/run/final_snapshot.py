"""The run's final snapshot at its end: the engine's, as it came over the bus, else the launcher's own replay of the
log, published only when a component (the alerts, a subscriber) listens for it. Nothing here waits for what is not
pending.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from trainmeter_core.bus.hub import Hub
from trainmeter_core.model import records
from trainmeter_core.run.end_times import EndTimes
from trainmeter_core.run.stderr_lines import Say

if TYPE_CHECKING:
    from trainmeter_core.runlog.recorder import Recorder

# The live engine answers run.end within milliseconds; past this the launcher replays from its checkpoint instead.
ENGINE_FINAL_WAIT_S = float(os.environ.get("TM_ENGINE_FINAL_WAIT_S", "0.1"))
FINAL_GRACE_S = 0.2
DIED_ALERT_WAIT_S = 3.0  # then the launcher replays from the engine's checkpoint itself


def final_snapshot(run_dir: Path, hub: Hub, say: Say) -> records.Snapshot | None:
    """The engine's final snapshot as it came over the bus; if the engine could not send it, a replay of the log."""
    data = hub.last_snapshot
    if data is not None and data.get("final"):
        try:
            snapshot = records.from_mapping(dict(data))
            if isinstance(snapshot, records.Snapshot):
                return snapshot
        except records.MalformedRecord:
            pass
    try:
        from trainmeter_core.runlog import replay

        return replay.final_snapshot(run_dir)
    except Exception as exc:  # the summary must still be written
        say(f"could not compute the run's final numbers: {type(exc).__name__}: {exc}")
        return None


def final_with_components(
    supervisor, hub: Hub, recorder: Recorder, run_dir: Path, say: Say, tm_status: int, times: EndTimes
):
    """The final snapshot while components run: the engine's when it is live, else the launcher's own replay, published
    only when a component listens for it. Returns the launcher's snapshot, or None when the engine's came. ``times``
    gets each wait: the engine's final snapshot, the alerts component, the launcher's own replay."""
    placed = {name for p in supervisor.placements for name in p.components}
    # The engine's last snapshot is computed from run.end: the one engine of the run makes it, and a live engine (one
    # that already published a snapshot) answers within milliseconds. Only when it does not (it is not up yet in a
    # short run, or it is gone) does the launcher replay from the engine's checkpoint and the log's tail itself.
    if hub.last_snapshot is not None and "engine" in placed:
        with times.stage("engine's final snapshot"):
            deadline = time.monotonic() + ENGINE_FINAL_WAIT_S
            while not (hub.last_snapshot or {}).get("final") and time.monotonic() < deadline:
                time.sleep(0.005)
    wants_alert = tm_status != 0 and "alerts" in placed
    if wants_alert:
        # A run that ended badly has an alert to say so, computed from the final snapshot by the alerts component:
        # it must be listening when the snapshot is published (a short run's components may still be starting). Once
        # it said it is done, it acted on the engine's final snapshot already and stopped listening: no alert may come
        # then (the died rule's episode may be open since an earlier attempt), and waiting for one was 3 s lost.
        with times.stage("alerts listening"):
            deadline = time.monotonic() + DIED_ALERT_WAIT_S
            while (
                "alerts" not in hub.done_components
                and not hub.listening("snapshot")
                and time.monotonic() < deadline
            ):
                time.sleep(0.01)
    snapshot = None
    if not (hub.last_snapshot or {}).get("final") and hub.listening("snapshot"):
        # Replay what the recorder has flushed (run.end included), and publish the result as the final snapshot, so
        # subscribers, the dashboard and the alert rules (a died run) get it all the same, unless the engine's came
        # meanwhile. With nobody listening, the launcher computes it after the log is closed, off the bus.
        with times.stage("launcher's replay"):
            recorder.flush(5.0)
            snapshot = final_snapshot(run_dir, hub, say)
        if snapshot is not None and not (hub.last_snapshot or {}).get("final"):
            hub.inject(snapshot)
            if not wants_alert:
                with times.stage("components' grace"):
                    time.sleep(FINAL_GRACE_S)  # let the components act on it before they are asked to stop
    if wants_alert and hub.listening("snapshot"):
        with times.stage("alerts done"):
            deadline = time.monotonic() + DIED_ALERT_WAIT_S
            while "alerts" not in hub.done_components and time.monotonic() < deadline:
                time.sleep(0.02)
        if "alerts" not in hub.done_components:
            say(f"the alerts component did not act on the final snapshot within {DIED_ALERT_WAIT_S:g} s")
    return snapshot
