"""The dashboard's state of a run (DashboardState): the engine's snapshots and history (fed as the bus carries them,
by the engine component's own code), plus alerts, the run's identity and tm's overhead."""

from __future__ import annotations

import msgspec
from live_run import feed as feed_both

from trainmeter_core.model import records
from trainmeter_core.model.history import History
from trainmeter_web.dashboard_state import DashboardState, encode, series_group

WALL0 = 1_700_000_000.0


class Feed:
    """Records with hub sequence numbers and a clock that moves as the test says."""

    def __init__(self, model: DashboardState) -> None:
        self.model = model
        self.seq = 0
        self.t = 100.0

    def __call__(self, record: records.Record) -> bool:
        self.seq += 1
        record.seq = self.seq
        if not record.t:
            record.t = self.t
            record.wall = WALL0 + self.t
        return feed_both(self.model, record)


def declared(name: str, value) -> records.Fact:
    return records.Fact(name=name, value=value, provenance="declared", origin=f"--{name.replace('_', '-')}")


def test_a_snapshot_comes_on_each_tick_and_the_document_version_moves_with_it():
    model = DashboardState()
    feed = Feed(model)
    assert not feed(records.Step(step=1, tokens_global=1000))
    version = model.version
    assert feed(records.Tick(n=1, interval_s=1.0))
    assert model.version == version + 1
    assert model.snapshot is not None and model.snapshot.tick == 1


def test_the_model_serves_the_engines_snapshot_and_never_an_older_one():
    model = DashboardState()
    assert model.feed(records.Snapshot(tick=9, seq=5, through_seq=4))
    assert model.snapshot is not None and model.snapshot.tick == 9
    assert (
        model.through_seq == 0
    )  # a snapshot is the engine's: the model's own place in the log does not move
    assert not model.feed(records.Snapshot(tick=8, seq=3, through_seq=2))  # older (a checkpoint's, read late)
    assert model.snapshot.tick == 9


def test_history_deltas_wait_for_the_whole_history_then_apply_in_order():
    model = DashboardState()
    point = (0, 1.0, 10.0, float("nan"), 100.0, 2.5)

    def delta(n, inc="a"):
        return records.HistoryDelta(incarnation=inc, n=n, series=["train_loss"], points=[point])

    assert model.needs_history
    model.feed(delta(2))
    model.feed(delta(3))
    assert model.history("train_loss", "step") == []  # held: no whole history yet
    whole = History()
    whole.add_point("train_loss", *point[1:])  # the engine's history after delta 2 holds one point
    assert model.load_history(whole, "a", 2)
    # delta 2 is already in the whole history; delta 3 adds the second point
    assert [(p.x, p.value) for p in model.history("train_loss", "step")] == [(1.0, 2.5), (1.0, 2.5)]
    assert model.feed(delta(4))
    assert model.added_points("train_loss") == 3
    assert not model.feed(
        delta(6)
    )  # delta 5 is missing: out of step, left untouched, a whole history is needed
    assert model.needs_history and model.added_points("train_loss") == 3
    model.feed(delta(1, inc="b"))  # a restarted engine: held until its whole history comes
    assert model.needs_history
    # The whole history that comes may still be the old engine's (written before it died): the new engine's held
    # delta is dropped rather than asked about forever, and the new engine's next delta asks again.
    assert model.load_history(History(), "a", 6)
    assert not model.feed(delta(2, inc="b")) and model.needs_history
    assert model.load_history(History(), "b", 2) and not model.needs_history


def test_an_alert_that_fires_then_clears_is_one_entry_with_both_times():
    model = DashboardState()
    feed = Feed(model)
    fired = records.Alert(rule="hung", state="fired", message="no step for 60 s", numbers={"idle_s": 60.0})
    fired.t, fired.wall = 10.0, WALL0 + 10
    cleared = records.Alert(rule="hung", state="cleared", message="steps again")
    cleared.t, cleared.wall = 20.0, WALL0 + 20
    assert feed(fired)
    assert feed(cleared)
    assert len(model.alerts) == 1
    entry = model.alerts[0]
    assert entry["state"] == "cleared"
    assert entry["fired_wall"] == WALL0 + 10
    assert entry["cleared_wall"] == WALL0 + 20
    assert entry["message"] == "no step for 60 s"


def test_a_second_episode_of_the_same_rule_is_a_second_entry():
    model = DashboardState()
    feed = Feed(model)
    feed(records.Alert(rule="hung", state="fired", message="a", episode=1))
    feed(records.Alert(rule="hung", state="fired", message="b", episode=2))
    assert [a["message"] for a in model.alerts] == ["a", "b"]


def test_the_agents_overhead_is_its_mean_microseconds_per_step_and_drops_come_from_bus_stats():
    model = DashboardState()
    feed = Feed(model)
    feed(records.Step(step=1, agent_us=10.0))
    feed(records.Step(step=2, agent_us=30.0))
    feed(records.Step(step=3))  # a step without the agent's own time is not counted as zero
    feed(records.BusStats(received=10, published=10, malformed=0, unknown=0, dropped_total=7))
    overhead = model.overhead_doc()
    assert overhead["agent_us_per_step"] == 20.0  # (10 + 30) / 2
    assert overhead["agent_steps"] == 2
    assert overhead["dropped_total"] == 7


def test_without_agent_times_or_bus_stats_the_overhead_says_why_instead_of_zero():
    overhead = DashboardState().overhead_doc()
    assert "agent_us_per_step" not in overhead and overhead["agent_absent"]
    assert "dropped_total" not in overhead and overhead["drops_absent"]


def test_a_crashed_component_is_counted():
    model = DashboardState()
    feed = Feed(model)
    feed(records.Component(name="web", event="crashed", process="web", signal=9))
    feed(records.Component(name="web", event="restarted", process="web", restarts=1))
    assert model.overhead_doc()["component_crashes"] == {"web": 1}


def test_the_run_document_takes_the_redacted_command_from_meta_and_the_facts_with_provenance():
    meta = {"run_id": "r1", "name": "demo", "command": ["train.py", "--token", "***"], "start_wall": WALL0}
    model = DashboardState(meta=meta)
    feed = Feed(model)
    feed(declared("budget_tokens", 1000))
    feed(records.Tick(n=1, interval_s=1.0))
    doc = model.run_doc()
    assert doc["command"] == ["train.py", "--token", "***"]
    assert doc["status"] == {"state": "starting"}
    (fact,) = [f for f in doc["facts"] if f["name"] == "budget_tokens"]
    assert fact["provenance"] == "declared" and fact["origin"] == "--budget-tokens" and fact["value"] == 1000


def test_the_run_ends_finished_with_its_exit_status():
    model = DashboardState()
    feed = Feed(model)
    feed(records.RunEnd(status=3, reason="exited", exit_code=3, elapsed_s=5.0))
    assert model.run_doc()["status"]["state"] == "finished"
    assert model.run_doc()["status"]["exit_status"] == 3
    assert model.snapshot is not None and model.snapshot.final


def test_a_metric_window_is_also_given_in_wall_time():
    model = DashboardState()
    feed = Feed(model)
    feed.t = 105.0
    feed(records.SampleHost(root_pid=1, procs=1, cpu_cores=1.5))
    feed.t = 110.0
    feed(records.Tick(n=1, interval_s=1.0))
    metric = model.snapshot_doc()["metrics"]["host_cpu_cores"]
    # the tick says t 110 is wall WALL0 + 110, so the sample's t 105 is wall WALL0 + 105
    assert metric["window_end_t"] == 105.0
    assert metric["window_end_wall"] == WALL0 + 105.0
    assert "window_end_wall" not in model.live_doc()["snapshot"]["metrics"]["host_cpu_cores"]


def test_series_are_filed_by_group_from_the_engines_names():
    assert series_group("train_loss") == {"group": "loop"}
    assert series_group("tm:mfu") == {"group": "metric", "metric": "mfu"}
    assert series_group("tm:mfu.low") == {"group": "metric", "metric": "mfu", "range_end": "low"}
    assert series_group("tm:gpu:node1/gpu3:sm_active") == {
        "group": "gpu",
        "device": "node1/gpu3",
        "counter": "sm_active",
    }
    assert series_group("tm:rank:2:step_time_s") == {"group": "rank", "rank": 2, "counter": "step_time_s"}


def test_the_catalog_shows_a_mapped_series_with_its_raw_key_and_counts_its_points():
    model = DashboardState()
    feed = Feed(model)
    for step in range(1, 6):
        feed(records.Step(step=step, tokens_global=100))
        feed(records.Metric(values={"train/loss": 1.0 / step, "<b>odd key</b>": 2.0}, step=step))
    feed(records.Tick(n=1, interval_s=1.0))
    catalog = model.catalog()
    assert catalog["train_loss"]["raw_key"] == "train/loss"
    assert catalog["train_loss"]["points"] == 5
    assert catalog["<b>odd key</b>"]["group"] == "loop"
    assert "points" not in model.catalog(points=False)["train_loss"]


def test_history_is_cached_until_the_series_gains_a_point():
    model = DashboardState()
    feed = Feed(model)
    feed(records.Step(step=1))
    feed(records.Metric(values={"train_loss": 2.0}, step=1))
    feed(records.Tick(n=1, interval_s=1.0))  # the engine's points reach the model with its next snapshot
    first = model.history("train_loss", "step")
    assert model.history("train_loss", "step") is first
    feed(records.Tick(n=2, interval_s=1.0))
    assert model.history("train_loss", "step") is first  # a tick without a new loss point
    feed(records.Metric(values={"train_loss": 1.0}, step=2))
    feed(records.Tick(n=3, interval_s=1.0))
    second = model.history("train_loss", "step")
    assert second is not first
    assert [(p.x, p.value) for p in second] == [(1.0, 2.0), (2.0, 1.0)]


def test_a_history_point_is_json_x_value_min_max_count_and_nan_is_null():
    model = DashboardState()
    feed = Feed(model)
    feed(records.Step(step=1))
    feed(records.Metric(values={"train_loss": float("nan")}, step=1))
    feed(records.Tick(n=1, interval_s=1.0))
    points = model.history("train_loss", "step")
    assert msgspec.json.decode(encode(points)) == [[1.0, None, None, None, 1]]


def test_the_live_document_is_built_once_per_version():
    model = DashboardState()
    feed = Feed(model)
    feed(records.Tick(n=1, interval_s=1.0))
    doc = model.live_doc()
    assert model.live_doc() is doc
    feed(records.Tick(n=2, interval_s=1.0))
    assert model.live_doc() is not doc
    assert set(doc) == {"snapshot", "status", "overhead", "alerts", "catalog", "phases_seen", "money"}


def test_the_live_document_says_which_phases_the_probes_reported():
    model = DashboardState()
    feed = Feed(model)
    feed(records.Phase(phase="compile", start_t=1.0, end_t=3.0, probe="torch.compile", t=3.0))
    feed(records.Phase(phase="eval", start_t=4.0, end_t=4.5, probe="eval", t=4.5))
    feed(records.Phase(phase="eval", start_t=5.0, end_t=5.5, probe="eval", t=5.5))
    feed(records.Tick(n=1, interval_s=1.0))
    assert model.live_doc()["phases_seen"] == {"compile": 1, "eval": 2}


def test_without_a_price_the_dashboards_money_is_its_reason():
    model = DashboardState()
    assert model.live_doc()["money"] == {
        "absent": "no price given: --price-per-gpu-hour, TM_PRICE_PER_GPU_HOUR or tm.toml price_per_gpu_hour"
    }


def test_a_price_given_to_the_dashboard_prices_its_latest_snapshot_and_moves_the_version():
    from trainmeter_core.model import money

    model = DashboardState()
    gpu_hours = records.MetricValue(value=0.25, unit="h")
    model.feed(
        records.Snapshot(tick=3, through_seq=3, metrics={"gpu_hours": gpu_hours}, phases_s={"compute": 1.0})
    )
    before = model.version
    model.set_price(money.Price(7.3193, "EUR", "--price-per-gpu-hour"))
    assert model.version > before  # every page gets the money with its next patch
    doc = model.live_doc()["money"]
    assert doc["figures"]["spent"]["value"] == 0.25 * 7.3193
    assert doc["price"]["words"] == "price 7.3193 EUR/GPU-h from --price-per-gpu-hour"
