"""The straggler through the real pipeline: four ranks' producers send their data waits, steps and collective probe
records (``collective_world``) through a real hub; an engine fed by a subscriber, as the engine component is, names
the slowed rank and its cause, and a replay of the log the recorder wrote gives the same snapshots."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time

from collective_world import RANKS, World, straggler_run
from deadline import wait_for

from trainmeter_core.bus import client as bus
from trainmeter_core.bus.hub import Hub
from trainmeter_core.model import records
from trainmeter_core.model.engine import Engine
from trainmeter_core.runlog import replay
from trainmeter_core.runlog.recorder import Recorder

END = records.RunEnd(status=0, reason="exited", elapsed_s=1.0)


@contextlib.contextmanager
def running_hub(short_dir, log_dir):
    recorder = Recorder(log_dir)
    hub = Hub(f"ipc://{short_dir}/in", f"ipc://{short_dir}/out", recorder)
    recorder.start()
    hub.start()
    try:
        yield hub
    finally:
        hub.finish(END)
        recorder.close()


def test_a_slowed_rank_is_named_through_the_hub_and_the_replay_equals_live(short_dir, tmp_path):
    world = World(seed=13)
    world.now_s = time.monotonic()  # the hub's ticks are on this clock: the steps are too
    live = Engine()
    snapshots: list[records.Snapshot] = []
    with running_hub(short_dir, tmp_path) as hub:
        sub = bus.Subscriber(hub.out_endpoint, Engine.FED_KINDS)
        producers = {r: bus.Producer(hub.in_endpoint, "agent", rank=r) for r in range(RANKS)}
        try:
            start = records.RunStart(host="n1", run_id="r", name="ddp", run_dir=str(tmp_path), command=["torchrun"],
                                     cwd="/", tm_version="0", python="3.11", platform="linux")  # fmt: skip
            producers[0].send(start)
            first: list[records.Record] = []
            wait_for(lambda: first.append(sub.recv(0.05)) or first[-1] is not None, what="the subscription")
            snapshots += live.feed(first[-1])  # the run.start, or a tick
            sent = 0
            for step in range(120):
                if step == 60:
                    world.slow_data[1] = 0.2  # rank 1 waits 200 ms longer for its data from step 61 on
                batch = list(world.steps(1))
                for record in batch:
                    producers[record.rank].send(record)
                sent += len(batch)
            wait_for(lambda: hub.kinds.get("step", 0) >= 120 * RANKS, what="every step at the hub")
            wait_for(lambda: hub.kinds.get("tick", 0) >= 1, timeout_s=30, what="a tick")
            while True:
                record = sub.recv(2.0)
                if record is None:
                    break
                snapshots += live.feed(record)
                if (
                    isinstance(record, records.Tick)
                    and live.state.ranks
                    and all(s.steps == 120 for s in live.state.ranks.values())
                ):
                    break
        finally:
            for producer in producers.values():
                producer.close()
            sub.close()
    assert sent == 120 * RANKS * 3  # a data wait, a collectives metric and a step per rank and step
    final = live.snapshot()
    assert final.metrics["straggler_rank"].value == 1.0
    assert final.metrics["straggler_wait_s"].label == "data wait"
    assert final.metrics["straggler_rank"].label == "n1"
    assert all(r.collective_steps == 120 for r in final.ranks)
    # Replay equals live: the snapshots the live engine made, the log's replay makes with the same communication
    # numbers and ranks (the rest may differ by where the live subscription began: its first record starts its clock)
    replayed = {s.tick: s for s in replay.snapshots(tmp_path)}
    assert snapshots, "no tick reached the live engine"
    for mine in snapshots:
        theirs = replayed[mine.tick]
        assert communication(mine) == communication(theirs) and mine.ranks == theirs.ranks


def communication(snapshot: records.Snapshot) -> dict[str, records.MetricValue]:
    keys = ("collective_wait_s", "straggler_", "bus_bandwidth_bps.")
    return {k: v for k, v in snapshot.metrics.items() if k.startswith(keys)}


def test_tm_view_json_gives_the_straggler_and_each_ranks_communication(tm_env, tmp_path):
    run_dir = tmp_path / "runs" / "20260101T000000Z-n1-ddp"
    run_dir.parent.mkdir()
    straggler_run(run_dir)
    shown = subprocess.run(
        ["tm", "view", "--json", str(run_dir)], env=tm_env, capture_output=True, text=True, timeout=120
    )
    assert shown.returncode == 0, shown.stderr
    snapshot = json.loads(shown.stdout)
    metrics = snapshot["metrics"]
    assert metrics["straggler_rank"] == {"value": 2.0, "label": "n1"}
    assert metrics["straggler_wait_s"]["label"] == "compute"
    assert sorted(k for k in metrics if k.startswith("bus_bandwidth_bps.")) == [
        f"bus_bandwidth_bps.all_reduce.4.rank{r}" for r in range(RANKS)
    ]
    (slow,) = [r for r in snapshot["ranks"] if r["rank"] == 2]
    assert set(slow) >= {"collective_wait_s", "data_wait_s", "compute_s", "collective_steps"}
