"""Golden run logs (made by scripts/make-golden-logs from real runs) replay into the numbers the runs showed live."""

from __future__ import annotations

import json
import random
import shutil

import msgspec
import pytest
from schema1 import upgrade_snapshot
from test_replay_unchanged import reconcile
from tm_runs import REPO, run_tm

from trainmeter_core.model import records
from trainmeter_core.model.engine import Engine
from trainmeter_core.runlog import replay

GOLDEN = REPO / "tests" / "fixtures" / "golden"
NAMES = sorted(p.name for p in GOLDEN.iterdir() if p.is_dir())
HEADER = set(records.Record.__struct_fields__) - {"t", "wall"}
FUZZ_CASES = 1000


def body(snapshot: dict) -> dict:
    return {k: v for k, v in snapshot.items() if k not in HEADER}


def as_json(snapshot: records.Snapshot) -> dict:
    return json.loads(msgspec.json.encode(records.to_builtins(snapshot)))


def test_there_are_several_golden_logs_including_two_ranks_and_no_budget():
    assert {"cpu-measured", "no-budget", "two-rank"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_replay_reproduces_the_final_snapshot_the_run_wrote(name):
    # The golden runs were recorded under schema 1: their summaries read through the old-to-new key table.
    live = upgrade_snapshot(json.loads((GOLDEN / name / "summary.json").read_text())["snapshot"])
    replayed = as_json(replay.final_snapshot(GOLDEN / name, use_checkpoint=False))
    reconcile(name, live, replayed)  # issue 11's changes, each checked (test_replay_unchanged.py)
    assert body(replayed) == body(live)


def test_a_cpu_run_with_a_measured_peak_shows_mfu_labelled_measured_and_the_same_on_another_machine(
    tm_env, tmp_path
):
    run = GOLDEN / "cpu-measured"
    live = json.loads((run / "summary.json").read_text())["snapshot"]["metrics"]["mfu_avg"]
    assert live["label"] == "measured" and live["convention"] == "titan" and 0 < live["value"] < 1
    # Another machine: no peaks file at all. The peak travels in the log as a fact, so MFU is the same.
    env = dict(tm_env, TM_PEAKS_FILE=str(tmp_path / "none.json"), HOME=str(tmp_path))
    copy = tmp_path / "elsewhere" / "cpu-measured"
    shutil.copytree(run, copy)
    result = run_tm(["view", "--json", str(copy)], env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["metrics"]["mfu_avg"] == live


def test_a_run_with_no_budget_names_the_flag_for_progress_and_eta():
    live = upgrade_snapshot(json.loads((GOLDEN / "no-budget" / "summary.json").read_text())["snapshot"])
    metrics = live["metrics"]
    for key in ("progress", "eta_s", "required_flop"):
        assert metrics[key].get("value") is None
        assert "--budget-tokens" in metrics[key]["absent"]
    assert "--peak-tflops" in metrics["mfu_avg"]["absent"] and "value" not in metrics["mfu_avg"]


def test_the_two_rank_run_has_two_ranks_one_step_clock_and_dp_two():
    snapshot = json.loads((GOLDEN / "two-rank" / "summary.json").read_text())["snapshot"]
    assert [(r["rank"], r["steps"]) for r in snapshot["ranks"]] == [(0, 30), (1, 30)]
    assert snapshot["steps"] == 30  # rank 0 is the clock: 30 steps, not 60
    assert snapshot["facts"]["dp"]["value"] == 2


# --------------------------------------------------------------------------------------------------------------------
# Fuzzed logs


def _malformed(line: bytes) -> bool:
    try:
        records.from_log_line(line)
    except records.MalformedRecord:
        return True
    return False


def mutate(line: bytes, rnd: random.Random) -> bytes:
    """A certainly-malformed version of one log line: cut, flipped bytes, wrong types, huge numbers or NaN."""
    for _ in range(50):
        how = rnd.choice(["cut", "flip", "type", "huge", "nan"])
        if how == "cut":
            out = line[: rnd.randrange(1, len(line) - 1)] + b"\n"
        elif how == "flip":
            i = rnd.randrange(0, len(line) - 1)
            out = line[:i] + b"\xff" + line[i + 1 :]  # never valid UTF-8
        else:
            data = json.loads(line)
            keys = [k for k in data if k not in ("kind",)]
            key = rnd.choice(keys)
            text = json.dumps(data)
            if how == "type":
                data[key] = {"not": ["what", "was", "meant"]}
                text = json.dumps(data)
            elif how == "huge":
                data[key] = 10**40
                text = json.dumps(data)
            else:
                text = text.replace(json.dumps({key: data[key]})[1:-1], f'"{key}": NaN', 1)
            out = text.encode() + b"\n"
        if _malformed(out):
            return out
    raise AssertionError("no malformed mutation found")


def final_of(lines: list[bytes]) -> dict:
    engine = Engine()
    for line in lines:
        try:
            record = records.from_log_line(line)
        except records.MalformedRecord:
            continue
        engine.feed(record, snapshots=False)
    return as_json(engine.snapshot())


@pytest.mark.parametrize("name", NAMES)
def test_fuzzed_logs_skip_exactly_the_mutated_lines_and_equal_the_clean_log_without_them(name, tmp_path):
    lines = (GOLDEN / name / "events-0001.jsonl").read_bytes().splitlines(keepends=True)
    cases = FUZZ_CASES // len(NAMES) + 1
    for case in range(cases):
        seed = 1000 * NAMES.index(name) + case
        rnd = random.Random(seed)
        chosen = sorted(rnd.sample(range(len(lines)), rnd.randint(1, 5)))
        mutated = list(lines)
        for i in chosen:
            mutated[i] = mutate(lines[i], rnd)
        folder = tmp_path / f"case{case}"
        folder.mkdir()
        (folder / "events-0001.jsonl").write_bytes(b"".join(mutated))
        stats: dict = {}
        from trainmeter_core.runlog.reader import read_log

        engine = Engine()
        for record in read_log(folder, stats=stats):
            engine.feed(record, snapshots=False)
        assert stats["skipped"] == len(chosen), f"seed={seed}"
        clean = [line for i, line in enumerate(lines) if i not in chosen]
        assert as_json(engine.snapshot()) == final_of(clean), f"seed={seed}"
        shutil.rmtree(folder)
