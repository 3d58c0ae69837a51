"""What the alert rules read that no other metric gives, a metric family: staleness, medians, liveness, loss counts,
GPU health, free space and memory, the exit; and the host's latest readings. Pure: no I/O, no clock."""

from __future__ import annotations

from trainmeter_core.model import formulas, records
from trainmeter_core.model.engine import attempts, training_window
from trainmeter_core.model.engine.builder import EI, NO_STEP, NO_TOKENS, SnapshotBuilder
from trainmeter_core.model.engine.nodes import clock_name
from trainmeter_core.model.engine.state import STEP_WINDOW, GpuState
from trainmeter_core.model.platform_adapters import GPU_LOST

# The clock event reasons that mean power or heat (nvml.h: hw_slowdown is either, so it counts as both).
_POWER_REASONS = ("sw_power_cap", "hw_power_brake", "hw_slowdown")
_THERMAL_REASONS = ("sw_thermal", "hw_thermal", "hw_slowdown")
# A GPU whose latest sample is older than this is no longer watched (the sampler narrowed its selection to the run's
# GPUs): its health is absent rather than frozen at its last reading.
_STALE_GPU_S = 30.0
_LATEST = "latest sample"
_WINDOW = "training window"
_WINDOW_FORMULA = (
    "Σ value × overlap / Σ overlap, over the samples whose own window (a rate's) or the time since the previous "
    "sample (a level's) overlaps the host's first step to its last"
)
_GPU_HEALTH = (
    "gpu_power_throttle",
    "gpu_thermal_throttle",
    "gpu_xid",
    "gpu_xid_last",
    "gpu_ecc_uncorrected",
    "gpu_lost",
)


def host(snap: SnapshotBuilder) -> None:
    """The host counters: the latest sample while the run lives, the training window's average once it ended (and
    always under ``<key>_avg``), each labelled with the window it covers."""
    state = snap.state
    host, node = state.host_sample, state.node_sample
    rows = (
        ("host_cpu_cores", "cores", host, "cpu_cores", "the run's process tree"),
        ("host_rss_b", "B", host, "rss_b", "the run's process tree"),
        ("node_cpu_iowait", None, node, "cpu_iowait", "the node"),
        ("node_mem_available_b", "B", node, "mem_available_b", "the node"),
    )
    for key, unit, sample, field, scope in rows:
        span = state.step_spans.get(sample.host) if sample is not None else None
        averaged = training_window.average(state.host_window.get(key), span)
        formula = f"{field} of {scope} over the training window: {_WINDOW_FORMULA}"
        if span is None:
            why = "no training step yet: the training window is not open"
            snap.put(f"{key}_avg", formula, absent=why, unit=unit, label=_WINDOW)
        elif averaged is None:
            why = (
                sample.absent.get(field) if sample is not None else None
            ) or "no sample covers the window yet"
            snap.put(f"{key}_avg", formula, absent=why, unit=unit, label=_WINDOW)
        else:
            inputs = {"covered_s": EI(value=averaged[1], unit="s", source="samples overlapping the window")}
            bounds = {"window_start_t": span.first_t, "window_end_t": span.last_t}
            snap.put(
                f"{key}_avg", formula, value=averaged[0], unit=unit, label=_WINDOW, inputs=inputs, **bounds
            )
        if snap.final and span is not None:
            snap.metrics[key] = snap.metrics[f"{key}_avg"]
            snap.explain[key] = snap.explain[f"{key}_avg"]
            continue
        value = getattr(sample, field) if sample is not None else None
        formula = f"the latest {field} of {scope}"
        if value is None:
            why = sample.absent.get(field) if sample is not None else None
            snap.put(key, formula, absent=why or "no host sample yet", unit=unit, label=_LATEST)
        else:
            assert sample is not None
            bounds = {"window_end_t": sample.t}
            if not field.endswith("_b") and sample.window_s is not None and sample.window_s > 0:
                bounds["window_start_t"] = sample.t - sample.window_s  # a rate covers its own window
            snap.put(key, formula, value=float(value), unit=unit, label=_LATEST, **bounds)


def alert_inputs(snap: SnapshotBuilder) -> None:
    """What the alert rules read and no other metric gives: staleness, medians, liveness, GPU health, space, exit."""
    state = snap.state
    now = state.now_t
    put_steps(snap, now)
    put_loss(snap)
    if state.child_alive is None:
        snap.put("child_alive", "the latest tick's child_alive", absent="no tick yet")
    else:
        snap.put(
            "child_alive",
            "the latest tick's child_alive (0 once the run ended)",
            value=float(state.child_alive),
        )
    formula = f"now − the end of {clock_name(state)}'s latest eval or checkpoint span"
    if state.pause_end_t is None or now is None:
        snap.put("since_pause_s", formula, absent="no eval or checkpoint span yet", unit="s")
    else:
        snap.put(
            "since_pause_s",
            formula,
            value=max(0.0, now - state.pause_end_t),
            unit="s",
            label=state.pause_phase,
        )
    for key, gpu in sorted(state.gpus.items()):
        put_gpu_health(snap, key, gpu)
    put_held_util(snap)
    put_space(snap)
    formula = "run.end's exit code and signal"
    if not state.finished:
        for key in ("exit_code", "exit_signal"):
            snap.put(key, formula, absent="the run has not ended")
    else:
        code, sig = state.exit_code, state.exit_signal
        if code is None:
            snap.put("exit_code", formula, absent="no exit code: the command was signalled or never started")
        else:
            snap.put("exit_code", formula, value=float(code))
        if sig is None:
            snap.put("exit_signal", formula, absent="no signal: the command exited")
        else:
            snap.put("exit_signal", formula, value=float(sig), label=state.exit_signal_name)


def put_steps(snap: SnapshotBuilder, now: float | None) -> None:
    state = snap.state
    who = clock_name(state)
    formula = f"now − the t of {who}'s latest step"
    if state.last_step_t is None or now is None:
        snap.put("since_step_s", formula, absent=NO_STEP, unit="s")
    elif attempts.awaiting_step(state):
        # Restarting from a checkpoint is no hang, as start-up is not: the time counts from this attempt's first step.
        why = f"attempt {state.attempts[-1].attempt} is restarting: no step of it yet"
        snap.put("since_step_s", formula, absent=why, unit="s")
    else:
        snap.put("since_step_s", formula, value=max(0.0, now - state.last_step_t), unit="s")
    window = f"median of {who}'s latest {STEP_WINDOW} step intervals, profiled steps left out"
    if state.recent_intervals_s:
        inputs = {"steps": EI(value=len(state.recent_intervals_s), source=f"{who} step records")}
        median = formulas.median(state.recent_intervals_s)
        snap.put("step_time_median_s", window, value=median, unit="s", inputs=inputs)
    else:
        snap.put(
            "step_time_median_s",
            window,
            absent=NO_STEP if not state.steps else "one step so far: an interval needs two",
            unit="s",
        )
    formula = f"median over {who}'s latest {STEP_WINDOW} steps of tokens / step interval"
    if state.recent_rates:
        inputs = {"steps": EI(value=len(state.recent_rates), source=f"{who} step records with tokens")}
        snap.put(
            "tokens_per_s_median",
            formula,
            value=formulas.median(state.recent_rates),
            unit="tokens/s",
            inputs=inputs,
        )
    else:
        snap.put(
            "tokens_per_s_median",
            formula,
            absent=snap.tps_absent if snap.tps is None else NO_TOKENS,
            unit="tokens/s",
        )


def put_loss(snap: SnapshotBuilder) -> None:
    state = snap.state
    formula = "count of train_loss values that were NaN or infinite"
    step_formula = "the step of the first NaN or infinite train_loss since the previous tick"
    if not state.loss_seen:
        for key in ("loss_nonfinite", "loss_tick_max"):
            snap.put(key, formula, absent="no train_loss reported")
        snap.put("loss_tick_nonfinite_step", step_formula, absent="no train_loss reported")
        return
    snap.put("loss_nonfinite", formula, value=float(state.loss_nonfinite))
    formula = "the largest finite train_loss since the previous tick"
    if state.loss_tick_max is None:
        snap.put("loss_tick_max", formula, absent="no finite train_loss since the previous tick")
    else:
        snap.put("loss_tick_max", formula, value=state.loss_tick_max)
    if state.loss_tick_nonfinite_step is None:
        if state.loss_nonfinite > state.loss_nonfinite_by_tick:
            why = "the first NaN or infinite train_loss since the previous tick came with no step"
        else:
            why = "no NaN or infinite train_loss since the previous tick"
        snap.put("loss_tick_nonfinite_step", step_formula, absent=why)
    else:
        snap.put("loss_tick_nonfinite_step", step_formula, value=float(state.loss_tick_nonfinite_step))


def put_gpu_health(snap: SnapshotBuilder, key: str, gpu: GpuState) -> None:
    now = snap.state.now_t
    if now is not None and gpu.t is not None and now - gpu.t > _STALE_GPU_S:
        why = f"no sample from {key} for {now - gpu.t:.0f} s: it is no longer watched"
        for name in _GPU_HEALTH:
            snap.put(f"{name}.{key}", "the latest sample of the GPU", absent=why)
        return
    # A lost GPU's row reads "GPU lost" for every field, so each number below is absent with that reason.
    why = gpu.absent.get("throttle") or gpu.absent.get("clock_event_reasons")
    for name, reasons in (
        ("gpu_power_throttle", _POWER_REASONS),
        ("gpu_thermal_throttle", _THERMAL_REASONS),
    ):
        formula = f"1 while a clock event reason of {', '.join(reasons)} is active, else 0"
        if why is not None:
            snap.put(f"{name}.{key}", formula, absent=why)
            continue
        active = [reason for reason in gpu.throttle if reason in reasons]
        snap.put(f"{name}.{key}", formula, value=1.0 if active else 0.0, label=",".join(active) or None)
    snap.put(f"gpu_xid.{key}", "count of the Xid events in every sample so far", value=float(gpu.xid_count))
    formula = "the latest Xid event's code"
    if gpu.xid_last is None:
        snap.put(f"gpu_xid_last.{key}", formula, absent="no Xid event so far")
    else:
        snap.put(f"gpu_xid_last.{key}", formula, value=float(gpu.xid_last))
    formula = "the latest volatile uncorrectable ECC error count"
    if gpu.ecc_uncorrected is None:
        why = gpu.absent.get("ecc_uncorrected") or f"no ECC count from {key}"
        snap.put(f"gpu_ecc_uncorrected.{key}", formula, absent=why)
    else:
        snap.put(f"gpu_ecc_uncorrected.{key}", formula, value=float(gpu.ecc_uncorrected))
    formula = f"1 while the sampler's row reads '{GPU_LOST}' (NVML: the GPU fell off the bus), else 0"
    snap.put(f"gpu_lost.{key}", formula, value=1.0 if gpu.lost else 0.0)


def put_held_util(snap: SnapshotBuilder) -> None:
    """``held_util_gpu.<key>``: the latest GPU-Util of each GPU the run holds (those its ranks reported, else those the
    sampler's selection said are the run's), for the ``gpu_idle`` rule. A GPU watched only for the hardware view has
    none; one no longer sampled is absent with the reason."""
    state = snap.state
    rig = snap.derived.rig
    ranks_gpus = None if rig.absent else {str(d.gpu_key) for d in rig.gpus}
    now = state.now_t
    formula = "the latest GPU-Util of a GPU the run holds"
    for key, gpu in sorted(state.gpus.items()):
        if (key not in ranks_gpus) if ranks_gpus is not None else not gpu.for_run:
            continue
        if now is not None and gpu.t is not None and now - gpu.t > _STALE_GPU_S:
            why = f"no sample from {key} for {now - gpu.t:.0f} s: it is no longer watched"
            snap.put(f"held_util_gpu.{key}", formula, absent=why, label=_LATEST)
        elif gpu.util_gpu is None:
            why = gpu.absent.get("util_gpu") or f"util_gpu not reported by {key}"
            snap.put(f"held_util_gpu.{key}", formula, absent=why, label=_LATEST)
        else:
            snap.put(f"held_util_gpu.{key}", formula, value=gpu.util_gpu, label=_LATEST, window_end_t=gpu.t)


def put_space(snap: SnapshotBuilder) -> None:
    node = snap.state.node_sample
    worst: dict[str, records.FsStat] = {}
    unread: dict[str, str] = {}
    for fs in node.filesystems if node is not None else []:
        if fs.total_b is None or fs.avail_b is None or fs.total_b <= 0:
            unread[fs.role] = f"no size reading for {fs.path}"
            continue
        held = worst.get(fs.role)
        if held is None or fs.avail_b / fs.total_b < held.avail_b / held.total_b:  # type: ignore[operator]
            worst[fs.role] = fs
    for role in ("run", "checkpoints", "shm"):
        fs = worst.get(role)
        formula = f"available / total bytes of the fullest filesystem holding the {role} folders"
        if fs is None:
            why = unread.get(role) or (
                "no checkpoint written yet" if role == "checkpoints" else "no filesystem sample yet"
            )
            snap.put(f"disk_free.{role}", formula, absent=why)
            snap.put(f"disk_avail_b.{role}", formula, absent=why, unit="B")
            continue
        inputs = {"total_b": EI(value=fs.total_b, unit="B", source=fs.mount or fs.path)}
        snap.put(f"disk_free.{role}", formula, value=fs.avail_b / fs.total_b, label=fs.path, inputs=inputs)  # type: ignore[operator]
        snap.put(f"disk_avail_b.{role}", formula, value=float(fs.avail_b), unit="B", label=fs.path)  # type: ignore[arg-type]
    formula = "MemAvailable / MemTotal, or the cgroup's room / its limit where that is less"
    if node is None or node.mem_available_b is None or not node.mem_total_b:
        why = node.absent.get("mem_available_b") if node is not None else None
        snap.put("node_mem_available", formula, absent=why or "no host sample yet")
        return
    free = node.mem_available_b / node.mem_total_b
    label = "node"
    limit, used = node.cgroup_mem_limit_b, node.cgroup_mem_used_b
    if limit and used is not None and (limit - used) / limit < free:
        free, label = max(0.0, (limit - used) / limit), "cgroup"
    snap.put("node_mem_available", formula, value=free, label=label)
