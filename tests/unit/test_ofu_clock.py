"""OFU on every card with a dense peak and GPM: fake GPUs sampled through the real backend over the fake NVML, fed to
the engine. The clock OFU scales to is the spec's tensor clock, else one derived from the SM count the device reports,
else the max SM clock the device reports; it is named in the label and the explain. No dense peak, no OFU."""

from __future__ import annotations

import pytest
from manual_clock import ManualClock

from trainmeter_core.model import records
from trainmeter_core.model.engine import Engine
from trainmeter_core.model.rig import RigDevice, ofu_clock
from trainmeter_sources.gpu import fake_pynvml as nvml
from trainmeter_sources.gpu.sampler import GpuSession


def run_on(spec: str, clock: ManualClock, **readings) -> tuple[dict, list[records.Snapshot]]:
    """One GPU of ``spec`` reading constant ``readings``; rank 0 computes on it and steps at 1000.5, 1001.5, 1002.5 s
    while the sampler samples at 1000, 1001, 1002 and 1003 s. Returns the gpu fact's value and every snapshot."""
    machine = nvml.install(nvml.FakeMachine(spec))
    gpu = machine.gpus[0]
    gpu.set(**readings)
    session = GpuSession.open({"TM_FAKE_GPUS": spec}, host="node1")
    logged: list = [
        records.RunStart(t=999.0, host="node1", run_id="r", name="t", run_dir="/r", command=["python"], cwd="/",
                     tm_version="0", python="3.11", platform="linux"),
        *session.facts(),
        records.Fact(name="device", value={"type": "cuda", "index": 0, "uuid": gpu.uuid}, provenance="detected",
                 origin="agent", host="node1", rank=0),
        *session.sample(clock.now_s),
    ]  # fmt: skip
    for step in (1, 2, 3):
        clock.now_s += 1.0
        logged.append(records.Step(t=clock.now_s - 0.5, host="node1", step=step, tokens_global=1000))
        logged.extend(session.sample(clock.now_s))
        logged.append(records.Tick(t=clock.now_s + 0.1, n=step, interval_s=1.0))
    logged.append(records.RunEnd(t=clock.now_s + 0.2, status=0, reason="exited", exit_code=0, elapsed_s=4.2))
    engine = Engine()
    for record in logged:
        record.host = "node1"  # the sampler's producer stamps the host on the bus; here it is one machine
    snapshots = []
    for seq, record in enumerate(logged, 1):
        record.seq = seq
        snapshots.extend(engine.feed(record))
    return session.facts()[0].value, snapshots


def test_a_fake_h200_gets_ofu_with_the_tensor_clock_derived_from_the_sm_count_nvml_gives(clock):
    fact, snapshots = run_on("1xH200", clock, tensor_active=0.4, sm_clock_mhz=1700.0)
    # NVML counts 16,896 FP32 cores on it; 128 per Hopper SM (the spec's whitepaper figure) makes 132 SMs
    assert fact["sm_count"] == 132
    assert fact["sm_count_source"] == "NVML: 16896 FP32 cores / 128 per hopper SM"
    assert fact["tensor_clock_mhz"] is None and fact["dense_bf16_flop_per_clock_per_sm"] == 4096
    final = snapshots[-1]
    ofu = final.metrics["ofu"]
    # tensor clock = 989.5e12 / (132 × 4096) = 1830.13 MHz; OFU = 0.4 × min(1700, 1830.13) / 1830.13 = 0.371558
    assert ofu.value == pytest.approx(0.4 * 1700 / (989.5e12 / (132 * 4096) / 1e6), rel=1e-9)
    assert ofu.label == "counters, training window, scaled to the 1830 MHz tensor clock"
    assert final.explain["ofu"].note == (
        "clock basis: the 1830 MHz tensor clock derived as the dense peak 9.895e14 FLOP/s / (132 SMs (NVML: 16896 "
        "FP32 cores / 128 per hopper SM) × 4096 FLOP per clock per SM)"
    )
    live = snapshots[-2].metrics["ofu"]
    assert live.label == "counters, latest sample, scaled to the 1830 MHz tensor clock"
    assert live.value == pytest.approx(ofu.value, rel=1e-9)  # constant readings: the latest equals the window
    # observed FLOPs: OFU × the dense peak × the GPM seconds (3 windows of 1 s after the first sample)
    assert final.metrics["observed_flop"].value == pytest.approx(ofu.value * 989.5e12 * 3.0, rel=1e-9)


def test_a_fake_b200_gets_ofu_scaled_to_its_max_sm_clock_and_says_so(clock):
    fact, snapshots = run_on("1xB200", clock, tensor_active=0.4, sm_clock_mhz=1800.0)
    # NVIDIA states no per-SM BF16 rate for Blackwell, so nothing derives a tensor clock
    assert fact["dense_bf16_flop_per_s"] == pytest.approx(2250e12)
    assert fact["dense_bf16_flop_per_clock_per_sm"] is None
    final = snapshots[-1]
    ofu = final.metrics["ofu"]
    # OFU = 0.4 × min(1800, 1965) / 1965 = 0.366412
    assert ofu.value == pytest.approx(0.4 * 1800 / 1965, rel=1e-12)
    assert ofu.label == "counters, training window, scaled to the 1965 MHz max SM clock"
    assert final.explain["ofu"].note.startswith(
        "clock basis: the 1965 MHz max SM clock NVML reports (no tensor clock"
    )


def test_a_card_with_no_dense_peak_has_ofu_absent_with_the_reason_and_its_counters_still_shown(clock):
    _, snapshots = run_on("1xGB10", clock, tensor_active=0.4)  # no GB10 spec without the spark plugin
    final = snapshots[-1]
    assert final.metrics["ofu"].value is None
    assert final.metrics["ofu"].absent == (
        "OFU is a share of the dense peak, and there is none: no device spec matches 'NVIDIA GB10': "
        "pass --peak-tflops X --peak-source TEXT, or add a spec (docs/specs.md)"
    )
    assert final.metrics["tensor_active"].value == pytest.approx(0.4)  # the counter itself is a measurement
    assert final.metrics["observed_flop"].value is None


def _device(**overrides) -> RigDevice:
    fields = dict(
        key="n/gpu0", host="n", kind="cuda", ranks=(0,), gpu_key="n/gpu0", name="Card", peak_flop_per_s=1e15,
        peak_kind="datasheet", peak_source="sheet", peak_absent=None, peak_beside=(), tensor_clock_mhz=1830.0,
        memory_bandwidth_bps=None, mapped_by="uuid", tensor_clock_basis="the 1830 MHz tensor clock of the device spec",
    )  # fmt: skip
    return RigDevice(**{**fields, **overrides})


def test_the_tensor_clock_wins_over_the_max_sm_clock():
    basis, why = ofu_clock(_device(), 1980.0)
    assert (basis.mhz, basis.label, why) == (1830.0, "scaled to the 1830 MHz tensor clock", None)


def test_without_a_tensor_clock_the_max_sm_clock_is_the_basis_and_without_either_ofu_has_none():
    device = _device(
        tensor_clock_mhz=None, tensor_clock_basis=None, tensor_clock_absent="no tensor clock for Card"
    )
    basis, _ = ofu_clock(device, 1980.0)
    assert (basis.mhz, basis.label) == (1980.0, "scaled to the 1980 MHz max SM clock")
    assert basis.basis == "the 1980 MHz max SM clock NVML reports (no tensor clock for Card)"
    basis, why = ofu_clock(device, None)
    assert basis is None and why == "no tensor clock for Card, and the sampler reported no max SM clock"


def test_a_tensor_clock_above_the_devices_own_max_sm_clock_is_not_believed():
    # a wrong SM count derives 2100 MHz on a card that never clocks above 1980: the device's clock is the basis
    basis, _ = ofu_clock(
        _device(tensor_clock_mhz=2100.0, tensor_clock_basis="the 2100 MHz tensor clock derived"), 1980.0
    )
    assert basis.mhz == 1980.0
    assert "the 2100 MHz tensor clock derived is above it" in basis.basis
