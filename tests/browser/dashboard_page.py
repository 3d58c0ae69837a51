"""The dashboard as the browser tests drive it: a Chromium page that records dialogs and script errors, a finished
run served by ``tm view``'s server in a thread, a live ``tm`` whose dashboard line is read as it comes, and what a
person reads off the page (colour contrast, a number with its unit prefix)."""

from __future__ import annotations

import re
import subprocess
import threading
from pathlib import Path

from deadline import wait_for
from tm_runs import REPO, TM, log_records, only_run, run_tm
from torch_required import require_torch

SHOTS = REPO / "artifacts" / "web"
XSS_KEY = "<img src=x onerror=alert(1)>"
GOLDEN = REPO / "tests" / "fixtures" / "golden"

# The series key is read from the command line, so the script itself holds no markup-looking text.
LOOP = """
import os, sys, time
from trainmeter_agent import emit

stop, steps, key = sys.argv[1], int(sys.argv[2]), sys.argv[3]
step = 0
while not os.path.exists(stop) and (steps == 0 or step < steps):
    step += 1
    emit(step=step, tokens=2048, train_loss=4.0 / step)
    emit(**{key: float(step)})
    time.sleep(0.05)
"""


class Page:
    """A fresh page that records dialogs and script errors, closed after the test."""

    def __init__(self, browser) -> None:
        self.context = browser.new_context(viewport={"width": 1400, "height": 1000})
        self.page = self.context.new_page()
        self.dialogs: list[str] = []
        self.exceptions: list[str] = []  # uncaught in the page's scripts
        self.errors: list[str] = []  # anything the console calls an error (CSP refusals included)
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        self.page.on(
            "pageerror", lambda exc: (self.exceptions.append(str(exc)), self.errors.append(str(exc)))
        )
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)

    def close(self) -> None:
        self.context.close()


class Served:
    """``tm view``'s server for a finished run, in a thread of this test."""

    def __init__(self, run_dir: Path, capsys, host: str = "127.0.0.1") -> None:
        from trainmeter_web import view

        self.stopping = threading.Event()
        self.thread = threading.Thread(target=view.serve, args=(run_dir, host, 0, self.stopping), daemon=True)
        self.thread.start()
        seen: list[str] = []

        def url():
            seen.append(capsys.readouterr().err)
            return re.search(r"dashboard (http://\S+)", "".join(seen))

        self.url = wait_for(url, what="the dashboard's start line").group(1)

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(10)


class LiveTm:
    """``tm`` running the loop above until its stop file appears; stderr read as it comes."""

    def __init__(self, env: dict, tmp_path: Path, args: list[str], steps: int = 0, loop: str = LOOP) -> None:
        script = tmp_path / "loop.py"
        script.write_text(loop)
        self.stop_file = tmp_path / "stop"
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [TM, "--port", "0", *args, str(script), str(self.stop_file), str(steps), XSS_KEY, "</script>"],
            env=env,
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()
        self.url = wait_for(self._url, what="tm's dashboard line")
        self.runs = Path(env["TM_RUNS_DIR"])

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line)

    def _url(self) -> str | None:
        for line in self.lines:
            match = re.search(r"dashboard (http://\S+)", line)
            if match:
                return match.group(1)
        return None

    def finish(self) -> int:
        self.stop_file.touch()
        return self.proc.wait(60)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def luminance(css: str) -> float:
    r, g, b = (int(v) / 255 for v in re.findall(r"\d+", css)[:3])
    lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in (r, g, b)]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def contrast(fg: str, bg: str) -> float:
    hi, lo = sorted((luminance(fg), luminance(bg)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def colors(p) -> dict[str, str]:
    return p.evaluate(
        """() => {
          const s = (sel, prop) => getComputedStyle(document.querySelector(sel))[prop];
          return {bg: s('body', 'backgroundColor'), text: s('body', 'color'), card: s('.card', 'backgroundColor'),
                  muted: s('.tile .line', 'color')};
        }"""
    )


_PREFIX = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}


def shown_number(text: str) -> float:
    """The number a person reads in a tile, in the metric's own unit: "41.2%" is 41.2, "72.6k tok/s" 72600,
    "13.8 ms" 0.0138 (seconds), "711 kFLOP" 711000."""
    match = re.match(r"(-?\d+(?:\.\d+)?(?:e-?\d+)?)\s*([kMGTPE]?)(.*)", text.strip())
    assert match, text
    number = float(match.group(1)) * _PREFIX[match.group(2)]
    return number / 1000 if match.group(3).strip() == "ms" else number


def find_golden_run() -> Path | None:
    """A golden run from the numbers issue with a train loss, preferring one with a chosen convention."""
    if not GOLDEN.is_dir():
        return None
    found = []
    for run_dir in sorted(p for p in GOLDEN.iterdir() if p.is_dir()):
        lines = b"".join(p.read_bytes() for p in sorted(run_dir.glob("events-*.jsonl")))
        if b"train_loss" in lines or b'"loss"' in lines:
            found.append((b'"name":"convention"' not in lines, run_dir))
    return sorted(found)[0][1] if found else None


def tiny_gpt_run(env: dict, tmp_path: Path) -> Path:
    require_torch()
    flags = [
        "--no-web", "--params", "106240", "--embedding-params", "4096", "--layers", "2", "--d-model", "64",
        "--seq-len", "64", "--convention", "titan", "--tokens-per-step", "1024", "--peak-tflops", "0.1",
        "--peak-source", "a figure for this test", "--budget-tokens", "100000",
    ]  # fmt: skip
    result = run_tm([*flags, str(REPO / "examples" / "tiny_gpt.py"), "--steps", "60"], env, timeout=300)
    assert result.returncode == 0, result.stderr
    return only_run(Path(env["TM_RUNS_DIR"]))


def loss_points_in_log(run_dir: Path) -> int:
    """The train losses the chart plots: the loop's own (emit or a tracker), which win over the agent's reading at
    backward(); the backward ones only where the loop reported none."""
    keys = ("train_loss", "train/loss", "loss/train", "training_loss", "loss")
    losses = [
        r
        for r in log_records(run_dir)
        if r["kind"] == "metric" and any(k in r.get("values", {}) for k in keys)
    ]
    own = [r for r in losses if r.get("origin", "emit") != "backward"]
    return len(own or losses)
