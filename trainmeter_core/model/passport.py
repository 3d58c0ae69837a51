"""The run passport: what a model card needs from a run, as Markdown and JSON, from the final snapshot and meta.json.

Every FLOPs figure names its convention and every MFU its peak; a figure the run could not establish is written as
"n/a" with the reason, never as a zero. Pure: the caller reads and writes the files.
"""

from __future__ import annotations

from typing import Any

from trainmeter_core.model import records

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


def _fmt(entry: dict[str, Any] | None, unit: str = "", scale: float = 1.0) -> str:
    if not entry:
        return "n/a"
    if entry.get("value") is None:
        if entry.get("low") is not None and entry.get("high") is not None:
            low, high = entry["low"] * scale, entry["high"] * scale
            return f"{low:.4g} to {high:.4g}{unit} (range over the four conventions)"
        return f"n/a ({entry.get('absent') or 'not known'})"
    text = f"{entry['value'] * scale:.4g}{unit}"
    # Each label once: `counted` is both the convention and the label of the counted figure.
    labels = list(dict.fromkeys(entry[k] for k in ("convention", "label") if entry.get(k)))
    return f"{text} ({', '.join(labels)})" if labels else text


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
    lines.append(f"- FLOPs spent: {_fmt(data['spent_flop'])}")
    lines.append(f"- MFU: {_fmt(data['mfu'], '%', 100.0)}")
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
