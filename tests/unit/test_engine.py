"""The engine, fed synthetic record sequences: MFU with its peak and convention, absent reasons, snapshots on ticks and
at run.end, restore-from-state equality, precedence warnings, series, time split, counters and stragglers."""

from __future__ import annotations

import math
import random

import msgspec
import pytest

from trainmeter_core.model import records
from trainmeter_core.model.engine import Engine

H100_URL = "https://resources.nvidia.com/en-us-tensor-core/gtc22-whitepaper-hopper"
# The 1.04B model of SPEC.md: hf 5,829,943,296, megatron 6,056,435,712, titan 6,282,928,128,
# all_params 6,688,727,040 FLOP per token (pinned in test_flops).
SHAPE_1B = {
    "params": 1_039_290_368,
    "embedding_params": 67_633_152,
    "layers": 18,
    "d_model": 2048,
    "seq_len": 1024,
}
# Every metric the brief lists: each must be in every snapshot, with an explain entry.
SPEC_METRICS = (
    "tokens_per_s", "step_time_s", "tokens", "flop_per_token", "flop_per_token.titan", "flop_per_token.megatron",
    "flop_per_token.hf", "flop_per_token.all_params", "flop_per_token.counted", "spent_flop", "required_flop",
    "progress", "eta_s", "mfu", "mfu_avg", "ofu", "mfu_ofu_gap", "observed_flop", "arithmetic_intensity", "goodput",
    "straggler_spread", "util_gpu", "sm_active", "tensor_active", "plan_mfu", "plan_hours", "projected_hours",
    "gpu_hours", "energy_j",
)  # fmt: skip


class Run:
    """Builds a record sequence in hub order, numbering each record as the hub would."""

    def __init__(self, host: str = "n1", env: dict[str, str] | None = None, start_t: float = 100.0) -> None:
        self.host = host
        self.records: list = []
        self.add(
            records.RunStart(
                t=start_t, host=host, run_id="r1", name="test", run_dir="/runs/r1", command=["python", "train.py"],
                cwd="/work", tm_version="0.1.0", python="3.11", platform="linux", env=env or {},
            )
        )  # fmt: skip

    def add(self, record):
        record.seq = len(self.records) + 1
        self.records.append(record)
        return record

    def fact(self, name, value, provenance="declared", origin=None, **header):
        header.setdefault("host", self.host)
        return self.add(
            records.Fact(
                name=name, value=value, provenance=provenance, origin=origin or f"--{name}", **header
            )
        )

    def shape(self, convention=None, **overrides):
        for name, value in {**SHAPE_1B, **overrides}.items():
            self.fact(name, value)
        if convention:
            self.fact("convention", convention)

    def gpu(self, index, uuid, dense=989.4e12, **extra):
        value = {
            "index": index, "uuid": uuid, "name": "NVIDIA H100 80GB HBM3", "spec_id": "h100-sxm",
            "display_name": "NVIDIA H100 SXM", "dense_bf16_flop_per_s": dense, "peak_absent": None,
            "tensor_clock_mhz": 1830.0, "memory_bandwidth_bps": 3.35e12, "sm_count": 132, "peak_source": H100_URL,
            **extra,
        }  # fmt: skip
        return self.fact("gpu", value, "detected", "sampler:nvml", device=f"{self.host}/gpu{index}")

    def device(self, rank, kind="cuda", index=None, uuid=None):
        return self.fact(
            "device", {"type": kind, "index": index, "uuid": uuid}, "detected", "agent", rank=rank
        )

    def step(self, t, step, rank=None, step_time_s=None, **fields):
        return self.add(
            records.Step(t=t, host=self.host, rank=rank, step=step, step_time_s=step_time_s, **fields)
        )

    def steps(self, first, n, dt=0.5, start_t=110.0, **fields):
        """n steps on rank 0 every dt seconds from start_t; the first carries no step time."""
        for i in range(n):
            t = start_t + dt * i
            self.step(t, first + i, step_time_s=dt if i else None, **fields)
        return start_t + dt * (n - 1)

    def tick(self, t, n):
        return self.add(records.Tick(t=t, n=n, interval_s=1.0))

    def end(self, t):
        return self.add(records.RunEnd(t=t, status=0, reason="exited", exit_code=0, elapsed_s=t - 100.0))


def feed(logged, engine=None):
    engine = engine or Engine()
    snapshots = []
    for record in logged:
        snapshots.extend(engine.feed(record))
    return engine, snapshots


def gpu_run(convention="titan"):
    """One H100 SXM reported by rank 0, 32,768 tokens per step every 0.5 s: 65,536 tokens/s."""
    run = Run()
    run.shape(convention)
    run.gpu(0, "GPU-0")
    run.device(0, index=0, uuid="GPU-0")
    last = run.steps(1, 21, tokens_global=32768)
    run.tick(last + 0.2, 1)
    return run


# ----------------------------------------------------------------------------------------------------------------------
# MFU


def test_a_cpu_run_with_a_measured_peak_gives_mfu_labelled_measured():
    run = Run()
    run.fact("flop_per_token", 1e9)
    run.device(0, "cpu")
    peak = {
        "flops": 1e13,
        "label": "measured",
        "source": "tm peak: 2048² bf16 matmul loop",
        "device_type": "cpu",
    }
    run.fact("peak", peak, "detected", "tm peak", device="n1/cpu")
    last = run.steps(1, 11, tokens=1000)
    run.tick(last + 0.1, 1)
    _, (snap,) = feed(run.records)
    mfu = snap.metrics["mfu"]
    # 1e9 FLOP/token × (1000 tokens / 0.5 s = 2000 tokens/s) / 1e13 FLOP/s = 0.2
    assert mfu.value == pytest.approx(0.2, rel=1e-12)
    assert mfu.label == "measured"
    assert mfu.convention == "declared"
    assert snap.explain["mfu"].inputs["peak_flop_per_s_per_device"].source == (
        "CPU, measured peak: tm peak: 2048² bf16 matmul loop"
    )


def test_a_shape_with_no_parameter_outside_the_embeddings_gives_flops_and_mfu_absent_not_zero():
    # Issue 41: an Embedding(50, 16) taken for the model gave N = E = 800, so hf FLOPs per token 6(N-E) = 0 and
    # "MFU 0.00%". A zero made of a missing input is absent, with the reason, in every figure built on it.
    run = Run()
    run.fact("params", 800, "detected", "agent:model")
    run.fact("embedding_params", 800, "detected", "agent:model")
    run.device(0, "cpu")
    peak = {"flops": 1e10, "label": "measured", "source": "tm peak", "device_type": "cpu"}
    run.fact("peak", peak, "detected", "tm peak", device="n1/cpu")
    last = run.steps(1, 11, tokens=64)
    run.tick(last + 0.1, 1)
    _, (snap,) = feed(run.records)
    why = "no parameter outside the embedding tables (parameter count 800 = embedding parameters)"
    for key in ("flop_per_token.hf", "flop_per_token", "spent_flop", "mfu", "mfu_avg"):
        metric = snap.metrics[key]
        assert metric.value is None and metric.low is None, key
        assert why in metric.absent, key


def test_a_spec_d_gpu_reported_by_a_rank_gives_mfu_with_convention_peak_name_and_source():
    _, (snap,) = feed(gpu_run().records)
    mfu = snap.metrics["mfu"]
    # 6,282,928,128 FLOP/token × 65,536 tokens/s / 989.4e12 FLOP/s = 0.416169373152019
    assert mfu.value == pytest.approx(0.416169373152019, rel=1e-12)
    assert (mfu.convention, mfu.label) == ("titan", "datasheet")
    peak = snap.explain["mfu"].inputs["peak_flop_per_s_per_device"]
    assert peak.value == 989.4e12
    assert "NVIDIA H100 SXM" in peak.source and H100_URL in peak.source
    assert snap.explain["mfu"].inputs["n_devices"].value == 1


def test_an_unknown_gpu_gives_mfu_absent_with_the_reason():
    run = Run()
    run.shape("titan")
    run.gpu(0, "GPU-0", dense=None, spec_id=None, display_name=None, name="NVIDIA Mystery 9000",
            peak_absent="no device spec matches 'NVIDIA Mystery 9000'")  # fmt: skip
    run.device(0, index=0, uuid="GPU-0")
    run.tick(run.steps(1, 5, tokens_global=32768) + 0.1, 1)
    _, (snap,) = feed(run.records)
    assert snap.metrics["mfu"].value is None
    assert snap.metrics["mfu"].absent == "no device spec matches 'NVIDIA Mystery 9000' (n1/gpu0)"
    assert snap.metrics["mfu_avg"].absent.startswith("no device spec matches")


def test_without_a_rank_device_mfu_is_absent_even_when_gpus_are_sampled():
    run = Run()
    run.shape("titan")
    run.gpu(0, "GPU-0")
    run.gpu(1, "GPU-1")
    run.tick(run.steps(1, 5, tokens_global=32768) + 0.1, 1)
    _, (snap,) = feed(run.records)
    assert snap.metrics["mfu"].value is None
    assert snap.metrics["mfu"].absent == "no rank reported its device: pass --gpus"
    assert snap.metrics["gpu_hours"].absent == "no rank reported its device: pass --gpus"


def test_without_a_convention_mfu_is_a_range_over_the_four():
    _, (snap,) = feed(gpu_run(convention=None).records)
    mfu = snap.metrics["mfu"]
    # low: hf 5,829,943,296 × 65,536 / 989.4e12 = 0.386164507627508
    # high: all_params 6,688,727,040 × 65,536 / 989.4e12 = 0.443048731851061
    assert mfu.value is None and mfu.convention is None
    assert mfu.low == pytest.approx(0.386164507627508, rel=1e-12)
    assert mfu.high == pytest.approx(0.443048731851061, rel=1e-12)
    fpt = snap.metrics["flop_per_token"]
    assert (fpt.low, fpt.high, fpt.convention) == (5_829_943_296, 6_688_727_040, None)
    assert snap.metrics["flop_per_token.megatron"].value == 6_056_435_712
    assert snap.metrics["flop_per_token.megatron"].convention == "megatron"


def test_mfu_avg_covers_the_training_window_from_the_first_to_the_last_step():
    run = gpu_run()
    run.end(125.0)
    _, snaps = feed(run.records)
    avg = snaps[-1].metrics["mfu_avg"]
    # window 110.0 .. 120.0: 20 steps after the first × 32,768 tokens = 655,360 tokens in 10 s = 65,536 tokens/s
    # 6,282,928,128 × 655,360 / (989.4e12 × 10) = 0.416169373152019
    assert avg.value == pytest.approx(0.416169373152019, rel=1e-12)
    assert (avg.window_start_t, avg.window_end_t) == (110.0, 120.0)
    assert (avg.convention, avg.label) == ("titan", "datasheet")


def test_a_declared_peak_is_used_and_labelled_declared():
    run = Run()
    run.shape("titan")
    run.gpu(0, "GPU-0")
    run.device(0, index=0, uuid="GPU-0")
    run.fact("peak", {"flops": 500e12, "label": "declared", "source": "capped clocks", "device_type": "cuda"},
             origin="--peak-tflops")  # fmt: skip
    run.tick(run.steps(1, 5, tokens_global=32768) + 0.1, 1)
    _, (snap,) = feed(run.records)
    # 6,282,928,128 × 65,536 = 411,757,977,796,608 FLOP/s / 500e12 = 0.823515955593216
    assert snap.metrics["mfu"].value == pytest.approx(0.823515955593216, rel=1e-12)
    assert snap.metrics["mfu"].label == "declared"


def test_the_tokens_per_step_fall_back_to_tokens_times_dp_and_say_when_dp_was_assumed():
    run = Run()
    run.tick(run.steps(1, 3, tokens=1000) + 0.1, 1)
    _, (snap,) = feed(run.records)
    # 1000 tokens × dp 1 (assumed) / 0.5 s = 2000 tokens/s
    assert snap.metrics["tokens_per_s"].value == 2000.0
    assert "dp assumed dp = 1" in snap.explain["tokens_per_s"].note
    run = Run()
    run.fact("dp", 4)
    run.tick(run.steps(1, 3, tokens=1000) + 0.1, 1)
    _, (snap,) = feed(run.records)
    # 1000 × 4 / 0.5 = 8000 tokens/s; tokens seen 3 × 4000 = 12,000
    assert snap.metrics["tokens_per_s"].value == 8000.0
    assert snap.tokens == 12_000
    assert snap.explain["tokens_per_s"].note is None


def test_without_token_counts_throughput_names_the_flag():
    run = Run()
    run.tick(run.steps(1, 3) + 0.1, 1)
    _, (snap,) = feed(run.records)
    assert snap.metrics["tokens_per_s"].absent == "tokens per step unknown: pass --tokens-per-step"
    assert snap.metrics["tokens"].value is None and snap.tokens is None
    assert snap.metrics["step_time_s"].value == 0.5


# ----------------------------------------------------------------------------------------------------------------------
# Snapshots


def test_snapshots_come_on_ticks_only_and_reflect_the_tick_seq():
    run = Run()
    run.steps(1, 3, tokens=10)
    first = run.tick(112.0, 1)
    run.steps(4, 3, start_t=112.5, tokens=10)
    second = run.tick(114.0, 2)
    engine = Engine()
    produced = [(record.seq, engine.feed(record)) for record in run.records]
    with_snapshots = [(seq, snaps) for seq, snaps in produced if snaps]
    assert [seq for seq, _ in with_snapshots] == [first.seq, second.seq]
    assert [s[0].through_seq for _, s in with_snapshots] == [first.seq, second.seq]
    assert [s[0].tick for _, s in with_snapshots] == [1, 2]
    assert with_snapshots[0][1][0].steps == 3 and with_snapshots[1][1][0].steps == 6


def test_the_final_snapshot_comes_at_run_end():
    run = gpu_run()
    end = run.end(125.0)
    _, snaps = feed(run.records)
    final = snaps[-1]
    assert (final.final, final.state, final.through_seq) == (True, "finished", end.seq)
    assert not snaps[0].final and snaps[0].state == "running"
    # run.start at 100, first step 110, last step 120, end 125
    assert final.elapsed_s == 25.0
    assert final.phases_s["startup"] == 10.0
    assert final.phases_s["compute"] == 10.0
    assert final.phases_s["after_last_step"] == 5.0


def test_every_metric_of_the_spec_is_in_every_snapshot_with_its_explain():
    for logged in (Run().records + [records.Tick(t=101.0, n=1, interval_s=1.0, seq=99)], gpu_run().records):
        _, snaps = feed(logged)
        for key in SPEC_METRICS:
            metric = snaps[-1].metrics[key]
            assert key in snaps[-1].explain
            # unknown stays unknown: either a number (or a range) or absent with its reason, never both, never neither
            has_number = metric.value is not None or metric.low is not None
            assert has_number != (metric.absent is not None), key


def test_a_run_before_its_first_step_is_starting_and_nothing_is_zero():
    run = Run()
    run.tick(101.0, 1)
    _, (snap,) = feed(run.records)
    assert snap.state == "starting"
    assert snap.metrics["tokens_per_s"].absent == "no training step yet"
    assert snap.metrics["progress"].absent == "budget not declared: pass --budget-tokens"
    assert snap.metrics["goodput"].absent == "no training step yet"
    assert snap.phases_s == {**dict.fromkeys(snap.phases_s, 0.0), "startup": 1.0}


def test_records_the_engine_does_not_use_change_nothing_but_the_seq():
    run = gpu_run()
    engine, _ = feed(run.records[:-1])
    before = engine.snapshot()
    engine.feed(records.Notice(topic="probe", message="quiet", seq=500))
    engine.feed(records.Unknown(kind="from.the.future", data={}, seq=501))
    after = engine.snapshot()
    assert after.through_seq == 501
    after.through_seq = before.through_seq
    assert after == before


# ----------------------------------------------------------------------------------------------------------------------
# Restore


def rich_run():
    """A run touching every handler: facts, ranks, metrics from emit and a tracker, phases, GPU and host samples."""
    run = Run(env={"CUDA_VISIBLE_DEVICES": "0,1"})
    run.shape("megatron")
    run.fact("budget_tokens", 2_000_000)
    run.fact("plan_mfu", 0.4)
    run.fact("plan_hours", 0.01)
    run.fact("params", 1_000_000_000, "detected", "agent:model")
    for i in (0, 1):
        run.gpu(i, f"GPU-{i}")
        run.device(i, index=i)
    t = 110.0
    for i in range(1, 41):
        for rank in (0, 1):
            run.step(t + 0.001 * rank, i, rank=rank, step_time_s=None if i == 1 else 0.5 + 0.1 * rank,
                     tokens=8192, dp=2)  # fmt: skip
        run.add(records.Metric(t=t, step=i, values={"loss": 3.0 - 0.01 * i, "lr": 1e-3, "acc": 0.5}))
        run.add(records.Metric(t=t, step=i, values={"train/loss": 9.0, "grad_norm": 1.0}, origin="wandb"))
        if i % 5 == 0:
            run.add(records.Phase(t=t, start_t=t - 0.2, end_t=t - 0.1, phase="data_wait", rank=0))
        if i % 2 == 0:
            for g in (0, 1):
                run.add(records.SampleGpu(t=t, host="n1", index=g, uuid=f"GPU-{g}", util_gpu=0.9, sm_active=0.8,
                                      tensor_active=0.5, dram_active=0.25, clock_sm_mhz=1500.0, power_w=600.0,
                                      gpm_window_s=1.0))  # fmt: skip
            run.add(records.SampleHost(t=t, root_pid=1, procs=3, cpu_cores=2.5, rss_b=10**9))
            run.tick(t + 0.05, i // 2)
        t += 0.5
    run.end(t + 1.0)
    return run


def test_a_restored_engine_fed_the_rest_gives_equal_snapshots():
    logged = rich_run().records
    full, expected = feed(logged)
    assert len(expected) == 21
    for cut in range(1, len(logged)):
        engine, head = feed(logged[:cut])
        state = engine.state_bytes()
        assert Engine.from_state(state).snapshot() == engine.snapshot()
        restored = Engine.from_state(state)
        _, tail = feed(logged[cut:], restored)
        # field for field, floats with ==: msgspec Structs compare every field
        assert head + tail == expected, f"cut at {cut}"
        assert restored.snapshot() == full.snapshot()
        # catching up quietly (no snapshots built) leaves the very same state behind
        quiet = Engine()
        for record in logged[:cut]:
            assert quiet.feed(record, snapshots=False) == []
        assert quiet.state_bytes() == state
        for series in ("train_loss", "tm:mfu", "tm:gpu:n1/gpu0:tensor_active", "tm:rank:1:step_time_s"):
            for axis in ("step", "tokens", "flops", "wall"):
                assert restored.history.query(series, axis) == full.history.query(series, axis)
    assert full.history.query("tm:mfu", "flops")  # the FLOPs axis is known under a convention


def test_the_same_records_give_the_same_snapshots():
    logged = rich_run().records
    assert feed(logged)[1] == feed(logged)[1]


def test_state_bytes_that_are_not_a_state_are_refused():
    with pytest.raises(msgspec.DecodeError):
        Engine.from_state(b"\x93not a state")


# ----------------------------------------------------------------------------------------------------------------------
# Facts, series, time split, counters, stragglers, budget


def test_a_declared_value_beats_a_detected_one_with_a_warning():
    run = Run()
    run.fact("params", 1_100_000_000, "detected", "agent:model")
    run.fact("params", 1_200_000_000, "declared", "--params")
    run.tick(101.0, 1)
    _, (snap,) = feed(run.records)
    assert snap.facts["params"].value == 1_200_000_000
    assert snap.facts["params"].provenance == "declared"
    assert "params declared 1.2e9 but detected 1.1e9: using the declared value" in snap.warnings


def test_declared_tokens_per_step_beat_the_detected_ones_with_a_warning():
    run = Run()
    run.fact("tokens_per_step", 4096)
    run.tick(run.steps(1, 3, tokens=1000) + 0.1, 1)
    _, (snap,) = feed(run.records)
    # 4096 tokens / 0.5 s = 8192 tokens/s
    assert snap.metrics["tokens_per_s"].value == 8192.0
    assert "tokens_per_step declared 4096 but detected 1000: using the declared value" in snap.warnings


def test_a_moe_model_warns_that_total_parameters_overstate_flops():
    run = Run()
    run.fact("moe_experts", 8, "detected", "agent:model")
    run.tick(101.0, 1)
    _, (snap,) = feed(run.records)
    assert any("8 experts" in w and "declare the active parameters" in w for w in snap.warnings)


def test_series_map_by_alias_keep_the_raw_key_and_emit_beats_a_tracker():
    run = Run()
    run.add(records.Metric(t=110.0, step=1, values={"loss": 2.0, "learning_rate": 1e-3}, origin="wandb"))
    run.add(records.Metric(t=110.5, step=2, values={"train/loss": 1.5}, origin="emit"))
    run.add(
        records.Metric(
            t=111.0, step=3, values={"loss": 1.0, "train_loss": 9.9, "custom/thing": 7.0}, origin="wandb"
        )
    )
    run.tick(112.0, 1)
    engine, (snap,) = feed(run.records)
    # the tracker's train_loss after emit's is ignored; its bare "loss" is now a custom series
    assert snap.series["train_loss"] == records.SeriesPoint(canonical="train_loss", raw_key="train/loss", value=1.5,
                                                        step=2, t=110.5, origin="emit")  # fmt: skip
    assert (snap.series["loss"].value, snap.series["loss"].origin) == (1.0, "wandb")
    assert (snap.series["lr"].raw_key, snap.series["lr"].origin) == ("learning_rate", "wandb")
    assert snap.series["custom/thing"].value == 7.0
    # history keeps the tracker's early bare loss (step 1) and emit's value (step 2)
    assert [(p.x, p.value) for p in engine.history.query("train_loss", "step")] == [(1.0, 2.0), (2.0, 1.5)]


def test_a_series_point_names_the_origin_of_the_value_it_holds():
    run = Run()
    run.step(110.0, 1)
    run.add(records.Metric(t=110.2, step=1, values={"train_loss": 2.0}, origin="backward"))
    run.step(110.5, 2, step_time_s=0.5)  # the next step: step 1's loss read at backward() stands
    run.add(records.Metric(t=110.6, step=2, values={"val_loss": 2.5, "lr": 1e-3}, origin="tensorboard"))
    run.tick(112.0, 1)
    _, (snap,) = feed(run.records)
    assert {name: (p.value, p.origin) for name, p in snap.series.items()} == {
        "train_loss": (2.0, "backward"),
        "val_loss": (2.5, "tensorboard"),
        "lr": (1e-3, "tensorboard"),
    }


def test_goodput_counts_productive_step_time_and_the_time_split_adds_up():
    run = Run()
    run.steps(1, 21, tokens=100)  # 110 .. 120
    run.add(records.Phase(t=113.0, start_t=112.0, end_t=113.0, phase="data_wait"))
    run.add(records.Phase(t=116.0, start_t=114.0, end_t=116.0, phase="checkpoint"))
    run.add(
        records.Phase(t=105.0, start_t=104.0, end_t=105.0, phase="compile")
    )  # before the first step: startup
    run.tick(121.0, 1)
    _, (snap,) = feed(run.records)
    # elapsed 21 s; startup 10 less the compile before the first step = 9, compile 1; window 11 s = 1 data wait +
    # 2 checkpoint + 8 compute
    assert snap.phases_s == {**dict.fromkeys(snap.phases_s, 0.0), "startup": 9.0, "compile": 1.0, "data_wait": 1.0,
                             "checkpoint": 2.0, "compute": 8.0}  # fmt: skip
    # goodput: productive step time 8 / 21 = 0.380952… (the data wait is badput, as in ml-goodput-measurement)
    assert snap.metrics["goodput"].value == pytest.approx(8 / 21, rel=1e-12)
    # no eval phase and no eval probe: that time may hide in compute, and the explain says which part and why
    assert (
        snap.explain["time_split"].note
        == "stays in compute, its probe never attached: eval (no probe reported)"
    )


def test_a_probe_that_reports_why_it_did_not_attach_is_named_in_the_time_split():
    run = Run()
    run.fact("probe.data_wait", "not attached: no torch DataLoader iterated yet", "detected", "agent:probes")
    for part in ("compile", "checkpoint", "eval"):
        run.fact(f"probe.{part}", "attached", "detected", "agent:probes")
    run.tick(run.steps(1, 3, tokens=100) + 0.1, 1)
    _, (snap,) = feed(run.records)
    assert snap.explain["time_split"].note == (
        "stays in compute, its probe never attached: data_wait (no torch DataLoader iterated yet)"
    )
    # goodput's note first says what the lost time was (run start 100, first step 110: 10 s of 11.1), then the same
    assert snap.explain["goodput"].note == (
        "lost 10.0 s of 11.1 s: start-up and imports 10.0 s; " + snap.explain["time_split"].note
    )


def test_counters_average_over_the_run_gpus_and_ofu_uses_the_tensor_clock():
    run = gpu_run()
    run.gpu(1, "GPU-1")  # sampled but no rank computes on it
    for index, tensor_active, clock in ((0, 0.5, 1500.0), (1, 0.9, 1980.0)):
        run.add(records.SampleGpu(t=121.0, host="n1", index=index, uuid=f"GPU-{index}", util_gpu=0.9, sm_active=0.7,
                              tensor_active=tensor_active, dram_active=0.4, clock_sm_mhz=clock, power_w=500.0,
                              gpm_window_s=1.0))  # fmt: skip
    run.tick(121.5, 2)
    _, snaps = feed(run.records)
    snap = snaps[-1]
    # only GPU 0: OFU = 0.5 × 1500 / 1830 = 0.409836065573770
    assert snap.metrics["ofu"].value == pytest.approx(0.40983606557377, rel=1e-12)
    # a counter, of the latest sample, scaled to the spec's tensor clock: the label names all three
    assert snap.metrics["ofu"].label == "counters, latest sample, scaled to the 1830 MHz tensor clock"
    assert snap.metrics["tensor_active"].value == 0.5
    # gap = 0.409836065573770 − 0.416169373152019 = −0.006333307578249
    assert snap.metrics["mfu_ofu_gap"].value == pytest.approx(-0.006333307578249, rel=1e-9)
    # observed: 0.409836… × 1 s × 989.4e12 = 4.05491803278689e14 FLOP
    assert snap.metrics["observed_flop"].value == pytest.approx(4.05491803278689e14, rel=1e-12)
    # AI: ridge 989.4e12 / 3.35e12 = 295.343283582 × MFU 0.416169373152 = 122.912829193 / DRAM 0.4 = 307.282072983
    assert snap.metrics["arithmetic_intensity"].value == pytest.approx(307.282072983, rel=1e-11)
    assert snap.metrics["mfu"].value == pytest.approx(
        0.416169373152019, rel=1e-12
    )  # never replaced by a counter


def test_a_cpu_only_run_on_a_node_with_gpus_is_never_scored_against_them():
    run = Run()
    run.shape("titan")
    run.gpu(0, "GPU-0")
    run.device(0, "cpu")
    run.add(records.SampleGpu(t=111.0, host="n1", index=0, uuid="GPU-0", util_gpu=1.0, tensor_active=0.9,
                          clock_sm_mhz=1980.0, gpm_window_s=1.0))  # fmt: skip
    run.tick(run.steps(1, 5, tokens=100) + 0.1, 1)
    _, (snap,) = feed(run.records)
    assert snap.metrics["mfu"].absent.startswith("no peak for a cpu device")
    assert snap.metrics["util_gpu"].value is None
    assert snap.metrics["ofu"].value is None
    assert "CPU run is never scored" in snap.metrics["ofu"].absent


def test_a_gpu_without_gpm_has_ofu_absent_with_the_samplers_reason():
    run = gpu_run()
    run.add(records.SampleGpu(t=121.0, host="n1", index=0, util_gpu=0.9, clock_sm_mhz=1500.0,
                          absent={"tensor_active": "GPM blocked by the provider"}))  # fmt: skip
    run.tick(121.5, 2)
    _, snaps = feed(run.records)
    assert snaps[-1].metrics["ofu"].absent == "GPM blocked by the provider"
    assert snaps[-1].metrics["util_gpu"].value == 0.9


def test_stragglers_compare_per_rank_step_times_and_name_the_slowest():
    run = Run()
    for i in range(1, 4):
        for rank, dt in ((0, 1.0), (1, 1.0), (2, 1.3), (3, 1.1)):
            run.step(110.0 + i, i, rank=rank, step_time_s=dt if i > 1 else None)
    run.tick(114.0, 1)
    _, (snap,) = feed(run.records)
    # EMAs are the constant step times; median of (1.0, 1.0, 1.1, 1.3) = 1.05; (1.3 − 1.0) / 1.05 = 0.285714…
    assert snap.metrics["straggler_spread"].value == pytest.approx(0.3 / 1.05, rel=1e-12)
    assert snap.explain["straggler_spread"].inputs["slowest_rank"].value == 2
    assert [(r.rank, r.steps, r.step_time_s) for r in snap.ranks] == [
        (0, 3, 1.0),
        (1, 3, 1.0),
        (2, 3, 1.3),
        (3, 3, 1.1),
    ]


def test_progress_eta_and_required_flop_follow_the_token_budget():
    run = gpu_run()
    run.fact("budget_tokens", 6_553_600)
    run.tick(121.0, 2)
    _, snaps = feed(run.records)
    snap = snaps[-1]
    # 21 steps × 32,768 = 688,128 tokens of 6,553,600: progress 0.105
    assert snap.metrics["progress"].value == pytest.approx(0.105, rel=1e-12)
    # (6,553,600 − 688,128) / 65,536 tokens/s = 89.5 s
    assert snap.metrics["eta_s"].value == pytest.approx(89.5, rel=1e-12)
    # 6,282,928,128 × 6,553,600 = 4.11757978e16 FLOP, under titan
    assert snap.metrics["required_flop"].value == 6_282_928_128 * 6_553_600
    assert snap.metrics["required_flop"].convention == "titan"
    assert snap.metrics["spent_flop"].value == 6_282_928_128 * 688_128
    # projected: (elapsed 21 s + 89.5 s) / 3600
    assert snap.metrics["projected_hours"].value == pytest.approx(110.5 / 3600, rel=1e-12)


def test_profiled_steps_stay_out_of_the_averages():
    run = Run()
    run.steps(1, 5, tokens=1000)  # 110 .. 112, 0.5 s each
    run.step(115.0, 6, step_time_s=3.0, tokens=1000, profiled=True)
    run.step(115.5, 7, step_time_s=0.5, tokens=1000)
    run.tick(116.0, 1)
    _, (snap,) = feed(run.records)
    assert snap.metrics["step_time_s"].value == 0.5
    assert snap.metrics["tokens_per_s"].value == 2000.0
    assert snap.tokens == 7000  # a profiled step still trained on its tokens


WEIRD = [0.0, -1.0, 1.5, math.nan, math.inf, -math.inf, 1e300, None, 0.5, 3, True, "x", {"a": 1}, [1]]
FACT_NAMES = (
    "params", "embedding_params", "layers", "d_model", "seq_len", "dp", "tokens_per_step", "flop_per_token",
    "convention", "budget_tokens", "budget_steps", "budget_flop", "plan_mfu", "plan_hours", "moe_experts",
    "counted_flop_per_token", "peak", "device", "gpu",
)  # fmt: skip


def nonsense_run(seed):
    """A valid run, then 200 records of every kind holding values a broken producer might send."""
    rng = random.Random(seed)
    run = gpu_run() if seed % 2 else Run()
    number = WEIRD[:9]
    for i in range(200):
        t = 121.0 + i * 0.1 + rng.choice([0.0, -50.0, 0.0])
        kind = rng.randrange(7)
        if kind == 0:
            run.step(t, i, rank=rng.choice([None, 0, 1, 2]), step_time_s=rng.choice([0.5, math.nan, -1.0, None, math.inf]),
                     tokens_global=rng.choice([None, 0, 32768, -4]), tokens=rng.choice([None, 5]),
                     dp=rng.choice([None, 0, 2]), profiled=rng.random() < 0.1)  # fmt: skip
        elif kind == 1:
            run.add(records.SampleGpu(t=t, host="n1", index=rng.choice([0, 1]), tensor_active=rng.choice(number),
                                  clock_sm_mhz=rng.choice(number), util_gpu=rng.choice(number),
                                  power_w=rng.choice(number), dram_active=rng.choice(number),
                                  gpm_window_s=rng.choice(number)))  # fmt: skip
        elif kind == 2:
            phase = rng.choice(["data_wait", "compile", "eval", "checkpoint", "profiler", "startup"])
            start_t = t - rng.choice([1.0, -1.0, math.nan])
            run.add(records.Phase(t=t, start_t=start_t, end_t=t, phase=phase, rank=rng.choice([None, 0, 1])))
        elif kind == 3:
            name = rng.choice(FACT_NAMES)
            value = rng.choice(WEIRD)
            if name == "peak" and rng.random() < 0.5:
                value = {
                    "flops": rng.choice(WEIRD),
                    "label": rng.choice(WEIRD),
                    "device_type": rng.choice(["cpu", 3]),
                }
            elif name == "device" and rng.random() < 0.7:
                value = {"type": rng.choice(["cpu", "cuda", None, "mps"]), "index": rng.choice(WEIRD),
                         "uuid": rng.choice(WEIRD)}  # fmt: skip
            elif name == "gpu" and rng.random() < 0.7:
                value = {"index": rng.choice([0, 1, "x"]), "uuid": rng.choice(WEIRD), "dense_bf16_flop_per_s": rng.choice(WEIRD),
                         "tensor_clock_mhz": rng.choice(WEIRD), "memory_bandwidth_bps": rng.choice(WEIRD)}  # fmt: skip
            provenance = rng.choice(["declared", "emitted", "detected", "assumed"])
            run.fact(
                name,
                value,
                provenance,
                rank=rng.choice([None, 0, 1]),
                device=rng.choice([None, "n1/gpu0", "n1/cpu"]),
            )
        elif kind == 4:
            key = rng.choice(["loss", "train/loss", "lr", "x"])
            run.add(records.Metric(t=t, values={key: rng.choice([1.0, math.nan, math.inf])}, step=rng.choice([None, i]),
                               origin=rng.choice(["emit", "wandb"])))  # fmt: skip
        elif kind == 5:
            run.tick(t, i)
        else:
            run.add(records.SampleHost(t=t, root_pid=1, procs=1, cpu_cores=rng.choice([None, 1.0])))
    run.end(300.0)
    return run


@pytest.mark.parametrize("seed", range(40))
def test_nonsense_inputs_are_absent_with_a_reason_never_a_crash_nor_a_non_finite_number(seed):
    engine, snaps = feed(nonsense_run(seed).records)
    assert snaps[-1].final
    for snap in snaps:
        for key, metric in snap.metrics.items():
            numbers = [v for v in (metric.value, metric.low, metric.high) if v is not None]
            assert bool(numbers) != (metric.absent is not None), f"{key} (seed {seed})"
            assert all(math.isfinite(v) for v in numbers), f"{key} (seed {seed})"
    # and the state of such a run still checkpoints; repr compares field for field with NaN equal to NaN (a NaN loss
    # is a real value to show), and float repr round-trips exactly
    assert repr(Engine.from_state(engine.state_bytes()).snapshot()) == repr(engine.snapshot())


def test_a_peak_fact_that_holds_no_number_is_refused_and_named():
    run = gpu_run()
    run.fact("peak", {"flops": math.nan, "label": "declared"}, "emitted", "emit", device="n1/gpu0")
    run.tick(121.0, 2)
    _, snaps = feed(run.records)
    assert snaps[-1].metrics["mfu"].absent == (
        "the peak fact from emit holds no positive FLOP/s: pass --peak-tflops X --peak-source TEXT (n1/gpu0)"
    )
