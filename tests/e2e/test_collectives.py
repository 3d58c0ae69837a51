"""The collective probe under ``tm -- torchrun`` (two ranks, gloo on the CPU, a small DDP model): every step's
all_reduce that DDP's reducer issues from C++, with its bytes counted by hand; the hung alert that names the rank
which never entered the all_reduce of step 20, with every rank's stacks; the losses the same with and without tm.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from tm_runs import log_records, only_run, run_tm

pytestmark = [pytest.mark.heavy, pytest.mark.xdist_group("heavy"), pytest.mark.ranks]

SCRIPT = Path(__file__).parents[1] / "agent_scripts" / "ddp_collectives.py"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
# The model's gradients: Linear(64, 32) and Linear(32, 8), weights and biases, float32, in DDP's one bucket.
GRAD_BYTES = (64 * 32 + 32 + 32 * 8 + 8) * 4  # 2344 floats = 9376 bytes
LATE_S = 0.4
# The hang of the acceptance: rank 1, alive, sleeps 12 s in step 20 before the collective the others wait in; the
# ranks report a stall after 1.5 s and the hung rule's collective floor is 4 s, so that it fires within the test.
HUNG_TOML = "[alerts.hung]\ncollective_floor_s = 4\nclear_after_s = 1\n"
HANG_ENV = {
    "STEPS": "24",
    "SLEEP_RANK": "1",
    "SLEEP_STEP": "20",
    "SLEEP_S": "12",
    "TM_COLLECTIVE_STALL_S": "1.5",
}


def tm_torchrun(tmp_path: Path, tm_env: dict, **env: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    run_env = dict(tm_env, TM_DISABLE_COMPONENTS="web", **env)
    result = run_tm(["--", *TORCHRUN, str(SCRIPT)], run_env, timeout=120, cwd=tmp_path)
    return result, log_records(only_run(tmp_path / "runs"))


def collective_rows(records: list[dict]) -> dict[int, dict[int, dict]]:
    """Each rank's collective metric rows of the default group, by step."""
    out: dict[int, dict[int, dict]] = {}
    for record in records:
        if record["kind"] == "metric" and record.get("origin") == "collectives:0":
            out.setdefault(record["rank"], {})[record["step"]] = record["values"]
    return out


def losses(prefix: Path) -> dict[int, str]:
    return {rank: Path(f"{prefix}.rank{rank}").read_text() for rank in (0, 1)}


def test_the_probe_sees_ddps_all_reduce_each_step_with_its_bytes_and_exposed_wait_and_changes_no_loss(
    tmp_path, tm_env, torch
):
    (tmp_path / "bare").mkdir()
    late = dict(
        SLEEP_RANK="1", SLEEP_STEP="20", SLEEP_S=str(LATE_S)
    )  # rank 1 enters step 20's all_reduce late
    bare = subprocess.run(
        [*TORCHRUN, str(SCRIPT)],
        env=dict(tm_env, STEPS="30", LOSSES=str(tmp_path / "bare" / "loss"), **late),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path / "bare",
    )
    assert bare.returncode == 0, bare.stderr
    result, records = tm_torchrun(tmp_path, tm_env, STEPS="30", LOSSES=str(tmp_path / "loss"), **late)
    assert result.returncode == 0, result.stderr
    assert losses(tmp_path / "loss") == losses(tmp_path / "bare" / "loss")  # every rank's, to the last bit
    rows = collective_rows(records)
    assert sorted(rows) == [0, 1]
    for rank, steps in rows.items():
        assert sorted(steps) == list(range(1, 31)), rank
        # Step 1 holds DDP's start-up (its broadcasts of parameters and buffers) besides the first all_reduce.
        assert steps[1]["collective_all_reduce_count"] == 1.0 and steps[1]["collective_broadcast_count"] >= 1
        for step in range(3, 31):  # from step 3 on, only the reducer's all_reduce of the one bucket
            values = steps[step]
            assert values["collective_count"] == 1.0 and values["collective_all_reduce_count"] == 1.0
            assert values["collective_bytes"] == values["collective_all_reduce_bytes"] == GRAD_BYTES
            assert values["collective_seq_first"] == values["collective_seq_last"]
            assert values["collective_seq_last"] == steps[step - 1]["collective_seq_last"] + 1
            assert values["collective_arrival_s"] > 0
    # Rank 0 waited for rank 1's late all_reduce at step 20, exposed, within 10% of the delay; rank 1 did not.
    assert abs(rows[0][20]["collective_exposed_s"] - LATE_S) <= 0.1 * LATE_S
    assert rows[1][20]["collective_exposed_s"] < 0.1 * LATE_S
    # The same collective has the same sequence number on both ranks.
    assert {s: v["collective_seq_last"] for s, v in rows[0].items()} == {
        s: v["collective_seq_last"] for s, v in rows[1].items()
    }
    facts = [r for r in records if r["kind"] == "fact" and r["name"] == "probe.collectives"]
    assert sorted((f["rank"], f["value"]) for f in facts) == [(0, "attached"), (1, "attached")]


def test_hung_names_the_rank_that_never_entered_the_all_reduce_of_step_20_with_every_ranks_stacks(
    tmp_path, tm_env, torch
):
    (tmp_path / "tm.toml").write_text(HUNG_TOML)
    result, records = tm_torchrun(tmp_path, tm_env, **HANG_ENV)
    assert result.returncode == 0, result.stderr  # tm never killed nor signalled the job
    fired = [r for r in records if r["kind"] == "alert" and r["rule"] == "hung" and r["state"] == "fired"]
    assert len(fired) == 1, [r["message"] for r in fired]
    (alert,) = fired
    rows = collective_rows(records)
    # The all_reduce rank 0 waits in is the one after step 19's: its sequence number in the default group.
    seq = int(rows[0][19]["collective_seq_last"]) + 1
    assert alert["subject"] == "rank 1"
    assert alert["numbers"]["seq"] == seq
    assert alert["message"].startswith(f"rank 0 waits in all_reduce #{seq} of group 0 (default_pg) for ")
    assert "rank 1, alive, never entered it" in alert["message"]
    stacks = alert["attachments"]
    assert sorted(stacks) == ["rank 0 stacks", "rank 1 stacks"]
    # Rank 1 sleeps where the script sleeps; rank 0 waits inside backward(); each with all its threads.
    assert "time.sleep(sleep_s)" in stacks["rank 1 stacks"] and "loss.backward()" in stacks["rank 0 stacks"]
    for text in stacks.values():
        assert 'Thread "MainThread"' in text and 'Thread "tm-agent-collectives"' in text
    assert "ALERT hung" in result.stderr


def test_a_rank_late_to_a_synchronous_all_reduce_from_python_shows_as_the_others_exposed_wait(
    tmp_path, tm_env, torch
):
    result, records = tm_torchrun(
        tmp_path, tm_env, STEPS="25", LOG_REDUCE="1", SLEEP_RANK="1", SLEEP_STEP="20", SLEEP_S=str(LATE_S)
    )
    assert result.returncode == 0, result.stderr
    rows = collective_rows(records)
    for rank in (0, 1):  # the reducer's bucket and the loss's one float, each step
        assert rows[rank][20]["collective_all_reduce_count"] == 2.0
        assert rows[rank][20]["collective_all_reduce_bytes"] == GRAD_BYTES + 4
    assert abs(rows[0][20]["collective_exposed_s"] - LATE_S) <= 0.1 * LATE_S
    assert rows[1][20]["collective_exposed_s"] < 0.1 * LATE_S


def test_an_internal_error_stops_the_probe_alone_and_the_loop_trains_on(tmp_path, tm_env, torch):
    result, records = tm_torchrun(tmp_path, tm_env, STEPS="40", PAUSE_S="0.05", TM_AGENT_FAULT="collectives")
    assert result.returncode == 0, result.stderr
    assert "tm: agent collectives stopped: InjectedFault" in result.stderr
    notices = [r for r in records if r["kind"] == "notice" and r["topic"] == "agent.collectives"]
    assert sorted(n["rank"] for n in notices) == [0, 1]
    for rank in (0, 1):
        steps = [r["step"] for r in records if r["kind"] == "step" and r["rank"] == rank]
        assert steps == list(range(1, 41))  # every step of both ranks, none lost to the probe's failure
    states = {
        (f["rank"], f["value"]) for f in records if f["kind"] == "fact" and f["name"] == "probe.collectives"
    }
    assert (0, "not attached: stopped after an internal error") in states


def test_ranks_waiting_in_a_barrier_while_rank_0_saves_a_checkpoint_is_no_hang(tmp_path, tm_env, torch):
    (tmp_path / "tm.toml").write_text("[alerts.hung]\ncollective_floor_s = 3\nclear_after_s = 1\n")
    result, records = tm_torchrun(
        tmp_path, tm_env, STEPS="15", CHECKPOINT_STEP="10", CHECKPOINT_S="8", TM_COLLECTIVE_STALL_S="1.5"
    )
    assert result.returncode == 0, result.stderr
    assert [r["message"] for r in records if r["kind"] == "alert" and r["rule"] == "hung"] == []
    stalls = {
        r["rank"]: r["value"]
        for r in records
        if r["kind"] == "fact" and r["name"] == "collective.stall" and r["value"]["stalled"]
    }
    # Rank 0 said it was saving; rank 1 waited in the barrier rank 0 had not entered.
    assert stalls[0]["phase"] == "checkpoint" and stalls[0]["waiting"] == []
    assert [w["op"] for w in stalls[1]["waiting"]] == ["barrier"]
    (saved,) = [r for r in records if r["kind"] == "phase" and r["phase"] == "checkpoint"]
    assert saved["rank"] == 0 and saved["end_t"] - saved["start_t"] >= 8
