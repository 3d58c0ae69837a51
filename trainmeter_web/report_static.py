"""What a report file shows a reader without scripts (a mail client or a CI viewer strips them): the run's headline
numbers, its alerts and its passport as plain HTML, in the words the core already writes them (the summary line's
phrases, ``passport.md``), and a footer that links nothing. The page's scripts put the dashboard in its place.

Pure: HTML text from what the report carries. Every string from the run is escaped; nothing here needs a server.
"""

from __future__ import annotations

import html
import re
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from trainmeter_core.model import badput, money

if TYPE_CHECKING:
    from trainmeter_core.model import records

#: The class of ``<html>`` while the static view is what the reader sees; report.js removes it (style.css).
STATIC_CLASS = "static"
_HTML_TAG = re.compile(r'<html lang="en" data-theme="light">')
_MAIN = "<main>\n"
_FOOTER = re.compile(r"<footer>.*?</footer>", re.S)


def utc(wall: float | None) -> str:
    if wall is None:
        return "n/a"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(wall))


def state_words(status: Mapping[str, Any], elapsed_s: float | None) -> list[str]:
    """``finished in 7.1 s · exit 0``, ``lost``, or ``running for 12.0 s``, as the summary line starts."""
    took = f" {elapsed_s:.1f} s" if elapsed_s is not None else ""
    state = status.get("state")
    if state == "finished":
        words = [f"finished in{took}" if took else "finished"]
        if status.get("exit_status") is not None:
            words.append(f"exit {status['exit_status']}")
        return words
    if state == "lost":
        return [f"lost after{took}" if took else "lost"]
    return [
        f"{state or 'starting'} for{took} when this report was written" if took else str(state or "starting")
    ]


def headline_words(snapshot: records.Snapshot | None, status: Mapping[str, Any]) -> list[str]:
    """The run's state, its steps and the summary line's numbers (``summary.headline``)."""
    from trainmeter_core.run.summary import headline

    if snapshot is None:
        return [*state_words(status, None), "no record the engine could use"]
    return [*state_words(status, snapshot.elapsed_s), f"{snapshot.steps} steps", *headline(snapshot)]


def _alert(alert: Mapping[str, Any], run_over: bool) -> str:
    if alert.get("state") == "cleared":
        when = f"cleared {utc(alert.get('cleared_wall'))}"
    else:
        when = "still firing when the run ended" if run_over else "firing"
    if alert.get("fired_wall"):
        when += f"; fired {utc(alert['fired_wall'])}"
    subject = alert.get("subject")
    return (
        f'<div class="alert {html.escape(str(alert.get("severity", "")))} {html.escape(str(alert.get("state", "")))}">'
        f'<span class="dot"></span><div><strong>{html.escape(str(alert.get("rule", "")))}</strong> '
        f"{html.escape(str(alert.get('message', '')))}"
        + (f'<div class="muted">{html.escape(str(subject))}</div>' if subject else "")
        + f'</div><div class="muted num">{html.escape(when)}</div></div>'
    )


def alerts_html(alerts: Iterable[Mapping[str, Any]], run_over: bool) -> str:
    """The alerts as the dashboard lists them, newest first; "No alert fired." when none did."""
    ordered = sorted(alerts, key=lambda a: -(a.get("fired_wall") or 0))
    if not ordered:
        return '<p class="empty">No alert fired.</p>'
    return "".join(_alert(a, run_over) for a in ordered)


def badput_html(snapshot: records.Snapshot | None) -> str:
    """Where the run's time went: productive step time and each badput bucket with time in it, in seconds, for the
    run and (a resumed run) for each attempt; empty without a time split."""
    split = snapshot.phases_s if snapshot is not None else None
    if not split:
        return ""
    shares = [a.phases_s for a in snapshot.attempts] if snapshot is not None else []
    head = "<tr><th>where</th><th>run</th>" + "".join(
        f"<th>attempt {i}</th>" for i in range(1, len(shares) + 1)
    )
    rows = []
    for name, title in badput.TITLES.items():
        seconds = split.get(name)
        if seconds is None or (name != "compute" and abs(seconds) < 1e-9):
            continue
        cells = "".join(f"<td>{share.get(name, 0.0):.1f} s</td>" for share in shares)
        rows.append(
            f'<tr data-part="{name}"><td>{html.escape(title)}</td><td>{seconds:.1f} s</td>{cells}</tr>'
        )
    return (
        '<div class="part-head"><div><h2>Where the time went</h2></div></div>\n'
        f'<div class="card"><table id="static-badput">{head}</tr>{"".join(rows)}</table></div>\n'
    )


def static_view(snapshot: records.Snapshot | None, data: Mapping[str, Any]) -> str:
    """The section a reader without scripts sees: headline, alerts, passport. ``data`` is what the file carries
    (``report.report_data``)."""
    doc, run, passport = data["doc"], data.get("run") or {}, data.get("passport") or {}
    status = doc.get("status") or {}
    name = run.get("name") or run.get("run_id") or "a run"
    words = headline_words(snapshot, status)
    if "markdown" in passport:
        passport_html = f'<pre id="static-passport">{html.escape(passport["markdown"])}</pre>'
    else:
        passport_html = f'<p class="empty">{html.escape(passport.get("absent") or "no passport")}</p>'
    run_over = status.get("state") in ("finished", "lost")
    return (
        '<section id="static-view" class="part">\n'
        f'<div class="part-head"><div><h2>{html.escape(str(name))}</h2><p class="sub">The run\'s numbers as tm\'s '
        "engine computed them. The charts and the rest of the dashboard need this file opened with scripts "
        "allowed.</p></div></div>\n"
        f'<div class="card"><p id="static-headline">{html.escape(" · ".join(words))}</p>'
        f'<p id="static-money">{html.escape(money.words(doc.get("money") or {}))}</p></div>\n'
        f"{badput_html(snapshot)}"
        '<div class="part-head"><div><h2>Alerts</h2></div></div>\n'
        f'<div class="card" id="static-alerts">{alerts_html((doc.get("alerts") or {}).values(), run_over)}</div>\n'
        f"{communication_html(snapshot)}"
        '<div class="part-head"><div><h2>Passport</h2></div></div>\n'
        f"{passport_html}\n"
        "</section>\n"
    )


def _seconds(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value * 1e3:.3g} ms" if abs(value) < 1 else f"{value:.3g} s"


def communication_html(snapshot: records.Snapshot | None) -> str:
    """The communication part for a reader without scripts: the straggler (or why none is named) and each rank's
    exposed collective wait, data wait, compute and bus bandwidth per operation kind; nothing without a snapshot."""
    if snapshot is None:
        return ""
    metrics = snapshot.metrics
    rank, wait = metrics.get("straggler_rank"), metrics.get("straggler_wait_s")
    if rank is not None and rank.value is not None:
        cause = wait.label if wait is not None and wait.label else "unknown"
        waited = _seconds(wait.value if wait is not None else None)
        line = f"the straggler is rank {rank.value:.0f} on {rank.label}: the others wait {waited} per step for it; "
        line += f"cause: {cause}"
    else:
        line = (rank.absent if rank is not None else None) or "no collective probe reported"
    rows = []
    for stat in sorted(snapshot.ranks, key=lambda r: r.rank):
        if stat.collective_wait_s is None:
            continue
        prefix = "bus_bandwidth_bps."
        suffix = f".rank{stat.rank}"
        bandwidths = [
            f"{key[len(prefix) : -len(suffix)].replace('.', ' ×')} {value.value / 1e9:.3g} GB/s"
            for key, value in sorted(metrics.items())
            if key.startswith(prefix) and key.endswith(suffix) and value.value is not None
        ]
        cells = [
            str(stat.rank),
            stat.host,
            _seconds(stat.step_time_s),
            _seconds(stat.collective_wait_s),
            _seconds(stat.data_wait_s),
            _seconds(stat.compute_s),
            ", ".join(bandwidths) or "n/a",
        ]
        rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    heads = ["rank", "host", "step time", "exposed collective wait", "data wait", "compute", "bus bandwidth"]
    table = (
        '<table class="ranks"><thead><tr>'
        + "".join(f"<th>{h}</th>" for h in heads)
        + f"</tr></thead><tbody>{''.join(rows)}</tbody></table>"
        if rows
        else ""
    )
    return (
        '<div class="part-head"><div><h2>Communication</h2></div></div>\n'
        f'<div class="card" id="static-communication"><p>{html.escape(line)}</p>{table}</div>\n'
    )


def footer(data: Mapping[str, Any]) -> str:
    """The report's footer: what wrote it and when; no link (nothing in a file may need a server)."""
    run = data.get("run") or {}
    text = (
        f"trainmeter report of {run.get('name') or 'a run'} · written {utc(data.get('written_wall'))} by tm "
        f"{data.get('tm_version') or '?'} from the run's log · charts hold up to {data.get('points')} points a series"
    )
    return f"<footer>{html.escape(text)}</footer>"


def with_static_view(page: str, snapshot: records.Snapshot | None, data: Mapping[str, Any]) -> str:
    """The dashboard's page as a report file serves it: the static view first in ``<main>``, shown (by style.css)
    until the scripts run, and the report's footer in place of the live page's."""
    page, found = _HTML_TAG.subn(f'<html lang="en" data-theme="light" class="{STATIC_CLASS}">', page, count=1)
    if not found or _MAIN not in page or not _FOOTER.search(page):
        raise ValueError("index.html has no <html>, <main> or <footer> where the report's static view goes")
    page = page.replace(_MAIN, _MAIN + static_view(snapshot, data), 1)
    return _FOOTER.sub(lambda _: footer(data), page, count=1)
