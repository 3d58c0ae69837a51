"""The run passport: what a model card needs from a run, as Markdown and JSON, from the final snapshot and meta.json.

Every FLOPs figure names its convention and every MFU its peak; a figure the run could not establish is written as
"n/a" with the reason, never as a zero. Pure: the caller reads and writes the files.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainmeter_core.model import job_identity, records

CONVENTIONS = ("titan", "megatron", "hf", "all_params")
#: The counters a passport gives over the training window: key, words, unit as written.
WINDOW_COUNTERS = (
    ("util_gpu", "GPU-Util", ""),
    ("sm_active", "SM active", ""),
    ("tensor_active", "tensor active", ""),
    ("dram_active", "DRAM active", ""),
    ("ofu", "OFU", ""),
    ("power_w", "power per GPU", " W"),
    ("clock_sm_mhz", "SM clock", " MHz"),
    ("host_cpu_cores", "CPU cores busy (the run's processes)", ""),
    ("host_rss_b", "resident memory (the run's processes)", " B"),
)


def _metric(snapshot: records.Snapshot, key: str) -> records.MetricValue | None:
    return snapshot.metrics.get(key)


def _fact_value(snapshot: records.Snapshot, name: str) -> Any:
    fact = snapshot.facts.get(name)
    return None if fact is None else fact.value


def window_counters(snapshot: records.Snapshot) -> dict[str, dict[str, Any] | None]:
    """Each counter over the training window (``<key>_avg`` of the snapshot) as plain data, with its window's bounds."""
    result = {}
    for key, _, _ in WINDOW_COUNTERS:
        metric = snapshot.metrics.get(f"{key}_avg")
        result[key] = (
            None
            if metric is None
            else {k: v for k, v in records.to_builtins(metric).items() if v is not None}
        )
    return result


def lost_time(snapshot: records.Snapshot) -> dict[str, Any] | None:
    """What the time goodput does not count was spent on, from goodput's explain (seconds per part, and the note)."""
    explain = snapshot.explain.get("goodput")
    if explain is None or not explain.note or not explain.note.startswith("lost "):
        return None
    parts = {k.removesuffix("_s"): v.value for k, v in explain.inputs.items() if k.endswith("_s")}
    return {"note": explain.note.split("; ")[0], "seconds": parts}


# ----------------------------------------------------------------------------------------------------------------------
# Which conventions a number is under, and which peak an MFU is against, in words (the passport and the summary line)


def conventions_basis(metrics: Mapping[str, records.MetricValue]) -> dict[str, Any] | None:
    """The conventions the run computed and, for each it could not, what it lacks (``flop_per_token.<convention>``);
    None where the snapshot has no per-convention figures (a hand-made one)."""
    computed: list[str] = []
    missing: dict[str, str] = {}
    for conv in CONVENTIONS:
        metric = metrics.get(f"flop_per_token.{conv}")
        if metric is None:
            return None
        if metric.value is not None:
            computed.append(conv)
        else:
            missing[conv] = metric.absent or "not computed"
    return {"computed": computed, "missing": missing}


def missing_words(basis: Mapping[str, Any] | None) -> str | None:
    """``titan, megatron, all_params not computed (layers unknown: pass --layers; …)``: the conventions the run could
    not compute, those that lack the same inputs together; None when it computed them all."""
    if not basis or not basis["missing"]:
        return None
    by_reason: dict[str, list[str]] = {}
    for conv, reason in basis["missing"].items():
        by_reason.setdefault(reason, []).append(conv)
    return ", ".join(f"{', '.join(convs)} not computed ({reason})" for reason, convs in by_reason.items())


def range_words(basis: Mapping[str, Any] | None, collapsed: bool) -> str:
    """What a range is over: the conventions by name (``range over titan, megatron, hf, all_params``), or that they
    agree where both ends read the same."""
    names = ", ".join(basis["computed"]) if basis and len(basis["computed"]) > 1 else None
    if collapsed:
        return f"{names} agree" if names else "the conventions agree"
    return f"range over {names}" if names else "range over conventions"


def mfu_peak(snapshot: records.Snapshot) -> dict[str, Any] | None:
    """The peak MFU is against, from MFU's explain: the total, the devices, and each distinct device peak with its
    source (which names the peak's kind and, for one measured with ``tm peak``, how and when); None where unknown."""
    for key in ("mfu_avg", "mfu"):
        explain = snapshot.explain.get(key)
        inputs = explain.inputs if explain is not None else {}
        total = inputs.get("peak_total_flop_per_s")
        if total is None or not isinstance(total.value, (int, float)):
            continue
        count = inputs.get("n_devices")
        peaks = [
            {"flop_per_s": entry.value, "source": entry.source}
            for name, entry in inputs.items()
            if name.startswith("peak_flop_per_s") and isinstance(entry.value, (int, float))
        ]
        return {
            "total_flop_per_s": total.value,
            "devices": count.value if count is not None else len(peaks),
            "per_device": peaks,
        }
    return None


def rate_text(value: float, unit: str = "FLOP/s", digits: int = 4) -> str:
    """A rate with its SI prefix, four significant digits: 85.57 GFLOP/s, 989.5 TFLOP/s."""
    for prefix, scale in (("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.{digits}g} {prefix}{unit}"
    return f"{value:.{digits}g} {unit}"


def peak_words(peak: Mapping[str, Any] | None) -> str | None:
    """``85.6 GFLOP/s (CPU, measured peak: tm peak: … 1 thread(s) … 2026-12-05)``, ``8 × 989 TFLOP/s (…)``, or a sum
    over devices whose peaks differ."""
    if not peak:
        return None
    devices, per_device = peak["devices"], peak["per_device"]
    if len(per_device) == 1:
        (one,) = per_device
        count = f"{devices} × " if isinstance(devices, int) and devices > 1 else ""
        return f"{count}{rate_text(one['flop_per_s'])} ({one['source']})"
    return f"{rate_text(peak['total_flop_per_s'])} over {devices} devices whose peaks differ (tm view lists each)"


def passport_data(snapshot: records.Snapshot, meta: dict) -> dict[str, Any]:
    """The passport as plain data (``passport.json``)."""

    def value(key: str) -> dict[str, Any] | None:
        m = _metric(snapshot, key)
        if m is None:
            return None
        return {k: v for k, v in records.to_builtins(m).items() if v is not None}

    series = {
        name: point.value for name, point in snapshot.series.items() if name in ("train_loss", "val_loss")
    }
    gpus = [f for f in snapshot.facts.values() if f.name == "gpu"]
    data = {
        "run": meta.get("run_id"),
        "command": meta.get("command"),
        "host": meta.get("host"),
        "versions": {
            "trainmeter": meta.get("tm_version"),
            "python": meta.get("python"),
            "platform": meta.get("platform"),
        },
        "model": {
            name: _fact_value(snapshot, name)
            for name in ("params", "embedding_params", "layers", "d_model", "seq_len", "moe_experts")
        },
        "flop_per_token": {conv: value(f"flop_per_token.{conv}") for conv in (*CONVENTIONS, "counted")},
        "tokens": value("tokens"),
        "steps": snapshot.steps,
        "spent_flop": value("spent_flop"),
        "mfu": value("mfu_avg") or value("mfu"),
        "mfu_peak": mfu_peak(snapshot),
        "conventions": conventions_basis(snapshot.metrics),
        "ofu": value("ofu_avg") or value("ofu"),
        "training_window": window_counters(snapshot),
        "lost_time": lost_time(snapshot),
        "gpu_hours": value("gpu_hours"),
        "energy_j": value("energy_j"),
        "elapsed_s": snapshot.elapsed_s,
        "hardware": {
            "devices": [r.device for r in snapshot.ranks if r.device],
            "ranks": len(snapshot.ranks),
            "gpus": [g.value for g in gpus],
        },
        "final_losses": series,
        "profile": _profile(snapshot),
        # The scheduler's ids (Slurm, Kubernetes) as the run's start read them; absent from a run recorded before.
        **({"job_identity": meta["job_identity"]} if meta.get("job_identity") is not None else {}),
        **({"attempts": [records.to_builtins(a) for a in snapshot.attempts]} if snapshot.attempts else {}),
    }
    # Schema 1's names of the two FLOP counts, kept until 0.2.0 (docs/api.md, "Old spellings", has the table).
    data["flops_per_token"] = data["flop_per_token"]
    data["flops_spent"] = data["spent_flop"]
    return data


def _profile(snapshot: records.Snapshot) -> list[dict[str, Any]] | None:
    """Each rank's latest imported profile: its window, where the GPU time went (shares of the window), its steps."""
    view = snapshot.profile
    if view is None:
        return None
    achieved = {(a.host, a.rank): a for a in view.achieved}
    out = []
    for trace in view.traces:
        window = trace.window_s or 0.0
        entry: dict[str, Any] = {
            "rank": trace.rank,
            "host": trace.host,
            "file": trace.file,
            "profiler": trace.profiler,
            "window_s": trace.window_s,
            "profiler_steps": trace.profiler_steps,
            "steps": trace.steps,
            "split": {k: v / window for k, v in trace.split_s.items()}
            if window > 0 and trace.split_s
            else None,
            "hta": records.to_builtins(trace.hta) if trace.hta is not None else None,
        }
        got = achieved.get((trace.host, trace.rank))
        if got is not None:
            entry["mfu"] = got.mfu
            entry["flop_per_s"] = got.flop_per_s
        if trace.absent:
            entry["absent"] = dict(trace.absent)
        out.append(entry)
    return out


def _fmt(
    entry: dict[str, Any] | None, unit: str = "", scale: float = 1.0, basis: Mapping[str, Any] | None = None
) -> str:
    if not entry:
        return "n/a"
    # Each label once: `counted` is both the convention and the label of the counted figure.
    labels = list(dict.fromkeys(entry[k] for k in ("convention", "label") if entry.get(k)))
    if entry.get("value") is None:
        if entry.get("low") is not None and entry.get("high") is not None:
            low, high = f"{entry['low'] * scale:.4g}", f"{entry['high'] * scale:.4g}"
            # Ends that read the same are one number, said once, with the conventions that agree on it.
            text = low if low == high else f"{low} to {high}"
            return f"{text}{unit} ({', '.join([*labels, range_words(basis, low == high)])})"
        return f"n/a ({entry.get('absent') or 'not known'})"
    text = f"{entry['value'] * scale:.4g}{unit}"
    return f"{text} ({', '.join(labels)})" if labels else text


def _with_missing(text: str, entry: dict[str, Any] | None, basis: Mapping[str, Any] | None) -> str:
    """A number under one of the four conventions, followed by those the run could not compute and what they lack."""
    missing = missing_words(basis)
    if not missing or not entry or entry.get("value") is None or entry.get("convention") not in CONVENTIONS:
        return text
    return f"{text}; {missing}"


def passport_markdown(data: dict[str, Any]) -> str:
    lines = [f"# Run passport: {data.get('run')}", ""]
    lines += ["## Model", ""]
    for name, v in data["model"].items():
        lines.append(
            f"- {name.replace('_', ' ')}: {'n/a' if v is None else format(v, ',') if isinstance(v, int) else v}"
        )
    lines += ["", "## Compute", ""]
    lines.append(f"- steps: {data['steps']:,}")
    attempts = data.get("attempts") or []
    if attempts:
        # A resumed run: how many starts, and what was done twice (each step counts once above).
        superseded = sum(a.get("superseded_steps", 0) for a in attempts)
        down_s = sum(a.get("gap_s") or 0.0 for a in attempts)
        lines.append(
            f"- attempts: {len(attempts)} (resumed from checkpoints; {down_s:.1f} s down between them; "
            f"{superseded:,} steps done again)"
        )
    lines.append(f"- tokens seen: {_fmt(data['tokens'])}")
    basis = data.get("conventions")
    spent = data["spent_flop"]
    lines.append(f"- FLOPs spent: {_with_missing(_fmt(spent, basis=basis), spent, basis)}")
    mfu = _fmt(data["mfu"], "%", 100.0, basis)
    if not (spent or {}).get("value"):
        mfu = _with_missing(mfu, data["mfu"], basis)  # said once: with the FLOPs where they are known
    peak = peak_words(data.get("mfu_peak"))
    lines.append(f"- MFU: {mfu}" + (f"; against the peak {peak}" if peak else ""))
    lines.append(f"- OFU: {_fmt(data['ofu'], '%', 100.0)}")
    lines.append(f"- GPU-hours: {_fmt(data['gpu_hours'])}")
    lines.append(f"- energy: {_fmt(data['energy_j'], ' J')}")
    lost = data.get("lost_time")
    if lost:
        lines.append(f"- goodput's lost time: {lost['note']}")
    window = data.get("training_window") or {}
    bounds = next((e for e in window.values() if e and e.get("window_start_t") is not None), None)
    lines += ["", "## Counters over the training window", ""]
    if bounds is not None:
        span_s = bounds["window_end_t"] - bounds["window_start_t"]
        lines.append(
            f"From the first step to the last ({span_s:.1f} s), each sample weighted by its overlap with it."
        )
        lines.append("")
    for key, words, unit in WINDOW_COUNTERS:
        lines.append(f"- {words}: {_fmt(window.get(key), unit)}")
    lines += ["", "## FLOPs per token", "", "| convention | FLOP per token |", "| --- | --- |"]
    for conv, entry in data["flop_per_token"].items():
        lines.append(f"| {conv} | {_fmt(entry)} |")
    lines += ["", "## Hardware", ""]
    for gpu in data["hardware"]["gpus"]:
        lines.append(
            f"- GPU {gpu.get('index')}: {gpu.get('name')} ({gpu.get('display_name') or 'no device spec'})"
        )
    lines.append(
        f"- ranks: {data['hardware']['ranks']}; devices: {', '.join(map(str, data['hardware']['devices'])) or 'n/a'}"
    )
    if data.get("job_identity") is not None:
        lines += ["", "## Job", ""]
        lines += [f"- {line}" for line in job_identity.lines(data["job_identity"])]
    if data.get("profile"):
        lines += ["", "## Profile", ""]
        for entry in data["profile"]:
            who = f"rank {entry['rank']}" if entry["rank"] is not None else "the process"
            steps = f", steps {entry['steps'][0]}-{entry['steps'][-1]}" if entry["steps"] else ""
            if entry["split"]:
                parts = ", ".join(
                    f"{k.replace('_', ' ')} {v:.0%}" for k, v in entry["split"].items() if v >= 0.005
                )
            else:
                parts = (entry.get("absent") or {}).get("split_s", "no GPU time")
            mfu = f"; MFU in the window {entry['mfu']:.1%}" if entry.get("mfu") is not None else ""
            lines.append(f"- {who} ({entry['profiler']}{steps}): {parts}{mfu}")
    lines += ["", "## Final losses", ""]
    if data["final_losses"]:
        lines += [f"- {k}: {v:.4g}" for k, v in data["final_losses"].items()]
    else:
        lines.append("- n/a (the loop reported no loss: `emit(train_loss=loss.item())`)")
    v = data["versions"]
    lines += [
        "",
        "## Versions",
        "",
        f"- trainmeter {v['trainmeter']}, Python {v['python']}, {v['platform']}",
        "",
    ]
    return "\n".join(lines)
