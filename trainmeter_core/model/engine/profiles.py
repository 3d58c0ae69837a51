"""Imported profiles, a metric family: each rank's latest trace with what it achieved (FLOP/s and MFU in the profiled
window), the spread between ranks and the likely straggler; and the handler of ``profile.import``. Pure."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainmeter_core.model import records
from trainmeter_core.model.engine.builder import EI, SnapshotBuilder
from trainmeter_core.model.engine.state import ProfileState

if TYPE_CHECKING:
    from trainmeter_core.model.rig import RigDevice

# A number a profile cannot give (no FLOPs, no device peak) is absent with the reason, never a zero.

#: Traces kept (the oldest go first) and profiled steps kept per trace: a run imports a handful of each.
MAX_TRACES = 256
MAX_STEPS_PER_TRACE = 1024
#: Steps shown per snapshot (the latest of the shown traces).
STEPS_SHOWN = 256
#: A straggler is named when the ranks' exposed communication differs by more than this share of a window.
STRAGGLER_SPREAD = 0.05
NO_PROFILE = "no profile imported: tm import RUN TRACE, or run with torch.profiler inside tm"
_COMPUTE = ("gemm", "attention", "other_compute")


def on_profile_import(profiles: ProfileState, record: records.ProfileImport) -> None:
    """Keep one record: a trace's steps come before the trace itself; importing a file again replaces it."""
    trace_id = record.trace_id or f"{record.file}|{record.rank}|{record.traced_pid}"
    if record.scope == "step":
        if trace_id in profiles.traces:  # the first step of the same trace imported again
            del profiles.traces[trace_id]
            profiles.steps.pop(trace_id, None)
        steps = profiles.steps.setdefault(trace_id, [])
        if len(steps) < MAX_STEPS_PER_TRACE:
            steps.append(record)
        return
    profiles.traces.pop(trace_id, None)  # re-inserted last: the newest import of this trace
    profiles.traces[trace_id] = record
    while len(profiles.traces) > MAX_TRACES:
        oldest = next(iter(profiles.traces))
        del profiles.traces[oldest]
        profiles.steps.pop(oldest, None)
    # Steps whose trace record never came (an importer that stopped short) must not pile up either.
    orphans = [t for t in profiles.steps if t not in profiles.traces]
    for orphan in orphans[: max(0, len(orphans) - MAX_TRACES)]:
        del profiles.steps[orphan]


def profile_view(snap: SnapshotBuilder, profiles: ProfileState) -> records.ProfileView | None:
    """The snapshot's profile part and its metrics (``profile_*``), or None (and no metric) before any import."""
    if not profiles.traces:
        return None
    latest: dict[tuple[str, int | None], records.ProfileImport] = {}
    for trace in profiles.traces.values():
        latest[(trace.host, trace.rank)] = trace  # import order: the last one of a rank wins
    traces = sorted(latest.values(), key=lambda t: (t.rank if t.rank is not None else -1, t.host))
    steps: list[records.ProfileImport] = []
    for trace in traces:
        steps.extend(profiles.steps.get(trace.trace_id, []))
    steps = steps[-STEPS_SHOWN:]
    achieved = [_achieved(snap, trace) for trace in traces]
    view = records.ProfileView(traces=traces, steps=steps, achieved=achieved, imported=len(profiles.traces))
    _spread(view)
    _metrics(snap, view)
    return view


def _device(snap: SnapshotBuilder, trace: records.ProfileImport) -> RigDevice | None:
    rank = trace.rank if trace.rank is not None else 0
    for device in snap.derived.rig.devices:
        if rank in device.ranks and (not trace.host or device.host == trace.host):
            return device
    return None


def _achieved(snap: SnapshotBuilder, trace: records.ProfileImport) -> records.ProfileAchieved:
    out = records.ProfileAchieved(rank=trace.rank, host=trace.host)
    absent: dict[str, str] = {}
    window = trace.window_s
    if trace.flop is None:
        absent["flop_per_s"] = trace.absent.get("flop", "the trace carries no FLOPs")
    elif not window:
        absent["flop_per_s"] = "the profiled window is empty"
    else:
        out.flop_per_s = trace.flop / window
    device = _device(snap, trace)
    if device is None:
        absent["peak_flop_per_s"] = snap.derived.rig.absent or f"no device of rank {trace.rank or 0} is known"
    elif device.peak_flop_per_s is None:
        absent["peak_flop_per_s"] = device.peak_absent or "the device has no peak"
    else:
        out.peak_flop_per_s = device.peak_flop_per_s
    if out.flop_per_s is not None and out.peak_flop_per_s:
        out.mfu = out.flop_per_s / out.peak_flop_per_s
    else:
        absent["mfu"] = absent.get("flop_per_s") or absent.get("peak_flop_per_s") or "unknown"
    out.absent = absent
    return out


def _share(trace: records.ProfileImport, part: str) -> float | None:
    window = trace.window_s
    if not window or part not in trace.split_s:
        return None
    return trace.split_s[part] / window


def _spread(view: records.ProfileView) -> None:
    """For each part of the split, the largest share of a window minus the smallest, over the ranks; and, where the
    ranks' exposed communication differs, the rank that waits least (the others wait for it)."""
    traces = [t for t in view.traces if t.split_s and t.window_s]
    if len(traces) < 2:
        return
    for part in traces[0].split_s:
        shares = [s for s in (_share(t, part) for t in traces) if s is not None]
        if len(shares) == len(traces):
            view.spread[part] = max(shares) - min(shares)
    comm = [(_share(t, "communication") or 0.0, t) for t in traces]
    if view.spread.get("communication", 0.0) > STRAGGLER_SPREAD:
        least, slow = min(comm, key=lambda c: c[0])
        most = max(c[0] for c in comm)
        compute = sum(_share(slow, p) or 0.0 for p in _COMPUTE)
        view.straggler = (
            f"rank {slow.rank if slow.rank is not None else '?'} waits least in communication "
            f"({least:.0%} of its window against up to {most:.0%} on the others) and computes {compute:.0%} of it: "
            "the other ranks wait for it"
        )


def _metrics(snap: SnapshotBuilder, view: records.ProfileView) -> None:
    """``profile_mfu``, ``profile_flop_per_s``, ``profile_idle`` and ``profile_exposed_communication``: over each
    rank's latest trace, for the alert rules and the dashboard."""
    label = "profiled window"
    ranks = len(view.traces)
    mfus = [a.mfu for a in view.achieved if a.mfu is not None]
    rates = [a.flop_per_s for a in view.achieved if a.flop_per_s is not None]
    reasons = sorted({r for a in view.achieved for k, r in a.absent.items() if k == "mfu"})
    inputs = {"ranks": EI(value=ranks, source="latest imported trace of each rank")}
    if len(mfus) == ranks:
        snap.put(
            "profile_mfu",
            "mean over ranks of FLOPs of the ops in the profiled window / window / device's dense peak",
            value=sum(mfus) / ranks,
            label=label,
            inputs=inputs,
            note="FLOPs as the profiler counted them (with_flops=True): matmuls and convolutions, not attention",
        )
    else:
        snap.put(
            "profile_mfu",
            "FLOPs in the profiled window / window / peak",
            absent="; ".join(reasons),
            label=label,
        )
    if len(rates) == ranks:
        snap.put(
            "profile_flop_per_s",
            "Σ over ranks of FLOPs of the ops in the profiled window / window",
            value=sum(rates),
            unit="FLOP/s",
            label=label,
            inputs=inputs,
        )
    else:
        snap.put(
            "profile_flop_per_s",
            "FLOPs in the profiled window / window",
            absent="; ".join(reasons),
            unit="FLOP/s",
        )
    for key, part in (("profile_idle", "idle"), ("profile_exposed_communication", "communication")):
        shares = [s for s in (_share(t, part) for t in view.traces) if s is not None]
        formula = f"mean over ranks of the {part} part of the profiled window's split / window"
        if shares and len(shares) == ranks:
            snap.put(key, formula, value=sum(shares) / ranks, label=label, inputs=inputs)
        else:
            why = next((t.absent.get("split_s") for t in view.traces if t.absent.get("split_s")), None)
            snap.put(key, formula, absent=why or "a trace has no split", label=label)
