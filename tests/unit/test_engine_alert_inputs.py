"""What the engine puts in each snapshot for the alert rules: time since the last step and the median step time, the
training process alive or not, the latest eval or checkpoint span, NaN losses and the tick's largest loss, GPU health
per GPU, the GPU-Util of the GPUs the run holds (the idle-GPU alert's input), free space and memory, and the run's
exit. All from records, never from a clock."""

from __future__ import annotations

import math

from trainmeter_core.model import records
from trainmeter_core.model.alerts import GpuIdle
from trainmeter_core.model.alerts.episodes import Alerter, rule_config
from trainmeter_core.model.engine import STEP_WINDOW, Engine
from trainmeter_sources.gpu import fake_pynvml
from trainmeter_sources.gpu.sampler import GpuSession, mark_other_processes


def feed(engine: Engine, *logged) -> list[records.Snapshot]:
    out: list[records.Snapshot] = []
    for seq, record in enumerate(logged, start=(engine.state.through_seq or 0) + 1):
        record.seq = seq
        out += engine.feed(record)
    return out


def tick(n: int, t: float, alive: bool = True) -> records.Tick:
    return records.Tick(n=n, interval_s=1.0, child_alive=alive, t=t, wall=1e9 + t)


def value(snapshot: records.Snapshot, key: str) -> float | None:
    return snapshot.metrics[key].value


def steps(start_t: float, intervals: list[float], tokens: int = 1000) -> list[records.Step]:
    out, t = [records.Step(step=1, t=start_t, tokens=tokens)], start_t
    for i, interval in enumerate(intervals, start=2):
        t += interval
        out.append(records.Step(step=i, t=t, step_time_s=interval, tokens=tokens))
    return out


def test_time_since_the_last_step_grows_with_ticks_while_no_step_comes():
    engine = Engine()
    (first,) = feed(
        engine,
        records.RunStart(
            t=0.0,
            run_id="r",
            name="r",
            run_dir="/r",
            command=["x"],
            cwd="/",
            tm_version="0",
            python="3",
            platform="p",
        ),
        tick(1, 1.0),
    )
    assert first.metrics["since_step_s"].absent == "no training step yet"
    *_, snap = feed(engine, *steps(1.5, [0.5, 0.5]), tick(2, 3.0), tick(3, 4.0), tick(4, 9.0))
    # last step at 1.5 + 0.5 + 0.5 = 2.5; the tick at 9 is 6.5 s later
    assert value(snap, "since_step_s") == 6.5
    assert value(snap, "step_time_median_s") == 0.5


def test_the_medians_look_at_the_latest_steps_only_and_ignore_one_long_step():
    engine = Engine()
    # 30 intervals of 0.1 s, then one of 5 s (a stall) and three of 0.1 s: the median stays 0.1 s
    intervals = [0.1] * 30 + [5.0] + [0.1] * 3
    (snap,) = feed(engine, *steps(0.0, intervals, tokens=512), tick(1, 10.0))
    assert value(snap, "step_time_median_s") == 0.1
    # 512 tokens / 0.1 s = 5120 tokens/s, the median per-step rate
    assert math.isclose(value(snap, "tokens_per_s_median"), 5120.0)
    assert len(engine.state.recent_intervals_s) == STEP_WINDOW == 21


def test_tokens_per_s_median_is_absent_without_tokens():
    engine = Engine()
    logged = [records.Step(step=1, t=0.0), records.Step(step=2, t=0.5, step_time_s=0.5)]
    (snap,) = feed(engine, *logged, tick(1, 1.0))
    assert value(snap, "step_time_median_s") == 0.5
    assert snap.metrics["tokens_per_s_median"].absent == "tokens per step unknown: pass --tokens-per-step"


def test_child_alive_follows_the_ticks_and_is_zero_once_the_run_ended():
    engine = Engine()
    (alive,) = feed(engine, tick(1, 1.0))
    (gone,) = feed(engine, tick(2, 2.0, alive=False))
    (final,) = feed(engine, records.RunEnd(status=0, reason="exited", exit_code=0, elapsed_s=2.5, t=2.5))
    assert (value(alive, "child_alive"), value(gone, "child_alive"), value(final, "child_alive")) == (
        1.0,
        0.0,
        0.0,
    )


def test_since_pause_names_the_latest_eval_or_checkpoint_span_of_rank_0():
    engine = Engine()
    spans = [
        records.Phase(phase="eval", start_t=10.0, end_t=14.0, t=14.0),
        records.Phase(phase="data_wait", start_t=15.0, end_t=16.0, t=16.0),  # not a pause of the training
        records.Phase(
            phase="checkpoint", start_t=20.0, end_t=21.0, t=21.0, rank=1
        ),  # another rank's: not the clock's
    ]
    (snap,) = feed(engine, *steps(0.0, [1.0] * 5), *spans, tick(1, 24.0))
    # the eval ended at 14, the tick is at 24: 10 s
    assert value(snap, "since_pause_s") == 10.0 and snap.metrics["since_pause_s"].label == "eval"


def test_nan_losses_are_counted_and_the_tick_keeps_its_largest_finite_loss():
    engine = Engine()
    losses = [
        records.Metric(values={"loss": v}, t=float(i))
        for i, v in enumerate([2.5, math.nan, 3.1, math.inf, 2.0])
    ]
    (snap,) = feed(engine, *losses, tick(1, 5.0))
    assert value(snap, "loss_nonfinite") == 2.0 and value(snap, "loss_tick_max") == 3.1
    (next_snap,) = feed(engine, tick(2, 6.0))
    # no loss since the previous tick: nothing to show, with the reason
    assert next_snap.metrics["loss_tick_max"].absent == "no finite train_loss since the previous tick"
    assert value(next_snap, "loss_nonfinite") == 2.0
    (quiet,) = feed(Engine(), tick(1, 1.0))
    assert quiet.metrics["loss_nonfinite"].absent == "no train_loss reported"


def test_the_tick_names_the_step_of_its_first_nan_loss_or_says_it_had_none():
    engine = Engine()
    logged = [
        records.Metric(values={"loss": math.nan}, t=0.5),  # before any step: a NaN with no step to name
        tick(1, 1.0),
        records.Step(step=1, t=1.5),
        records.Metric(values={"loss": 2.5}, step=1, t=1.6),
        records.Metric(values={"loss": math.inf}, step=2, t=1.7),
        records.Metric(values={"loss": math.nan}, step=3, t=1.8),
        tick(2, 2.0),
        tick(3, 3.0),
    ]
    first, second, third = feed(engine, *logged)
    assert first.metrics["loss_tick_nonfinite_step"].absent == (
        "the first NaN or infinite train_loss since the previous tick came with no step"
    )
    assert value(second, "loss_tick_nonfinite_step") == 2.0 and value(second, "loss_nonfinite") == 3.0
    assert (
        third.metrics["loss_tick_nonfinite_step"].absent
        == "no NaN or infinite train_loss since the previous tick"
    )
    assert Engine().snapshot().metrics["loss_tick_nonfinite_step"].absent == "no train_loss reported"


def test_gpu_health_per_gpu_throttle_xid_ecc_and_lost():
    engine = Engine()
    samples = [
        records.SampleGpu(index=0, host="n1", t=1.0, throttle=["sw_power_cap"], xid=[13], ecc_uncorrected=0),
        records.SampleGpu(
            index=0, host="n1", t=2.0, throttle=["hw_slowdown", "sw_thermal"], xid=[79, 48], ecc_uncorrected=2
        ),
        records.SampleGpu(
            index=1,
            host="n1",
            t=2.0,
            absent={f: "GPU lost" for f in ("throttle", "ecc_uncorrected", "util_gpu")},
        ),
    ]
    (snap,) = feed(engine, *samples, tick(1, 3.0))
    m = snap.metrics
    # hw_slowdown is either heat or power (nvml.h): it counts as both
    assert (m["gpu_power_throttle.n1/gpu0"].value, m["gpu_power_throttle.n1/gpu0"].label) == (
        1.0,
        "hw_slowdown",
    )
    assert (m["gpu_thermal_throttle.n1/gpu0"].value, m["gpu_thermal_throttle.n1/gpu0"].label) == (
        1.0,
        "hw_slowdown,sw_thermal",
    )
    # 1 + 2 Xid events over the two samples; the latest is 48
    assert (value(snap, "gpu_xid.n1/gpu0"), value(snap, "gpu_xid_last.n1/gpu0")) == (3.0, 48.0)
    assert value(snap, "gpu_ecc_uncorrected.n1/gpu0") == 2.0 and value(snap, "gpu_lost.n1/gpu0") == 0.0
    assert value(snap, "gpu_lost.n1/gpu1") == 1.0
    assert m["gpu_thermal_throttle.n1/gpu1"].absent == "GPU lost"
    assert m["gpu_ecc_uncorrected.n1/gpu1"].absent == "GPU lost"
    assert m["gpu_xid_last.n1/gpu1"].absent == "no Xid event so far"


def test_free_space_per_role_is_the_fullest_filesystem_and_memory_takes_the_tighter_cgroup():
    engine = Engine()
    gib = 2**30
    node = records.SampleNode(
        t=1.0,
        mem_total_b=100 * gib,
        mem_available_b=50 * gib,
        cgroup_mem_limit_b=40 * gib,
        cgroup_mem_used_b=38 * gib,
        filesystems=[
            records.FsStat(
                role="run", path="/home/u/runs/r", mount="/home", total_b=1000 * gib, avail_b=400 * gib
            ),
            records.FsStat(
                role="checkpoints", path="/a/ckpt", mount="/a", total_b=100 * gib, avail_b=30 * gib
            ),
            records.FsStat(
                role="checkpoints", path="/b/ckpt", mount="/b", total_b=200 * gib, avail_b=10 * gib
            ),
            records.FsStat(
                role="shm",
                path="/dev/shm",
                mount="/dev/shm",
                total_b=64 * 2**20,
            ),
        ],
    )
    (snap,) = feed(engine, node, tick(1, 2.0))
    assert value(snap, "disk_free.run") == 0.4  # 400 / 1000
    # /a has 30 / 100 = 0.3 free, /b 10 / 200 = 0.05: the fuller one counts
    assert (value(snap, "disk_free.checkpoints"), snap.metrics["disk_free.checkpoints"].label) == (
        0.05,
        "/b/ckpt",
    )
    assert value(snap, "disk_avail_b.checkpoints") == 10 * gib
    assert snap.metrics["disk_free.shm"].absent == "no size reading for /dev/shm"
    # the node has 50 / 100 = 0.5 available, the cgroup (40 − 38) / 40 = 0.05: the cgroup's is tighter
    assert (value(snap, "node_mem_available"), snap.metrics["node_mem_available"].label) == (0.05, "cgroup")


def test_the_final_snapshot_carries_the_exit_code_or_the_signal():
    engine = Engine()
    (running,) = feed(engine, tick(1, 1.0))
    assert running.metrics["exit_code"].absent == "the run has not ended"
    (final,) = feed(
        engine,
        records.RunEnd(status=137, reason="signaled", signal=9, signal_name="SIGKILL", elapsed_s=2.0, t=2.0),
    )
    assert (value(final, "exit_signal"), final.metrics["exit_signal"].label) == (9.0, "SIGKILL")
    assert final.metrics["exit_code"].absent == "no exit code: the command was signalled or never started"
    (exited,) = feed(Engine(), records.RunEnd(status=1, reason="exited", exit_code=1, elapsed_s=1.0, t=1.0))
    assert (
        value(exited, "exit_code") == 1.0
        and exited.metrics["exit_signal"].absent == "no signal: the command exited"
    )


def test_alert_inputs_survive_a_checkpoint_and_restore():
    engine = Engine()
    logged = [*steps(0.0, [0.2] * 10), records.Metric(values={"train_loss": math.nan}, t=2.1)]
    logged += [
        records.SampleGpu(index=0, host="n1", t=2.2, xid=[79]),
        records.Phase(phase="checkpoint", start_t=2.3, end_t=2.4, t=2.4),
    ]
    feed(engine, *logged)
    restored = Engine.from_state(engine.state_bytes())
    (a,) = feed(engine, tick(1, 3.0))
    (b,) = feed(restored, tick(1, 3.0))
    keys = [
        "since_step_s",
        "step_time_median_s",
        "tokens_per_s_median",
        "loss_nonfinite",
        "gpu_xid.n1/gpu0",
        "since_pause_s",
    ]
    assert [a.metrics[k] for k in keys] == [b.metrics[k] for k in keys]
    assert value(a, "loss_nonfinite") == 1.0 and value(a, "gpu_xid.n1/gpu0") == 1.0


def test_alert_inputs_have_an_explain_like_every_metric():
    (snap,) = feed(Engine(), *steps(0.0, [0.5]), tick(1, 1.0))
    for key in (
        "since_step_s",
        "step_time_median_s",
        "tokens_per_s_median",
        "child_alive",
        "since_pause_s",
        "loss_nonfinite",
        "node_mem_available",
        "exit_code",
    ):
        assert key in snap.explain and snap.explain[key].formula


def test_a_gpu_no_longer_sampled_has_its_health_absent_rather_than_frozen():
    engine = Engine()
    throttled = records.SampleGpu(index=3, host="n1", t=1.0, throttle=["sw_thermal"])
    (fresh,) = feed(engine, throttled, tick(1, 30.0))
    (stale,) = feed(engine, tick(2, 32.0))
    assert value(fresh, "gpu_thermal_throttle.n1/gpu3") == 1.0
    # 32 − 1 = 31 s > 30 s without a sample
    assert (
        stale.metrics["gpu_thermal_throttle.n1/gpu3"].absent
        == "no sample from n1/gpu3 for 31 s: it is no longer watched"
    )
    assert stale.metrics["gpu_lost.n1/gpu3"].value is None


def test_the_idle_gpu_alert_fires_on_a_fake_idle_gpu_the_run_holds_and_not_on_a_busy_one(clock):
    machine = fake_pynvml.install(fake_pynvml.FakeMachine("3xH100"))
    machine.apply_script(
        {"1": {"gpu_busy": 0.95}, "2": {"gpu_busy": 0.0}}
    )  # gpu0 idle, gpu1 busy, gpu2 not held
    session = GpuSession.open({"TM_FAKE_GPUS": "3xH100", "CUDA_VISIBLE_DEVICES": "0,1"}, host="n1")
    engine = Engine()
    rule = GpuIdle()
    alerts = Alerter([rule], {rule.name: rule_config(rule, {"fire_after_s": 3})})
    fired = []
    for n in range(1, 7):
        rows = session.sample(float(n))
        mark_other_processes(rows, {10}, container=False, for_run=True)
        # gpu2 only as the hardware view sees it: watched, never the run's
        watched = records.SampleGpu(index=2, util_gpu=0.0, for_run=False, t=float(n))
        for one in (*rows, watched):
            one.host = "n1"
        for snapshot in feed(engine, *rows, watched, tick(n, float(n))):
            fired += [(a.t, a.state, a.subject) for a in alerts.observe(snapshot)]
        clock.now_s += 1
    assert (
        value(snapshot, "held_util_gpu.n1/gpu0") == 0.0 and value(snapshot, "held_util_gpu.n1/gpu1") == 0.95
    )
    assert "held_util_gpu.n1/gpu2" not in snapshot.metrics
    assert fired == [(4.0, "fired", "n1/gpu0")]  # idle from t=1, for fire_after_s = 3 s
    session.close()
