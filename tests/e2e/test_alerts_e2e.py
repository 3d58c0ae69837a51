"""One real run per alert rule, thresholds scaled down in tm.toml: a loop that stalls, one that slows down, a loss
that turns NaN, a fake GPU that throttles and one that reports an Xid, two ranks with one slow, a child killed by
SIGKILL. Each gives exactly one ``fired`` and, where the condition can end, one ``cleared`` (in the run log, in
alerts.jsonl and on stderr, in that order); a normal run of the same length gives none."""

from __future__ import annotations

import json
import sys

import pytest
from tm_runs import log_records, only_run, run_tm

# Every rule scaled down at once, for every run below (the normal run included): a false alarm anywhere shows.
SCALED = """
[alerts.hung]
floor_s = 3
clear_after_s = 2
[alerts.throughput_drop]
fraction = 0.6
clear_fraction = 0.8
warmup_s = 2
min_samples = 3
fire_after_s = 2
clear_after_s = 2
pause_holdoff_s = 0
[alerts.loss_nan]
clear_after_s = 1
[alerts.loss_spike]
min_points = 5
clear_after_s = 2
[alerts.straggler]
margin = 0.5
min_steps = 10
fire_after_s = 2
clear_after_s = 2
[alerts.gpu_throttle]
fire_after_s = 2
clear_after_s = 2
[alerts.gpu_xid]
clear_after_s = 2
"""

# STEPS steps of SLEEP seconds each; SPECIAL maps a step to (sleep instead, loss instead) so each test scripts its
# trouble. The loop is plain Python with emit(): no torch, so a run costs seconds.
LOOP = """
import math, os, signal, sys, time
nan = math.nan  # the special steps are written with repr(), which spells NaN "nan"
from trainmeter_agent import emit
steps, sleep_s = {steps}, {sleep_s}
special = {special}
for i in range(1, steps + 1):
    emit(step=i, tokens=1024)
    wait, loss = special.get(i, (sleep_s, 4.0 / i ** 0.5))
    emit(train_loss=loss)
    if wait == "kill":
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(wait)
"""


def alerts_of_run(
    tmp_path, tm_env, steps=80, sleep_s=0.1, special=None, env=None, command=None, tm_toml=SCALED
):
    """Run the loop (or ``command``) under tm with SCALED (or ``tm_toml``) next to it; returns (tm's result, run dir,
    alert records)."""
    (tmp_path / "tm.toml").write_text(tm_toml)
    script = tmp_path / "loop.py"
    script.write_text(LOOP.format(steps=steps, sleep_s=sleep_s, special=special or {}))
    run_env = dict(tm_env, TM_DISABLE_COMPONENTS="web", **(env or {}))
    args = command if command is not None else [str(script)]
    result = run_tm(args, run_env, timeout=240, cwd=tmp_path)
    run = only_run(tmp_path / "runs")
    records = log_records(run)
    alerts = [r for r in records if r["kind"] == "alert"]
    # Every alert is in the run log, in alerts.jsonl (the same lines) and on stderr, in hub order.
    written = [json.loads(line) for line in (run / "alerts.jsonl").read_text().splitlines()] if alerts else []
    assert written == alerts
    assert [r["seq"] for r in alerts] == sorted(r["seq"] for r in alerts)
    lines = [line for line in result.stderr.splitlines() if " ALERT " in line or " cleared " in line]
    # "tm: 08:00:03 ALERT hung (critical): ..." and "tm: 08:00:12 cleared hung: ...": the fourth word is the rule
    assert [line.split()[3].rstrip(":") for line in lines] == [a["rule"] for a in alerts]
    return result, run, alerts


def states(alerts):
    return [(a["rule"], a["state"], a.get("subject")) for a in alerts]


@pytest.mark.xdist_group("heavy")
def test_a_normal_run_of_the_same_length_raises_no_alert(tm_env, tmp_path):
    result, run, alerts = alerts_of_run(tmp_path, tm_env, steps=100)
    assert result.returncode == 0, result.stderr
    assert alerts == [] and not (run / "alerts.jsonl").exists()
    assert sum(1 for r in log_records(run) if r["kind"] == "step") == 100


@pytest.mark.xdist_group("heavy")
def test_a_loop_that_stalls_is_hung_once_and_cleared_when_it_steps_again(tm_env, tmp_path):
    # step 30 waits 9 s: past max(10 × 0.1, 3) = 3 s it is hung; it steps again after 9
    result, run, alerts = alerts_of_run(tmp_path, tm_env, steps=70, special={30: (9.0, 4.0 / 30**0.5)})
    assert result.returncode == 0, result.stderr
    assert states(alerts) == [("hung", "fired", None), ("hung", "cleared", None)]
    fired = alerts[0]
    assert fired["numbers"]["threshold_s"] == 3.0 and fired["numbers"]["steps"] == 30.0
    assert fired["severity"] == "critical" and "while the training process lives" in fired["message"]


@pytest.mark.xdist_group("heavy")
def test_a_hang_that_recovered_just_before_the_end_is_resolved_when_the_run_ends(tm_env, tmp_path):
    # step 30 waits 6 s: hung past 3 s; it steps again, and ends 15 steps (1.5 s) later with exit 0. The clear wait
    # (30 s here) outlasts the run: only the run's end can clear it, with the reason.
    long_wait = SCALED.replace("floor_s = 3\nclear_after_s = 2", "floor_s = 3\nclear_after_s = 30")
    result, run, alerts = alerts_of_run(
        tmp_path, tm_env, steps=45, special={30: (6.0, 4.0 / 30**0.5)}, tm_toml=long_wait
    )
    assert result.returncode == 0, result.stderr
    assert states(alerts) == [("hung", "fired", None), ("hung", "cleared", None)]
    cleared = alerts[1]
    assert cleared["message"].startswith("cleared at the run's end after ")
    assert "it stepped until the end" in cleared["message"] and cleared["numbers"]["steps"] == 45.0
    assert cleared["seq"] > next(r["seq"] for r in log_records(run) if r["kind"] == "run.end")


@pytest.mark.xdist_group("heavy")
def test_a_loop_that_slows_down_drops_throughput_once_and_clears_when_it_is_back(tm_env, tmp_path):
    # 0.1 s per step, then 0.25 s (40 % of the rate, below 60 %) for steps 60..99, then 0.1 s again
    slow = {i: (0.25, 4.0 / i**0.5) for i in range(60, 100)}
    result, run, alerts = alerts_of_run(tmp_path, tm_env, steps=170, special=slow)
    assert result.returncode == 0, result.stderr
    assert states(alerts) == [("throughput_drop", "fired", None), ("throughput_drop", "cleared", None)]
    ratio = alerts[0]["numbers"]["ratio"]
    assert 0.3 < ratio < 0.6, alerts[0]  # about 0.1 / 0.25 = 0.4


@pytest.mark.xdist_group("heavy")
def test_a_loss_that_turns_nan_fires_once_and_clears_when_it_is_finite_again(tm_env, tmp_path):
    nan = {i: (0.1, float("nan")) for i in range(20, 26)}
    result, run, alerts = alerts_of_run(tmp_path, tm_env, steps=60, special=nan)
    assert result.returncode == 0, result.stderr
    assert states(alerts) == [("loss_nan", "fired", None), ("loss_nan", "cleared", None)]
    # the six NaNs (0.1 s apart) may straddle a tick: the alert fires on the first snapshot that holds any of them
    assert 1.0 <= alerts[0]["numbers"]["nonfinite_values"] <= 6.0 and alerts[0]["severity"] == "critical"


def fake_gpus(tmp_path, script: dict) -> dict[str, str]:
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps(script))
    return {"TM_FAKE_GPUS": "2xH100", "TM_FAKE_GPUS_SCRIPT": str(path), "TM_GPU_INTERVAL_S": "0.5"}


@pytest.mark.xdist_group("heavy")
def test_a_fake_gpu_that_throttles_for_heat_fires_once_and_clears_when_it_stops(tm_env, tmp_path):
    # 5 s of throttling: the hub's first tick comes 1 to 2 s after its start (half a second past a whole second of the
    # clock, bus/tick_clock.py), and the rule needs 2 s of it from the first snapshot that sees a GPU sample; with 4 s
    # the first snapshot came late enough once that no alert fired. The run's 12 s leave the clear its 2 s.
    env = fake_gpus(tmp_path, {"1": {"throttle": "thermal", "throttle_until_s": 5.0}})
    result, run, alerts = alerts_of_run(tmp_path, tm_env, steps=120, env=env)
    assert result.returncode == 0, result.stderr
    host = next(r["host"] for r in log_records(run) if r["kind"] == "sample.gpu")
    assert states(alerts) == [
        ("gpu_throttle", "fired", f"{host}/gpu1"),
        ("gpu_throttle", "cleared", f"{host}/gpu1"),
    ]
    assert alerts[0]["message"] == f"{host}/gpu1 throttles for heat (sw_thermal)"


@pytest.mark.xdist_group("heavy")
def test_a_fake_gpu_that_reports_an_xid_fires_once_and_clears_after_a_quiet_while(tm_env, tmp_path):
    env = fake_gpus(tmp_path, {"0": {"xids": [[2.0, 79]]}})
    result, run, alerts = alerts_of_run(tmp_path, tm_env, steps=100, env=env)
    assert result.returncode == 0, result.stderr
    host = next(r["host"] for r in log_records(run) if r["kind"] == "sample.gpu")
    assert states(alerts) == [("gpu_xid", "fired", f"{host}/gpu0"), ("gpu_xid", "cleared", f"{host}/gpu0")]
    assert alerts[0]["numbers"]["xid"] == 79.0 and "fallen off the bus" in alerts[0]["message"]


RANKS = """
import time
import torch.distributed as dist
from trainmeter_agent import emit
dist.init_process_group("gloo")
rank = dist.get_rank()
start, i = time.monotonic(), 0
# Both ranks step for 16 s (so neither waits for the other at the end); rank 1 takes twice as long per step from 4 s
# to 10 s. The ranks never wait for each other in between.
while time.monotonic() - start < 16:
    i += 1
    emit(step=i, tokens=512)
    elapsed = time.monotonic() - start
    time.sleep(0.2 if rank == 1 and 4 <= elapsed < 10 else 0.1)
dist.destroy_process_group()
"""


@pytest.mark.xdist_group("heavy")
@pytest.mark.ranks
def test_two_ranks_with_one_slow_make_one_straggler_episode(tm_env, tmp_path):
    from torch_required import require_torch

    require_torch()
    (tmp_path / "ranks.py").write_text(RANKS)
    command = [
        "--",
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "ranks.py",
    ]
    result, run, alerts = alerts_of_run(tmp_path, tm_env, command=command)
    assert result.returncode == 0, result.stderr
    # the straggler rule only; rank 0's own throughput stays steady
    assert states(alerts) == [("straggler", "fired", "rank 1"), ("straggler", "cleared", "rank 1")]
    assert alerts[0]["numbers"]["ratio"] > 1.5


@pytest.mark.xdist_group("heavy")
def test_a_child_killed_by_sigkill_is_one_died_alert(tm_env, tmp_path):
    result, run, alerts = alerts_of_run(tmp_path, tm_env, steps=60, special={30: ("kill", 1.0)})
    assert result.returncode == 128 + 9
    assert states(alerts) == [("died", "fired", None)]
    assert alerts[0]["numbers"]["signal"] == 9.0 and "SIGKILL" in alerts[0]["message"]
