"""What a finished run leaves its reader: ``summary.json`` (the final snapshot merged with the launcher's counters),
the passport files, and the one summary line tm prints last. The launcher (or ``tm attach``) is their one writer while
the run lives.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import shutil
import sys
import time
from pathlib import Path

from trainmeter_core.model import paid_time, passport, records
from trainmeter_core.run.stderr_lines import Say
from trainmeter_core.runlog import rundir


def write_passport(run_dir: Path, snapshot: records.Snapshot | None, say: Say) -> None:
    if snapshot is None:
        return
    try:
        meta = rundir.read_json(run_dir / "meta.json") or {}
        data = passport.passport_data(snapshot, meta)
        (run_dir / "passport.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
        (run_dir / "passport.md").write_text(passport.passport_markdown(data))
    except Exception as exc:
        say(f"could not write the passport: {type(exc).__name__}: {exc}")


def write_summary(
    run_dir,
    hub,
    recorder,
    status,
    reason,
    code,
    sig,
    elapsed_s,
    start_wall,
    snapshot: records.Snapshot | None = None,
    attempt: int = 1,
    end_s: dict[str, float] | None = None,
) -> dict:
    """``summary.json``: the last snapshot (once there is an engine) merged with the launcher's own counters.

    A resumed run's summary counts the run's steps (every attempt's, each step once) and lists its attempts; its
    elapsed time, exit and bus counters are this attempt's. ``end_s``: the seconds each stage of tm's own end took
    after the command ended (``run/end_times.py``), as ``tm_end_s``."""
    attempts = [] if snapshot is None else [records.to_builtins(a) for a in snapshot.attempts]
    summary = {
        "state": "finished",
        "exit_status": status,
        "reason": reason,
        "exit_code": code,
        "signal": sig,
        "start_wall": start_wall,
        "end_wall": time.time(),
        "elapsed_s": elapsed_s,
        **({"tm_end_s": {stage: round(s, 4) for stage, s in end_s.items()}} if end_s is not None else {}),
        "steps": snapshot.steps if attempts else hub.steps,
        "skipped_steps": hub.skipped_steps,
        "records": dict(sorted(hub.kinds.items())),
        "bus": {
            "received": hub.received,
            "malformed": hub.malformed,
            "unknown": hub.unknown,
            "dropped": dict(hub.dropped),
            "dropped_total": hub.dropped_total(),
            # Agents killed (or gone without atexit): each lost at most its last flush window of records.
            "ended_without_bye": list(getattr(hub, "ended_without_bye", [])),
            "log_queue_dropped": recorder.queue_dropped,
            "log_reserve_skipped": recorder.reserve_skipped,
            "log_bytes": recorder.bytes_written,
            "log_segments": recorder.segments,
        },
        "hub_error": hub.error,
        **({"attempt": attempt, "attempts": attempts} if attempt > 1 or attempts else {}),
        # The run's counters over its training window and what goodput's lost time went to, read from the final
        # snapshot (which has them in full) so that a reader of this file finds them at the top.
        "training_window": None if snapshot is None else passport.window_counters(snapshot),
        "lost_time": None if snapshot is None else passport.lost_time(snapshot),
        "snapshot": None if snapshot is None else records.to_builtins(snapshot),
    }
    tmp = run_dir / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=1, default=str) + "\n")
    os.replace(tmp, run_dir / "summary.json")
    return summary


#: Between the ends of a range, as typeset (a hyphen reads as a minus sign before a negative end).
EN_DASH = "\u2013"


def _decimals(magnitude: float) -> int | None:
    """Decimals that show ``magnitude`` to three significant digits, or None where it needs an exponent."""
    if magnitude == 0:
        return 2
    if not 1e-3 <= magnitude < 1e4:
        return None
    return max(0, 2 - math.floor(math.log10(magnitude)))


def format_range(low: float, high: float) -> tuple[str, ...]:
    """Both ends of a range at the same precision (set by the larger), or one value when they read the same.

    ``(5.0, 6.0123)`` gives ``("5.00", "6.01")``; ``(1.3101e10, 1.3102e10)`` gives ``("1.31e+10",)``.
    """
    decimals = _decimals(max(abs(low), abs(high)))
    if decimals is None:
        ends = (f"{low:.2e}", f"{high:.2e}")
    else:
        ends = (f"{low:.{decimals}f}", f"{high:.{decimals}f}")
    return ends[:1] if ends[0] == ends[1] else ends


def _number(
    metric: records.MetricValue | None,
    unit: str = "",
    scale: float = 1.0,
    basis: dict | None = None,
    extra: tuple[str | None, ...] = (),
) -> str | None:
    """One number of the line with its convention and label; ``extra`` phrases follow them in the parentheses."""
    if metric is None:
        return None
    labels = [x for x in (metric.convention, metric.label) if x]
    if metric.value is not None:
        text = f"{metric.value * scale:.3g}{unit}"
    elif metric.low is not None and metric.high is not None:
        ends = format_range(metric.low * scale, metric.high * scale)
        # No convention was chosen: say over which the ends differ, or that they agree (an MLP's nearly do).
        labels.append(passport.range_words(basis, len(ends) == 1))
        text = f"{EN_DASH.join(ends)}{unit}"
    else:
        # The first missing input is enough for one line; `tm view` and the dashboard name them all.
        return f"n/a ({metric.absent.split('; ')[0]})" if metric.absent else None
    said = [", ".join(labels)] if labels else []
    said += [x for x in extra if x]
    return f"{text} ({'; '.join(said)})" if said else text


def _attempt_words(summary: dict) -> str:
    """``attempt 2, resumed after step 150, 31.2 s down``: a resumed run's last attempt, in the summary line."""
    words = f"attempt {summary['attempt']}"
    attempts = summary.get("attempts") or []
    last = attempts[-1] if attempts else {}
    if last.get("resumed_from") is not None:
        words += f", resumed after step {last['resumed_from']}"
    if last.get("gap_s") is not None:
        words += f", {last['gap_s']:.1f} s down before it"
    superseded = sum(a.get("superseded_steps", 0) for a in attempts)
    if superseded:
        words += f", {superseded} steps done again"
    return words


def tm_command(environ: dict | None = None, argv0: str | None = None) -> str:
    """How the shell that started this ``tm`` calls it again: ``tm`` where the ``tm`` on its ``PATH`` is this one,
    else this one's path (relative to the working folder when under it): a ``tm`` started as ``.venv/bin/tm`` (the
    demo's) from a shell that never activated ``.venv`` is not ``tm`` there. ``tm`` when this is no ``tm`` script."""
    env = os.environ if environ is None else environ
    program = sys.argv[0] if argv0 is None else argv0
    if os.path.basename(program) != "tm" or not os.path.isfile(program):
        return "tm"
    found = shutil.which("tm", path=env.get("PATH", ""))
    if found is not None and os.path.realpath(found) == os.path.realpath(program):
        return "tm"
    path = Path(program).absolute()
    try:
        shown = str(path.relative_to(Path.cwd()))
    except ValueError:
        shown = str(path)
    return shlex.quote(shown if os.sep in shown else f".{os.sep}{shown}")


def view_command(run_dir: Path, environ: dict | None = None, argv0: str | None = None) -> str:
    """The ``tm view`` that finds this run again as printed, from the shell that started tm: by name where tm looks by
    default, else by its path; ``tm`` itself as that shell finds this one (``tm_command``)."""
    env = os.environ if environ is None else environ
    tm = tm_command(env, argv0)
    if run_dir.parent == rundir.runs_dir(None, env):
        return f"{tm} view {run_dir.name}"
    try:
        shown = run_dir.relative_to(Path.cwd())
    except ValueError:
        shown = run_dir
    return f"{tm} view {shlex.quote(str(shown))}"


def headline(snapshot: records.Snapshot, price: paid_time.Price | None = None) -> list[str]:
    """The run's headline numbers, each a phrase of the summary line: tokens, FLOPs spent (with the conventions it
    covers, and those it could not compute with what each lacks), MFU over the training window against its named peak,
    the latest train and validation losses, the energy (and the money, given a price). None before the first step; a
    number tm cannot compute says why (``n/a (...)``) or is left out. ``tm report`` shows the same phrases to a reader without scripts."""
    if not snapshot.steps:
        return []
    parts = []
    m = snapshot.metrics
    tokens = _number(m.get("tokens"))
    basis = passport.conventions_basis(m)
    spent, mfu_avg = m.get("spent_flop"), m.get("mfu_avg")
    # The conventions the run could not compute and what each lacks, said once: with the FLOPs where they are under
    # one of the four, else with the MFU.
    missing = passport.missing_words(basis)
    on_flops = spent is not None and spent.value is not None and spent.convention in passport.CONVENTIONS
    on_mfu = not on_flops and mfu_avg is not None and mfu_avg.convention in passport.CONVENTIONS
    flops = _number(spent, " FLOP", basis=basis, extra=(missing if on_flops else None,))
    peak = passport.peak_words(passport.mfu_peak(snapshot))
    mfu = _number(
        mfu_avg, "%", 100.0, basis, (missing if on_mfu else None, f"against {peak}" if peak else None)
    )
    if tokens:
        parts.append(f"tokens {tokens}")
    if flops:
        parts.append(f"FLOPs {flops}")
    if mfu:
        parts.append(f"MFU {mfu}")
    parts.extend(
        f"{k} {p.value:.4g}" for k, p in sorted(snapshot.series.items()) if k in ("train_loss", "val_loss")
    )
    # Energy where the run's GPUs gave it; money where the run was given a price (printed, never stored).
    parts.extend(paid_time.end_words(snapshot, price))
    return parts


def summary_line(
    run_dir: Path,
    summary: dict,
    snapshot: records.Snapshot | None = None,
    price: paid_time.Price | None = None,
) -> str:
    status = summary["exit_status"]
    parts = [f"finished in {summary['elapsed_s']:.1f} s", f"exit {status}", f"{summary['steps']} steps"]
    if summary["skipped_steps"]:
        parts.append(f"{summary['skipped_steps']} skipped")
    if summary.get("attempt", 1) > 1:
        parts.append(_attempt_words(summary))
    if snapshot is not None:
        parts.extend(headline(snapshot, price))
    drops = summary["bus"]["dropped_total"]
    parts.append(f"{drops} records dropped" if drops else "nothing dropped")
    parts.append(f"see it again: {view_command(run_dir)}")
    return " · ".join(parts)
