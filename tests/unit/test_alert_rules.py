"""Each built-in alert rule as a pure function on synthetic snapshot sequences: firing, clearing, flapping, start-up
and eval spans. Time is the snapshots' ``t``; thresholds are scaled down through the same config a tm.toml gives."""

from __future__ import annotations

import math

import pytest

from trainmeter_core.model import records
from trainmeter_core.model.alerts import (
    BUILTIN_RULES,
    Died,
    DiskFull,
    GpuEcc,
    GpuIdle,
    GpuLost,
    GpuThrottle,
    GpuXid,
    HostMemory,
    Hung,
    LossNan,
    LossSpike,
    Straggler,
    ThroughputDrop,
    check_tm_toml,
)
from trainmeter_core.model.alerts.episodes import Alerter, rule_config
from trainmeter_core.model.alerts.training import hung_threshold_s, is_stepping


def mv(value: float | None, label: str | None = None, absent: str | None = None) -> records.MetricValue:
    return records.MetricValue(value=value, label=label, absent=absent if value is None else None)


def snap(t: float, final: bool = False, steps: int = 0, ranks=(), series=None, **metrics) -> records.Snapshot:
    """A snapshot at time ``t`` (tick ``t`` too); keyword metrics take a number, or a MetricValue for a label.
    A "." in a metric key is written "__" here (``disk_free__run`` is ``disk_free.run``)."""
    values = {
        k.replace("__", "."): v if isinstance(v, records.MetricValue) else mv(v) for k, v in metrics.items()
    }
    return records.Snapshot(
        tick=int(t),
        t=float(t),
        final=final,
        steps=steps,
        metrics=values,
        ranks=list(ranks),
        series=series or {},
        elapsed_s=float(t),
    )


def alerter(rule, **config) -> Alerter:
    return Alerter([rule], {rule.name: rule_config(rule, config)})


def feed(alerts: Alerter, snapshots) -> list[tuple[float, str, str | None]]:
    out = []
    for snapshot in snapshots:
        out += [(a.t, a.state, a.subject) for a in alerts.observe(snapshot)]
    return out


def test_every_builtin_rule_has_a_unique_name_a_severity_and_numeric_defaults():
    names = [cls.name for cls in BUILTIN_RULES]
    assert len(set(names)) == len(names) == 14
    for cls in BUILTIN_RULES:
        assert cls.severity in ("info", "warning", "critical")
        assert all(isinstance(v, float) for v in rule_config(cls(), None).values())


# ----------------------------------------------------------------------------------------------------------------------
# hung


def stepping(t, since, median=0.5, alive=1.0, steps=100):
    return snap(t, steps=steps, since_step_s=since, step_time_median_s=median, child_alive=alive)


def test_hung_threshold_is_the_larger_of_factor_times_median_and_the_floor():
    assert hung_threshold_s(stepping(0, 1, median=2.0), 10, 300) == 300  # 10 × 2 = 20 < 300
    assert hung_threshold_s(stepping(0, 1, median=40.0), 10, 300) == 400  # 10 × 40 = 400
    assert hung_threshold_s(snap(0, since_step_s=1), 10, 300) == 300  # no median yet: the floor


def test_hung_fires_once_past_the_threshold_and_clears_when_steps_resume():
    alerts = alerter(Hung(), factor=10, floor_s=3, clear_after_s=2)
    # median 0.5 s: threshold max(5, 3) = 5 s; the last step ages 1 s per snapshot from t 10
    sequence = [
        stepping(10 + i, since=float(i)) for i in range(9)
    ]  # since 0..8: fired at since 6 (> 5), t 16
    sequence += [
        stepping(19 + i, since=0.2) for i in range(4)
    ]  # steps again from t 19: quiet, cleared at t 21
    assert feed(alerts, sequence) == [(16.0, "fired", None), (21.0, "cleared", None)]
    (fired,) = alerter(Hung(), factor=10, floor_s=3).observe(stepping(16, since=6.0))
    assert fired.severity == "critical" and fired.numbers["threshold_s"] == 5.0
    assert fired.message.startswith("no step for 6 s after step 100 while the training process lives")


def test_a_hang_that_recovered_is_resolved_when_the_run_ends_before_the_clear_wait():
    # The default clear wait (10 s) outlasts the run: hung at t 16 (since 6 > 5), steps again from t 19, and the run
    # ends with exit 0 at t 20.5, 0.1 s after its last step (1.5 s after it recovered).
    alerts = alerter(Hung(), factor=10, floor_s=3)
    sequence = [stepping(10 + i, since=float(i)) for i in range(9)]
    sequence += [stepping(19, since=0.2), stepping(20, since=0.1)]
    sequence += [snap(20.5, final=True, steps=170, since_step_s=0.1, step_time_median_s=0.5, child_alive=0.0)]
    assert feed(alerts, sequence) == [(16.0, "fired", None), (20.5, "cleared", None)]
    assert alerts.open_episodes() == []
    cleared = alerter(Hung(), factor=10, floor_s=3)
    feed(cleared, sequence[:-1])
    (record,) = cleared.observe(sequence[-1])
    assert record.message == (
        "cleared at the run's end after 4 s: it stepped until the end: its last step came 0.1 s before the run "
        "ended, after 170 steps"
    )  # fired since t 16 (the snapshot it was seen at), cleared at t 20.5: 4.5 s, shown as 4


def test_a_run_that_ends_while_hung_stays_hung_and_a_stall_at_the_end_fires_nothing():
    hung = [stepping(10 + i, since=float(i)) for i in range(9)]  # fired at t 16
    # killed at t 30 with no step since t 10 (20 s > 5): still hung at its end
    killed = snap(30, final=True, steps=100, since_step_s=20.0, step_time_median_s=0.5, child_alive=0.0)
    assert feed(alerter(Hung(), factor=10, floor_s=3), [*hung, killed]) == [(16.0, "fired", None)]
    # a run whose last step came 8 s before its end, and no tick saw it stalled while alive: nothing fires at the end
    quiet = [stepping(10, since=1.0), stepping(11, since=2.0)]
    late = snap(17, final=True, steps=100, since_step_s=8.0, step_time_median_s=0.5, child_alive=0.0)
    assert feed(alerter(Hung(), factor=10, floor_s=3), [*quiet, late]) == []


def test_hung_never_fires_at_start_up_or_once_the_process_is_gone():
    alerts = alerter(Hung(), factor=10, floor_s=3)
    before_first_step = [
        snap(t, child_alive=1.0, since_step_s=mv(None, absent="no training step yet")) for t in range(60)
    ]
    gone = [stepping(60 + i, since=10.0 + i, alive=0.0) for i in range(10)]
    assert feed(alerts, before_first_step + gone) == []


# ----------------------------------------------------------------------------------------------------------------------
# throughput drop

SCALED = dict(
    warmup_s=5,
    min_samples=5,
    fire_after_s=3,
    clear_after_s=3,
    baseline_window_s=100,
    pause_holdoff_s=5,
)


def rate(t, tokens_per_s, steps=None, since_pause=None):
    extra = {} if since_pause is None else {"since_pause_s": mv(since_pause, label="eval")}
    return snap(t, steps=steps if steps is not None else int(t), tokens_per_s_median=tokens_per_s, **extra)


def test_throughput_drop_fires_after_a_sustained_drop_and_clears_after_recovery():
    alerts = alerter(ThroughputDrop(), **SCALED)
    sequence = [rate(t, 1000.0) for t in range(0, 30)]
    sequence += [
        rate(t, 500.0) for t in range(30, 40)
    ]  # 50 % < 70 % from t 30: fired at t 33 (3 s sustained)
    sequence += [rate(t, 1000.0) for t in range(40, 50)]  # back from t 40: cleared at t 43
    assert feed(alerts, sequence) == [(33.0, "fired", None), (43.0, "cleared", None)]


def test_throughput_drop_numbers_say_the_rate_its_median_and_the_ratio():
    alerts = alerter(ThroughputDrop(), **dict(SCALED, fire_after_s=0))
    fired = [a for s in [rate(t, 1000.0) for t in range(20)] + [rate(20, 400.0)] for a in alerts.observe(s)]
    (alert,) = fired
    # 400 / 1000 = 0.4
    assert alert.numbers == {
        "tokens_per_s": 400.0,
        "median_tokens_per_s": 1000.0,
        "ratio": 0.4,
        "fraction": 0.7,
    }
    assert alert.message == "tokens/s 400 is 40% of its running median 1000 (alert below 70%)"


def test_throughput_drop_holds_during_start_up():
    alerts = alerter(ThroughputDrop(), **dict(SCALED, warmup_s=20))
    # slow ramp-up for 20 s (compile, warm caches), then steady: the ramp is never judged, nor made the baseline
    sequence = [rate(t, 100.0 + 45 * t) for t in range(0, 20)] + [rate(t, 1000.0) for t in range(20, 60)]
    assert feed(alerts, sequence) == []


def test_throughput_drop_holds_during_and_just_after_an_eval_span():
    alerts = alerter(ThroughputDrop(), **SCALED)
    sequence = [rate(t, 1000.0) for t in range(0, 30)]
    # an eval ended at t 30; for 5 s after it the rate is low (the step that waited), then normal
    sequence += [rate(t, 300.0, since_pause=t - 30.0) for t in range(30, 35)]
    sequence += [rate(t, 1000.0, since_pause=t - 30.0) for t in range(35, 50)]
    assert feed(alerts, sequence) == []


def test_throughput_drop_keeps_its_baseline_while_low_and_has_hysteresis():
    alerts = alerter(ThroughputDrop(), **SCALED)
    sequence = [rate(t, 1000.0) for t in range(0, 30)]
    sequence += [
        rate(t, 500.0) for t in range(30, 230)
    ]  # low for 200 s, twice the baseline window: still fired
    sequence += [rate(t, 800.0) for t in range(230, 260)]  # 80 %: above 70 % but below the 85 % to clear
    assert feed(alerts, sequence) == [(33.0, "fired", None)]
    assert feed(alerts, [rate(t, 900.0) for t in range(260, 270)]) == [(263.0, "cleared", None)]


def test_throughput_drop_uses_steps_per_second_when_tokens_are_unknown():
    alerts = alerter(ThroughputDrop(), **dict(SCALED, fire_after_s=0))
    sequence = [snap(t, steps=t, step_time_median_s=0.1) for t in range(20)]
    alert = feed(alerts, sequence + [snap(20, steps=20, step_time_median_s=0.25)])
    # 1 / 0.25 = 4 steps/s against a median of 1 / 0.1 = 10: 40 %
    assert alert == [(20.0, "fired", None)]


def test_a_stall_does_not_move_the_throughput_median():
    alerts = alerter(ThroughputDrop(), **SCALED)
    # no new step for 60 s (the hung rule's business): the median of per-step rates stays where it was
    sequence = [rate(t, 1000.0) for t in range(0, 30)] + [rate(t, 1000.0, steps=30) for t in range(30, 90)]
    assert feed(alerts, sequence) == []


# ----------------------------------------------------------------------------------------------------------------------
# loss


def loss(t, value, nonfinite, step=None, first=None):
    """A snapshot whose latest train_loss is ``value``; ``first``: the step of the tick's first NaN or infinite one."""
    series = {
        "train_loss": records.SeriesPoint(
            canonical="train_loss", raw_key="loss", value=value, step=step or int(t)
        )
    }
    none = mv(None, absent="no NaN or infinite train_loss since the previous tick")
    return snap(
        t,
        series=series,
        loss_nonfinite=float(nonfinite),
        loss_tick_nonfinite_step=none if first is None else float(first),
    )


def test_loss_nan_fires_at_once_and_clears_when_the_loss_stays_finite():
    alerts = alerter(LossNan(), clear_after_s=2)
    sequence = [loss(t, 2.0, 0) for t in range(5)]
    sequence += [loss(t, math.nan, t - 4) for t in range(5, 8)]  # NaN at t 5, 6, 7
    sequence += [loss(t, 1.9, 3) for t in range(8, 12)]  # finite from t 8: cleared at t 10
    assert feed(alerts, sequence) == [(5.0, "fired", None), (10.0, "cleared", None)]
    (fired,) = alerter(LossNan()).observe(loss(5, math.inf, 1, step=41))
    assert fired.message == "train_loss is inf at step 41 (1 NaN or infinite values so far)"


def test_loss_nan_names_the_first_nan_step_of_the_episode_not_the_latest():
    # 20 steps a snapshot, NaN from step 101: the snapshot at step 120 holds 20 of them, the first at step 101.
    (fired,) = alerter(LossNan()).observe(loss(6, math.nan, 20, step=120, first=101))
    assert fired.message == (
        "train_loss is nan (the first NaN or infinite value at step 101; 20 so far, the latest at step 120)"
    )
    assert (fired.numbers["step"], fired.numbers["latest_step"]) == (101.0, 120.0)


def test_loss_nan_that_fires_later_still_names_the_step_where_its_condition_began():
    # fire_after_s 2: the condition holds from t 6 (first NaN at step 101), it fires at t 8 and names step 101.
    alerts = alerter(LossNan(), fire_after_s=2)
    sequence = [loss(5, 2.0, 0, step=100)]
    sequence += [loss(t, math.nan, 20 * (t - 5), step=20 * t, first=20 * t - 19) for t in (6, 7, 8)]
    fired = [a for s in sequence for a in alerts.observe(s)]
    assert [(a.t, a.state) for a in fired] == [(8.0, "fired")]
    assert fired[0].numbers["step"] == 101.0 and "at step 101; 60 so far" in fired[0].message


def test_a_second_nan_episode_names_its_own_first_step():
    alerts = alerter(LossNan(), clear_after_s=1, flap_window_s=0)
    sequence = [loss(1, math.nan, 3, step=12, first=10), loss(2, 1.5, 3, step=20), loss(3, 1.4, 3, step=30)]
    sequence += [loss(4, math.nan, 5, step=40, first=37)]
    fired = [a for s in sequence for a in alerts.observe(s) if a.state == "fired"]
    assert [a.numbers["step"] for a in fired] == [10.0, 37.0]


def test_a_nan_between_two_snapshots_still_fires():
    alerts = alerter(LossNan())
    feed(alerts, [loss(1, 2.0, 0)])
    (fired,) = alerts.observe(
        loss(2, 1.9, 1, step=30, first=27)
    )  # one NaN came and went between the snapshots
    assert fired.numbers["new_nonfinite_values"] == 1.0 and fired.numbers["step"] == 27.0
    assert fired.message == (
        "1 NaN or infinite train_loss values since the previous check, the first at step 27; latest 1.9 at step 30"
    )


def test_loss_rules_say_nothing_without_a_loss():
    alerts = Alerter([LossNan(), LossSpike()])
    quiet = snap(1, loss_nonfinite=mv(None, absent="no train_loss reported"), loss_tick_max=mv(None))
    assert feed(alerts, [quiet]) == []


def test_loss_spike_fires_far_above_the_recent_range_and_clears_back_within_it():
    alerts = alerter(LossSpike(), min_points=5, window=10, clear_after_s=2)
    steady = [snap(t, loss_tick_max=2.0 + 0.1 * (t % 5)) for t in range(10)]  # range 2.0..2.4
    # limit 2.4 + max(1 × 0.4, 0.1 × 2.4) = 2.8: 3.5 fires; spikes stay out of the window
    spike = [snap(t, loss_tick_max=3.5) for t in range(10, 13)]
    back = [snap(t, loss_tick_max=2.2) for t in range(13, 17)]  # within range from t 13: cleared at t 15
    assert feed(alerts, steady + spike + back) == [(10.0, "fired", None), (15.0, "cleared", None)]


def test_loss_spike_holds_until_it_has_min_points_and_between_losses():
    alerts = alerter(LossSpike(), min_points=5)
    wild = [snap(t, loss_tick_max=v) for t, v in enumerate([10.0, 2.0, 2.1, 50.0, 2.2])]
    no_loss = [
        snap(t, loss_tick_max=mv(None, absent="no finite train_loss since the previous tick"))
        for t in range(5, 9)
    ]
    assert feed(alerts, wild + no_loss) == []


# ----------------------------------------------------------------------------------------------------------------------
# straggler


def ranks(t, *step_times, steps=30):
    stats = [
        records.RankStat(rank=i, host="n1", steps=steps, step_time_s=s) for i, s in enumerate(step_times)
    ]
    return snap(t, ranks=stats)


def test_a_slow_rank_is_a_straggler_after_it_stays_slow():
    alerts = alerter(Straggler(), margin=0.25, fire_after_s=2, clear_after_s=2)
    # rank 1 at 0.2 s against 0.1: 2 × > 1.25 × from t 0, fired at t 2; equal again from t 5, cleared at t 7
    sequence = [ranks(t, 0.1, 0.2) for t in range(5)] + [ranks(t, 0.1, 0.11) for t in range(5, 9)]
    assert feed(alerts, sequence) == [(2.0, "fired", "rank 1"), (7.0, "cleared", "rank 1")]
    (alert,) = alerter(Straggler(), fire_after_s=0).observe(ranks(0, 0.1, 0.1, 0.3))
    # rank 2: 0.3 / median(0.1, 0.1) = 3
    assert alert.numbers == {
        "rank": 2.0,
        "step_time_s": 0.3,
        "others_median_s": 0.1,
        "ratio": pytest.approx(3.0),
    }


def test_straggler_holds_with_one_rank_or_few_steps():
    alerts = alerter(Straggler(), fire_after_s=0)
    assert feed(alerts, [ranks(0, 0.1), ranks(1, 0.1, 0.5, steps=5)]) == []


# ----------------------------------------------------------------------------------------------------------------------
# died


def ended(code=None, sig=None, final=True):
    return snap(
        100,
        final=final,
        steps=42,
        exit_code=mv(code, absent="no exit code"),
        exit_signal=mv(sig, label="SIGKILL" if sig == 9 else "SIGTERM", absent="no signal"),
    )


def test_died_fires_on_a_signal_or_a_non_zero_exit_in_the_final_snapshot():
    (killed,) = Alerter([Died()]).observe(ended(sig=9.0))
    assert (killed.severity, killed.numbers["signal"]) == ("critical", 9.0)
    assert killed.message == "the training process was killed by SIGKILL (signal 9) after 42 steps"
    (failed,) = Alerter([Died()]).observe(ended(code=1.0))
    assert failed.message == "the training process exited with code 1 after 42 steps"
    (stopped,) = Alerter([Died()]).observe(ended(sig=15.0))
    assert stopped.severity == "warning"  # SIGTERM: stopped on purpose, most likely
    assert Alerter([Died()]).observe(ended(code=0.0)) == []
    assert Alerter([Died()]).observe(ended(sig=9.0, final=False)) == []


# ----------------------------------------------------------------------------------------------------------------------
# machine


def test_gpu_throttle_for_heat_fires_after_it_lasts_and_power_alone_is_info():
    alerts = alerter(GpuThrottle(), fire_after_s=3, clear_after_s=2)
    hot = {"gpu_thermal_throttle__n1/gpu0": mv(1.0, "sw_thermal"), "gpu_power_throttle__n1/gpu0": mv(0.0)}
    cool = {"gpu_thermal_throttle__n1/gpu0": mv(0.0), "gpu_power_throttle__n1/gpu0": mv(0.0)}
    sequence = [snap(t, **hot) for t in range(5)] + [snap(t, **cool) for t in range(5, 9)]
    assert feed(alerts, sequence) == [(3.0, "fired", "n1/gpu0"), (7.0, "cleared", "n1/gpu0")]
    capped = {
        "gpu_thermal_throttle__n1/gpu1": mv(0.0),
        "gpu_power_throttle__n1/gpu1": mv(1.0, "sw_power_cap"),
    }
    (alert,) = alerter(GpuThrottle(), fire_after_s=0).observe(snap(0, **capped))
    assert (alert.severity, alert.message) == ("info", "n1/gpu1 throttles for power (sw_power_cap)")
    assert alerter(GpuThrottle(), power=0, fire_after_s=0).observe(snap(0, **capped)) == []


def test_an_absent_throttle_reading_trips_nothing():
    lost = {"gpu_thermal_throttle__n1/gpu0": mv(None, absent="GPU lost")}
    assert alerter(GpuThrottle(), fire_after_s=0).observe(snap(0, **lost)) == []


def test_gpu_idle_fires_on_a_held_gpu_idle_for_its_duration_and_not_on_a_busy_one():
    alerts = alerter(GpuIdle(), fire_after_s=3, clear_after_s=2)
    # gpu0 idle (2% < 5%) from t=0, gpu1 busy throughout; gpu0 goes to work at t=6
    held = [{"held_util_gpu__n1/gpu0": 0.02, "held_util_gpu__n1/gpu1": 0.97} for _ in range(6)]
    held += [{"held_util_gpu__n1/gpu0": 0.9, "held_util_gpu__n1/gpu1": 0.97} for _ in range(4)]
    sequence = [snap(t, child_alive=1.0, **metrics) for t, metrics in enumerate(held)]
    assert feed(alerts, sequence) == [(3.0, "fired", "n1/gpu0"), (8.0, "cleared", "n1/gpu0")]
    (alert,) = alerter(GpuIdle(), fire_after_s=0).observe(snap(0, child_alive=1.0, **held[0]))
    assert alert.message == (
        "n1/gpu0 sits idle while the run holds it: GPU-Util 2%, below 5% (paid time with nothing to show)"
    )
    assert alert.numbers == {"util_gpu": 0.02, "max_util": 0.05}


def test_gpu_idle_follows_its_threshold_and_says_nothing_once_the_run_is_gone():
    half = {"held_util_gpu__n1/gpu0": 0.4}
    assert alerter(GpuIdle(), fire_after_s=0).observe(snap(0, child_alive=1.0, **half)) == []
    (alert,) = alerter(GpuIdle(), fire_after_s=0, max_util=0.5).observe(snap(0, child_alive=1.0, **half))
    assert alert.subject == "n1/gpu0"
    gone = {"held_util_gpu__n1/gpu0": 0.0}
    assert alerter(GpuIdle(), fire_after_s=0).observe(snap(0, child_alive=0.0, **gone)) == []
    absent = {"held_util_gpu__n1/gpu0": mv(None, absent="GPU lost")}
    assert alerter(GpuIdle(), fire_after_s=0).observe(snap(0, child_alive=1.0, **absent)) == []


def test_gpu_xid_fires_on_a_new_event_and_clears_after_a_quiet_while():
    alerts = alerter(GpuXid(), clear_after_s=3)
    none = {"gpu_xid__n1/gpu0": 0.0, "gpu_xid_last__n1/gpu0": mv(None, absent="no Xid event so far")}
    one = {"gpu_xid__n1/gpu0": 1.0, "gpu_xid_last__n1/gpu0": 79.0}
    sequence = [snap(0, **none), snap(1, **one)] + [snap(t, **one) for t in range(2, 6)]
    assert feed(alerts, sequence) == [(1.0, "fired", "n1/gpu0"), (5.0, "cleared", "n1/gpu0")]
    (alert,) = alerter(GpuXid()).observe(snap(1, **one))
    assert alert.message == "n1/gpu0 reported Xid 79 (GPU has fallen off the bus)"
    assert alert.numbers == {"xid_events": 1.0, "new_xid_events": 1.0, "xid": 79.0}


def test_gpu_ecc_and_gpu_lost_fire_per_gpu():
    (ecc,) = Alerter([GpuEcc()]).observe(
        snap(0, **{"gpu_ecc_uncorrected__n1/gpu1": 2.0, "gpu_ecc_uncorrected__n1/gpu0": 0.0})
    )
    assert (ecc.subject, ecc.severity, ecc.numbers) == ("n1/gpu1", "critical", {"ecc_uncorrected": 2.0})
    alerts = alerter(GpuLost(), clear_after_s=1)
    sequence = [
        snap(0, **{"gpu_lost__n1/gpu0": 1.0}),
        snap(1, **{"gpu_lost__n1/gpu0": 0.0}),
        snap(2, **{"gpu_lost__n1/gpu0": 0.0}),
    ]
    assert feed(alerts, sequence) == [(0.0, "fired", "n1/gpu0"), (2.0, "cleared", "n1/gpu0")]


def test_disk_full_names_the_role_the_path_and_what_is_left():
    full = {"disk_free__checkpoints": mv(0.03, "/data/ckpt"), "disk_avail_b__checkpoints": 3 * 2**30}
    fine = {
        "disk_free__run": mv(0.5, "/home/u/.trainmeter/runs/r"),
        "disk_free__shm": mv(None, absent="no filesystem sample yet"),
    }
    (alert,) = Alerter([DiskFull()]).observe(snap(0, **full, **fine))
    assert alert.subject == "checkpoints"
    # 1 − 0.03 = 97.0 % full; 3 GiB left
    assert alert.message == "the filesystem holding checkpoints (/data/ckpt) is 97.0% full, 3.0 GiB left"


def test_host_memory_fires_below_the_minimum_available():
    (alert,) = Alerter([HostMemory()]).observe(snap(0, node_mem_available=mv(0.02, "cgroup")))
    assert alert.message == "host memory nearly exhausted: 2.0% available (cgroup)"
    assert Alerter([HostMemory()]).observe(snap(0, node_mem_available=mv(0.5, "node"))) == []


# ----------------------------------------------------------------------------------------------------------------------
# is_stepping (the heartbeat's question)


def test_is_stepping_needs_a_live_process_and_a_recent_step():
    assert is_stepping(stepping(10, since=1.0), 10, 3)
    assert not is_stepping(stepping(10, since=6.0), 10, 3)  # past max(10 × 0.5, 3) = 5 s: hung
    assert not is_stepping(stepping(10, since=1.0, alive=0.0), 10, 3)
    starting = snap(2, child_alive=1.0, since_step_s=mv(None, absent="no training step yet"))
    assert is_stepping(starting, 10, 3) and not is_stepping(snap(4, child_alive=1.0), 10, 3)


def test_check_tm_toml_names_a_bad_builtin_table_and_a_table_that_names_no_rule_loaded():
    document = {"alerts": {"hung": {"floor_s": -5}, "hungg": {"floor_s": 1}, "disk_full": {"min_free": 0.1}}}
    builtin = (
        "died, disk_full, gpu_ecc, gpu_idle, gpu_lost, gpu_throttle, gpu_xid, host_memory, hung, loss_nan, "
        "loss_spike, "
        "node_lost, "
    )
    assert check_tm_toml(document, "/w/tm.toml") == [
        "/w/tm.toml [alerts.hungg]: no such alert rule (did you mean [alerts.hung]?); the rules loaded: "
        + builtin
        + "straggler, throughput_drop",
        "/w/tm.toml [alerts.hung] floor_s: expected a number ≥ 0, got -5",
    ]


def test_check_tm_toml_accepts_the_table_of_a_plugins_rule_when_that_rule_is_loaded():
    class MyRule:
        name = "my_rule"
        defaults = {"x": 0.5}

    document = {"alerts": {"my_rule": {"x": 1}}}
    rules = [cls() for cls in BUILTIN_RULES] + [MyRule()]
    assert check_tm_toml(document, "tm.toml", rules) == []
    assert check_tm_toml(document, "tm.toml")[0].startswith("tm.toml [alerts.my_rule]: no such alert rule; ")
    assert check_tm_toml({"alerts": []}) == [
        "tm.toml: 'alerts' must be a table of rule tables, e.g. [alerts.hung]"
    ]


def test_check_tm_toml_says_a_bare_threshold_under_alerts_belongs_in_a_rules_table():
    (line,) = check_tm_toml({"alerts": {"hung_floor_s": 60}}, "tm.toml")
    assert line.startswith(
        "tm.toml [alerts] hung_floor_s: thresholds go in a rule's table, e.g. [alerts.hung]; "
    )
