"""The run's energy, a metric family: joules from NVML's total energy counter on the run's GPUs (each GPU's rises
between its samples), the integral of sampled power where a GPU has no counter (and the label says so), and kWh, J per
token and J per step. Pure: no I/O, no clock.

It never counts a GPU the run does not hold, and never a counter that also counts someone else (another process on
the GPU, a MIG slice's neighbours): the energy is then absent with the reason, never the node's.
"""

from __future__ import annotations

from trainmeter_core.model import records
from trainmeter_core.model.engine import attempts
from trainmeter_core.model.engine.builder import EI, NO_STEP, NO_TOKENS, SnapshotBuilder
from trainmeter_core.model.engine.state import EngineState, GpuState

J_PER_KWH = 3.6e6
FORMULA = (
    "Σ over the run's GPUs of the rises of NVML's total energy counter between the GPU's samples "
    "(∫ sampled power dt on a GPU without the counter)"
)
COUNTER = "energy counter"
INTEGRAL = "∫ sampled power"
NOT_THE_RUNS = (
    "no GPU is known to be the run's: tm watches every GPU for the hardware view only "
    "(pass --gpus or set CUDA_VISIBLE_DEVICES)"
)
BACKWARDS = "the counter went backwards (a driver reload or a GPU reset)"
KWH_FORMULA = "energy_j / 3.6e6"
PER_TOKEN_FORMULA = "energy_j / tokens seen (the whole run's energy, start-up included)"
PER_STEP_FORMULA = "energy_j / steps (the whole run's energy, start-up included)"


def take_energy(
    state: EngineState,
    gpu: GpuState,
    record: records.SampleGpu,
    power_w: float | None,
    previous_t: float | None,
) -> None:
    """One sample into its GPU's energy: the counter's rise since its previous reading and power × the time since the
    previous sample, never across a resumed run's gap. Whether the GPU is the run's is decided when the energy is
    shown (``energy``): a GPU the run ends up on was paid for from the run's start."""
    if record.mig_parent_uuid is not None:
        gpu.mig_parent_uuid = record.mig_parent_uuid
    gpu.for_run = gpu.for_run or record.for_run
    if record.other_pids:
        gpu.other_pids = sorted(set(gpu.other_pids) | set(record.other_pids))
    if "other_pids" in record.absent:
        gpu.others_unknown = record.absent["other_pids"]
    if power_w is not None and previous_t is not None and record.t > previous_t:
        gpu.energy_j += power_w * (record.t - previous_t)
        gpu.power_samples += 1
    counter_j = record.energy_j
    if counter_j is None:
        gpu.counter_absent = record.absent.get("energy_j") or "the sampler read no energy counter"
        return
    gpu.counter_absent = None
    since_t = attempts.previous_reading(state, gpu.counter_t)  # the run's down time is not the run's energy
    if gpu.counter_j is not None and since_t is not None and record.t > since_t:
        rise_j = counter_j - gpu.counter_j
        if rise_j < 0:
            gpu.counter_dropped += 1
        else:
            gpu.counter_energy_j += rise_j
            gpu.counter_intervals += 1
    gpu.counter_j, gpu.counter_t = counter_j, record.t


def energy(snap: SnapshotBuilder, latest: list[GpuState], why: str | None) -> None:
    """``energy_j`` and what follows from it: ``energy_kwh``, ``energy_j_per_token``, ``energy_j_per_step``."""
    # The run's GPUs: those its ranks reported, else those the sampler's selection said are the run's.
    claimed = not snap.derived.rig.absent
    held = [gpu for gpu in latest if claimed or gpu.for_run]
    reason = why or (None if held else (NOT_THE_RUNS if latest else "no GPU sample yet"))
    total_j = 0.0
    inputs: dict[str, records.ExplainInput] = {}
    integrated: list[str] = []
    dropped = 0
    notes: list[str] = []
    for gpu in held if reason is None else []:
        key = f"{gpu.host}/gpu{gpu.index}"
        reason = _not_the_runs_alone(key, gpu)
        if reason is not None:
            break
        if gpu.counter_intervals or gpu.counter_dropped:
            total_j += gpu.counter_energy_j
            dropped += gpu.counter_dropped
            lost = f", {gpu.counter_dropped} dropped: {BACKWARDS}" if gpu.counter_dropped else ""
            source = f"{COUNTER}, {gpu.counter_intervals} intervals{lost}"
            inputs[key] = EI(value=gpu.counter_energy_j, unit="J", source=source)
        elif gpu.counter_absent is not None and gpu.power_samples:
            total_j += gpu.energy_j
            integrated.append(key)
            source = f"{INTEGRAL} over {gpu.power_samples} samples: no energy counter ({gpu.counter_absent})"
            inputs[key] = EI(value=gpu.energy_j, unit="J", source=source)
        else:
            reason = _no_reading(key, gpu)
            break
        if gpu.others_unknown is not None:
            notes.append(f"{key}: tm could not tell whether another process uses it ({gpu.others_unknown})")
    if reason is not None:
        for key, formula, unit in (
            ("energy_j", FORMULA, "J"),
            ("energy_kwh", KWH_FORMULA, "kWh"),
            ("energy_j_per_token", PER_TOKEN_FORMULA, "J/token"),
            ("energy_j_per_step", PER_STEP_FORMULA, "J/step"),
        ):
            snap.put(key, formula, absent=reason, unit=unit)
        return
    label = _label(integrated, dropped, len(inputs))
    if dropped:
        inputs["dropped_intervals"] = EI(value=dropped, source=BACKWARDS)
    note = "; ".join(notes) or None
    snap.put("energy_j", FORMULA, value=total_j, unit="J", label=label, inputs=inputs, note=note)
    snap.put("energy_kwh", KWH_FORMULA, value=total_j / J_PER_KWH, unit="kWh", label=label)
    state = snap.state
    formula = PER_TOKEN_FORMULA
    if state.steps_with_tokens and state.tokens_seen:
        tokens = EI(value=state.tokens_seen, source="tokens seen")
        snap.put(
            "energy_j_per_token",
            formula,
            value=total_j / state.tokens_seen,
            unit="J/token",
            label=label,
            inputs={"energy_j": EI(value=total_j, unit="J"), "tokens": tokens},
        )
    else:
        snap.put("energy_j_per_token", formula, absent=NO_TOKENS if state.steps else NO_STEP, unit="J/token")
    formula = PER_STEP_FORMULA
    if state.steps:
        steps = EI(value=state.steps, source="steps kept")
        snap.put(
            "energy_j_per_step",
            formula,
            value=total_j / state.steps,
            unit="J/step",
            label=label,
            inputs={"energy_j": EI(value=total_j, unit="J"), "steps": steps},
        )
    else:
        snap.put("energy_j_per_step", formula, absent=NO_STEP, unit="J/step")


def _not_the_runs_alone(key: str, gpu: GpuState) -> str | None:
    if gpu.mig_parent_uuid is not None:
        return (
            f"{key} is a MIG slice: NVML's energy counter and power are the whole GPU's "
            f"({gpu.mig_parent_uuid}), shared with its other slices"
        )
    if gpu.other_pids:
        pids = ", ".join(str(pid) for pid in gpu.other_pids[:5])
        more = f" and {len(gpu.other_pids) - 5} more" if len(gpu.other_pids) > 5 else ""
        return f"another process also uses {key} (pid {pids}{more}): its energy counter counts both"
    return None


def _no_reading(key: str, gpu: GpuState) -> str:
    if gpu.counter_absent is not None:
        return f"no energy counter on {key} ({gpu.counter_absent}) and no two power readings"
    return f"no two energy counter readings from {key} yet"


def _label(integrated: list[str], dropped: int, n_gpus: int) -> str:
    if not integrated:
        label = COUNTER
    elif len(integrated) == n_gpus:
        label = f"{INTEGRAL} (no energy counter)"
    else:
        label = f"{COUNTER}; {INTEGRAL} on {', '.join(integrated)} (no counter)"
    if dropped:
        label += f", {dropped} interval{'s' if dropped > 1 else ''} dropped (counter went backwards)"
    return label
