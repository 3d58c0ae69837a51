"""Runs side by side in the dashboard: ``tm compare A B -o FILE`` (one self-contained file) and ``tm view A B``
(served), the runs' curves overlaid on one x axis beside what differs and their headline numbers
(``trainmeter_core.model.comparison``).

The x axes are steps, tokens, FLOPs spent under the comparison's one convention (each run's tokens × its FLOPs per
token under it, as the engine defines FLOPs spent) and the time since each run started. The MFU curve is each run's
tokens/s under that convention against its own run's peak, with the engine's formula. It reads the run directories
only; each run's numbers are its engine's (replayed here for a finished run, taken from its engine for a live one).
"""

from __future__ import annotations

import argparse
import math
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainmeter_core import __version__
from trainmeter_web.report import REPORT_POINTS, columns, write_file

if TYPE_CHECKING:  # the command is registered on every `tm --help`: its module imports nothing heavy
    from trainmeter_core.model import money
    from trainmeter_core.model.comparison import RunSide
    from trainmeter_core.model.history import HistoryPoint
    from trainmeter_web.dashboard_state import DashboardState

#: The history series a comparison overlays (the MFU curve is made from tokens/s, under the comparison's convention).
SERIES = (
    "train_loss",
    "val_loss",
    "tm:tokens_per_s",
    "tm:step_time_s",
    "tm:ofu",
    "tm:goodput",
    "lr",
    "grad_norm",
)
MFU_SERIES = "mfu"


def _points(dashboard: DashboardState, name: str, axis: str, points: int) -> list[HistoryPoint]:
    return dashboard.history(name, axis, None, points)


def _moved(points: list[HistoryPoint], dx: float = 0.0, sx: float = 1.0) -> list[HistoryPoint]:
    from trainmeter_core.model.history import HistoryPoint

    return [HistoryPoint(p.x * sx + dx, p.value, p.min, p.max, p.count) for p in points]


def _mfu_points(points: list[HistoryPoint], fpt: float, peak_total: float) -> list[HistoryPoint]:
    from trainmeter_core.model import formulas
    from trainmeter_core.model.history import HistoryPoint

    def mfu(tokens_per_s: float) -> float:
        return formulas.mfu(fpt, tokens_per_s, peak_total) if math.isfinite(tokens_per_s) else math.nan

    return [HistoryPoint(p.x, mfu(p.value), mfu(p.min), mfu(p.max), p.count) for p in points]


def run_series(
    dashboard: DashboardState, side: RunSide, convention: str | None, points: int = REPORT_POINTS
) -> dict[str, Any]:
    """One run's curves on the comparison's axes, as columns (report.columns), and why an axis or curve is missing."""
    from trainmeter_core.model.comparison import flop_per_token

    snapshot = side.snapshot
    start = side.meta.get("start_wall") or (
        dashboard.run_start.wall if dashboard.run_start is not None else None
    )
    fpt, no_fpt = flop_per_token(snapshot, convention) if convention else (None, "no convention")
    peak_explain = snapshot.explain.get("mfu")
    peak_input = peak_explain.inputs.get("peak_total_flop_per_s") if peak_explain is not None else None
    peak_total = (
        peak_input.value if peak_input is not None and isinstance(peak_input.value, (int, float)) else None
    )

    def on_axis(name: str, axis: str) -> list[HistoryPoint]:
        if axis == "flop":
            # FLOPs spent under the comparison's convention: the run's tokens × its FLOPs per token under it.
            return _moved(_points(dashboard, name, "tokens", points), sx=fpt) if fpt is not None else []
        if axis == "wall":
            return _moved(_points(dashboard, name, "wall", points), dx=-start) if start is not None else []
        return _points(dashboard, name, axis, points)

    series: dict[str, Any] = {}
    for name in SERIES:
        carried = columns(lambda axis, name=name: on_axis(name, axis))
        if carried is not None:
            series[name] = carried
    out: dict[str, Any] = {"series": series, "missing": {}}
    if fpt is not None and peak_total:
        mfu = columns(lambda axis: _mfu_points(on_axis("tm:tokens_per_s", axis), fpt, peak_total))
        if mfu is not None:
            series[MFU_SERIES] = mfu
    else:
        metric = snapshot.metrics.get("mfu")
        out["missing"]["mfu"] = no_fpt or (
            metric.absent if metric is not None and metric.absent else "no peak"
        )
    if fpt is None:
        out["missing"]["flop"] = f"no FLOPs per token under {convention}: {no_fpt}" if convention else no_fpt
    if start is None:
        out["missing"]["wall"] = "the run's start time is not known"
    return out


def comparison_data(
    dashboards: list[DashboardState],
    sides: list[RunSide],
    convention: str | None = None,
    price: money.Price | None = None,
) -> dict[str, Any]:
    """What the comparison page reads (``/api/compare``, or carried in the file); with a price, money's rows."""
    from trainmeter_core.model.comparison import compare

    comparison = compare(sides, convention, price)
    chosen = comparison["convention"]["name"]
    runs = [
        {"label": entry["label"], **run_series(dashboard, side, chosen)}
        for entry, dashboard, side in zip(comparison["runs"], dashboards, sides, strict=True)
    ]
    return {
        "kind": "compare",
        "tm_version": __version__,
        "written_wall": time.time(),
        "points": REPORT_POINTS,
        "comparison": comparison,
        "runs": runs,
    }


def open_runs(paths: list[Path]) -> tuple[list[DashboardState], list[RunSide]]:
    """Each run as the dashboard sees it now, and as the comparison reads it; a run with nothing usable is a UsageError
    (one line, status 2)."""
    from trainmeter_core.commands.compare import run_state, unusable
    from trainmeter_core.errors import UsageError
    from trainmeter_core.model.comparison import RunSide
    from trainmeter_web.follow import dashboard_now

    dashboards, sides = [], []
    for path in paths:
        stats: dict = {}
        dashboard = dashboard_now(path, stats)
        if dashboard is None:
            raise UsageError(f"stopped before {path.name} said anything")
        if dashboard.snapshot is None:
            raise unusable(path, stats)
        if stats.get("skipped"):
            print(f"tm: skipped {stats['skipped']} unreadable lines of {path.name}'s log", file=sys.stderr)
        dashboards.append(dashboard)
        sides.append(RunSide(path.name, dict(dashboard.meta), dashboard.snapshot, run_state(path)))
    return dashboards, sides


def compare_html(data: dict[str, Any]) -> str:
    from trainmeter_web.bundle import standalone_html

    return standalone_html("compare.html", "compare.js", data)


class CompareCommand:
    """``tm compare``'s HTML: the dashboard completes the built-in command with ``-o FILE``."""

    name = "compare"
    help = "runs side by side; with -o FILE, also their curves overlaid, as one self-contained HTML file"

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "-o",
            "--output",
            metavar="FILE",
            help="write the comparison with the runs' curves overlaid as one HTML file (- for stdout)",
        )

    def run(self, args: argparse.Namespace) -> int:
        from trainmeter_core.commands.compare import resolve_runs
        from trainmeter_core.commands.price_options import price_from

        price = price_from(args)
        dashboards, sides = open_runs(resolve_runs(args.runs, args.runs_dir))
        html = compare_html(comparison_data(dashboards, sides, args.convention, price))
        try:
            target = write_file(args.output, html)
        except OSError as exc:
            print(f"tm: {exc}", file=sys.stderr)
            return 2
        if target is not None:
            size_mb = len(html.encode()) / 1e6
            print(f"tm: wrote {target} ({size_mb:.2f} MB): {len(sides)} runs side by side", file=sys.stderr)
        return 0


def serve(
    paths: list[Path],
    host: str,
    port: int | None,
    stopping: threading.Event | None = None,
    convention: str | None = None,
    price: money.Price | None = None,
) -> int:
    """``tm view A B ...``: the comparison served until Ctrl-C (or ``stopping``), as of the moment it started."""
    from trainmeter_core.model.comparison import label
    from trainmeter_web.dashboard_state import encode
    from trainmeter_web.guard import Guard
    from trainmeter_web.server import Server, listen, make_compare_app

    dashboards, sides = open_runs(paths)
    body = encode(comparison_data(dashboards, sides, convention, price))
    listening = listen(host, port, stopping)
    if listening is None:
        return 2
    bound, stopping = listening
    guard = Guard(bound.host, bound.token)
    server = Server(None, bound.sock, guard, app=lambda changes: make_compare_app(body, guard))
    server.start()
    for line in bound.startup_lines():
        print(f"tm: {line}", file=sys.stderr)
    names = ", ".join(f"{label(i)} {p.name}" for i, p in enumerate(paths))
    print(f"tm: comparing {names} (Ctrl-C to stop)", file=sys.stderr)
    try:
        stopping.wait()
    finally:
        server.stop()
    return 0
