"""One snapshot from the engine's state: the metric families in order, then the series, ranks, facts and warnings.

Pure: no I/O, no clock. The order matters: later families read what earlier ones found (tokens/s, MFU, ETA, elapsed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainmeter_core.model import records
from trainmeter_core.model.engine import (
    attempts,
    budget,
    collectives,
    counters,
    health,
    nodes,
    profiles,
    throughput,
    time_split,
    utilization,
)
from trainmeter_core.model.engine.builder import SnapshotBuilder
from trainmeter_core.model.facts import number

if TYPE_CHECKING:
    from trainmeter_core.model.engine.derived import Derived
    from trainmeter_core.model.engine.state import EngineState
    from trainmeter_core.model.history import History

#: Metric keys of schema 1, where ``flops`` named a count and a rate alike, and their schema-2 names. Each snapshot
#: carries the old key too, as a copy of the new one, until ``OLD_KEYS_LEAVE_IN`` (docs/api.md, "Old spellings"), so
#: subscribers keep working meanwhile.
OLD_METRIC_KEYS = {
    "flops_per_token": "flop_per_token",
    "flops_spent": "spent_flop",
    "flops_required": "required_flop",
    "observed_flops": "observed_flop",
}
#: The release that drops the old spellings (of the snapshot's metrics and of passport.json); docs/api.md says so.
OLD_KEYS_LEAVE_IN = "0.2.0"


def with_old_keys(metrics: dict[str, records.MetricValue]) -> dict[str, records.MetricValue]:
    """The metrics plus their schema-1 aliases (``flops_per_token.titan`` for ``flop_per_token.titan``, ...)."""
    aliases = {}
    for key, value in metrics.items():
        head, dot, tail = key.partition(".")
        for old, new in OLD_METRIC_KEYS.items():
            if head == new:
                aliases[old + dot + tail] = value
    return metrics | aliases


def build_snapshot(state: EngineState, derived: Derived, final: bool, lean: bool = False) -> records.Snapshot:
    """The snapshot of an engine's state: every metric, its explain, the series, ranks, time split, facts, warnings.

    ``lean`` builds only the metrics history keeps over time, without explain: for catching up quietly.
    """
    snap = SnapshotBuilder(state, derived, final, lean)
    if lean:
        throughput.throughput(snap)
        utilization.mfu_metrics(snap)
        utilization.after_counters(snap, *counters.counters(snap))
        time_split.time_split(snap)
        return records.Snapshot(tick=state.tick, metrics=snap.metrics)
    throughput.throughput(snap)
    budget.flop_per_token(snap)
    budget.budget(snap)
    utilization.mfu_metrics(snap)
    utilization.after_counters(snap, *counters.counters(snap))
    phases = time_split.time_split(snap)
    ranks = throughput.ranks(snap)
    collectives.communication(snap, ranks)
    job_nodes = nodes.nodes(snap)
    budget.plan(snap)
    health.host(snap)
    health.alert_inputs(snap)
    profile = profiles.profile_view(snap, state.profiles)
    attempts.put_metrics(snap)
    warnings = list(derived.fact_warnings) + attempts.warnings(state)
    declared_tokens = derived.declared_tokens_per_step
    if state.tokens_mismatch is not None and declared_tokens is not None:
        warnings.append(
            f"tokens_per_step declared {declared_tokens} but detected {state.tokens_mismatch}: "
            "using the declared value"
        )
    experts = number(state.facts.value("moe_experts"))
    if experts is not None and experts > 1:
        warnings.append(
            f"the model has {experts:g} experts: total parameters overstate FLOPs; declare the active parameters "
            "with --params"
        )
    return records.Snapshot(
        t=state.now_t if state.now_t is not None else 0.0,
        wall=state.now_wall,
        source="engine",
        tick=state.tick,
        final=final,
        state="finished" if final else ("running" if state.steps else "starting"),
        elapsed_s=snap.elapsed_s,
        steps=state.steps,
        tokens=state.tokens_seen if state.steps_with_tokens else None,
        metrics=with_old_keys(snap.metrics),
        explain=snap.explain,
        series=dict(state.series),
        ranks=ranks,
        phases_s=phases,
        phases_seen=dict(state.phases_seen),
        facts=dict(state.facts.winners),
        warnings=warnings,
        through_seq=state.through_seq,
        profile=profile,
        job=state.job,
        nodes=job_nodes,
        attempts=attempts.stats(state),
    )


#: The derived numbers kept over time (history series ``tm:<key>``), once a tick.
HISTORY_METRICS = (
    "tokens_per_s", "step_time_s", "mfu", "ofu", "util_gpu", "sm_active", "tensor_active", "dram_active",
    "arithmetic_intensity", "observed_flop", "goodput",
)  # fmt: skip


def record_history(history: History, derived: Derived, snapshot: records.Snapshot, wall: float) -> None:
    """The derived numbers of a tick's snapshot into the engine's history: a range is kept as its two ends."""
    step, tokens, flops = derived.x()
    add = history.add_point
    for key in HISTORY_METRICS:
        value = snapshot.metrics.get(key)
        if value is None:
            continue
        if value.value is not None:
            add(f"tm:{key}", step, tokens, flops, wall, value.value)
        elif value.low is not None and value.high is not None:
            add(f"tm:{key}.low", step, tokens, flops, wall, value.low)
            add(f"tm:{key}.high", step, tokens, flops, wall, value.high)
