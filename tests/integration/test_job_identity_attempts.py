"""A resumed run's attempts each keep the job identity they started under (a requeued Slurm job resumes as another
job, a rescheduled pod as another pod), and ``meta.json``'s own is the newest attempt's (run/identity.describe_run)."""

from __future__ import annotations

import json

from trainmeter_core.model import job_identity
from trainmeter_core.run.identity import describe_run


def describe(run_dir, attempt: int, slurm_job_id: str):
    return describe_run(
        run_dir,
        name="train",
        command=["train.py"],
        cwd="/work",
        start_wall=1_796_000_000.0 + attempt * 100,
        start_t=float(attempt),
        child_pid=None,
        env={},
        plugins=[],
        source="launcher",
        job_identity=job_identity.job_identity({"SLURM_JOB_ID": slurm_job_id, "SLURM_STEP_ID": "0"}),
        attempt=attempt,
        resume_reason="--resume" if attempt > 1 else None,
    )


def test_each_attempt_keeps_the_slurm_job_it_ran_as_and_the_run_s_identity_is_the_newest(tmp_path):
    run_dir = tmp_path / "20261201T000000Z-n1-train"
    run_dir.mkdir()
    describe(run_dir, 1, "100")
    start = describe(run_dir, 2, "101")  # requeued: Slurm gave the resumed attempt a new job
    assert start.job_identity.slurm_job_id == "101"
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["job_identity"]["slurm_job_id"] == "101"
    assert [a["job_identity"]["slurm_job_id"] for a in meta["attempts"]] == ["100", "101"]
