"""Throughput, a metric family: rank 0's step time and tokens/s (EMAs), tokens seen, and the spread of step times over
ranks. Pure: no I/O, no clock."""

from __future__ import annotations

from trainmeter_core.model import formulas, records
from trainmeter_core.model.engine.builder import EI, NO_STEP, NO_TOKENS, SnapshotBuilder
from trainmeter_core.model.engine.nodes import clock_name, node_rank_of


def throughput(snap: SnapshotBuilder) -> None:
    state = snap.state
    clock = state.ranks.get(state.clock_rank or 0)  # rank 0, or a node's own first rank (nodes.is_clock)
    who = clock_name(state)
    alpha = formulas.EMA_ALPHA
    one_step = "one step so far: a rate needs two"
    if clock is not None and clock.step_time_ema_s is not None:
        snap.put(
            "step_time_s",
            f"EMA of {who}'s seconds per step, alpha {alpha}",
            value=clock.step_time_ema_s,
            unit="s",
            label="ema",
            inputs={"steps": EI(value=state.steps, source=f"{who} step records")},
        )
    else:
        snap.put(
            "step_time_s",
            f"EMA of {who}'s seconds per step",
            absent=one_step if state.steps else NO_STEP,
        )
    formula = (
        f"EMA(tokens per step) / EMA(step interval), alpha {alpha}, {who}'s steps, profiled ones left out"
    )
    if state.tokens_ema is not None and state.interval_ema_s:
        snap.tps = formulas.rate_per_s(state.tokens_ema, state.interval_ema_s)
        note = "dp unknown: tokens × dp assumed dp = 1 (pass --dp)" if state.dp_assumed else None
        snap.put(
            "tokens_per_s",
            formula,
            value=snap.tps,
            unit="tokens/s",
            label="ema",
            note=note,
            inputs={
                "tokens_per_step": EI(
                    value=state.last_tokens_per_step, unit="tokens", source=state.last_tokens_source
                ),
                "tokens_per_step_ema": EI(value=state.tokens_ema, unit="tokens"),
                "step_interval_ema_s": EI(value=state.interval_ema_s, unit="s"),
            },
        )
    else:
        snap.tps_absent = (
            NO_STEP if not state.steps else (NO_TOKENS if not state.steps_with_tokens else one_step)
        )
        snap.put("tokens_per_s", formula, absent=snap.tps_absent, unit="tokens/s")
    if state.steps_with_tokens:
        missing = state.steps - state.steps_with_tokens
        note = f"{missing} steps without a token count are not included" if missing else None
        snap.put(
            "tokens",
            f"Σ tokens per step over {who}'s steps",
            value=float(state.tokens_seen),
            unit="tokens",
            note=note,
            inputs={"steps": EI(value=state.steps_with_tokens, source=state.last_tokens_source)},
        )
    else:
        snap.put("tokens", "Σ tokens per step", absent=NO_TOKENS if state.steps else NO_STEP, unit="tokens")


def ranks(snap: SnapshotBuilder) -> list[records.RankStat]:
    state = snap.state
    device_of = {rank: d.key for d in snap.derived.rig.devices for rank in d.ranks}
    stats = [
        records.RankStat(
            rank=r,
            host=s.host,
            steps=s.steps,
            step_time_s=s.step_time_ema_s,
            device=device_of.get(r),
            node=node_rank_of(state, s.host),
            collective_wait_s=s.collective_wait_ema_s,
            data_wait_s=s.data_wait_ema_s,
            compute_s=_compute_s(s.step_time_ema_s, s.collective_wait_ema_s, s.data_wait_ema_s),
            collective_steps=s.collective_steps,
        )
        for r, s in sorted(state.ranks.items())
    ]
    timed = [s for s in stats if s.step_time_s is not None]
    formula = "(max − min) / median of the per-rank step-time EMAs"
    if len(timed) < 2:
        snap.put("straggler_spread", formula, absent="needs step times from 2 or more ranks")
    else:
        spread, slowest = formulas.straggler_spread([s.step_time_s for s in timed])  # type: ignore[misc]
        inputs = {f"rank {s.rank}": EI(value=s.step_time_s, unit="s", source=s.host) for s in timed}
        inputs["slowest_rank"] = EI(value=timed[slowest].rank, source=timed[slowest].host)
        snap.put(
            "straggler_spread",
            formula,
            value=spread,
            inputs=inputs,
            note=f"the slowest rank is {timed[slowest].rank} on {timed[slowest].host}",
        )
    return stats


def _compute_s(step_s: float | None, wait_s: float | None, data_wait_s: float | None) -> float | None:
    """A rank's compute per step: its step time less its exposed collective wait and its data wait (a rank with no
    data-wait probe keeps its data wait in compute, as the time split does); None without a step time or a wait."""
    if step_s is None or wait_s is None:
        return None
    return max(0.0, step_s - wait_s - (data_wait_s or 0.0))
