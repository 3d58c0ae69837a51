"""Facts with provenance (declared > emitted > detected > assumed), the run's devices and peaks, FLOPs per token."""

from __future__ import annotations

import pytest

from trainmeter_core.model.facts import (
    NO_RANK_DEVICE,
    FactTable,
    fact_key,
    format_number,
    model_flops,
)
from trainmeter_core.model.records import Fact
from trainmeter_core.model.rig import resolve_rig

H100_URL = "https://resources.nvidia.com/en-us-tensor-core/gtc22-whitepaper-hopper"


def fact(name, value, provenance="detected", origin="agent", **header):
    return Fact(name=name, value=value, provenance=provenance, origin=origin, **header)


def gpu_fact(host, index, uuid, dense=989.4e12, **extra):
    value = {
        "index": index,
        "uuid": uuid,
        "name": "NVIDIA H100 80GB HBM3",
        "spec_id": "h100-sxm",
        "display_name": "NVIDIA H100 SXM",
        "dense_bf16_flop_per_s": dense,
        "tensor_clock_mhz": 1830.0,
        "memory_bandwidth_bps": 3.35e12,
        "peak_source": H100_URL,
        **extra,
    }
    return fact("gpu", value, origin="sampler:nvml", host=host, device=f"{host}/gpu{index}")


def device_fact(host, rank, kind="cuda", index=None, uuid=None):
    return fact("device", {"type": kind, "index": index, "uuid": uuid}, host=host, rank=rank)


def table(*facts):
    t = FactTable()
    for f in facts:
        t.add(f)
    return t


# ----------------------------------------------------------------------------------------------------------------------
# Precedence


def test_a_declared_value_beats_a_detected_one_and_the_warning_shows_both():
    t = table(
        fact("params", 1_100_000_000, "detected"), fact("params", 1_200_000_000, "declared", "--params")
    )
    assert t.value("params") == 1_200_000_000
    assert t.warnings() == ["params declared 1.2e9 but detected 1.1e9: using the declared value"]


def test_a_lower_provenance_arriving_later_is_kept_but_does_not_win():
    t = table(
        fact("params", 1_200_000_000, "declared", "--params"), fact("params", 1_100_000_000, "detected")
    )
    assert t.value("params") == 1_200_000_000
    assert t.losers["params"]["detected"].value == 1_100_000_000
    assert len(t.warnings()) == 1


def test_the_order_is_declared_then_emitted_then_detected_then_assumed():
    t = table(
        fact("dp", 1, "assumed"),
        fact("dp", 2, "detected"),
        fact("dp", 4, "emitted"),
    )
    assert t.value("dp") == 4
    # emitted 4 wins; detected 2 and assumed 1 are both kept and named, the nearer provenance first
    assert t.warnings() == [
        "dp emitted 4 but detected 2: using the emitted value",
        "dp emitted 4 but assumed 1: using the emitted value",
    ]


def test_a_newer_value_of_the_same_provenance_replaces_the_old_one_without_a_warning():
    t = table(fact("seq_len", 1024), fact("seq_len", 2048))
    assert t.value("seq_len") == 2048
    assert t.warnings() == []


def test_agreeing_values_raise_no_warning():
    t = table(fact("layers", 24, "detected"), fact("layers", 24, "declared", "--layers"))
    assert t.warnings() == []


def test_a_fact_carrying_its_own_warning_passes_it_on():
    t = table(fact("dp", 1, "assumed", warning="dp unknown: assumed 1, pass --dp"))
    assert t.warnings() == ["dp: dp unknown: assumed 1, pass --dp"]


def test_per_device_and_per_rank_facts_compete_only_with_their_own_scope():
    assert fact_key(gpu_fact("n1", 3, "GPU-3")) == "gpu@n1/gpu3"
    assert fact_key(device_fact("n1", 5, index=5)) == "device@rank5"
    assert fact_key(fact("device", {"type": "cpu"}, rank=None)) == "device@rank0"
    t = table(gpu_fact("n1", 0, "GPU-0"), gpu_fact("n1", 1, "GPU-1"))
    assert [f.device for f in t.scoped("gpu")] == ["n1/gpu0", "n1/gpu1"]


def test_numbers_in_warnings_read_as_a_person_writes_them():
    assert format_number(1.2e9) == "1.2e9"
    assert format_number(1_100_000_000) == "1.1e9"
    assert format_number(0.45) == "0.45"
    assert format_number(8) == "8"
    assert format_number(2.5e-5) == "2.5e-5"
    assert format_number({"flops": 1e12, "label": "measured"}) == "1e12 FLOP/s"


def test_the_table_round_trips_through_msgpack():
    import msgspec

    t = table(fact("params", 1, "detected"), fact("params", 2, "declared", "--params"))
    again = msgspec.msgpack.decode(msgspec.msgpack.encode(t), type=FactTable)
    assert again == t
    assert again.warnings() == t.warnings()


# ----------------------------------------------------------------------------------------------------------------------
# The rig


def test_no_rank_device_means_no_rig_even_with_gpus_sampled():
    rig = resolve_rig(table(gpu_fact("n1", 0, "GPU-0"), gpu_fact("n1", 1, "GPU-1")))
    assert rig.devices == ()
    assert rig.absent == NO_RANK_DEVICE == "no rank reported its device: pass --gpus"
    assert rig.peak_total_flop_per_s is None
    assert rig.peak_absent == NO_RANK_DEVICE


def test_a_cuda_device_maps_to_its_gpu_fact_by_uuid():
    rig = resolve_rig(
        table(
            gpu_fact("n1", 0, "GPU-aaa"),
            gpu_fact("n1", 1, "GPU-bbb"),
            device_fact("n1", 0, index=0, uuid="GPU-bbb"),
        )
    )
    (device,) = rig.devices
    assert (device.key, device.mapped_by) == ("n1/gpu1", "uuid")
    assert device.peak_flop_per_s == 989.4e12
    assert device.peak_kind == "datasheet"
    assert device.peak_source == H100_URL
    assert device.name == "NVIDIA H100 SXM"


def test_without_a_uuid_the_index_maps_through_cuda_visible_devices():
    facts = table(gpu_fact("n1", 2, "GPU-2"), gpu_fact("n1", 3, "GPU-3"), device_fact("n1", 0, index=1))
    rig = resolve_rig(facts, {"n1": ("2", "3")})
    assert [(d.key, d.mapped_by) for d in rig.devices] == [("n1/gpu3", "visible devices")]
    rig = resolve_rig(facts, {"n1": ("GPU-3", "GPU-2")})
    assert [d.key for d in rig.devices] == ["n1/gpu2"]
    # With no CUDA_VISIBLE_DEVICES, CUDA index 1 is NVML index 1: no such GPU sampled, so no datasheet peak.
    (device,) = resolve_rig(facts).devices
    assert device.key == "n1/cuda:1"
    assert device.peak_flop_per_s is None
    assert "no GPU sample describes this device" in device.peak_absent


def test_two_ranks_on_one_gpu_are_one_device():
    facts = table(
        gpu_fact("n1", 0, "GPU-0"),
        device_fact("n1", 0, index=0, uuid="GPU-0"),
        device_fact("n1", 1, index=0, uuid="GPU-0"),
    )
    (device,) = resolve_rig(facts).devices
    assert device.ranks == (0, 1)


def test_the_same_index_on_two_hosts_is_two_devices():
    facts = table(
        gpu_fact("a", 0, "GPU-a0"),
        gpu_fact("b", 0, "GPU-b0"),
        device_fact("a", 0, index=0),
        device_fact("b", 1, index=0),
    )
    rig = resolve_rig(facts)
    assert [d.key for d in rig.devices] == ["a/gpu0", "b/gpu0"]
    # Σ of the peaks: 2 × 989.4e12
    assert rig.peak_total_flop_per_s == 2 * 989.4e12


def test_an_unknown_gpu_has_no_peak_and_says_why():
    unknown = gpu_fact(
        "n1",
        0,
        "GPU-0",
        dense=None,
        spec_id=None,
        display_name=None,
        name="NVIDIA Mystery 9000",
        peak_absent="no device spec matches 'NVIDIA Mystery 9000'",
    )
    rig = resolve_rig(table(unknown, device_fact("n1", 0, index=0, uuid="GPU-0")))
    assert rig.peak_total_flop_per_s is None
    assert rig.peak_absent == "no device spec matches 'NVIDIA Mystery 9000' (n1/gpu0)"


def test_a_cpu_run_uses_its_measured_peak_and_never_the_nodes_gpus():
    peak = fact(
        "peak",
        {"flops": 2e11, "label": "measured", "source": "tm peak, 4096² bf16 matmul", "device_type": "cpu"},
        origin="tm peak",
        device="n1/cpu",
    )
    facts = table(gpu_fact("n1", 0, "GPU-0"), peak, device_fact("n1", 0, "cpu"), device_fact("n1", 1, "cpu"))
    rig = resolve_rig(facts)
    assert [d.key for d in rig.devices] == ["n1/cpu/rank0", "n1/cpu/rank1"]  # one CPU device per rank
    assert rig.gpus == ()
    assert rig.peak_kind == "measured"
    assert rig.peak_total_flop_per_s == 4e11  # 2 ranks × 2e11


def test_a_cpu_device_without_a_peak_fact_names_the_flags():
    rig = resolve_rig(table(device_fact("n1", 0, "cpu")))
    assert rig.peak_absent == (
        "no peak for a cpu device: pass --peak-tflops X --peak-source TEXT (or measure one with tm peak) (n1/cpu/rank0)"
    )


def test_a_declared_peak_replaces_the_datasheet_and_is_labelled_declared():
    peak = fact(
        "peak",
        {"flops": 900e12, "label": "declared", "source": "our cloud's clock cap", "device_type": "cuda"},
        "declared",
        "--peak-tflops",
    )
    rig = resolve_rig(table(gpu_fact("n1", 0, "GPU-0"), peak, device_fact("n1", 0, index=0)))
    (device,) = rig.devices
    assert (device.peak_flop_per_s, device.peak_kind, device.peak_source) == (
        900e12,
        "declared",
        "our cloud's clock cap",
    )


def test_a_cpu_peak_is_never_applied_to_a_gpu():
    peak = fact("peak", {"flops": 2e11, "label": "measured", "source": "tm peak", "device_type": "cpu"})
    rig = resolve_rig(table(gpu_fact("n1", 0, "GPU-0"), peak, device_fact("n1", 0, index=0)))
    assert rig.devices[0].peak_kind == "datasheet"


def test_a_mix_of_peaks_divides_by_their_sum_and_names_both_kinds():
    facts = table(
        gpu_fact("n1", 0, "GPU-0"),
        fact(
            "peak",
            {"flops": 1e12, "label": "measured", "source": "tm peak", "device_type": "cpu"},
            device="n1/cpu",
        ),
        device_fact("n1", 0, index=0),
        device_fact("n1", 1, "cpu"),
    )
    rig = resolve_rig(facts)
    assert rig.peak_total_flop_per_s == 989.4e12 + 1e12
    assert rig.peak_kind == "datasheet+measured"


# ----------------------------------------------------------------------------------------------------------------------
# FLOPs per token

SHAPE_1B = {
    "params": 1_039_290_368,
    "embedding_params": 67_633_152,
    "layers": 18,
    "d_model": 2048,
    "seq_len": 1024,
}


def shape_facts(**overrides):
    values = {**SHAPE_1B, **overrides}
    return [fact(name, value, "declared", f"--{name}") for name, value in values.items() if value is not None]


def test_without_a_convention_flop_per_token_is_a_range_over_the_four():
    flops = model_flops(table(*shape_facts()))
    # hf 5,829,943,296 is the lowest and all_params 6,688,727,040 the highest (pinned in test_flops)
    assert (flops.low, flops.high, flops.value, flops.convention) == (
        5_829_943_296,
        6_688_727_040,
        None,
        None,
    )


def test_a_chosen_convention_gives_one_value_under_its_name():
    flops = model_flops(table(*shape_facts(), fact("convention", "megatron", "declared", "--convention")))
    assert (flops.value, flops.convention) == (6_056_435_712, "megatron")


def test_a_chosen_convention_missing_an_input_is_absent_with_the_flag():
    flops = model_flops(
        table(*shape_facts(layers=None), fact("convention", "titan", "declared", "--convention"))
    )
    assert flops.value is None
    assert flops.absent == "layers unknown: pass --layers (or pass --flops-per-token)"


def test_the_one_convention_that_can_be_computed_gives_one_number_under_it_and_names_the_others():
    flops = model_flops(table(*shape_facts(layers=None)))
    # only hf = 6(N − E) = 6 × 971,657,216 = 5,829,943,296 needs no layers: one number under hf, not a range
    assert (flops.value, flops.convention, flops.low, flops.high) == (5_829_943_296, "hf", None, None)
    assert flops.note == (
        "only hf could be computed (no convention chosen); the others lack an input: "
        "titan: layers unknown: pass --layers; megatron: layers unknown: pass --layers; "
        "all_params: layers unknown: pass --layers"
    )


def test_without_the_embedding_count_all_params_is_the_one_number():
    # No embedding count: titan, megatron and hf need it; all_params alone does not, so it is the one number.
    flops = model_flops(table(*shape_facts(embedding_params=None)))
    assert flops.convention == "all_params" and flops.value == flops.per_convention["all_params"]


def test_no_shape_at_all_names_every_missing_input_once():
    flops = model_flops(table())
    assert not flops.known
    assert flops.absent.startswith("parameter count unknown: pass --params; embedding parameters unknown")
    assert flops.absent.count("--params") == 1


def test_a_declared_flop_per_token_needs_no_shape():
    flops = model_flops(table(fact("flop_per_token", 6.28e9, "declared", "--flops-per-token")))
    assert (flops.value, flops.convention) == (6.28e9, "declared")


def test_a_count_given_as_a_whole_float_is_a_count():
    flops = model_flops(
        table(*shape_facts(params=1.039290368e9), fact("convention", "hf", "declared", "--convention"))
    )
    assert flops.value == 5_829_943_296


@pytest.mark.parametrize("bad", [1.5, "many", True])
def test_a_count_that_is_not_whole_is_named_not_guessed(bad):
    flops = model_flops(
        table(*shape_facts(layers=bad), fact("convention", "titan", "declared", "--convention"))
    )
    assert flops.value is None
    assert "--layers" in flops.absent
