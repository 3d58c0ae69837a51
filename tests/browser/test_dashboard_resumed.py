"""A resumed run's dashboard in a real browser: the attempt, the time the run was down, and the gap marked on
every chart.
"""

from __future__ import annotations

import json

from dashboard_page import (
    SHOTS,
    Served,
)
from test_engine_attempts import Log

from trainmeter_core.model import records

# ---------------------------------------------------------------------------------------------------------------------
# A resumed run (tm --resume): the header says which attempt and how long the run was down, and every chart marks the
# gap on the wall-time axis and the step the run went back to on the step axis.

RESUMED_WALL0 = 1_796_000_000.0


def resumed_run(run_dir):
    """Attempt 1 steps 1..10 and is lost after its checkpoint of step 10 (its last tick at wall + 120); attempt 2
    starts at wall + 150 (30 s down), resumes after step 10 and ends after step 20."""
    log = Log()
    log.start(100.0)
    for step in range(1, 11):
        log.add(records.Step(t=109.0 + step, step=step, tokens=100), wall_offset=RESUMED_WALL0)
        log.add(
            records.Metric(t=109.2 + step, values={"train_loss": 4.0 / step}, step=step),
            wall_offset=RESUMED_WALL0,
        )
    log.tick(120.0, 1)
    log.start(150.0, attempt=2, resume_reason="--resume")
    for step in range(11, 21):
        fields = {"resumed_from": 10} if step == 11 else {"step_time_s": 1.0}
        log.add(records.Step(t=149.0 + step, step=step, tokens=100, **fields), wall_offset=RESUMED_WALL0)
        log.add(
            records.Metric(t=149.2 + step, values={"train_loss": 4.0 / step}, step=step),
            wall_offset=RESUMED_WALL0,
        )
    log.tick(170.0, 2)
    log.end(170.5)
    for record in log.records:
        if record.wall < RESUMED_WALL0:
            record.wall = record.t + RESUMED_WALL0
    run_dir.mkdir(parents=True)
    meta = {
        "run_id": run_dir.name,
        "name": "train",
        "command": ["train.py"],
        "start_wall": RESUMED_WALL0 + 100.0,
    }
    meta["attempts"] = [{"attempt": 1}, {"attempt": 2, "resume_reason": "--resume"}]
    (run_dir / "meta.json").write_text(json.dumps(meta))
    (run_dir / "events-0001.jsonl").write_bytes(
        b"".join(records.to_log_line(records.to_builtins(r)) for r in log.records if r.seq < 25)
    )
    (run_dir / "events-0002.jsonl").write_bytes(
        b"".join(records.to_log_line(records.to_builtins(r)) for r in log.records if r.seq >= 25)
    )


def test_the_dashboard_says_the_attempt_and_marks_where_the_run_was_down(page, tmp_path, capsys):
    run_dir = tmp_path / "runs" / "20261201T000000Z-vm-train"
    resumed_run(run_dir)
    served = Served(run_dir, capsys)
    p = page.page
    try:
        p.goto(served.url)
        p.wait_for_function("() => document.querySelector('#run-state')?.textContent === 'finished · exit 0'")
        assert p.text_content("#attempts") == "attempt 2 · resumed after step 10 · down 30 s (attempt 1 lost)"
        assert p.text_content("#progress-stats [data-explain=steps]") == "20"
        # On the step axis, the loss chart marks the step the run went back to
        p.wait_for_function(
            "() => (document.querySelector('#chart-loss') || {dataset: {}}).dataset.gaps === '10..10'"
        )
        # On the wall-time axis, the stretch from attempt 1's last tick (wall + 120) to attempt 2's start (+ 150)
        p.click("#x-axis button[data-axis=wall]")
        expected = f"{RESUMED_WALL0 + 120.0:.0f}..{RESUMED_WALL0 + 150.0:.0f}"
        p.wait_for_function(
            f"() => (document.querySelector('#chart-loss') || {{dataset: {{}}}}).dataset.gaps === '{expected}'"
        )
        assert p.get_attribute("#chart-loss", "data-nan") == ""  # a gap is no NaN stretch
        SHOTS.mkdir(parents=True, exist_ok=True)
        p.mouse.move(0, 0)
        p.screenshot(path=str(SHOTS / "resumed.png"), full_page=False)
        assert page.errors == []
    finally:
        served.stop()


def test_the_time_split_has_one_bar_per_attempt_each_its_share(page, tmp_path, capsys):
    run_dir = tmp_path / "runs" / "20261201T000000Z-vm-train"
    resumed_run(run_dir)
    served = Served(run_dir, capsys)
    p = page.page
    try:
        p.goto(served.url)
        p.wait_for_function("() => document.querySelectorAll('#attempt-bars .attempt-bar').length === 2")
        # attempt 1: start-up 10 s (100 → 110), compute 9 s (110 → 119), after the last step 1 s (119 → 120, its last
        # tick); attempt 2: down 30 s, start-up 10 s (150 → 160), compute 9 s, after the last step 1.5 s (169 → 170.5)
        heads = p.eval_on_selector_all("#attempt-bars .attempt-bar .sub", "ps => ps.map(p => p.textContent)")
        assert heads == ["attempt 1 · 20 s · lost", "attempt 2 · 50.5 s · exited 0"]
        parts = p.eval_on_selector_all(
            "#attempt-bars .attempt-bar",
            "bars => bars.map(b => [...b.querySelectorAll('.split > span')].map(s => s.dataset.part))",
        )
        assert parts == [
            ["compute", "startup", "after_last_step"],
            ["compute", "startup", "down", "after_last_step"],
        ]
        widths = p.eval_on_selector_all(
            "#attempt-bars .attempt-bar[data-attempt='2'] .split > span",
            "spans => spans.map(s => s.style.width)",
        )
        # 9 / 50.5, 10 / 50.5, 30 / 50.5, 1.5 / 50.5 of the bar
        assert [round(float(w.rstrip("%")), 1) for w in widths] == [17.8, 19.8, 59.4, 3.0]
        assert "down between attempts 30 s" in p.get_attribute("#attempt-bars [data-attempt='2']", "title")
        p.locator("#split-card").screenshot(path=str(SHOTS / "resumed-attempt-bars.png"))
        assert page.errors == []
    finally:
        served.stop()
