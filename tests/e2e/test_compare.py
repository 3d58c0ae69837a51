"""``tm compare A B [C ...]`` and ``tm view A B``: the command's answers (text, JSON, a file, a served page) for runs
written here, and bad input (one run, a missing run, the same run twice, a corrupt log) as one line and status 2. Two
real CPU runs compared in a browser are in test_compare_browser.py."""

from __future__ import annotations

import json
import re
import threading
import urllib.request
from pathlib import Path

import pytest
from deadline import wait_for
from tm_runs import run_tm

from trainmeter_core.model import records

WALL0 = 1_700_000_000.0


def write_run(runs: Path, name: str, command: list[str], steps: int = 5, lr: float = 1e-3) -> Path:
    """A finished run of ``steps`` steps of 100 tokens with a falling loss, as tm's recorder writes it."""
    logged: list[records.Record] = [
        records.RunStart(
            run_id=name,
            name="demo",
            run_dir=str(runs / name),
            command=command,
            cwd="/w",
            tm_version="0.1.0",
            python="3.11.7",
            platform="Linux",
        ),  # fmt: skip
        records.Fact(name="convention", value="titan", provenance="declared", origin="--convention"),
        records.Fact(name="flop_per_token", value=600.0, provenance="declared", origin="--flops-per-token"),
    ]
    for step in range(1, steps + 1):
        logged += [
            records.Step(step=step, tokens_global=100, step_time_s=0.5),
            records.Metric(values={"train_loss": 4.0 / step, "lr": lr}, step=step),
            records.Tick(n=step, interval_s=1.0),
        ]
    logged.append(records.RunEnd(status=0, reason="exited", exit_code=0, elapsed_s=float(steps)))
    for i, record in enumerate(logged, start=1):
        record.seq, record.t, record.wall = i, float(i), WALL0 + i
    run_dir = runs / name
    run_dir.mkdir(parents=True)
    meta = {
        "run_id": name,
        "name": "demo",
        "command": command,
        "start_wall": WALL0,
        "host": "h",
        "tm_version": "0.1.0",
    }
    (run_dir / "meta.json").write_text(json.dumps(meta))
    (run_dir / "summary.json").write_text(json.dumps({"state": "finished", "exit_status": 0}))
    (run_dir / "events-0001.jsonl").write_bytes(
        b"".join(records.to_log_line(records.to_builtins(r)) for r in logged)
    )
    return run_dir


@pytest.fixture
def two_runs(tm_env) -> tuple[Path, Path]:
    runs = Path(tm_env["TM_RUNS_DIR"])
    a = write_run(runs, "20260101T000000Z-h-slow", ["train.py", "--lr", "1e-3", "--steps", "5"])
    b = write_run(runs, "20260101T000100Z-h-fast", ["train.py", "--lr", "3e-3", "--steps", "5"], lr=3e-3)
    return a, b


def test_json_lists_exactly_the_flag_that_differs_and_the_headline_numbers_against_the_first(
    tm_env, two_runs
):
    result = run_tm(["compare", "--json", "slow", "fast"], tm_env)
    assert result.returncode == 0, result.stderr
    comparison = json.loads(result.stdout)
    assert comparison["differences"] == [
        {"category": "command line", "name": "--lr", "values": ["1e-3", "3e-3"]}
    ]
    assert [r["label"] for r in comparison["runs"]] == ["A", "B"] and comparison["baseline"] == "A"
    # Each run declared its FLOPs per token: the engine puts them under "declared", and so does the comparison.
    assert comparison["convention"]["name"] == "declared"
    rows = {row["key"]: row for row in comparison["headline"]}
    # 5 steps of 100 tokens each: 500 tokens; FLOPs spent = 600 FLOP/token × 500 tokens = 300,000 FLOP
    assert rows["tokens"]["values"] == [500, 500] and rows["tokens"]["ratio"] == [None, 1.0]
    assert rows["spent_flop"]["values"] == [300_000.0, 300_000.0]
    assert rows["train_loss"]["values"] == [0.8, 0.8]  # 4 / 5, the last loss of each
    assert rows["train_loss"]["difference"] == [None, 0.0]


def test_the_text_lists_what_differs_first_then_the_headline_numbers(tm_env, two_runs):
    result = run_tm(["compare", "slow", "fast"], tm_env)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["A", "20260101T000000Z-h-slow", "finished", "no", "device", "reported"]
    first = lines.index("What differs")
    assert lines[first + 1].split() == ["command", "line", "--lr", "1e-3", "3e-3"]
    headline = lines.index("Headline numbers against A (FLOPs and MFU under declared)")
    assert headline > first
    assert lines[headline + 1].split() == ["A", "B", "B", "−", "A", "B", "/", "A"]
    tokens = next(line for line in lines if line.strip().startswith("tokens "))
    assert tokens.split() == ["tokens", "500", "500", "+0", "×1"]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["slow"], "tm compare needs two runs or more, got one run (slow)"),
        ([], "tm compare needs two runs or more, got no run"),
        (["slow", "nothing-like-this"], "no run matches 'nothing-like-this'"),
        (["slow", "20260101T000000Z-h-slow"], "is 20260101T000000Z-h-slow, already in the comparison"),
        (
            ["slow", "broken"],
            "20260101T000200Z-h-broken's log has no record the engine can use: 2 unreadable lines",
        ),
        (["--json", "slow", "broken"], "20260101T000200Z-h-broken's log has no record the engine can use"),
        (["slow", "fast", "--convention", "flat"], "argument --convention: invalid choice: 'flat'"),
    ],
)
def test_bad_input_is_one_line_and_status_2(tm_env, two_runs, args, said):
    broken = Path(tm_env["TM_RUNS_DIR"]) / "20260101T000200Z-h-broken"
    broken.mkdir()
    (broken / "meta.json").write_text(json.dumps({"name": "broken"}))
    (broken / "events-0001.jsonl").write_bytes(b'\x00\xff this is not a log\n{"kind": 7}\n')
    result = run_tm(["compare", *args], tm_env)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith("tm: ") and said in result.stderr and result.stderr.count("\n") == 1


def test_view_json_of_two_runs_points_to_compare(tm_env, two_runs):
    result = run_tm(["view", "--json", "slow", "fast"], tm_env)
    assert result.returncode == 2
    assert (
        result.stderr == "tm: tm view --json prints one run's snapshot: tm compare --json A B compares runs\n"
    )


def carried(html: str) -> dict:
    return json.loads(
        re.search(r'<script type="application/json" id="tm-data">(.*?)</script>', html, re.S).group(1)
    )


def test_compare_o_writes_the_comparison_and_each_runs_curves_on_every_axis(tm_env, two_runs, tmp_path):
    out = tmp_path / "cmp.html"
    result = run_tm(["compare", "slow", "fast", "-o", str(out)], tm_env)
    assert result.returncode == 0, result.stderr
    assert result.stderr == f"tm: wrote {out} ({out.stat().st_size / 1e6:.2f} MB): 2 runs side by side\n"
    data = carried(out.read_text())
    assert data["comparison"]["differences"][0]["name"] == "--lr"
    (a, b) = data["runs"]
    loss = a["series"]["train_loss"]
    assert loss["x"]["step"] == [1, 2, 3, 4, 5] and loss["x"]["tokens"] == [100, 200, 300, 400, 500]
    # FLOPs spent under titan: 600 FLOP/token × 100, 200, ... tokens; time since the start: wall − start_wall, the
    # metric records of steps 1..5 being records 5, 8, 11, 14, 17 (3 + 3k), at WALL0 + seq
    assert loss["x"]["flop"] == [60_000, 120_000, 180_000, 240_000, 300_000]
    assert loss["x"]["wall"] == [5, 8, 11, 14, 17]
    assert b["series"]["lr"]["v"] == [0.003] * 5
    # No device reported a peak: no MFU curve, and why.
    assert "mfu" not in a["series"] and a["missing"]["mfu"]


def test_view_of_two_runs_serves_the_comparison_page_and_its_document(tm_env, two_runs, capsys):
    from trainmeter_web import compare

    stopping = threading.Event()
    thread = threading.Thread(
        target=compare.serve, args=(list(two_runs), "127.0.0.1", 0, stopping), daemon=True
    )
    thread.start()
    seen: list[str] = []

    def url():
        seen.append(capsys.readouterr().err)
        return re.search(r"dashboard (http://\S+)", "".join(seen))

    try:
        base = wait_for(url, what="the comparison's start line").group(1)
        page = urllib.request.urlopen(base).read().decode()
        assert '<script type="module" src="/static/compare.js"></script>' in page
        document = json.loads(urllib.request.urlopen(base + "api/compare").read())
        assert [r["name"] for r in document["comparison"]["runs"]] == [p.name for p in two_runs]
        assert "comparing A 20260101T000000Z-h-slow, B 20260101T000100Z-h-fast" in "".join(seen)
    finally:
        stopping.set()
        thread.join(10)


def test_numbers_read_in_their_units_rounded_to_three_significant_digits_first():
    from trainmeter_core.commands.compare import difference_text, duration_text, number_text, si_text

    assert si_text(999_699) == "1M"  # rounded to 1.00e6 first, so never "1e+03k"
    assert si_text(4_931_584, " tok/s") == "4.93M tok/s"
    assert duration_text(7 * 24 * 3600) == "7d 0h" and duration_text(0.0422) == "42.2 ms"
    assert duration_text(725) == "12m 05s" and duration_text(26.91) == "26.9 s"
    assert number_text(0.3331, None, "mfu_avg") == "33.3%" and number_text(301.0, "steps") == "301"
    assert number_text(None, "s") == "n/a" and number_text(float("nan"), "tokens") == "n/a"
    # a difference of two MFUs is in percentage points: 0.33 − 0.3334 = −0.0034, −0.34 pp
    assert difference_text(-0.0034, None, "mfu") == "-0.34 pp"
    assert difference_text(22.8, "s", "elapsed_s") == "+22.8 s"


REAL = Path(__file__).parents[1] / "fixtures" / "real"


def test_two_real_h200_runs_differ_by_their_iterations_and_sampling_and_share_one_convention(tm_env):
    result = run_tm(
        ["compare", "--json", str(REAL / "h200-nanogpt-eager"), str(REAL / "h200-nanogpt-kill")], tm_env
    )
    assert result.returncode == 0, result.stderr
    comparison = json.loads(result.stdout)
    assert comparison["differences"] == [
        {"category": "command line", "name": "--max_iters", "values": ["300", "900"]},
        {"category": "environment", "name": "TM_GPU_INTERVAL_S", "values": [None, "0.5"]},
    ]
    # Neither run chose a convention (their MFU is a range); titan is the first both can be counted under, and is
    # nanoGPT's own: 854,770,176 FLOP per token (tests/fixtures/real/README.md).
    assert comparison["convention"]["name"] == "titan"
    rows = {row["key"]: row for row in comparison["headline"]}
    assert rows["flop_per_token"]["values"] == [854_770_176, 854_770_176]
    assert rows["steps"]["values"] == [301, 901]
    # Each MFU against the same H200 datasheet peak, so no note about peaks; the convention is noted.
    assert not any("peaks differ" in n for n in comparison["notes"])
    assert comparison["notes"][0].startswith(
        "FLOPs and MFU are under titan: the runs' FLOPs are under no common"
    )
    # titan is one of the four conventions the run's own MFU ranged over: recomputed under it against the run's own
    # peak, it lies inside that range.
    own = json.loads(run_tm(["view", "--json", str(REAL / "h200-nanogpt-eager")], tm_env).stdout)["metrics"][
        "mfu_avg"
    ]
    assert own["low"] <= rows["mfu_avg"]["values"][0] <= own["high"]


@pytest.mark.heavy
@pytest.mark.xdist_group("heavy")
def test_runs_on_different_hardware_are_each_against_their_own_peak_with_a_note_saying_so(tm_env, tmp_path):
    import subprocess
    import sys

    week = tmp_path / "week"
    subprocess.run(
        [sys.executable, str(Path(__file__).parents[1] / "scripts" / "week_run.py"), str(week)], check=True
    )
    result = run_tm(["compare", "--json", str(REAL / "h200-nanogpt-eager"), str(week)], tm_env, timeout=300)
    assert result.returncode == 0, result.stderr
    comparison = json.loads(result.stdout)
    notes = comparison["notes"]
    assert any(n.startswith("each MFU is against its own run's peak, and the peaks differ: A 990 TFLOP/s (NVIDIA H200")
               and "; B 989 TFLOP/s (H100 SXM" in n for n in notes), notes  # fmt: skip
    assert "the runs ran on different devices: A 1 × NVIDIA H200 SXM; B 8 × H100 SXM" in notes
    hardware = {d["name"]: d["values"] for d in comparison["differences"] if d["category"] == "hardware"}
    assert hardware["devices"] == ["1 × NVIDIA H200 SXM", "8 × H100 SXM"]
    # The week's FLOPs per token was declared (no shape): it cannot be put under titan, and says why.
    rows = {row["key"]: row for row in comparison["headline"]}
    assert rows["mfu_avg"]["values"][1] is None and "parameter count unknown" in rows["mfu_avg"]["absent"][1]


# ----------------------------------------------------------------------------------------------------------------------
# Money at a price the reader gives (model/money.py)


def test_with_a_price_each_runs_money_is_its_gpu_hours_priced_against_the_first(tm_env):
    env = {k: v for k, v in tm_env.items() if "PRICE" not in k}
    runs = [str(REAL / "h200-nanogpt-eager"), str(REAL / "h200-nanogpt-kill")]
    result = run_tm(
        ["compare", "--json", *runs, "--price-per-gpu-hour", "7.3193", "--price-currency", "EUR"], env
    )
    assert result.returncode == 0, result.stderr
    comparison = json.loads(result.stdout)
    rows = {row["key"]: row for row in comparison["headline"]}
    hours = rows["gpu_hours"]["values"]
    # money spent = GPU-hours × 7.3193, run by run; its ratio is the GPU-hours' ratio
    assert rows["money.spent"]["values"] == [pytest.approx(h * 7.3193) for h in hours]
    assert rows["money.spent"]["unit"] == "EUR"
    assert rows["money.spent"]["ratio"][1] == pytest.approx(hours[1] / hours[0])
    assert "money.lost.startup" in rows
    assert "price 7.3193 EUR/GPU-h from --price-per-gpu-hour" in comparison["notes"]
    plain = json.loads(run_tm(["compare", "--json", *runs], env).stdout)
    assert not [row for row in plain["headline"] if row["key"].startswith("money")]
    assert any(n.startswith("money n/a (no price given: --price-per-gpu-hour") for n in plain["notes"])
