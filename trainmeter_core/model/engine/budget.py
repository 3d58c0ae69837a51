"""The model's FLOPs, a metric family: FLOPs per token under every convention and counted, FLOPs spent and required,
progress and ETA, the declared plan and the projected hours, GPU-hours. Pure: no I/O, no clock."""

from __future__ import annotations

from trainmeter_core.model import formulas
from trainmeter_core.model.engine.builder import (
    EI,
    NO_BUDGET,
    NO_STEP,
    NO_TOKENS,
    SnapshotBuilder,
    fact_source,
    positive,
)
from trainmeter_core.model.facts import number, whole
from trainmeter_core.model.flops import CONVENTIONS

# The device kinds a rank reports that are GPUs (torch's device types; ROCm reports "cuda").
_GPU_KINDS = ("cuda", "mps", "xpu")


def flop_per_token(snap: SnapshotBuilder) -> None:
    flops = snap.derived.flops
    shape_inputs = {k: v for k, v in flops.inputs.items() if k not in ("convention", "flop_per_token")}
    for name, value in flops.per_convention.items():
        formula = CONVENTIONS[name].formula
        if value is None:
            snap.put(
                f"flop_per_token.{name}",
                formula,
                absent=flops.reasons[name],
                unit="FLOP/token",
                convention=name,
                inputs=shape_inputs,
            )
        else:
            snap.put(
                f"flop_per_token.{name}",
                formula,
                value=float(value),
                unit="FLOP/token",
                convention=name,
                inputs=shape_inputs,
            )
    _counted(snap)
    conv = flops.convention
    formula = CONVENTIONS[conv].formula if conv in CONVENTIONS else "the declared FLOPs per token"
    if conv is None:
        formula = "the range over the four conventions"
    snap.put_scaled("flop_per_token", formula, 1.0, "FLOP/token", inputs=dict(flops.inputs))
    if snap.derived.flops.note:
        snap.explain["flop_per_token"].note = snap.derived.flops.note


def _counted(snap: SnapshotBuilder) -> None:
    """``counted``: the agent's FLOPs per token; else its count of one step over the declared tokens per step."""
    facts = snap.state.facts
    counted = facts.get("counted_flop_per_token")
    counted_value = number(counted.value) if counted is not None else None
    formula = "executed FLOPs of one real step (FlopCounterMode, recompute included) / its tokens"
    common = {"unit": "FLOP/token", "convention": "counted"}
    note = "shown beside MFU, never in place of a named convention"
    if counted is not None and counted_value is not None:
        inputs = {"counted": EI(value=counted_value, unit="FLOP/token", source=fact_source(counted))}
        snap.put(
            "flop_per_token.counted",
            formula,
            value=counted_value,
            label="counted",
            note=note,
            inputs=inputs,
            **common,
        )
        return
    step = facts.get("counted_step_flop")
    step_flop = number(step.value) if step is not None else None
    state = snap.state
    tokens = state.last_tokens_per_step
    if step_flop is not None and tokens:
        # The agent counted one step of rank 0, whose tokens are the step's over the data-parallel ranks.
        dp = whole(facts.value("dp"))
        if dp is None and len(state.ranks) <= 1:
            dp = 1
        if dp is None or dp < 1:
            absent = f"{step_flop:,.0f} FLOPs counted in one step of rank 0, but the data-parallel degree is unknown: pass --dp"
            snap.put("flop_per_token.counted", formula, absent=absent, **common)
            return
        value = step_flop * dp / tokens
        inputs = {
            "counted_step_flop": EI(value=step_flop, unit="FLOP", source=fact_source(step)),
            "tokens_per_step": EI(value=tokens, unit="tokens", source=state.last_tokens_source),
            "dp": EI(value=dp, source=fact_source(facts.get("dp")) or "one rank"),
        }
        formula = "FLOPs counted in one step of rank 0 × dp / tokens per step"
        snap.put(
            "flop_per_token.counted",
            formula,
            value=value,
            label="counted",
            note=note,
            inputs=inputs,
            **common,
        )
        return
    # The agent's own reason when it counted but could not divide (tokens unknown, compiled model, ...).
    absent = (
        counted.note if counted is not None and counted.note else "no step was counted with FlopCounterMode"
    )
    snap.put("flop_per_token.counted", formula, absent=absent, **common)


def budget(snap: SnapshotBuilder) -> None:
    state = snap.state
    facts = state.facts
    tokens_known = bool(state.steps_with_tokens)
    if tokens_known:
        snap.put_scaled(
            "spent_flop",
            "FLOPs per token × tokens seen",
            float(state.tokens_seen),
            "FLOP",
            inputs={"tokens": EI(value=state.tokens_seen, unit="tokens")},
        )
    else:
        snap.put(
            "spent_flop",
            "FLOPs per token × tokens seen",
            absent=NO_TOKENS if state.steps else NO_STEP,
            unit="FLOP",
        )
    budget_tokens = positive(facts.value("budget_tokens"))
    budget_steps = positive(facts.value("budget_steps"))
    budget_flop = positive(facts.value("budget_flop"))
    budget_inputs = {
        name: EI(value=facts.value(name), source=fact_source(facts.get(name)))
        for name in ("budget_tokens", "budget_steps", "budget_flop")
        if facts.get(name) is not None
    }
    if budget_tokens:
        snap.put_scaled(
            "required_flop",
            "FLOPs per token × token budget",
            budget_tokens,
            "FLOP",
            inputs=budget_inputs,
        )
    elif budget_flop:
        snap.put(
            "required_flop",
            "the declared FLOPs budget",
            value=budget_flop,
            unit="FLOP",
            convention=snap.derived.flops.convention or "declared",
            label="declared",
            inputs=budget_inputs,
        )
    else:
        snap.put("required_flop", "FLOPs per token × token budget", absent=NO_BUDGET, unit="FLOP")
    progress = eta = None
    absent = NO_BUDGET
    eta_absent = snap.tps_absent  # what the ETA lacks once progress is known
    if budget_tokens:
        formula = "tokens seen / token budget; ETA = remaining tokens / tokens per s"
        if tokens_known:
            progress = formulas.progress(state.tokens_seen, budget_tokens)
            if snap.tps:
                eta = formulas.eta_s(budget_tokens - state.tokens_seen, snap.tps)
        absent = NO_TOKENS if state.steps else NO_STEP
    elif budget_steps:
        formula = "steps / step budget; ETA = remaining steps × step time"
        progress = formulas.progress(state.steps, budget_steps)
        step_time = state.ranks[0].step_time_ema_s if 0 in state.ranks else None
        if step_time:
            eta = formulas.eta_s(budget_steps - state.steps, 1.0 / step_time)
        absent = NO_STEP
        eta_absent = "one step so far: a step time needs two"
    elif budget_flop:
        formula = "FLOPs spent / FLOPs budget; ETA = remaining FLOPs / (FLOPs per token × tokens per s)"
        fpt = snap.derived.flops.value
        if fpt is not None and tokens_known:
            progress = formulas.progress(fpt * state.tokens_seen, budget_flop)
            if snap.tps:
                eta = formulas.eta_s(budget_flop - fpt * state.tokens_seen, fpt * snap.tps)
        absent = snap.derived.flops.absent or "a FLOPs budget needs one FLOPs per token: pass --convention"
        if fpt is not None:
            absent = NO_TOKENS if state.steps else NO_STEP
    else:
        formula = "tokens seen / token budget; ETA = remaining tokens / tokens per s"
    if progress is not None:
        snap.put("progress", formula, value=progress, inputs=budget_inputs)
    else:
        snap.put("progress", formula, absent=absent)
    if eta is not None:
        snap.eta_s = eta
        snap.put("eta_s", formula, value=eta, unit="s", inputs=budget_inputs)
    else:
        snap.put("eta_s", formula, absent=absent if progress is None else eta_absent, unit="s")


def plan(snap: SnapshotBuilder) -> None:
    facts = snap.state.facts
    for name, unit, flag in (("plan_mfu", None, "--plan-mfu"), ("plan_hours", "h", "--plan-hours")):
        value = number(facts.value(name))
        if value is None:
            snap.put(name, "declared", absent=f"plan not declared: pass {flag}", unit=unit)
        else:
            snap.put(
                name,
                "declared",
                value=value,
                unit=unit,
                label="declared",
                inputs={name: EI(value=value, source=fact_source(facts.get(name)))},
            )
    formula = "(elapsed + ETA) / 3600"
    if snap.eta_s is not None and snap.elapsed_s is not None:
        snap.put(
            "projected_hours",
            formula,
            value=formulas.projected_hours(snap.elapsed_s, snap.eta_s),
            unit="h",
            inputs={
                "elapsed_s": EI(value=snap.elapsed_s, unit="s"),
                "eta_s": EI(value=snap.eta_s, unit="s"),
            },
        )
    else:
        snap.put(
            "projected_hours",
            formula,
            absent=snap.metrics["eta_s"].absent or "no elapsed time yet",
            unit="h",
        )
    formula = "elapsed × the run's GPUs / 3600"
    gpus = [d for d in snap.derived.rig.devices if d.kind in _GPU_KINDS]
    if snap.derived.rig.absent or snap.elapsed_s is None or not gpus:
        # A CPU run spends no GPU-hours: that is unknown-as-absent, not a count of 0 GPUs.
        kinds = ", ".join(sorted({d.kind for d in snap.derived.rig.devices}))
        why = snap.derived.rig.absent or (
            "no elapsed time yet"
            if snap.elapsed_s is None
            else f"the run computes on no GPU (its devices: {kinds})"
        )
        snap.put("gpu_hours", formula, absent=why, unit="h")
    else:
        n = len(gpus)
        snap.put(
            "gpu_hours",
            formula,
            value=formulas.gpu_hours(snap.elapsed_s, n),
            unit="h",
            inputs={"n_devices": EI(value=n, source="device facts of the ranks' GPUs")},
        )
