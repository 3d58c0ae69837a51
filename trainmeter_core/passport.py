"""The run passport: what a model card needs from a run, as Markdown and JSON, from the final snapshot and meta.json.

Every FLOPs figure names its convention and every MFU its peak; a figure the run could not establish is written as
"n/a" with the reason, never as a zero. Pure: the caller reads and writes the files.
"""

from __future__ import annotations

from typing import Any

from trainmeter_core import records as rec

CONVENTIONS = ("titan", "megatron", "hf", "all_params")


def _metric(snapshot: rec.Snapshot, key: str) -> rec.MetricValue | None:
    return snapshot.metrics.get(key)


def _fact_value(snapshot: rec.Snapshot, name: str) -> Any:
    fact = snapshot.facts.get(name)
    return None if fact is None else fact.value


def passport_data(snapshot: rec.Snapshot, meta: dict) -> dict[str, Any]:
    """The passport as plain data (``passport.json``)."""

    def value(key: str) -> dict[str, Any] | None:
        m = _metric(snapshot, key)
        if m is None:
            return None
        return {k: v for k, v in rec.to_builtins(m).items() if v is not None}

    series = {
        name: point.value for name, point in snapshot.series.items() if name in ("train_loss", "val_loss")
    }
    gpus = [f for f in snapshot.facts.values() if f.name == "gpu"]
    return {
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
        "flops_per_token": {conv: value(f"flops_per_token.{conv}") for conv in (*CONVENTIONS, "counted")},
        "tokens": value("tokens"),
        "steps": snapshot.steps,
        "flops_spent": value("flops_spent"),
        "mfu": value("mfu_avg") or value("mfu"),
        "ofu": value("ofu"),
        "gpu_hours": value("gpu_hours"),
        "energy_j": value("energy_j"),
        "elapsed_s": snapshot.elapsed_s,
        "hardware": {
            "devices": [r.device for r in snapshot.ranks if r.device],
            "ranks": len(snapshot.ranks),
            "gpus": [g.value for g in gpus],
        },
        "final_losses": series,
    }


def _fmt(entry: dict[str, Any] | None, unit: str = "") -> str:
    if not entry:
        return "n/a"
    if entry.get("value") is None:
        if entry.get("low") is not None and entry.get("high") is not None:
            return f"{entry['low']:.4g} to {entry['high']:.4g}{unit} (range over the four conventions)"
        return f"n/a ({entry.get('absent') or 'not known'})"
    text = f"{entry['value']:.4g}{unit}"
    labels = [entry[k] for k in ("convention", "label") if entry.get(k)]
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
    lines.append(f"- tokens seen: {_fmt(data['tokens'])}")
    lines.append(f"- FLOPs spent: {_fmt(data['flops_spent'])}")
    lines.append(f"- MFU: {_fmt(data['mfu'])}")
    lines.append(f"- OFU: {_fmt(data['ofu'])}")
    lines.append(f"- GPU-hours: {_fmt(data['gpu_hours'])}")
    lines.append(f"- energy: {_fmt(data['energy_j'], ' J')}")
    lines += ["", "## FLOPs per token", "", "| convention | FLOP per token |", "| --- | --- |"]
    for conv, entry in data["flops_per_token"].items():
        lines.append(f"| {conv} | {_fmt(entry)} |")
    lines += ["", "## Hardware", ""]
    for gpu in data["hardware"]["gpus"]:
        lines.append(
            f"- GPU {gpu.get('index')}: {gpu.get('name')} ({gpu.get('display_name') or 'no device spec'})"
        )
    lines.append(
        f"- ranks: {data['hardware']['ranks']}; devices: {', '.join(map(str, data['hardware']['devices'])) or 'n/a'}"
    )
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
