"""The collective probe and the straggler under ``tm -- torchrun`` of an FSDP2 model (``fully_shard``), four ranks,
gloo on the CPU: each step's all_gathers (forward) and all_reduces (backward: gloo has no reduce_scatter) with their
bytes counted by hand; a rank slowed 200 ms a step in its forward, then in its DataLoader, named with its cause within
50 steps; no straggler alert over 1,000 clean steps; the hung alert naming the rank that, alive, never entered step
20's all_reduce, with every rank's stacks; every rank's losses the same with and without tm.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from test_collectives import HANG_ENV, HUNG_TOML
from test_straggler_e2e import straggler_over_time
from tm_runs import log_records, only_run, run_tm

pytestmark = [pytest.mark.heavy, pytest.mark.xdist_group("heavy"), pytest.mark.ranks]

SCRIPT = Path(__file__).parents[1] / "agent_scripts" / "fsdp2_loop.py"
RANKS = 4
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={RANKS}"]
# Two FSDP units, Linear(64, 32) and Linear(32, 8), each sharded on dim 0 in four equal shards (no padding): the
# all_gather of a unit outputs its whole parameters, the all_reduce of its gradient is as large, both float32.
FIRST_BYTES = (32 * 64 + 32) * 4  # 8320
SECOND_BYTES = (8 * 32 + 8) * 4  # 1056
UNIT_BYTES = FIRST_BYTES + SECOND_BYTES  # 9376 a step, each kind
SLOW = 1


def tm_torchrun(
    tmp_path: Path, tm_env: dict, timeout: float = 120, **env: str
) -> tuple[subprocess.CompletedProcess, Path]:
    run_env = dict(tm_env, TM_DISABLE_COMPONENTS="web", **env)
    result = run_tm(["--", *TORCHRUN, str(SCRIPT)], run_env, timeout=timeout, cwd=tmp_path)
    return result, only_run(tmp_path / "runs")


def losses(prefix: Path) -> dict[int, str]:
    return {rank: Path(f"{prefix}.rank{rank}").read_text() for rank in range(RANKS)}


def test_the_probe_sees_fsdp2s_all_gathers_and_all_reduces_with_their_bytes_and_changes_no_loss(
    tmp_path, tm_env, torch
):
    (tmp_path / "bare").mkdir()
    bare = subprocess.run(
        [*TORCHRUN, str(SCRIPT)],
        env=dict(tm_env, STEPS="20", LOSSES=str(tmp_path / "bare" / "loss")),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path / "bare",
    )
    assert bare.returncode == 0, bare.stderr
    # 0.1 s between steps: the probe's thread, which polls each second, sees the group alive before it is destroyed.
    result, run_dir = tm_torchrun(tmp_path, tm_env, STEPS="20", PAUSE_S="0.1", LOSSES=str(tmp_path / "loss"))
    assert result.returncode == 0, result.stderr
    assert losses(tmp_path / "loss") == losses(tmp_path / "bare" / "loss")  # every rank's, to the last bit
    records = log_records(run_dir)
    rows: dict[int, dict[int, dict]] = {}
    for record in records:
        if record["kind"] == "metric" and record.get("origin") == "collectives:0":
            rows.setdefault(record["rank"], {})[record["step"]] = record["values"]
    assert sorted(rows) == list(range(RANKS))
    for rank, steps in rows.items():
        assert sorted(steps) == list(range(1, 21)), rank
        for step, values in steps.items():
            assert (
                values["collective_all_gather_count"] == 2.0 and values["collective_all_reduce_count"] == 2.0
            )
            assert values["collective_count"] == 4.0, (rank, step, values)
            assert (
                values["collective_all_gather_bytes"] == values["collective_all_reduce_bytes"] == UNIT_BYTES
            )
            assert values["collective_bytes"] == 2 * UNIT_BYTES
            assert values["collective_seq_last"] - values["collective_seq_first"] == 3
            assert values["collective_seq_first"] == 4 * (step - 1) + 1
    # The engine's row of each step: the count and bytes of each operation by group size (4); a time only for the
    # all_gathers, which FSDP2 waits on from Python (its all_reduces are waited on in C++: the recorder times none).
    summary = {
        (r["rank"], r["step"]): r["values"]
        for r in records
        if r["kind"] == "metric" and r.get("origin") == "collectives"
    }
    assert {rank for rank, _ in summary} == set(range(RANKS))
    for values in summary.values():
        assert values["coll.all_gather.4.count"] == values["coll.all_reduce.4.count"] == 2.0
        # what the rank put in: an all_reduce's buffer, an all_gather's shard (its output / 4)
        assert (
            values["coll.all_reduce.4.bytes"] == UNIT_BYTES
            and values["coll.all_gather.4.bytes"] == UNIT_BYTES / 4
        )
        assert "coll.all_reduce.4.time_s" not in values
    timed = [
        values["coll.all_gather.4.time_s"]
        for values in summary.values()
        if "coll.all_gather.4.time_s" in values
    ]
    assert len(timed) >= len(summary) // 2 and all(t > 0 for t in timed)


@pytest.mark.parametrize(("where", "cause"), [("forward", "compute"), ("data", "data wait")])
def test_an_fsdp2_rank_slowed_200_ms_a_step_is_named_with_its_cause_within_50_steps(
    tmp_path, tm_env, torch, where, cause
):
    result, run_dir = tm_torchrun(tmp_path, tm_env, STEPS="60", SLOW_RANK=str(SLOW), SLOW_WHERE=where)
    assert result.returncode == 0, result.stderr
    named_at, named, last = straggler_over_time(run_dir)
    assert named == SLOW and named_at is not None and named_at <= 50, (named_at, named)
    assert last.metrics["straggler_rank"].value == SLOW
    assert f"cause: {cause}" in last.explain["straggler_rank"].note
    assert last.metrics["straggler_wait_s"].label == cause
    waits = {r.rank: r.collective_wait_s for r in last.ranks}
    assert len(waits) == RANKS and min(waits, key=waits.get) == SLOW
    fired = [
        a
        for a in log_records(run_dir)
        if a["kind"] == "alert" and a["rule"] == "straggler" and a["state"] == "fired"
    ]
    assert fired and f"rank {SLOW}" in fired[0]["message"] and cause in fired[0]["message"], fired


def test_hung_names_the_fsdp2_rank_that_never_entered_the_all_reduce_of_step_20_with_every_ranks_stacks(
    tmp_path, tm_env, torch
):
    (tmp_path / "tm.toml").write_text(HUNG_TOML)
    assert HANG_ENV["SLEEP_RANK"] == str(SLOW)
    result, run_dir = tm_torchrun(tmp_path, tm_env, PAUSE_S="0.01", **HANG_ENV)
    assert result.returncode == 0, result.stderr  # tm never killed nor signalled the job
    records = log_records(run_dir)
    fired = [r for r in records if r["kind"] == "alert" and r["rule"] == "hung" and r["state"] == "fired"]
    assert len(fired) == 1, [r["message"] for r in fired]
    (alert,) = fired
    # Step 20 is all_gather, all_gather (its forward, which rank 1 ran too), then the backward's all_reduces: the
    # others wait in the first of those, the third collective of the step in the default group.
    last_of_19 = next(
        r["values"]["collective_seq_last"]
        for r in records
        if r["kind"] == "metric" and r.get("origin") == "collectives:0" and r["rank"] == 0 and r["step"] == 19
    )
    seq = int(last_of_19) + 3
    assert alert["subject"] == f"rank {SLOW}"
    assert alert["numbers"]["seq"] == seq
    assert alert["message"].startswith(
        f"ranks 0, 2, 3 wait in all_reduce #{seq} of group 0 (default_pg) for "
    )
    assert f"rank {SLOW}, alive, never entered it" in alert["message"]
    stacks = alert["attachments"]
    assert sorted(stacks) == [f"rank {rank} stacks" for rank in range(RANKS)]
    assert "time.sleep(sleep_s)" in stacks[f"rank {SLOW} stacks"]
    for rank in (0, 2, 3):
        assert "loss.backward()" in stacks[f"rank {rank} stacks"]
    for text in stacks.values():
        assert 'Thread "MainThread"' in text and 'Thread "tm-agent-collectives"' in text


# scripts/test runs it after the parallel suite: beside other tests, on CI's two cores, one of the four ranks got so
# much less CPU than the others that it really did make them wait (3 ms of a 24 ms step, 13%, for 11 s), and was named.
# Alone, with a pause of 5 ms a step, it did so once in seven runs (rank 2, 3 ms of 24.5 ms, 11%, 10 s): four ranks whose
# 24.5 ms steps hold 5 ms of sleep share two cores. With 20 ms of sleep a step they wait less for a core (2 of 2 here),
# yet on CI a rank's wait EMA, compared at a tick with the others' of other steps, still stayed 10% of the step below
# theirs for the alert's 5 s, twice in one run: the straggler now compares means over the same 32 steps (3 runs here,
# the largest gap 8 to 31% of the threshold where the EMAs' reached 43 to 80%; docs/metrics.md, "Why the same steps").
@pytest.mark.alone
def test_four_clean_fsdp2_ranks_name_no_straggler_over_1000_steps(tmp_path, tm_env, torch):
    result, run_dir = tm_torchrun(tmp_path, tm_env, timeout=240, STEPS="1000", PAUSE_S="0.02")
    assert result.returncode == 0, result.stderr
    records = log_records(run_dir)
    reported = {r["rank"] for r in records if r["kind"] == "metric" and r.get("origin") == "collectives"}
    assert reported == set(range(RANKS))  # every rank's waits reached the log
    assert not [a for a in records if a["kind"] == "alert" and a["rule"] == "straggler"]
