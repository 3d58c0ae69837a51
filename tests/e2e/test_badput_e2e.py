"""The ground truth of the badput buckets (issue 44, item 1): a CPU training loop with known sleeps in its start-up,
a checkpoint's load, its data loading, a checkpoint's save, an eval and one hang, stopped by a kill (SIGTERM, as a
scheduler sends) and resumed three times with known gaps. Each bucket of its time split equals the time injected into
it plus the same bucket of a control run (the same loop, stops and resumes without the sleeps, resumed at once), within
max(2 %, 0.5 s); the buckets and the productive step time add up to the run's allocated time, within 1 %. The control
runs twice, before and after the run with the sleeps, and counts as the mean of the two: a machine that grows busier
or quieter over the test (CI's first minute after its parallel run) moves each start-up by a tenth of a second, four
start-ups a run, and one control on one side took that as a bucket off by 0.36 s."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from deadline import wait_for
from tm_runs import REPO, TM, log_records, only_run, run_tm
from torch_required import require_torch

from trainmeter_core.model import formulas

LOOP = REPO / "tests" / "scripts" / "badput_loop.py"
LAST_STEP = 100
STOPS = (
    25,
    55,
    85,
)  # each past a checkpoint (every 20 steps): steps 21..25, 41..55 and 81..85 are done again
HANG_AT = 70  # in the third attempt
GAPS_S = (1.0, 1.5, 2.0)  # the run down before the second, third and fourth attempts
# The hung rule, its floor lowered under the hang (4.5 s) and over every other sleep (at most 1.2 s between two steps)
# and over the end of a process after its last step.
TM_TOML = "[alerts.hung]\nfloor_s = 3\nclear_after_s = 1\n"


def attempts(folder: Path, env: dict[str, str], sleeps: bool, gaps_s: tuple[float, ...], out: dict) -> None:
    """The loop under tm in ``folder``: killed after each of STOPS, resumed after each gap; the run's folder and the
    gaps as slept into ``out``."""
    ckpt = folder / "ckpt"
    ckpt.mkdir()
    out["gaps_s"] = []
    run_name = None
    for index, stop in enumerate((*STOPS, 0)):
        command = [TM, "--no-web", str(folder / LOOP.name), str(ckpt), str(LAST_STEP), str(stop)]
        command += ["1" if sleeps else "0", str(HANG_AT)]
        if run_name is not None:
            command[2:2] = ["--resume", run_name]
        tm = subprocess.Popen(command, env=env, cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            if not stop:
                assert tm.wait(120) == 0, tm.stderr.read().decode() if tm.stderr else ""
                break
            stopped = ckpt / "stopped"
            wait_for(lambda s=stopped: s.exists() and s.read_text(), timeout_s=120, what="the loop's stop")
            os.kill(tm.pid, signal.SIGTERM)  # tm passes it on to the training and writes the attempt's end
            assert tm.wait(60) == 128 + signal.SIGTERM
            stopped.unlink()
        finally:
            if tm.poll() is None:
                tm.kill()
                tm.wait()
        run_name = only_run(Path(env["TM_RUNS_DIR"])).name
        started = time.monotonic()
        time.sleep(gaps_s[index])
        out["gaps_s"].append(time.monotonic() - started)
    out["run"] = only_run(Path(env["TM_RUNS_DIR"]))


def scenario(tmp_path: Path, tm_env: dict[str, str], name: str, sleeps: bool, gaps_s, out: dict) -> None:
    folder = tmp_path / name
    folder.mkdir()
    shutil.copy(LOOP, folder / LOOP.name)
    (folder / "tm.toml").write_text(TM_TOML)  # next to the script, where tm reads it
    env = dict(tm_env, TM_RUNS_DIR=str(folder / "runs"), TM_DISABLE_COMPONENTS="web")
    attempts(folder, env, sleeps, gaps_s, out)


def injected_s(run_with_sleeps: dict) -> dict[str, float]:
    """What the loop slept, bucket by bucket, as it measured it; and the gaps as the test slept them."""
    slept = {name: 0.0 for name in (*formulas.BADPUT_BUCKETS, "compute")}
    lines = (run_with_sleeps["folder"] / "ckpt" / "injected.jsonl").read_text().splitlines()
    for line in lines:
        entry = json.loads(line)
        slept[entry["bucket"]] += entry["s"]
    slept["down"] = sum(run_with_sleeps["gaps_s"])
    return slept


@pytest.mark.alone  # scripts/test runs it after the parallel suite: another test beside it moves its start-ups
@pytest.mark.xdist_group("heavy")
def test_each_bucket_is_the_time_injected_into_it_plus_the_control_runs_and_they_add_up(tm_env, tmp_path):
    require_torch()
    with_sleeps: dict = {"folder": tmp_path / "sleeps"}
    controls: list[dict] = [{"folder": tmp_path / "control"}, {"folder": tmp_path / "control-after"}]
    # torch's files into the page cache first: a cold import would be the first attempt's start-up alone.
    subprocess.run([sys.executable, "-c", "import torch"], check=True, env=tm_env, timeout=120)
    # One after the other: side by side, each would slow the other down unevenly on a small machine.
    for name, sleeps, gaps_s, out in (
        ("control", False, (0.0, 0.0, 0.0), controls[0]),
        ("sleeps", True, GAPS_S, with_sleeps),
        ("control-after", False, (0.0, 0.0, 0.0), controls[1]),
    ):
        scenario(tmp_path, tm_env, name, sleeps, gaps_s, out)

    finals = {}
    for name, out in (("sleeps", with_sleeps), ("control", controls[0]), ("control-after", controls[1])):
        summary = json.loads((out["run"] / "summary.json").read_text())
        snapshot = summary["snapshot"]
        assert [a["end"] for a in summary["attempts"]] == ["killed by SIGTERM"] * 3 + ["exited 0"], name
        assert snapshot["steps"] == LAST_STEP, name
        log = log_records(out["run"])
        # The allocated time, from the log: the first attempt's run.start to the last run.end, by the wall clock.
        starts = [r for r in log if r["kind"] == "run.start"]
        ends = [r for r in log if r["kind"] == "run.end"]
        allocated_s = ends[-1]["wall"] - starts[0]["wall"]
        split = snapshot["phases_s"]
        assert set(split) == {*formulas.BADPUT_BUCKETS, "compute"}, name
        named_s = sum(seconds for bucket, seconds in split.items() if bucket != "other")
        assert named_s == pytest.approx(allocated_s, rel=0.01), (name, split)
        assert snapshot["elapsed_s"] == pytest.approx(allocated_s, rel=0.01), name
        # goodput: the productive step time over the allocated time
        assert snapshot["metrics"]["goodput"]["value"] == pytest.approx(
            split["compute"] / snapshot["elapsed_s"]
        )
        # one bar per attempt: the attempts' shares add up to the run's split, bucket by bucket
        for bucket, seconds in split.items():
            shares = sum(a["phases_s"][bucket] for a in snapshot["attempts"])
            assert shares == pytest.approx(seconds, abs=1e-6), (name, bucket)
        finals[name] = split

    slept = injected_s(with_sleeps)
    # the loop slept where it says: 4 start-ups, 3 loads, 4 data waits, 5 saves, 4 evals, 1 hang
    assert [round(slept[b], 1) for b in ("startup", "checkpoint_load", "data_wait", "checkpoint", "eval", "hang")] == [
        6.0, 3.0, 4.0, 6.0, 4.8, 4.5
    ]  # fmt: skip
    report = {
        bucket: (
            finals["sleeps"][bucket],
            slept[bucket],
            (finals["control"][bucket] + finals["control-after"][bucket]) / 2,
        )
        for bucket in (*formulas.BADPUT_BUCKETS, "compute")
    }
    print("bucket: with the sleeps, injected, the controls' mean (s), before and after")
    for bucket, (measured, injected, baseline) in report.items():
        print(
            f"  {bucket}: {measured:.3f}, {injected:.3f}, {baseline:.3f}, off by {measured - injected - baseline:+.3f}"
            f" ({finals['control'][bucket]:.3f}, {finals['control-after'][bucket]:.3f})"
        )
    # every bucket checked, every one that is off named at once (with the sleeps, injected, control)
    off = {
        bucket: numbers
        for bucket, numbers in report.items()
        if abs(numbers[0] - numbers[1] - numbers[2]) > max(0.02 * (numbers[1] + numbers[2]), 0.5)
    }
    assert not off, off


LOADS = """
import torch
torch.save({"w": torch.ones(2)}, "ckpt.pt")
state = torch.load("ckpt.pt")
torch.serialization.load("ckpt.pt")
model = torch.nn.Linear(2, 1)
optimizer = torch.optim.AdamW(model.parameters())
for _ in range(3):
    optimizer.zero_grad()
    model(state["w"]).sum().backward()
    optimizer.step()
"""


@pytest.mark.xdist_group("heavy")
def test_a_checkpoint_loaded_with_torch_load_is_a_checkpoint_load_phase(tm_env, tmp_path):
    require_torch()
    (tmp_path / "loads.py").write_text(LOADS)
    result = run_tm(["--no-web", str(tmp_path / "loads.py")], tm_env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    run = only_run(tmp_path / "runs")
    phases = [(r["phase"], r["probe"]) for r in log_records(run) if r["kind"] == "phase"]
    # one save, then two loads (torch.load and the same function under torch.serialization), each its own phase
    assert phases == [
        ("checkpoint", "torch.save"),
        ("checkpoint_load", "torch.load"),
        ("checkpoint_load", "torch.load"),
    ]
    split = json.loads((run / "summary.json").read_text())["snapshot"]["phases_s"]
    assert split["checkpoint_load"] > 0  # before the first step: the load's own bucket, not start-up's
