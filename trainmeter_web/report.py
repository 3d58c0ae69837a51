"""``tm report [RUN] [-o FILE]``: the run's dashboard as one self-contained HTML file that opens anywhere (a mail
attachment, a CI artifact), with no network: every script, style and number inside.

The numbers are the engine's (a finished run replayed here, a live one taken from its engine, as ``tm view`` does)
and the page is the dashboard's own code (``bundle.py``). Each series is carried at the page's resolution on every x
axis, so a week-long run stays a file of a few MB. It reads the run directory and writes only the file asked for.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainmeter_core import __version__

if TYPE_CHECKING:  # the command is registered on every `tm --help`: its module imports nothing heavy
    from trainmeter_core.model.history import HistoryPoint
    from trainmeter_web.dashboard_state import DashboardState

#: Points a series keeps per axis: the live page's resolution (stream.DEFAULT_POINTS).
REPORT_POINTS = 600


def _same(a: float, b: float) -> bool:
    return a == b or (a != a and b != b)


def _number(v: float, digits: int = 6) -> float | int | None:
    """A point's number as the file carries it: ``digits`` significant digits (the page shows three), whole numbers
    without ".0", NaN as null. A week-long run's file stays a few MB this way."""
    if not math.isfinite(v):
        return None
    if v.is_integer() and abs(v) < 2**53:
        return int(v)
    return float(f"{v:.{digits}g}")


def _x(v: float, axis: str) -> float | int | None:
    """An x as the file carries it: a wall time to the millisecond, the other axes to 7 significant digits (a
    600-point chart places a point to about one part in a thousand)."""
    if axis == "wall" and math.isfinite(v):
        return round(v, 3)
    return _number(v, 7)


def _columns(points: list[HistoryPoint]) -> dict[str, list]:
    """Values, and min, max and count only where some point merges several (a raw point's are its value and 1)."""
    columns: dict[str, list] = {"v": [_number(p.value) for p in points]}
    if any(not _same(p.min, p.value) for p in points):
        columns["lo"] = [_number(p.min) for p in points]
    if any(not _same(p.max, p.value) for p in points):
        columns["hi"] = [_number(p.max) for p in points]
    if any(p.count != 1 for p in points):
        columns["n"] = [p.count for p in points]
    return columns


def columns(points_on: Callable[[str], list[HistoryPoint]]) -> dict[str, Any] | None:
    """One series on every axis it has points on, as columns: the values once, and one x column per axis; an axis
    whose points are other ones (a point that lacks that axis was left out there) carries its own columns.
    ``points_on(axis)`` gives the series' points on an axis, oldest first."""
    from trainmeter_core.model.history import X_AXES

    entry: dict[str, Any] = {}
    base: list[HistoryPoint] | None = None
    for axis in X_AXES:
        found = points_on(axis)
        if not found:
            continue
        xs = [_x(p.x, axis) for p in found]
        if base is None:
            base = found
            entry.update(_columns(found))
            entry["x"] = {}
        if len(found) == len(base) and all(
            _same(a.value, b.value) and _same(a.min, b.min) and _same(a.max, b.max) and a.count == b.count
            for a, b in zip(found, base, strict=True)
        ):
            entry["x"][axis] = xs
        else:
            entry.setdefault("own", {})[axis] = {"x": xs, **_columns(found)}
    return entry or None


def series_columns(
    dashboard: DashboardState, name: str, points: int = REPORT_POINTS
) -> dict[str, Any] | None:
    """A series of the run's history at the page's resolution, as ``columns`` carries it."""
    return columns(lambda axis: dashboard.history(name, axis, None, points))


def passport_doc(dashboard: DashboardState) -> dict[str, Any]:
    """The passport as the dashboard's /api/passport gives it: the run's passport.md, else made now from the final
    snapshot (a run that was lost, or recorded before passports were written)."""
    if dashboard.run_dir is not None:
        try:
            return {
                "markdown": (dashboard.run_dir / "passport.md").read_text(encoding="utf-8", errors="replace")
            }
        except OSError:
            pass
    from trainmeter_core.model import passport

    if dashboard.snapshot is None:
        return {"absent": "the run has no snapshot to make a passport from"}
    return {
        "markdown": passport.passport_markdown(passport.passport_data(dashboard.snapshot, dashboard.meta))
    }


def with_paid_time(passport: dict[str, Any], dashboard: DashboardState) -> dict[str, Any]:
    """The passport with where the run's paid GPU time went (``model/paid_time``, as ``tm runs RUN`` says it) as its
    last section: the report's page and its static view both show the passport. The GPU samples are the log's."""
    from trainmeter_core.model import paid_time
    from trainmeter_core.runlog.gpu_usage import gpu_usage

    if dashboard.snapshot is None or "markdown" not in passport:
        return passport
    usage = gpu_usage(dashboard.run_dir) if dashboard.run_dir is not None else None
    figures = paid_time.paid_time(
        dashboard.snapshot, usage, price=dashboard.price
    )  # tm report's price, if given
    return {**passport, "markdown": f"{passport['markdown'].rstrip()}\n\n{paid_time.markdown(figures)}"}


def report_data(
    dashboard: DashboardState, written_wall: float, points: int = REPORT_POINTS
) -> dict[str, Any]:
    """What a report file carries: the live page's first document, every series, the run and its passport."""
    with dashboard.lock:
        doc = dashboard.live_doc()
        series = {}
        for name in doc["catalog"]:
            columns = series_columns(dashboard, name, points)
            if columns is not None:
                series[name] = columns
        run = dashboard.run_doc()
    return {
        "kind": "report",
        "tm_version": __version__,
        "written_wall": written_wall,
        "points": points,
        "doc": doc,
        "run": run,
        "passport": with_paid_time(passport_doc(dashboard), dashboard),
        "series": series,
    }


def report_html(dashboard: DashboardState, written_wall: float | None = None) -> str:
    """The file: the dashboard's page and scripts with the run's documents, and what a reader without scripts sees
    (the headline numbers, the alerts, the passport: ``report_static``)."""
    from trainmeter_web.bundle import standalone_html, static_files
    from trainmeter_web.report_static import with_static_view

    data = report_data(dashboard, time.time() if written_wall is None else written_wall)
    files = static_files()
    files["index.html"] = with_static_view(files["index.html"], dashboard.snapshot, data)
    return standalone_html("index.html", "report.js", data, files)


def write_file(path: str, text: str) -> Path | None:
    """Write ``text`` to ``path`` whole (a reader never sees half a file), or to stdout for ``-``."""
    if path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return None
    target = Path(path).expanduser().absolute()
    tmp = target.with_name(f".{target.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OSError(
            f"cannot write {target} ({exc.strerror or exc}): pass -o FILE in a folder you can write"
        ) from None
    return target


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "run", nargs="?", help="a run directory, a run name or its unique prefix (default: the latest)"
    )
    p.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="where to write the HTML (default: RUN-report.html in the current directory; - for stdout)",
    )
    p.add_argument("--runs-dir", help="where runs are (default: TM_RUNS_DIR, else ./.trainmeter/runs)")
    from trainmeter_core.commands.price_options import add_price_arguments

    add_price_arguments(p)


class ReportCommand:
    """``tm report`` as the ``trainmeter_commands`` hook describes a command."""

    name = "report"
    help = "the run's dashboard as one self-contained HTML file that opens anywhere, with no network"

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        add_arguments(p)

    def run(self, args: argparse.Namespace) -> int:
        return run(args)


def run(args: argparse.Namespace) -> int:
    from trainmeter_core.commands.price_options import price_from
    from trainmeter_core.errors import UsageError
    from trainmeter_core.runlog import rundir
    from trainmeter_web.follow import dashboard_now

    try:
        run_dir = rundir.resolve_run(args.run, rundir.runs_dir(args.runs_dir) if args.runs_dir else None)
        price = price_from(args)
    except (rundir.RunDirError, UsageError) as exc:
        print(f"tm: {exc}", file=sys.stderr)
        return 2
    stats: dict = {}
    dashboard = dashboard_now(run_dir, stats)
    if dashboard is None:
        return 130
    if dashboard.snapshot is None:
        print(f"tm: {run_dir.name} has no record the engine can use: nothing to report", file=sys.stderr)
        return 2
    dashboard.set_price(price)  # the file carries the money it makes, never the run directory
    if stats.get("skipped"):
        reasons = ", ".join(f"{n} {r}" for r, n in sorted(stats["reasons"].items()))
        print(f"tm: skipped {stats['skipped']} unreadable lines of the log ({reasons})", file=sys.stderr)
    html = report_html(dashboard)
    try:
        target = write_file(args.output or f"{run_dir.name}-report.html", html)
    except OSError as exc:
        print(f"tm: {exc}", file=sys.stderr)
        return 2
    if target is not None:
        print(
            f"tm: wrote {target} ({len(html.encode()) / 1e6:.2f} MB): the run's dashboard in one file",
            file=sys.stderr,
        )
    return 0
