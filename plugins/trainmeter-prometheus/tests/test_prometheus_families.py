"""What /metrics holds for a run, from records made by hand: each number under its name, unit and labels; a range as
its two ends; an absent number absent (never 0); GPUs per device; alerts until they clear; tm's own drops and cost."""

from __future__ import annotations

import threading

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_testing import ABOUT, WHO, key, openmetrics, samples, snapshot, text
from trainmeter_prometheus.exporter import RunCollector, registry_for
from trainmeter_prometheus.identity import identity, scheduler_labels
from trainmeter_prometheus.state import ExporterState

from trainmeter_core.api import money, records


def state_with(snap: records.Snapshot) -> ExporterState:
    state = ExporterState()
    state.feed(snap)
    return state


def test_mfu_under_a_chosen_convention_is_one_sample_labelled_with_the_convention_and_the_peak_kind():
    snap = snapshot(
        mfu=records.MetricValue(value=0.4125, convention="megatron", label="datasheet"),
        mfu_avg=records.MetricValue(value=0.39, convention="megatron", label="datasheet"),
        tokens_per_s=records.MetricValue(value=20480.0, unit="tokens/s", label="ema"),
        step_time_s=records.MetricValue(value=0.1, unit="s", label="ema"),
    )
    got = samples(text(state_with(snap)))
    assert got[key("trainmeter_mfu_ratio", convention="megatron", bound="value", peak="datasheet")] == 0.4125
    assert (
        got[key("trainmeter_mfu_window_ratio", convention="megatron", bound="value", peak="datasheet")]
        == 0.39
    )
    assert got[key("trainmeter_tokens_per_second")] == 20480.0
    assert got[key("trainmeter_step_time_seconds")] == 0.1
    assert got[key("trainmeter_snapshot_tick")] == 7  # the tick these numbers come from
    assert got[key("trainmeter_steps_total")] == 40
    # one sample: no range
    assert [n for (n, _) in got if n == "trainmeter_mfu_ratio"] == ["trainmeter_mfu_ratio"]


def test_without_a_chosen_convention_mfu_and_flops_are_their_range_as_a_low_and_a_high_sample():
    snap = snapshot(
        mfu=records.MetricValue(low=0.29, high=0.34, label="datasheet+measured"),
        flop_per_token=records.MetricValue(low=741523968.0, high=859488768.0, unit="FLOP/token"),
        spent_flop=records.MetricValue(low=3.6e15, high=4.2e15, unit="FLOP"),
        **{
            "flop_per_token.titan": records.MetricValue(value=854770176.0, convention="titan"),
            "flop_per_token.hf": records.MetricValue(value=741523968.0, convention="hf"),
            "flop_per_token.megatron": records.MetricValue(absent="layers unknown: pass --layers"),
        },
    )
    got = samples(text(state_with(snap)))
    mfu = {labels: v for (name, labels), v in got.items() if name == "trainmeter_mfu_ratio"}
    peak = "datasheet+measured"
    assert mfu == {
        key("", convention="range", bound="low", peak=peak)[1]: 0.29,
        key("", convention="range", bound="high", peak=peak)[1]: 0.34,
    }
    assert got[key("trainmeter_flop_per_token", convention="range", bound="low")] == 741523968.0
    assert got[key("trainmeter_spent_flop", convention="range", bound="high")] == 4.2e15
    # each convention that can be computed, under its own name; megatron is absent, so it is not there at all
    each = {
        dict(labels)["convention"]: v
        for (n, labels), v in got.items()
        if n == "trainmeter_convention_flop_per_token"
    }
    assert each == {"titan": 854770176.0, "hf": 741523968.0}


def test_a_number_absent_in_the_snapshot_is_absent_from_metrics_never_zero():
    snap = snapshot(
        mfu=records.MetricValue(absent="no rank reported its device: pass --gpus", label="datasheet"),
        tokens_per_s=records.MetricValue(absent="tokens per step unknown: pass --tokens-per-step"),
        progress=records.MetricValue(absent="budget not declared: pass --budget-tokens"),
        step_time_s=records.MetricValue(value=0.25, unit="s", label="ema"),
    )
    exposition = text(state_with(snap))
    for name in (
        "trainmeter_mfu_ratio",
        "trainmeter_tokens_per_second",
        "trainmeter_progress_ratio",
        "trainmeter_tokens_total",
    ):
        assert name not in exposition  # not even a HELP line: the family has no sample
    assert samples(exposition)[key("trainmeter_step_time_seconds")] == 0.25


def test_every_loss_is_exported_with_its_series_and_origin_and_other_series_are_not():
    def point(name: str, value: float, origin: str, raw_key: str | None = None) -> records.SeriesPoint:
        return records.SeriesPoint(
            canonical=name, raw_key=raw_key or name, value=value, step=30, origin=origin
        )

    snap = snapshot(loss_nonfinite=records.MetricValue(value=3.0))
    snap.series = {
        "train_loss": point("train_loss", 2.25, "backward", raw_key="loss"),
        "val_loss": point("val_loss", 2.5, "emit", raw_key="eval/loss"),
        "aux_loss": point("aux_loss", float("nan"), "wandb"),
        "lr": point("lr", 3e-4, "emit"),
        "grad_norm": point("grad_norm", 1.2, "tensorboard"),
    }
    exposition = text(state_with(snap))
    got = samples(exposition)
    losses = {
        dict(labels)["series"]: (dict(labels)["origin"], v)
        for (n, labels), v in got.items()
        if n == "trainmeter_loss"
    }
    assert losses.keys() == {"train_loss", "val_loss", "aux_loss"}  # lr and grad_norm are no losses
    assert losses["train_loss"] == ("backward", 2.25) and losses["val_loss"] == ("emit", 2.5)
    origin, nan = losses["aux_loss"]
    assert origin == "wandb" and nan != nan  # a NaN loss is the loop's value: exported, for an alert to find
    assert got[key("trainmeter_loss_nonfinite_total")] == 3.0
    assert (
        'trainmeter_loss{job="20261201T000000Z-n1-train",node="n1",origin="wandb",series="aux_loss"} NaN'
        in exposition
    )


def test_a_run_that_reported_no_loss_has_no_loss_family():
    snap = snapshot(loss_nonfinite=records.MetricValue(absent="no train_loss reported"))
    snap.series = {"lr": records.SeriesPoint(canonical="lr", raw_key="lr", value=3e-4, origin="emit")}
    exposition = text(state_with(snap))
    assert "trainmeter_loss" not in exposition


def test_gpu_counters_are_per_device_in_base_units_and_a_field_the_device_lacks_is_left_out():
    state = state_with(snapshot(**{"gpu_lost.n1/gpu0": records.MetricValue(value=0.0)}))
    state.feed(
        records.SampleGpu(
            host="n1",
            index=0,
            uuid="GPU-aaaa",
            name="NVIDIA H100 80GB HBM3",
            clock_sm_mhz=1980.0,
            power_w=677.5,
            temp_c=61.0,
            mem_used_b=2**30,
            util_gpu=0.97,
            tensor_active=0.32,
            energy_j=5.5e6,
        ),
        received_s=10.0,
    )
    state.feed(records.SampleGpu(host="n2", index=1, clock_sm_mhz=1410.0, fake=True), received_s=10.0)
    got = samples(text(state, now_s=11.0))
    assert got[key("trainmeter_gpu_sm_clock_hertz", device="gpu0")] == 1.98e9  # 1980 MHz x 1e6
    assert (
        got[("trainmeter_gpu_sm_clock_hertz", frozenset({"node": "n2", "device": "gpu1"}.items()))] == 1.41e9
    )
    assert got[key("trainmeter_gpu_power_watts", device="gpu0")] == 677.5
    assert got[key("trainmeter_gpu_temperature_celsius", device="gpu0")] == 61.0
    assert got[key("trainmeter_gpu_memory_used_bytes", device="gpu0")] == 1073741824.0
    assert got[key("trainmeter_gpu_tensor_active_ratio", device="gpu0")] == 0.32
    assert got[key("trainmeter_gpu_energy_joules_total", device="gpu0")] == 5.5e6
    assert got[key("trainmeter_gpu_lost", device="gpu0")] == 0.0  # a known 0: the GPU answers
    info = {
        dict(labels)["device"]: dict(labels) for (n, labels), _ in got.items() if n == "trainmeter_gpu_info"
    }
    assert info["gpu0"]["uuid"] == "GPU-aaaa" and "fake" not in info["gpu0"]
    assert info["gpu1"]["fake"] == "true" and info["gpu1"]["node"] == "n2"
    # gpu1 (n2) reported no power: no power sample for it, while gpu0 has one
    assert [dict(labels)["device"] for (n, labels) in got if n == "trainmeter_gpu_power_watts"] == ["gpu0"]


def test_a_gpu_no_longer_sampled_drops_out_after_30_s():
    state = ExporterState()
    state.feed(records.SampleGpu(host="n1", index=0, power_w=300.0), received_s=100.0)
    still = samples(text(state, now_s=130.0))  # 30 s after its sample: still there
    assert key("trainmeter_gpu_power_watts", device="gpu0") in still
    assert "trainmeter_gpu_power_watts" not in text(state, now_s=130.5)


def test_an_alert_is_firing_until_it_clears_and_each_episode_counts_once_from_the_file_and_the_bus():
    state = state_with(snapshot())
    # alerts.jsonl said it fired (seq 31); the same record then arrives on the bus, and a second rule fires
    state.alert_line(
        {"kind": "alert", "seq": 31, "rule": "hung", "state": "fired", "severity": "critical", "message": "m"}
    )
    state.feed(records.Alert(seq=31, rule="hung", state="fired", severity="critical", message="m"))
    state.feed(records.Alert(seq=40, rule="gpu_throttle", state="fired", message="m", subject="n1/gpu0"))
    got = samples(text(state))
    assert got[key("trainmeter_alert_firing", rule="hung", severity="critical", subject="")] == 1.0
    assert (
        got[key("trainmeter_alert_firing", rule="gpu_throttle", severity="warning", subject="n1/gpu0")] == 1.0
    )
    assert got[key("trainmeter_alerts_fired_total", rule="hung", severity="critical")] == 1  # not 2
    state.feed(records.Alert(seq=52, rule="hung", state="cleared", severity="critical", message="m"))
    got = samples(text(state))
    assert [dict(labels)["rule"] for (n, labels) in got if n == "trainmeter_alert_firing"] == ["gpu_throttle"]
    assert got[key("trainmeter_alerts_fired_total", rule="hung", severity="critical")] == 1


def test_tm_s_own_drops_and_the_agent_s_time_per_rank_are_counters():
    state = state_with(snapshot())
    state.feed(
        records.BusStats(
            received=5000,
            published=5000,
            malformed=2,
            unknown=1,
            dropped_total=7,
            log_bytes=123456,
            log_queue_dropped=3,
            log_reserve_skipped=0,
        )
    )
    state.feed(records.Step(host="n1", step=1, agent_us=40.0))  # rank None: a single process is rank 0
    state.feed(records.Step(host="n1", rank=0, step=2, agent_us=60.0))
    state.feed(records.Step(host="n1", rank=0, step=3))  # no agent time: not a step of the sum
    state.feed(records.Step(host="n1", rank=1, step=1, agent_us=25.0))
    state.feed(records.Component(name="web", event="crashed", process="web"))
    got = samples(text(state))
    assert got[key("trainmeter_bus_dropped_records_total")] == 7
    assert got[key("trainmeter_bus_malformed_records_total")] == 2
    assert got[key("trainmeter_log_queue_dropped_records_total")] == 3
    assert got[key("trainmeter_log_reserve_skipped_records_total")] == 0  # a known count, from bus.stats
    assert got[key("trainmeter_log_size_bytes")] == 123456
    assert abs(got[key("trainmeter_agent_seconds_total", rank="0")] - 100e-6) < 1e-12  # 40 µs + 60 µs
    assert got[key("trainmeter_agent_steps_total", rank="0")] == 2
    assert abs(got[key("trainmeter_agent_seconds_total", rank="1")] - 25e-6) < 1e-12
    assert got[key("trainmeter_component_crashes_total", component="web")] == 1


def test_before_any_bus_stats_the_drop_counters_are_absent():
    exposition = text(state_with(snapshot()))
    assert (
        "trainmeter_bus_dropped_records" not in exposition and "trainmeter_log_size_bytes" not in exposition
    )


def test_ranks_carry_rank_node_and_device_labels():
    snap = snapshot()
    snap = records.Snapshot(
        **{f: getattr(snap, f) for f in ("tick", "t", "wall", "state", "elapsed_s", "steps")},
        ranks=[
            records.RankStat(rank=0, host="n1", steps=40, step_time_s=0.5, device="n1/gpu0"),
            records.RankStat(rank=1, host="n2", steps=39, device="n2/cpu/rank1"),
        ],
    )
    got = samples(text(state_with(snap)))
    assert got[key("trainmeter_rank_step_time_seconds", rank="0", device="gpu0")] == 0.5
    assert (
        got[
            (
                "trainmeter_rank_steps_total",
                frozenset({"node": "n2", "rank": "1", "device": "cpu/rank1"}.items()),
            )
        ]
        == 39
    )
    # rank 1 has no step time yet: no sample for it
    assert [dict(labels)["rank"] for (n, labels) in got if n == "trainmeter_rank_step_time_seconds"] == ["0"]


def test_communication_per_rank_and_the_straggler_with_its_host_and_cause():
    snap = snapshot(
        **{
            "bus_bandwidth_bps.all_reduce.4.rank2": records.MetricValue(value=3e8, unit="B/s", label="n1"),
            "bus_bandwidth_bps.barrier.4.rank2": records.MetricValue(absent="a barrier moves no data"),
            "straggler_rank": records.MetricValue(value=2.0, label="n1"),
            "straggler_wait_s": records.MetricValue(value=0.2, unit="s", label="data wait"),
        }
    )
    snap = records.Snapshot(
        **{f: getattr(snap, f) for f in ("tick", "t", "wall", "state", "elapsed_s", "steps", "metrics")},
        ranks=[
            records.RankStat(rank=2, host="n1", steps=40, step_time_s=0.32, device="n1/gpu2",
                             collective_wait_s=0.02, data_wait_s=0.2, compute_s=0.1, collective_steps=40),
            records.RankStat(rank=3, host="n1", steps=40, step_time_s=0.32, device="n1/gpu3"),
        ],
    )  # fmt: skip
    got = samples(text(state_with(snap)))
    assert got[key("trainmeter_rank_collective_wait_seconds", rank="2", device="gpu2")] == 0.02
    assert got[key("trainmeter_rank_data_wait_seconds", rank="2", device="gpu2")] == 0.2
    assert got[key("trainmeter_rank_compute_seconds", rank="2", device="gpu2")] == 0.1
    bandwidth = key(
        "trainmeter_rank_bus_bandwidth_bytes_per_second", rank="2", op="all_reduce", group_size="4"
    )
    assert got[bandwidth] == 3e8
    assert got[key("trainmeter_straggler_rank", host="n1", cause="data wait")] == 2.0
    assert got[key("trainmeter_straggler_wait_seconds")] == 0.2
    # rank 3 reported no collective: no sample for it; the barrier's bandwidth is absent: none either
    assert [
        dict(labels)["rank"] for (n, labels) in got if n == "trainmeter_rank_collective_wait_seconds"
    ] == ["2"]
    assert [dict(labels)["op"] for (n, labels) in got if n.endswith("bus_bandwidth_bytes_per_second")] == [
        "all_reduce"
    ]


def test_job_and_node_come_from_the_run_s_identity():
    meta = {"run_id": "20261201T000000Z-n1-train", "name": "train", "host": "n1"}
    who = identity(meta)
    assert (who.job, who.node) == (WHO.job, WHO.node)
    assert who.node_of("n2") == "n2" and who.node_of("") == "n1"  # a forwarded record keeps its node
    got = samples(text(state_with(snapshot())))
    info = [dict(labels) for (n, labels) in got if n == "trainmeter_run_info"]
    assert info == [
        {
            "node": "n1",
            "run_id": WHO.job,
            "run_name": "train",
            "tm_version": "0.1.0",
            "exporter_version": "0.1.0",
        }
    ]


def test_the_slurm_and_kubernetes_ids_the_run_read_are_labels_of_run_info_and_an_absent_one_is_no_label():
    meta = {
        "run_id": "20261201T000000Z-n1-train",
        "job_identity": {
            "slurm_job_id": "4242",
            "slurm_step_id": "0",
            "pod": "trainer-0",
            "namespace": "ml-team",
            "absent": {
                "slurm_array_job_id": "not a job array: no SLURM_ARRAY_JOB_ID in the environment",
                "pod_uid": "no kubepods pod folder in /proc/self/cgroup: set POD_UID from the downward API",
            },
        },
    }
    labels = scheduler_labels(meta)
    assert labels == {
        "slurm_job_id": "4242",
        "slurm_step_id": "0",
        "pod": "trainer-0",
        "namespace": "ml-team",
    }
    assert scheduler_labels({"run_id": "x"}) == {}  # a run recorded before tm read the ids
    collector = RunCollector(state_with(snapshot()), threading.Lock(), WHO, {**ABOUT, **labels}, lambda: 0.0)
    got = samples(generate_latest(registry_for(collector)).decode())
    (info,) = [dict(labels) for (n, labels) in got if n == "trainmeter_run_info"]
    assert {k: info.get(k) for k in labels} == labels
    assert "pod_uid" not in info and "slurm_array_job_id" not in info


def test_the_run_state_is_one_hot_and_before_the_first_snapshot_only_the_run_is_described():
    got = samples(text(state_with(snapshot())))
    states = {dict(labels)["state"]: v for (n, labels), v in got.items() if n == "trainmeter_run_state"}
    assert states == {"starting": 0.0, "running": 1.0, "finished": 0.0, "lost": 0.0}
    names = {n for (n, _) in samples(text(ExporterState()))}
    assert names == {"trainmeter_run_info"}


def test_the_openmetrics_exposition_carries_units_and_ends_with_eof():
    snap = snapshot(step_time_s=records.MetricValue(value=0.1, unit="s", label="ema"))
    exposition = openmetrics(state_with(snap))
    assert "# UNIT trainmeter_step_time_seconds seconds" in exposition
    assert "# TYPE trainmeter_run info" in exposition
    assert exposition.endswith("# EOF\n")


def test_every_node_of_a_job_of_several_nodes_labels_its_series_with_the_one_job():
    # meta.json of a node of a job (run/identity.py writes the job's place): the job is its id on every node, the node
    # its host, so a fleet's PromQL groups the job's nodes by `job`.
    for host, rank in (("n1", 0), ("n2", 1)):
        meta = {
            "run_id": f"20261201T000000Z-{host}-train",
            "host": host,
            "job": {
                "id": "gpt-rdzv",
                "node_rank": rank,
                "nnodes": 2,
                "hub": "n1:29501",
                "found_by": "torchrun flags",
            },
        }
        who = identity(meta)
        assert (who.job, who.node) == ("gpt-rdzv", host)


# ----------------------------------------------------------------------------------------------------------------------
# Money at the price given (never stored): labelled with its currency and source, absent without a price


def priced(price: money.Price | None) -> dict:
    from prometheus_client.exposition import generate_latest
    from prometheus_client.parser import text_string_to_metric_families
    from trainmeter_prometheus.exporter import RunCollector, registry_for

    snap = snapshot(
        gpu_hours=records.MetricValue(value=0.5, unit="h"),
        eta_s=records.MetricValue(value=1800.0, unit="s"),
    )
    snap.explain["gpu_hours"] = records.Explain(
        formula="elapsed × the run's GPUs / 3600", inputs={"n_devices": records.ExplainInput(value=4)}
    )
    snap.phases_s.update({"compute": 9.0, "checkpoint": 2.5, "startup_compile": 1.0})
    collector = RunCollector(state_with(snap), threading.Lock(), WHO, {}, clock=lambda: 0.0, price=price)
    exposition = generate_latest(registry_for(collector)).decode()
    return {
        (sample.name, frozenset((k, v) for k, v in sample.labels.items() if k != "job")): sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
    }


def test_money_is_on_metrics_at_the_price_given_with_its_currency_and_source():
    got = priced(
        money.Price(7.3193, "EUR", "TM_PROMETHEUS_PRICE_PER_GPU_HOUR (--prometheus-price-per-gpu-hour)")
    )
    labels = {
        "currency": "EUR",
        "price_source": "TM_PROMETHEUS_PRICE_PER_GPU_HOUR (--prometheus-price-per-gpu-hour)",
    }
    assert got[key("trainmeter_money_price_per_gpu_hour", **labels)] == 7.3193
    # 0.5 GPU-h × 7.3193
    assert got[key("trainmeter_money_spent", **labels)] == pytest.approx(3.65965)
    # ETA 1800 s on 4 GPUs: 2 GPU-h × 7.3193, computed from the same snapshot
    assert got[key("trainmeter_money_to_finish", **labels)] == pytest.approx(1800 / 3600 * 4 * 7.3193)
    # each badput part: its seconds × 4 GPUs × the price / 3600; compute is productive, no sample
    assert got[key("trainmeter_money_lost", part="checkpoint", **labels)] == pytest.approx(
        2.5 * 4 * 7.3193 / 3600
    )
    assert key("trainmeter_money_lost", part="compute", **labels) not in got
    assert not [
        name for name, _ in got if name == "trainmeter_money_plan"
    ]  # no plan declared: no sample, never 0


def test_without_a_price_there_is_no_money_family():
    assert not [name for name, _ in priced(None) if name.startswith("trainmeter_money")]
