"""Communication, a metric family: each rank's exposed collective wait and bus bandwidth per operation kind, and the
straggler, the rank that made the others wait, with its cause. Pure: no I/O, no clock. It compares each rank's own
measured wait, never the clocks of different hosts (docs/metrics.md, "Communication and the straggler")."""

from __future__ import annotations

import bisect
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
#: Steps with a collective wait a rank must have reported before it is compared.
STRAGGLER_MIN_STEPS = 10
#: The straggler compares each rank's mean wait over the same steps: the latest STRETCHES_COMPARED stretches of
#: STRETCH_STEPS steps that every compared rank has reported to their end (docs/metrics.md, "Why the same steps").
STRETCH_STEPS = 8
STRETCHES_COMPARED = 4
#: Stretches a rank keeps: a rank whose rows arrive this many steps ahead of another's still shares some with it.
STRETCHES_KEPT = 128
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
    take_rank_values(rank, record.values, record.step)


def take_rank_values(rank: RankState, values: dict[str, float], step: int | None) -> None:
    """``take_collectives`` for a rank whose state exists (its fields of the collectives alone: the engine's one pass
    over a block's steps takes a step's row by this between two steps, ``block_take.take_run``)."""
    wait = values.get(WAIT_KEY)
    if wait is not None and 0.0 <= wait < math.inf:
        previous = rank.collective_wait_ema_s
        rank.collective_wait_ema_s = wait if previous is None else previous + _ALPHA * (wait - previous)
        rank.collective_steps += 1
        if step is not None:
            _take_stretch(rank, step // STRETCH_STEPS, wait)
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


def _take_stretch(rank: RankState, stretch: int, wait: float) -> None:
    """One step's wait into its stretch. The probe sends a rank's steps in order: a step of an earlier stretch than
    the latest is a resumed attempt's, and the stretches before it start again."""
    stretches = rank.wait_stretches
    if stretches and stretches[-1] == stretch:
        rank.wait_sums_s[-1] += wait
        rank.wait_counts[-1] += 1
        return
    if stretches and stretch < stretches[-1]:
        stretches.clear()
        rank.wait_sums_s.clear()
        rank.wait_counts.clear()
    stretches.append(stretch)
    rank.wait_sums_s.append(wait)
    rank.wait_counts.append(1)
    if len(stretches) > STRETCHES_KEPT:
        del stretches[0], rank.wait_sums_s[0], rank.wait_counts[0]


def _index(rank: RankState, stretch: int) -> int | None:
    """Where ``stretch`` is among the rank's kept stretches, None where it has none: where its steps had no gap, at
    its distance from the latest, else found by bisection."""
    stretches = rank.wait_stretches
    at = len(stretches) - 1 - (stretches[-1] - stretch)
    if 0 <= at and stretches[at] == stretch:
        return at
    at = bisect.bisect_left(stretches, stretch)
    return at if at < len(stretches) and stretches[at] == stretch else None


def common_waits(ranks: list[RankState]) -> tuple[list[float], list[int]] | None:
    """Each rank's mean wait per step over the latest STRETCHES_COMPARED stretches that every one of ``ranks``
    reported to its end (a stretch before each rank's latest), and those stretches, latest first; None where they
    share none."""
    if any(not r.wait_stretches for r in ranks):
        return None
    ended = min(r.wait_stretches[-1] for r in ranks)  # every rank's stretches before this one are complete
    oldest = max(r.wait_stretches[0] for r in ranks)
    sums, counts = [0.0] * len(ranks), [0] * len(ranks)
    chosen: list[int] = []
    stretch = ended - 1
    while stretch >= oldest and len(chosen) < STRETCHES_COMPARED:
        found = [_index(r, stretch) for r in ranks]
        if None not in found:
            chosen.append(stretch)
            for i, (r, at) in enumerate(zip(ranks, found, strict=True)):
                sums[i] += r.wait_sums_s[at]  # type: ignore[index]
                counts[i] += r.wait_counts[at]  # type: ignore[index]
        stretch -= 1
    if not chosen:
        return None
    means = [total / n for total, n in zip(sums, counts, strict=True)]
    return means, chosen


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
    and ``straggler_rank``, that rank, named once the wait exceeds STRAGGLER_SHARE of the median step time. The waits
    compared are each rank's mean over the same steps (``common_waits``), never EMAs at steps of their own: a rank's
    rows arrive seconds after another's, and at one step every rank's wait moves together."""
    over = f"{STRETCHES_COMPARED * STRETCH_STEPS} steps"
    rank_formula = (
        f"the rank with the least collective wait, named when the other ranks' median wait exceeds its own by "
        f"{STRAGGLER_SHARE:.0%} of the median step time (each rank's mean wait over the latest {over} every rank "
        f"reported; ranks with {STRAGGLER_MIN_STEPS} or more steps reported)"
    )
    wait_formula = (
        f"median of the other ranks' collective waits − the least-waiting rank's (means per step over the latest "
        f"{over} every rank reported)"
    )
    compared = [
        s
        for s in stats
        if s.collective_wait_s is not None and s.collective_steps >= STRAGGLER_MIN_STEPS and s.step_time_s
    ]
    common = common_waits([snap.state.ranks[s.rank] for s in compared]) if len(compared) >= 2 else None
    if common is None:
        reporting = [s for s in stats if s.collective_wait_s is not None]
        if not reporting:
            why = NO_PROBE
        elif len(reporting) < 2:
            why = FEW_RANKS
        elif len(compared) < 2:
            why = f"fewer than 2 ranks have reported {STRAGGLER_MIN_STEPS} steps of collective waits"
        else:
            why = f"the ranks' collective waits share no {STRETCH_STEPS} steps that every rank reported to their end"
        snap.put("straggler_rank", rank_formula, absent=why)
        snap.put("straggler_wait_s", wait_formula, absent=why, unit="s")
        return
    means, stretches = common
    wait_of = {s.rank: mean for s, mean in zip(compared, means, strict=True)}
    slow = min(compared, key=lambda s: (wait_of[s.rank], s.rank))
    others = [s for s in compared if s is not slow]
    gap_s = formulas.median([wait_of[s.rank] for s in others]) - wait_of[slow.rank]
    step_s = formulas.median([s.step_time_s for s in compared])  # type: ignore[misc]
    cause, evidence = _cause(snap, slow, others, gap_s)
    threshold_s = STRAGGLER_SHARE * step_s
    inputs = {f"rank {s.rank} wait": EI(value=wait_of[s.rank], unit="s", source=s.host) for s in compared}
    first, last = stretches[-1] * STRETCH_STEPS, (stretches[0] + 1) * STRETCH_STEPS - 1
    inputs["steps_compared"] = EI(value=len(stretches) * STRETCH_STEPS, source=f"steps {first} to {last}")
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
