"""Communication, a metric family: each rank's exposed collective wait and bus bandwidth per operation kind, and the
straggler, the rank that made the others wait, with its cause. Pure: no I/O, no clock. It compares each rank's own
measured wait, never the clocks of different hosts (docs/metrics.md, "Communication and the straggler")."""

from __future__ import annotations

import math

from trainmeter_core.model import formulas, records
from trainmeter_core.model.engine.builder import EI, SnapshotBuilder
from trainmeter_core.model.engine.state import CollectiveOp, EngineState, GpuState, RankState

#: The origin of the collective probe's metric records (docs/bus.md, "Collective metrics").
ORIGIN = "collectives"
#: A rank's exposed wait in collectives during one step, in the probe's records.
WAIT_KEY = "collective_wait_s"
#: The straggler is named when the others' median wait exceeds its own by this share of the median step time.
STRAGGLER_SHARE = 0.10
#: Steps with a collective wait a rank must have reported before it is compared (its EMA has settled by then).
STRAGGLER_MIN_STEPS = 10
#: A GPU whose SM clock is this much below the other GPUs' of its host (their median) counts as slow.
CLOCK_BELOW = 0.10
#: The clock event reasons that slow a GPU down (power or heat; nvml.h).
_SLOWING_REASONS = ("sw_power_cap", "hw_power_brake", "hw_slowdown", "sw_thermal", "hw_thermal")
_FIELDS = ("bytes", "time_s", "count")
#: Operation kinds and group sizes kept per rank: a probe that made up ever new names must not grow the state.
KINDS_MAX = 64
_ALPHA = formulas.EMA_ALPHA

NO_PROBE = "no collective probe reported: no rank sent a collectives metric record"
FEW_RANKS = "fewer than 2 ranks report collective waits"


def bus_factor(op: str, ranks: int) -> float | None:
    """nccl-tests' bus bandwidth factor of an operation on ``ranks`` ranks (its doc/PERFORMANCE.md): busbw = algbw ×
    the factor. None for an operation it gives none (a barrier moves no data; an unknown kind)."""
    n = ranks
    if n < 1:
        return None
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if op in ("broadcast", "reduce", "send", "recv"):
        return 1.0
    return None


def operation_bytes(op: str, rank_bytes: float, ranks: int) -> float:
    """nccl-tests' size S of one operation from the bytes one rank contributed (its input tensor): the whole gathered
    array for an all_gather (n × the input), the input itself for every other kind."""
    return rank_bytes * ranks if op == "all_gather" else rank_bytes


# ----------------------------------------------------------------------------------------------------------------------
# Records in


def take_collectives(state: EngineState, record: records.Metric) -> None:
    """One step of one rank's collectives (a metric record of origin ``collectives``) into that rank's state: its
    exposed wait and each operation kind's bytes, time and count, as EMAs per step. They make no series of the loop."""
    rank_id = record.rank or 0
    rank = state.ranks.get(rank_id)
    if rank is None:
        rank = state.ranks[rank_id] = RankState(host=record.host)
    take_rank_values(rank, record.values)


def take_rank_values(rank: RankState, values: dict[str, float]) -> None:
    """``take_collectives`` for a rank whose state exists (its fields of the collectives alone: the engine's one pass
    over a block's steps takes a step's row by this between two steps, ``block_take.take_run``)."""
    wait = values.get(WAIT_KEY)
    if wait is not None and 0.0 <= wait < math.inf:
        previous = rank.collective_wait_ema_s
        rank.collective_wait_ema_s = wait if previous is None else previous + _ALPHA * (wait - previous)
        rank.collective_steps += 1
    per_op: dict[str, dict[str, float]] = {}
    for key, value in values.items():
        if not key.startswith("coll."):
            continue
        parts = key.split(".")
        if len(parts) != 4 or parts[3] not in _FIELDS or not parts[2].isdigit():
            continue  # not of the contract's shape: coll.<op>.<n>.<field>
        if not 0.0 <= value < math.inf:
            continue
        per_op.setdefault(f"{parts[1]}.{parts[2]}", {})[parts[3]] = value
    for name, fields in per_op.items():
        kind = rank.collectives.get(name)
        if kind is None:
            if len(rank.collectives) >= KINDS_MAX:
                continue
            op, size = name.rsplit(".", 1)
            kind = rank.collectives[name] = CollectiveOp(op=op, group_size=int(size))
        kind.steps += 1
        kind.bytes_ema = _ema(kind.bytes_ema, fields.get("bytes"))
        kind.time_ema_s = _ema(kind.time_ema_s, fields.get("time_s"))
        kind.count_ema = _ema(kind.count_ema, fields.get("count"))


def _ema(previous: float | None, sample: float | None) -> float | None:
    if sample is None:
        return previous
    return sample if previous is None else previous + _ALPHA * (sample - previous)


# ----------------------------------------------------------------------------------------------------------------------
# The metric family


def communication(snap: SnapshotBuilder, stats: list[records.RankStat]) -> None:
    """Each rank's exposed collective wait and bus bandwidths, their median, and the straggler with its cause."""
    state = snap.state
    reporting = [s for s in stats if s.collective_wait_s is not None]
    formula = "median over the ranks of each rank's EMA of its exposed collective wait per step"
    if not reporting:
        snap.put(WAIT_KEY, formula, absent=NO_PROBE, unit="s")
    else:
        inputs = {f"rank {s.rank}": EI(value=s.collective_wait_s, unit="s", source=s.host) for s in reporting}
        value = formulas.median([s.collective_wait_s for s in reporting])  # type: ignore[misc]
        snap.put(WAIT_KEY, formula, value=value, unit="s", label="ema", inputs=inputs)
    for stat in reporting:
        put_rank(snap, stat, state.ranks[stat.rank].collectives)
    straggler(snap, stats)


def put_rank(snap: SnapshotBuilder, stat: records.RankStat, kinds: dict[str, CollectiveOp]) -> None:
    """One rank's exposed collective wait, and its bus bandwidth per operation kind and group size."""
    rank = stat.rank
    snap.put(
        f"{WAIT_KEY}.rank{rank}",
        f"EMA, alpha {_ALPHA}, of rank {rank}'s seconds per step blocked in collectives with nothing else to do",
        value=stat.collective_wait_s,
        unit="s",
        label=stat.host,
        inputs={"steps": EI(value=stat.collective_steps, source="collectives metric records")},
    )
    for name, kind in sorted(kinds.items()):
        key = f"bus_bandwidth_bps.{name}.rank{rank}"
        factor = bus_factor(kind.op, kind.group_size)
        size = "n × the bytes it contributed" if kind.op == "all_gather" else "the bytes it contributed"
        formula = (
            f"algbw × factor (nccl-tests): algbw = S / t, S = {size} per step (EMA), t = the {kind.op}s' "
            f"measured time per step (EMA); factor {_factor_words(kind.op)}, n = {kind.group_size}"
        )
        if factor is None:
            why = (
                "a barrier moves no data"
                if kind.op == "barrier"
                else f"nccl-tests gives no bus bandwidth factor for {kind.op}"
            )
            snap.put(key, formula, absent=why, unit="B/s", label=stat.host)
            continue
        if not kind.bytes_ema or not kind.time_ema_s:
            why = (
                f"rank {rank}'s {kind.op}s reported no bytes"
                if not kind.bytes_ema
                else f"rank {rank}'s {kind.op}s reported no duration (the probe times a collective Python waited "
                "on; DDP's reducer waits in C++, and torch's flight recorder gives no durations on Gloo)"
            )
            snap.put(key, formula, absent=why, unit="B/s", label=stat.host)
            continue
        size_b = operation_bytes(kind.op, kind.bytes_ema, kind.group_size)
        algbw = size_b / kind.time_ema_s
        inputs = {
            "bytes_per_step": EI(value=kind.bytes_ema, unit="B", source="the rank's input tensors"),
            "time_per_step_s": EI(value=kind.time_ema_s, unit="s"),
            "count_per_step": EI(value=kind.count_ema),
            "algbw_bps": EI(value=algbw, unit="B/s"),
            "factor": EI(value=factor),
        }
        snap.put(key, formula, value=algbw * factor, unit="B/s", label=stat.host, inputs=inputs)


def _factor_words(op: str) -> str:
    if op == "all_reduce":
        return "2(n−1)/n"
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return "(n−1)/n"
    if op in ("broadcast", "reduce", "send", "recv"):
        return "1"
    return "unknown"


def straggler(snap: SnapshotBuilder, stats: list[records.RankStat]) -> None:
    """``straggler_wait_s``, how long the others wait per step for the rank that waits least (its cause the label),
    and ``straggler_rank``, that rank, named once the wait exceeds STRAGGLER_SHARE of the median step time."""
    rank_formula = (
        f"the rank with the least collective wait, named when the other ranks' median wait exceeds its own by "
        f"{STRAGGLER_SHARE:.0%} of the median step time (ranks with {STRAGGLER_MIN_STEPS} or more steps reported)"
    )
    wait_formula = "median of the other ranks' collective waits − the least-waiting rank's (EMAs per step)"
    compared = [
        s
        for s in stats
        if s.collective_wait_s is not None and s.collective_steps >= STRAGGLER_MIN_STEPS and s.step_time_s
    ]
    if len(compared) < 2:
        reporting = [s for s in stats if s.collective_wait_s is not None]
        if not reporting:
            why = NO_PROBE
        elif len(reporting) < 2:
            why = FEW_RANKS
        else:
            why = f"fewer than 2 ranks have reported {STRAGGLER_MIN_STEPS} steps of collective waits"
        snap.put("straggler_rank", rank_formula, absent=why)
        snap.put("straggler_wait_s", wait_formula, absent=why, unit="s")
        return
    slow = min(compared, key=lambda s: (s.collective_wait_s, s.rank))
    others = [s for s in compared if s is not slow]
    gap_s = formulas.median([s.collective_wait_s for s in others]) - slow.collective_wait_s  # type: ignore[misc]
    step_s = formulas.median([s.step_time_s for s in compared])  # type: ignore[misc]
    cause, evidence = _cause(snap, slow, others, gap_s)
    threshold_s = STRAGGLER_SHARE * step_s
    inputs = {f"rank {s.rank} wait": EI(value=s.collective_wait_s, unit="s", source=s.host) for s in compared}
    inputs["median_step_time_s"] = EI(value=step_s, unit="s")
    inputs["threshold_s"] = EI(
        value=threshold_s, unit="s", source=f"{STRAGGLER_SHARE:.0%} of the median step"
    )
    inputs.update(evidence)
    named = gap_s > threshold_s
    note = (
        f"rank {slow.rank} on {slow.host} makes the others wait {gap_s * 1e3:.0f} ms per step; cause: {cause}"
        if named
        else f"no rank makes the others wait: the largest gap {gap_s * 1e3:.1f} ms is under the threshold"
    )
    snap.put(
        "straggler_wait_s",
        wait_formula,
        value=max(0.0, gap_s),
        unit="s",
        label=cause if named else None,
        inputs=inputs,
        note=note,
    )
    if not named:
        why = (
            f"no straggler: the others wait {max(0.0, gap_s) * 1e3:.1f} ms per step for rank {slow.rank}, under "
            f"{STRAGGLER_SHARE:.0%} of the median step ({threshold_s * 1e3:.1f} ms)"
        )
        snap.put("straggler_rank", rank_formula, absent=why)
        return
    snap.put(
        "straggler_rank", rank_formula, value=float(slow.rank), label=slow.host, inputs=inputs, note=note
    )


def _cause(
    snap: SnapshotBuilder, slow: records.RankStat, others: list[records.RankStat], gap_s: float
) -> tuple[str, dict[str, records.ExplainInput]]:
    """What was slow on the straggler: ``data wait`` where its data-wait excess over the others' median is the larger
    share of the gap, else ``compute``, and ``its GPU`` when its GPU is throttled or clocked below its host's others."""
    evidence: dict[str, records.ExplainInput] = {}
    data_excess_s = 0.0
    waits = [s.data_wait_s for s in others if s.data_wait_s is not None]
    if slow.data_wait_s is not None and waits:
        data_excess_s = slow.data_wait_s - formulas.median(waits)
        evidence["data_wait_excess_s"] = EI(value=data_excess_s, unit="s", source="data_wait phases")
    evidence["compute_excess_s"] = EI(
        value=gap_s - data_excess_s, unit="s", source="the gap less the data wait"
    )
    if data_excess_s > gap_s - data_excess_s:
        return "data wait", evidence
    gpu = _slow_gpu(snap, slow, others)
    if gpu is None:
        return "compute", evidence
    words, key = gpu
    evidence["gpu"] = EI(value=None, source=key)
    return f"its GPU: {words}", evidence


def _slow_gpu(
    snap: SnapshotBuilder, slow: records.RankStat, others: list[records.RankStat]
) -> tuple[str, str] | None:
    """The straggler's GPU and why it is slow (its clock event reasons, or its SM clock below the median of the
    others' GPUs on its own host: clocks of different hosts are never compared), or None."""
    state = snap.state
    gpus = {d.key: d.gpu_key for d in snap.derived.rig.devices if d.gpu_key is not None}
    mine = _gpu_of(state, gpus, slow.device)
    if mine is None:
        return None
    key, gpu = mine
    reasons = [r for r in gpu.throttle if r in _SLOWING_REASONS]
    if reasons:
        return f"{key} throttled ({', '.join(reasons)})", key
    clocks = []
    for other in others:
        theirs = _gpu_of(state, gpus, other.device)
        if theirs is None or theirs[0] == key or theirs[1].host != gpu.host:
            continue
        if theirs[1].clock_sm_mhz is not None:
            clocks.append(theirs[1].clock_sm_mhz)
    if gpu.clock_sm_mhz is not None and clocks:
        usual = formulas.median(clocks)
        if gpu.clock_sm_mhz < (1 - CLOCK_BELOW) * usual:
            return f"{key} at {gpu.clock_sm_mhz:.0f} MHz, the others of {gpu.host} at {usual:.0f} MHz", key
    return None


def _gpu_of(state: EngineState, gpus: dict[str, str], device: str | None) -> tuple[str, GpuState] | None:
    gpu_key = gpus.get(device) if device is not None else None
    gpu = state.gpus.get(gpu_key) if gpu_key is not None else None
    return None if gpu is None or gpu_key is None else (gpu_key, gpu)
